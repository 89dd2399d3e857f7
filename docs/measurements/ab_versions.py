"""Time pycoll.all_reduce and pycoll.broadcast against raw mpi4py for one
checkout of pycoll.

Used to compare two versions on the same machine in one sitting (how
pycoll.dispatch's generated front was measured): run it for each checkout in
turn, round after round, e.g.

    git worktree add /tmp/old c5128cf
    for round in 1 2 3; do
        mpiexec -n 2 python docs/measurements/ab_versions.py /tmp/old 8 16777216
        mpiexec -n 2 python docs/measurements/ab_versions.py . 8 16777216
    done

Arguments: the checkout, then the message sizes in bytes (default 8).
Prints, on rank 0, the median over 5 blocks of each size (20,000 calls a
block at 8 bytes, fewer for larger messages), and checks every result.
"""

import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
from mpi4py import MPI  # noqa: E402

import pycoll  # noqa: E402  (from the checkout named on the command line)

pycoll.init_process_group()
comm = MPI.COMM_WORLD.Dup()


def bench(f, n):
    for _ in range(max(n // 10, 2)):
        f()
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


def measure(nbytes: int) -> None:
    x = np.ones(nbytes // 4, np.float32)
    calls = max(20000 * 8 // max(nbytes, 8), 20) if nbytes > 8 else 20000
    want = {"all_reduce": comm.size * (comm.size - 1) / 2, "broadcast": 0}  # x is the rank
    sides = {
        "all_reduce": (
            lambda: comm.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM),
            lambda: pycoll.all_reduce(x),
        ),
        "broadcast": (lambda: comm.Bcast([x, MPI.FLOAT], 0), lambda: pycoll.broadcast(x, 0)),
    }
    for name, (raw_call, pyc_call) in sides.items():

        def raw(call=raw_call):
            x[:] = comm.rank
            call()

        def pyc(call=pyc_call):
            x[:] = comm.rank
            call()

        r = np.median(np.array([(bench(raw, calls), bench(pyc, calls)) for _ in range(5)]), axis=0)
        assert (x == want[name]).all(), f"wrong {name} result"
        if comm.rank == 0:
            print(
                f"{pycoll.__file__}: {name} {nbytes} B: raw {r[0]:.2f} us, "
                f"pycoll {r[1]:.2f} us, ratio {r[1] / r[0]:.2f}"
            )


for nbytes in [int(a) for a in sys.argv[2:]] or [8]:
    measure(nbytes)
pycoll.destroy_process_group()
