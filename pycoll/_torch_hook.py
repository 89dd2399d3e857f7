"""The hook torch runs at ``import torch`` (entry-point group "torch.backends").

It makes ``init_process_group("pycoll")`` work without ``import pycoll.torch``
by importing it (which registers the backend and the ``mpi://`` rendezvous;
about 45 ms, and nothing is started: no MPI, no thread). A failing hook
there would break ``import torch`` for everyone who has pycoll installed, so
this one never raises: a failure becomes a warning, and ``import
pycoll.torch`` then shows the error in full. torch skips every such hook
where ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import warnings


def autoload() -> None:
    """Register the backend "pycoll" with torch; never raises."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        import pycoll.torch  # noqa: F401  (registers on import)
    except Exception as exc:  # noqa: BLE001 - must not break `import torch`
        warnings.warn(
            f"pycoll could not register its torch backend ({type(exc).__name__}: {exc}); "
            f"`import pycoll.torch` shows the error",
            RuntimeWarning,
            stacklevel=2,
        )
