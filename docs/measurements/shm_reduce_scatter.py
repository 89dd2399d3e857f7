"""reduce_scatter_tensor through the node's shared window
(pycoll.collectives.shm.Parted) against MPI's own, at 1-64 MiB of input, in
one run: where the window pays, hence pycoll.collectives.reduce.SHM_RS_BYTES.

Three sides per size, float32 SUM, out of place: pycoll with the window
forced (SHM_RS_BYTES = 1), pycoll with it off (0: MPI's reduce-scatter, the
path below the threshold), and raw mpi4py's Reduce_scatter_block. Every
side's result is checked once on every rank; then rounds of a block of calls
each, the order rotated every round, each block's time the slowest rank's
mean per call. Printed on rank 0: median ms per call, algbw (input bytes over
time) and the median per-round ratio of the window's time to each other's.
A measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/shm_reduce_scatter.py        # 5 rounds
    mpiexec -n 4 python docs/measurements/shm_reduce_scatter.py 5
"""

import sys

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll.bench.table import time_block
from pycoll.collectives import reduce as R

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
sizes = [1 << s for s in range(20, 27)]  # input bytes: 1-64 MiB


def forced(threshold, out, x):
    def call():
        R.SHM_RS_BYTES = threshold
        pycoll.reduce_scatter_tensor(out, x)

    return call


if me == 0:
    print(f"{n} ranks, float32 SUM, {rounds} rounds: ms per call (algbw GB/s of input)")
    print(
        f"{'input':>8s} {'window':>14s} {'MPI (pycoll)':>14s} {'mpi4py':>14s}  window/MPI  window/mpi4py"
    )
for nbytes in sizes:
    count = nbytes // 4 // n * n
    x = (np.arange(count) % 1000 + me).astype(np.float32)
    want = sum((np.arange(count) % 1000 + r).astype(np.float32) for r in range(n))
    want = want[me * (count // n) : (me + 1) * (count // n)]
    outs = {name: np.empty(count // n, np.float32) for name in ("window", "mpi", "mpi4py")}
    sides = {
        "window": forced(1, outs["window"], x),
        "mpi": forced(0, outs["mpi"], x),
        "mpi4py": lambda o=outs["mpi4py"], x=x: comm.Reduce_scatter_block(x, o, MPI.SUM),
    }
    for name, call in sides.items():
        outs[name][...] = -1
        call()
        if comm.allreduce(not np.array_equal(outs[name], want), MPI.LOR):
            raise SystemExit(f"{name} gave a wrong result at {nbytes} bytes")
    times = {name: [] for name in sides}
    names = list(sides)
    calls = max(1, min(20, (64 << 20) // nbytes))
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t = time_block(sides[name], calls, 1, comm)
            times[name].append(comm.allreduce(t, MPI.MAX))
    if me == 0:
        med = {name: float(np.median(v)) for name, v in times.items()}
        row = " ".join(f"{med[s] * 1e3:7.2f} ({x.nbytes / med[s] / 1e9:4.1f})" for s in names)
        ratio = [
            np.median([a / b for a, b in zip(times["window"], times[o])]) for o in ("mpi", "mpi4py")
        ]
        print(f"{nbytes >> 20:6d} M {row}  {ratio[0]:9.2f}  {ratio[1]:12.2f}")
R.SHM_RS_BYTES = 32 << 20
pycoll.destroy_process_group()
