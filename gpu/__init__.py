"""pycoll.gpu: GPU arrays over MPI (in progress).

What is here so far:

- :func:`cuda_aware`: whether the MPI library can take device pointers, and why
  pycoll thinks so (see :mod:`pycoll.gpu.aware`).
- :class:`BackendConfig`: torch's backend-config strings (``"cpu:mpi,cuda:nccl"``),
  parsed and checked.

Importing this module needs neither cupy nor a GPU.
"""

from __future__ import annotations

from .aware import Awareness, cuda_aware
from .backend_config import BackendConfig

__all__ = ["Awareness", "BackendConfig", "cuda_aware"]
