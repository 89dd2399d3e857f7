"""Backend-config strings, as torch.distributed's BackendConfig parses them.

``"mpi"`` means every device kind uses MPI (``"cpu:mpi,cuda:mpi"``);
``"cpu:mpi,cuda:nccl"`` names one backend per device kind. pycoll knows the
devices ``cpu`` and ``cuda`` and the backends ``mpi`` and ``nccl`` (cuda only).
A trailing comma, a device named twice, an unknown device or backend, or a
missing ``device:`` part is a ValueError naming what is wrong.
"""

from __future__ import annotations

from typing import Dict

__all__ = ["BackendConfig", "DEVICES", "BACKENDS"]

DEVICES = ("cpu", "cuda")
# Which devices each backend serves when it is named alone.
BACKENDS: Dict[str, tuple] = {"mpi": ("cpu", "cuda"), "nccl": ("cuda",)}


class BackendConfig:
    """A backend per device kind, from ``"mpi"`` or ``"cpu:mpi,cuda:nccl"``."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"backend must be a string, got {type(text).__name__}")
        spec = text.strip().lower()
        self.device_backend_map: Dict[str, str] = {}
        if ":" not in spec and "," not in spec:
            if spec not in BACKENDS:
                raise ValueError(
                    f"unknown backend {text!r}; pycoll has {', '.join(BACKENDS)} "
                    f"(or a device map such as 'cpu:mpi,cuda:nccl')"
                )
            for device in BACKENDS[spec]:
                self.device_backend_map[device] = spec
            return
        for item in spec.split(","):
            if not item:
                raise ValueError(
                    f"backend config {text!r} has an empty entry (a stray comma); "
                    f"write 'cpu:mpi,cuda:nccl'"
                )
            device, sep, backend = item.partition(":")
            device, backend = device.strip(), backend.strip()
            if not sep or not device or not backend:
                raise ValueError(
                    f"backend config entry {item!r} in {text!r} must be 'device:backend'"
                )
            if device not in DEVICES:
                raise ValueError(
                    f"unknown device {device!r} in backend config {text!r}; "
                    f"devices are {', '.join(DEVICES)}"
                )
            if backend not in BACKENDS or device not in BACKENDS[backend]:
                usable = [b for b, devices in BACKENDS.items() if device in devices]
                raise ValueError(
                    f"backend {backend!r} cannot serve {device} in {text!r}; "
                    f"for {device} use {' or '.join(usable)}"
                )
            if device in self.device_backend_map:
                raise ValueError(f"device {device!r} is given twice in backend config {text!r}")
            self.device_backend_map[device] = backend

    def get_device_backend_map(self) -> Dict[str, str]:
        """``{"cpu": "mpi", "cuda": "nccl"}``: the backend for each device kind."""
        return dict(self.device_backend_map)

    def __str__(self) -> str:
        return ",".join(f"{d}:{b}" for d, b in self.device_backend_map.items())

    def __repr__(self) -> str:
        return f"BackendConfig({str(self)!r})"
