"""Whether a block of one all_reduce path slows the block of MPI's call that
follows it: the check behind pycoll.bench.tune's interleaved rounds, whose
ratios would favour a path that left MPI's next calls slower.

For each size, rounds of: a block of mpi4py's blocking Allreduce after a block
of itself (alone), and after a block of pycoll's all_reduce forced to MPI's
call, the ring and the window (pycoll.tuning.decide). Each block is timed after
one untimed call; rank 0 prints the median over rounds of mpi4py's block in
each case, in us. A measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/after_window.py 7 4M,8M,16M
"""

import statistics
import sys
import time

import numpy as np

import pycoll
from pycoll import _mpi, tuning
from pycoll.bench import parse_size

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
raw = comm.Dup()
group = pycoll.new_group()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "4M,8M,16M").split(",")]
CASES = {"alone": "raw", "after MPI's": "mpi", "after the ring": "ring",
         "after the window": "window"}  # fmt: skip


def block(way, x, k):
    if way == "raw":
        x[:] = 1.0
        expected = float(comm.size)

        def call():
            raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)
    else:
        tuning.decide(group, ([0], [way]))

        def call():
            pycoll.all_reduce(x, group=group)

    call()
    if way == "raw":  # checked: mpi4py's result on this rank
        assert float(x[0]) == expected and float(x[-1]) == expected
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        call()
    return comm.allreduce((time.perf_counter() - t0) / k, op=MPI.MAX)


for nbytes in sizes:
    x = np.zeros(nbytes // 4, np.float32)
    y = np.zeros(nbytes // 4, np.float32)
    k = max(3, int(0.02 / (nbytes / 5e9)))  # about 20 ms a block at 5 GB/s
    times = {name: [] for name in CASES}
    for _ in range(rounds):
        for name, before in CASES.items():
            block(before, y if before == "raw" else x, k)
            times[name].append(block("raw", y, k))
    if comm.rank == 0:
        cells = ", ".join(f"{n} {statistics.median(t) * 1e6:.1f}" for n, t in times.items())
        print(f"{nbytes:>10} B: mpi4py's Allreduce (us) {cells}", flush=True)
pycoll.destroy_process_group()
