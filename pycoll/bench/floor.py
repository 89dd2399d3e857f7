"""The C floor: each collective in a compiled loop on the same libmpi, in the same process.

pycoll-bench's third column. A loop of ``MPI_Allreduce`` (and the others)
written in C costs what MPI itself costs per call, with no Python in
between; it is the floor that both pycoll and raw mpi4py sit above. It is
compiled on first use with the MPI's own compiler wrapper (``mpicc`` next to
the interpreter, as the MPICH and Open MPI wheels install it, or on PATH),
cached under ``~/.cache/pycoll``, and loaded with ctypes into the running
process, so it calls the very library mpi4py initialised (checked: a loop
linked against another libmpi would find MPI uninitialised, and is refused).
Where there is no wrapper or no C compiler the column is left out.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

# One entry point: ``what`` picks the collective (the order of WHAT below);
# ``in_place`` passes MPI_IN_PLACE where MPI allows it. An in-place
# reduce-scatter leaves the result at the start of ``send``; ``recv`` (this
# rank's part of ``send``, as torch's in-place form has it) gets a copy, as
# a raw mpi4py user would make.
SOURCE = r"""
#include <mpi.h>
#include <string.h>

int pycoll_floor_ready(void) { int flag = 0; MPI_Initialized(&flag); return flag; }

int pycoll_floor(int what, MPI_Fint fcomm, void *send, void *recv, int count,
                 MPI_Fint ftype, MPI_Fint fop, int root, int in_place, long iters) {
    MPI_Comm comm = MPI_Comm_f2c(fcomm);
    MPI_Datatype t = MPI_Type_f2c(ftype);
    MPI_Op op = fop < 0 ? MPI_OP_NULL : MPI_Op_f2c(fop);
    int rank, size, err = MPI_SUCCESS;
    long i;
    MPI_Comm_rank(comm, &rank);
    MPI_Type_size(t, &size);
    for (i = 0; i < iters && err == MPI_SUCCESS; i++) {
        switch (what) {
        case 0:
            err = MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, count, t, op, comm);
            break;
        case 1:
            err = MPI_Bcast(recv, count, t, root, comm);
            break;
        case 2:
            if (rank == root)
                err = MPI_Reduce(in_place ? MPI_IN_PLACE : send, recv, count, t, op, root, comm);
            else
                err = MPI_Reduce(send, NULL, count, t, op, root, comm);
            break;
        case 3:
            if (in_place)
                err = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, count, t, comm);
            else
                err = MPI_Allgather(send, count, t, recv, count, t, comm);
            break;
        case 4:
            if (in_place) {
                err = MPI_Reduce_scatter_block(MPI_IN_PLACE, send, count, t, op, comm);
                if (recv != send) memmove(recv, send, (size_t)count * size);
            } else {
                err = MPI_Reduce_scatter_block(send, recv, count, t, op, comm);
            }
            break;
        case 5:
            if (in_place)
                err = MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, count, t, comm);
            else
                err = MPI_Alltoall(send, count, t, recv, count, t, comm);
            break;
        default:
            return -1;
        }
    }
    return err;
}
"""

WHAT = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")


def compiler() -> Optional[str]:
    """The MPI's C compiler wrapper: the one installed beside this interpreter
    (a wheel's), else the first ``mpicc`` on PATH; None if there is none."""
    beside = Path(sys.executable).parent / "mpicc"
    if beside.exists():
        return str(beside)
    return shutil.which("mpicc")


class Floor:
    """The compiled loop, loaded into this process."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.pycoll_floor
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]

    def loop(
        self,
        collective: str,
        comm: Any,
        send: Optional[np.ndarray],
        recv: Optional[np.ndarray],
        count: int,
        datatype: Any,
        op: Any = None,
        root: int = 0,
        in_place: bool = False,
    ) -> Any:
        """A callable running ``iters`` calls of the collective in C."""
        fn = self._fn
        args = (
            WHAT.index(collective),
            comm.py2f(),
            None if send is None else send.ctypes.data,
            None if recv is None else recv.ctypes.data,
            count,
            datatype.py2f(),
            -1 if op is None else op.py2f(),
            root,
            int(in_place),
        )

        def run(iters: int) -> None:
            err = fn(*args, iters)
            if err != 0:
                raise RuntimeError(f"the C floor's {collective} failed with MPI error {err}")

        return run


def load(cache: Optional[Path] = None) -> Optional[Floor]:
    """Compile (once, cached) and load the loop; None where it cannot be built
    here or would not share this process's libmpi."""
    from mpi4py import MPI

    cc = compiler()
    if cc is None:
        return None
    version = MPI.Get_library_version()
    digest = hashlib.sha256(f"{SOURCE}\0{cc}\0{version}".encode()).hexdigest()[:16]
    where = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pycoll"
    lib_path = where / f"floor-{digest}.so"
    if not lib_path.exists():
        try:
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=where) as tmp:
                src = Path(tmp) / "floor.c"
                src.write_text(SOURCE)
                built = Path(tmp) / "floor.so"
                subprocess.run(
                    [cc, "-O2", "-shared", "-fPIC", "-o", str(built), str(src)],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                os.replace(built, lib_path)  # atomic: ranks building at once agree
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError:
        return None
    lib.pycoll_floor_ready.restype = ctypes.c_int
    if not lib.pycoll_floor_ready():  # linked against another copy of libmpi
        return None
    return Floor(lib)
