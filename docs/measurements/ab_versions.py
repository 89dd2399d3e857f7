"""Time 8-byte pycoll.all_reduce against raw mpi4py for one checkout of pycoll.

Used to compare two versions on the same machine in one session (the figures
in docs/benchmarks.md, "Cost of bounded waits"):

    git worktree add /tmp/old c5128cf
    mpiexec -n 2 python docs/measurements/ab_versions.py /tmp/old
    mpiexec -n 2 python docs/measurements/ab_versions.py .
    PYCOLL_WAIT=blocking mpiexec -n 2 python docs/measurements/ab_versions.py .

Prints the median over 5 blocks of 20,000 calls of each, on rank 0.
"""

import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
from mpi4py import MPI  # noqa: E402

import pycoll  # noqa: E402  (from the checkout named on the command line)

pycoll.init_process_group()
comm = MPI.COMM_WORLD.Dup()
x = np.ones(2, np.float32)


def bench(f, n=20000):
    for _ in range(2000):
        f()
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


def raw():
    comm.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM)


def pyc():
    pycoll.all_reduce(x)


r = np.median(np.array([(bench(raw), bench(pyc)) for _ in range(5)]), axis=0)
if comm.rank == 0:
    print(f"{pycoll.__file__}: raw {r[0]:.2f} us, pycoll {r[1]:.2f} us, ratio {r[1] / r[0]:.2f}")
pycoll.destroy_process_group()
