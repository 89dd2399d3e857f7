"""pycoll.gpu: CUDA arrays in pycoll's collectives.

This folder (gpu/ at the top of the source tree) is installed as pycoll.gpu;
import it by that name.

Every collective takes CUDA arrays (cupy, torch CUDA tensors, anything with
``__cuda_array_interface__`` or CUDA ``__dlpack__``); :mod:`pycoll.gpu.collectives`
sends them through NCCL, a CUDA-aware MPI, or pinned host memory. Public here:

- :func:`cuda_aware`: whether the MPI library can take device pointers, and why
  pycoll thinks so (see :mod:`pycoll.gpu.aware`).
- :class:`BackendConfig`: torch's backend-config strings (``"cpu:mpi,cuda:nccl"``),
  parsed and checked; ``init_process_group(backend=...)`` takes them.

Importing this module needs neither cupy nor a GPU.
"""

from __future__ import annotations

from .aware import Awareness, cuda_aware
from .backend_config import BackendConfig

__all__ = ["Awareness", "BackendConfig", "cuda_aware"]
