"""The one place that imports ``mpi4py.MPI``.

Importing ``mpi4py.MPI`` initializes MPI. pycoll defers that to
:func:`pycoll.init_process_group`, so that ``import pycoll`` is safe in
processes that must not become MPI processes (a launcher that calls mpiexec,
a pytest parent that spawns MPI jobs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from typing import Any, Optional

MPI: Any = None
IN_PLACE: Any = None  # MPI.IN_PLACE, kept here for the collectives' hot paths
VENDOR = ""  # "MPICH", "Open MPI", ...: what mpi4py.MPI.get_vendor() says, once loaded


def load() -> Any:
    """Import mpi4py.MPI (initializing MPI) and return the module.

    ``PYCOLL_ASYNC_PROGRESS=1`` asks the MPI library for its own progress
    thread (MPICH's MPIR_CVAR_ASYNC_PROGRESS, read at MPI_Init; mpi4py
    initializes with MPI_THREAD_MULTIPLE, which it needs), so that async
    collectives advance while the caller computes. It is off by default: it
    costs a thread per rank spinning on a core (docs/benchmarks.md).
    """
    global MPI, IN_PLACE, VENDOR
    if MPI is None:
        if os.environ.get("PYCOLL_ASYNC_PROGRESS", "").strip() == "1":
            os.environ.setdefault("MPIR_CVAR_ASYNC_PROGRESS", "1")
        from mpi4py import MPI as _MPI

        MPI = _MPI
        IN_PLACE = _MPI.IN_PLACE
        VENDOR = _MPI.get_vendor()[0]
    return MPI


def available() -> bool:
    """True when mpi4py's MPI extension is installed, without initializing MPI."""
    try:
        return importlib.util.find_spec("mpi4py.MPI") is not None
    except ModuleNotFoundError:
        return False


_LIBRARY: Optional[ctypes.CDLL] = None


def library() -> ctypes.CDLL:
    """The libmpi that mpi4py loaded, for the few calls mpi4py does not wrap
    (MPI_Op_create with a C function, the MPIX CUDA queries)."""
    global _LIBRARY
    if _LIBRARY is None:
        load()
        path = None
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    name = line.rsplit(None, 1)[-1]
                    if os.path.basename(name).startswith("libmpi.so"):
                        path = name
                        break
        except OSError:
            pass
        path = path or ctypes.util.find_library("mpi")
        if path is None:
            raise RuntimeError(
                "pycoll: cannot find the MPI library mpi4py loaded (no libmpi.so in this "
                "process's memory map or on the library path)"
            )
        _LIBRARY = ctypes.CDLL(path)
    return _LIBRARY
