"""MPI's own small collectives in three forms, timed in C: the blocking call, the
nonblocking call tested until done (what pycoll's compiled path makes), and an
MPI-4 persistent request started and tested. A loop per form runs in C on the
libmpi mpi4py loaded (compiled with the MPI's own ``mpicc``, as pycoll.bench.floor
is), under the thread level mpi4py asks for: what separates pycoll's calls from
mpi4py's below the Python of either. Rounds interleave the forms; each figure is
the median over rounds of the slowest rank's mean per call.

    mpiexec -n 2 python docs/measurements/mpi_call_forms.py [ROUNDS] [COUNT] [LEVEL]

ROUNDS (5), COUNT float32 elements a rank (2: 8 bytes), LEVEL ``multiple`` (mpi4py's
default, and so pycoll's and the raw side's of pycoll-bench) or ``single``.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import mpi4py

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
COUNT = int(sys.argv[2]) if len(sys.argv) > 2 else 2
mpi4py.rc.thread_level = sys.argv[3] if len(sys.argv) > 3 else "multiple"

from mpi4py import MPI  # noqa: E402

SOURCE = r"""
#include <mpi.h>
#include <stdlib.h>
#define F MPI_FLOAT
#define NOINFO MPI_INFO_NULL
enum { BLOCKING, NONBLOCKING, PERSISTENT };
enum { ALLREDUCE, BCAST, REDUCE, ALLGATHER_IP, ALLGATHER, ALLTOALL_IP, ALLTOALL };
static int wait_all(MPI_Request *q) {
    int flag = 0, err = 0;
    while (!flag && !err) err = MPI_Test(q, &flag, MPI_STATUS_IGNORE);
    return err;
}
/* Seconds for ``iters`` calls of collective ``what`` in ``form``; -1 on an error. */
double pycoll_forms(int what, int form, int comm_f, int k, long iters) {
    MPI_Comm c = MPI_Comm_f2c(comm_f);
    int rank, n;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &n);
    float *a = calloc((size_t)k * n, sizeof(float));
    float *b = calloc((size_t)k * n, sizeof(float));
    void *ip = MPI_IN_PLACE, *s = rank ? a : ip;
    MPI_Request q = MPI_REQUEST_NULL;
    int err = 0;
    if (form == PERSISTENT) {
        switch (what) {
        case ALLREDUCE: err = MPI_Allreduce_init(ip, a, k, F, MPI_SUM, c, NOINFO, &q); break;
        case BCAST: err = MPI_Bcast_init(a, k, F, 0, c, NOINFO, &q); break;
        case REDUCE: err = MPI_Reduce_init(s, a, k, F, MPI_SUM, 0, c, NOINFO, &q); break;
        case ALLGATHER_IP: err = MPI_Allgather_init(ip, k, F, a, k, F, c, NOINFO, &q); break;
        case ALLGATHER: err = MPI_Allgather_init(b, k, F, a, k, F, c, NOINFO, &q); break;
        case ALLTOALL_IP: err = MPI_Alltoall_init(ip, k, F, a, k, F, c, NOINFO, &q); break;
        default: err = MPI_Alltoall_init(b, k, F, a, k, F, c, NOINFO, &q); break;
        }
    }
    MPI_Barrier(c);
    double t = MPI_Wtime();
    for (long i = 0; i < iters && !err; i++) {
        if (form == PERSISTENT) {
            err = MPI_Start(&q);
            if (!err) err = wait_all(&q);
            continue;
        }
        int nb = form == NONBLOCKING;
        switch (what) {
        case ALLREDUCE: err = nb ? MPI_Iallreduce(ip, a, k, F, MPI_SUM, c, &q)
                                 : MPI_Allreduce(ip, a, k, F, MPI_SUM, c); break;
        case BCAST: err = nb ? MPI_Ibcast(a, k, F, 0, c, &q) : MPI_Bcast(a, k, F, 0, c); break;
        case REDUCE: err = nb ? MPI_Ireduce(s, a, k, F, MPI_SUM, 0, c, &q)
                              : MPI_Reduce(s, a, k, F, MPI_SUM, 0, c); break;
        case ALLGATHER_IP: err = nb ? MPI_Iallgather(ip, k, F, a, k, F, c, &q)
                                    : MPI_Allgather(ip, k, F, a, k, F, c); break;
        case ALLGATHER: err = nb ? MPI_Iallgather(b, k, F, a, k, F, c, &q)
                                 : MPI_Allgather(b, k, F, a, k, F, c); break;
        case ALLTOALL_IP: err = nb ? MPI_Ialltoall(ip, k, F, a, k, F, c, &q)
                                   : MPI_Alltoall(ip, k, F, a, k, F, c); break;
        default: err = nb ? MPI_Ialltoall(b, k, F, a, k, F, c, &q)
                          : MPI_Alltoall(b, k, F, a, k, F, c); break;
        }
        if (nb && !err) err = wait_all(&q);
    }
    t = MPI_Wtime() - t;
    if (form == PERSISTENT && q != MPI_REQUEST_NULL) MPI_Request_free(&q);
    free(a);
    free(b);
    return err ? -1.0 : t;
}
"""

WHAT = ["all_reduce", "broadcast", "reduce", "all_gather in place", "all_gather",
        "all_to_all in place", "all_to_all"]  # fmt: skip
FORMS = ["blocking", "nonblocking + tests", "persistent start + tests"]


def load() -> ctypes.CDLL:
    """Compile the loops with the MPI's mpicc (each rank its own copy) and load them."""
    cc = Path(sys.executable).parent / "mpicc"
    where = Path(tempfile.mkdtemp(prefix="pycoll-forms-"))
    (where / "forms.c").write_text(SOURCE)
    built = where / "forms.so"
    subprocess.run(
        [str(cc), "-O2", "-shared", "-fPIC", "-o", str(built), str(where / "forms.c")],
        check=True,
        timeout=120,
    )
    lib = ctypes.CDLL(str(built))
    lib.pycoll_forms.restype = ctypes.c_double
    lib.pycoll_forms.argtypes = [ctypes.c_int] * 4 + [ctypes.c_long]
    return lib


def main() -> None:
    comm = MPI.COMM_WORLD.Dup()
    lib = load()
    cases = [(w, f) for w in range(len(WHAT)) for f in range(len(FORMS))]
    iters = {}
    for case in cases:  # warm up, and size each loop to about 20 ms
        t = lib.pycoll_forms(*case, comm.py2f(), COUNT, 200)
        if t < 0:
            raise SystemExit(f"{WHAT[case[0]]}, {FORMS[case[1]]}: MPI error")
        iters[case] = max(200, int(0.02 / max(comm.allreduce(t, op=MPI.MAX) / 200, 1e-9)))
    times = {case: [] for case in cases}
    for r in range(ROUNDS):
        order = cases[r % len(cases) :] + cases[: r % len(cases)]
        for case in order:
            t = lib.pycoll_forms(*case, comm.py2f(), COUNT, iters[case])
            if t < 0:
                raise SystemExit(f"{WHAT[case[0]]}, {FORMS[case[1]]}: MPI error")
            times[case].append(comm.allreduce(t, op=MPI.MAX) / iters[case] * 1e6)
    if comm.rank == 0:
        level = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                 MPI.THREAD_SERIALIZED: "serialized",
                 MPI.THREAD_MULTIPLE: "multiple"}[MPI.Query_thread()]  # fmt: skip
        print(f"# {comm.size} ranks, {4 * COUNT} B a rank, thread level {level}, "
              f"{ROUNDS} rounds; us per call (median over rounds of the slowest rank)")  # fmt: skip
        print(f"{'collective':22s}" + "".join(f"{f:>28s}" for f in FORMS))
        for w, name in enumerate(WHAT):
            row = [statistics.median(times[(w, f)]) for f in range(len(FORMS))]
            print(f"{name:22s}" + "".join(f"{x:28.3f}" for x in row))
    comm.Free()


if __name__ == "__main__":
    main()
