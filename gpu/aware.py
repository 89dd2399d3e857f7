"""Is the MPI library CUDA-aware? Asked once per process, answered with a reason.

A device pointer handed to an MPI that is not CUDA-aware is a segfault, not
an exception, and mpi4py has no query for it, so pycoll decides, in order:

1. ``PYCOLL_CUDA_AWARE=0|1``: the user knows.
2. MPI-4.1's ``mpi_memory_alloc_kinds`` info key on MPI_COMM_WORLD: aware when
   it lists a ``cuda`` kind.
3. The vendor's own query, through ctypes, and only on that vendor's library
   (each symbol can exist elsewhere with other semantics): MPICH's
   ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &ok)``, Open MPI's
   ``MPIX_Query_cuda_support()``.
4. Otherwise: not aware (staging through host memory is slower, never wrong).

The answer is cached and logged at INFO on the ``pycoll`` logger.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import NamedTuple, Optional

from pycoll import _mpi  # light: MPI itself starts only in _mpi.load()

__all__ = ["Awareness", "cuda_aware", "reset"]

log = logging.getLogger("pycoll")

MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's enum value for CUDA in MPIX_GPU_query_support


class Awareness(NamedTuple):
    """The answer: ``aware`` and the ``reason`` it rests on.

    Its truth is ``aware``, so ``if pycoll.gpu.cuda_aware():`` reads as it
    says (a plain tuple of two would always be true).
    """

    aware: bool
    reason: str

    def __bool__(self) -> bool:
        return self.aware


_ANSWER: Optional[Awareness] = None


def reset() -> None:
    """Forget the cached answer (for tests, and after changing the setting)."""
    global _ANSWER
    _ANSWER = None


def cuda_aware() -> Awareness:
    """Whether device buffers may go to MPI directly, and why (cached)."""
    global _ANSWER
    if _ANSWER is None:
        _ANSWER = _decide()
        log.info(
            "pycoll.gpu: MPI is %sCUDA-aware (%s)",
            "" if _ANSWER.aware else "not ",
            _ANSWER.reason,
        )
    return _ANSWER


def _decide() -> Awareness:
    forced = os.environ.get("PYCOLL_CUDA_AWARE", "").strip()
    if forced in ("0", "1"):
        return Awareness(forced == "1", f"PYCOLL_CUDA_AWARE={forced}")
    if forced:
        raise ValueError(
            f"PYCOLL_CUDA_AWARE={forced!r}: set it to 1 (MPI takes device pointers), "
            f"0 (stage through host memory), or leave it unset to ask MPI"
        )
    MPI = _mpi.load()
    kinds = _alloc_kinds(MPI)
    if kinds is not None and any(k.split(":")[0] == "cuda" for k in kinds.split(",")):
        return Awareness(True, f"mpi_memory_alloc_kinds={kinds!r} lists cuda")
    vendor = _mpi.VENDOR
    query = _vendor_query(vendor)
    if query is not None:
        return query
    why = f"mpi_memory_alloc_kinds={kinds!r}" if kinds is not None else "no mpi_memory_alloc_kinds"
    return Awareness(False, f"{why}, and {vendor or 'this MPI'} has no CUDA query pycoll trusts")


def _alloc_kinds(MPI: object) -> Optional[str]:
    try:
        info = MPI.COMM_WORLD.Get_info()  # type: ignore[attr-defined]
        try:
            return info.Get("mpi_memory_alloc_kinds")
        finally:
            info.Free()
    except Exception:  # an MPI older than 4.1 may refuse the key
        return None


def _vendor_query(vendor: str) -> Optional[Awareness]:
    try:
        lib = _mpi.library()
    except RuntimeError:
        return None
    if vendor == "MPICH" and hasattr(lib, "MPIX_GPU_query_support"):
        ok = ctypes.c_int(0)
        rc = lib.MPIX_GPU_query_support(ctypes.c_int(MPIX_GPU_SUPPORT_CUDA), ctypes.byref(ok))
        if rc == 0:
            return Awareness(bool(ok.value), f"MPICH's MPIX_GPU_query_support(CUDA) = {ok.value}")
    if vendor == "Open MPI" and hasattr(lib, "MPIX_Query_cuda_support"):
        lib.MPIX_Query_cuda_support.restype = ctypes.c_int
        value = int(lib.MPIX_Query_cuda_support())
        return Awareness(bool(value), f"Open MPI's MPIX_Query_cuda_support() = {value}")
    return None
