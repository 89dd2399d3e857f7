"""The one place that imports ``mpi4py.MPI``.

Importing ``mpi4py.MPI`` initializes MPI. pycoll defers that to
:func:`pycoll.init_process_group`, so that ``import pycoll`` is safe in
processes that must not become MPI processes (a launcher that calls mpiexec,
a pytest parent that spawns MPI jobs).
"""

from __future__ import annotations

import importlib.util
from typing import Any

MPI: Any = None
IN_PLACE: Any = None  # MPI.IN_PLACE, kept here for the collectives' hot paths


def load() -> Any:
    """Import mpi4py.MPI (initializing MPI) and return the module."""
    global MPI, IN_PLACE
    if MPI is None:
        from mpi4py import MPI as _MPI

        MPI = _MPI
        IN_PLACE = _MPI.IN_PLACE
    return MPI


def available() -> bool:
    """True when mpi4py's MPI extension is installed, without initializing MPI."""
    try:
        return importlib.util.find_spec("mpi4py.MPI") is not None
    except ModuleNotFoundError:
        return False
