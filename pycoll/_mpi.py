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
import sys
from typing import Any, Dict, Optional

MPI: Any = None
IN_PLACE: Any = None  # MPI.IN_PLACE, kept here for the collectives' hot paths
# pycoll's own point-to-point steps tag their messages with the call's seq
# modulo TAGS (pycoll.collectives.ring.side): MPI guarantees tags below 32768.
TAGS = 1 << 15
VENDOR = ""  # "MPICH", "Open MPI", ...: what mpi4py.MPI.get_vendor() says, once loaded

# MPICH's nonblocking reduce-scatter in its default algorithm (recursive
# halving) takes 5-11x its blocking call's time for inputs of 512 KiB-1.5 MiB
# (MPICH 5.0.2, 2 and 4 ranks); its pairwise algorithm does not, and from
# 32 KiB per rank's part is faster than either (docs/benchmarks.md, "Which path
# wins where"). MPICH picks the algorithm of each reduce-scatter form by a
# variable read at MPI_Init: pycoll asks for pairwise on the v-form
# (MPI_Ireduce_scatter) and sends large reduce-scatters through it, leaving the
# block form, and small calls, to MPICH's own choice
# (pycoll.paths.rule).
REDUCE_SCATTER_CVAR = "MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM"
# True once loaded when the v-form reduce-scatter runs pairwise (MPICH, the
# variable set to sched_pairwise by pycoll or by the user before MPI_Init).
REDUCE_SCATTER_PAIRWISE = False
# Open MPI's nonblocking reduce (libnbc), in its default choice of algorithm,
# took 4.5-5.9x Open MPI's blocking reduce at 512 KiB-8 MiB on 2 ranks and
# 3-15x at 128 B-32 KiB on 4; its binomial tree (2) took 1.2-1.4x and
# 1.35-3.9x there, the same as the default at 8 B-32 KiB on 2 ranks, and
# 0.85-1.05x from 512 KiB on 4 (Open MPI 5.0 wheel; docs/benchmarks.md, "Which
# path wins where"). pycoll's reduce is that nonblocking call in the default
# wait mode. Open MPI reads the variable from the environment at MPI_Init;
# MPICH ignores it.
REDUCE_MCA = "OMPI_MCA_coll_libnbc_ireduce_algorithm"
# Open MPI's nonblocking all_reduce, in libnbc's default choice, takes its
# binomial tree (a reduce to one rank, then a broadcast back) for every call
# made in place, as pycoll's all_reduce always is: 1.6-2.7x Open MPI's
# blocking all_reduce's time from 32 KiB on 2 ranks (docs/benchmarks.md, "Which
# path wins where"). pycoll leaves this variable as it finds it (pycoll-run
# sets it: the ring); True once loaded where it names an algorithm, which
# pycoll's choice of path (pycoll.paths) then leaves to MPI.
ALL_REDUCE_MCA = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"
ALL_REDUCE_CHOSEN = False
STARTED_MPI = False  # whether load() was the import that started MPI (its variables counted)
# From this size of each rank's part the v-form is taken: there pairwise
# measured 0.1-0.7x the block form's time on 2 and 4 ranks; below it (4 ranks,
# 8-16 KiB parts) up to 1.7x.
PAIRWISE_PART_BYTES = 32 << 10


def reduce_scatter_v(part_bytes: int) -> bool:
    """Whether a reduce-scatter whose parts are ``part_bytes`` each goes
    through MPI's v-form with equal counts (MPI_Ireduce_scatter) rather than
    the block form: on MPICH with pairwise asked for, from PAIRWISE_PART_BYTES.
    (Persistent plans, pycoll.persistent, hold buffers below that size.)"""
    return REDUCE_SCATTER_PAIRWISE and part_bytes >= PAIRWISE_PART_BYTES


def load() -> Any:
    """Import mpi4py.MPI (initializing MPI) and return the module.

    ``PYCOLL_ASYNC_PROGRESS=1`` asks the MPI library for its own progress
    thread (MPICH's MPIR_CVAR_ASYNC_PROGRESS, read at MPI_Init; mpi4py
    initializes with MPI_THREAD_MULTIPLE, which it needs), so that async
    collectives advance while the caller computes. It is off by default: it
    costs a thread per rank spinning on a core (docs/benchmarks.md,
    "Functional collectives").

    Where this import starts MPI, MPICH's v-form nonblocking reduce-scatter
    is asked to run pairwise (``REDUCE_SCATTER_CVAR``) and Open MPI's
    nonblocking reduce to take its binomial tree (``REDUCE_MCA``), each
    unless set already.
    """
    global MPI, IN_PLACE, VENDOR, REDUCE_SCATTER_PAIRWISE, STARTED_MPI, ALL_REDUCE_CHOSEN
    if MPI is None:
        if os.environ.get("PYCOLL_ASYNC_PROGRESS", "").strip() == "1":
            os.environ.setdefault("MPIR_CVAR_ASYNC_PROGRESS", "1")
        STARTED_MPI = "mpi4py.MPI" not in sys.modules
        if STARTED_MPI:  # this import starts MPI: the variables count
            os.environ.setdefault(REDUCE_SCATTER_CVAR, "sched_pairwise")
            os.environ.setdefault(REDUCE_MCA, "2")
        from mpi4py import MPI as _MPI

        MPI = _MPI
        IN_PLACE = _MPI.IN_PLACE
        VENDOR = _MPI.get_vendor()[0]
        REDUCE_SCATTER_PAIRWISE = (
            VENDOR == "MPICH" and os.environ.get(REDUCE_SCATTER_CVAR) == "sched_pairwise"
        )
        ALL_REDUCE_CHOSEN = os.environ.get(ALL_REDUCE_MCA, "").strip() not in ("", "0")
    return MPI


def available() -> bool:
    """True when mpi4py's MPI extension is installed, without initializing MPI."""
    try:
        return importlib.util.find_spec("mpi4py.MPI") is not None
    except ModuleNotFoundError:
        return False


_LIBRARY: Optional[ctypes.CDLL] = None
_HAS: Dict[str, bool] = {}


def has(name: str) -> bool:
    """Whether the libmpi mpi4py loaded has the C function ``name`` (an MPI
    older than the function's standard has not: ``MPI_Isendrecv`` came with
    MPI-4.0, Open MPI 5 and MPICH 4)."""
    found = _HAS.get(name)
    if found is None:
        found = _HAS[name] = hasattr(library(), name)
    return found


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
