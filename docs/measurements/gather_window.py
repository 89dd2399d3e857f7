"""all_gather_into_tensor_coalesced through the node's shared window
(pycoll.collectives.shm.Gathered) against its packed path (pack, MPI's
all-gather, unpack), both against mpi4py's all-gather of the total size, at
16 KiB to 16 MiB a rank: where the window pays, hence
pycoll.collectives.coalesced.SHM_FROM.

The lists hold up to 1,000 float32 arrays of 1 KiB (larger totals: 1,000
arrays of total/1,000 bytes). The same list objects every call, as a training
loop gives them (the kept plan: no per-array check). Every side's result is
checked once on every rank; then rounds of a block of calls each, the order
rotated every round, a block's time the slowest rank's mean per call. Printed
on rank 0: median us per call and the median per-round ratios. A measurement
for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/gather_window.py        # 5 rounds
    mpiexec -n 4 python docs/measurements/gather_window.py 5
"""

import sys

import numpy as np
from window_sides import compare, forced, header

import pycoll
from pycoll import _mpi
from pycoll.collectives import coalesced

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5

header(comm, f"{n} ranks, float32, {rounds} rounds: us per call; ratios to mpi4py's one "
       f"all-gather", "a rank")  # fmt: skip
for total in [1 << s for s in range(14, 25)]:
    count = min(1000, total // 1024)
    each = total // count // 4
    xs = [np.full(each, me * 10000 + i, np.float32) for i in range(count)]
    outs = {side: [np.empty(n * each, np.float32) for _ in range(count)] for side in "wp"}
    one = np.concatenate(xs)
    one_out = np.empty(n * one.size, np.float32)
    gather = pycoll.all_gather_into_tensor_coalesced

    def right(name, xs=xs, outs=outs, one=one, one_out=one_out, each=each):
        if name == "mpi4py":
            return np.array_equal(one_out.reshape(n, -1)[n - 1], one + (n - 1 - me) * 10000)
        return all(
            np.array_equal(o, np.repeat(np.arange(n, dtype=np.float32) * 10000 + i, each))
            for i, o in enumerate(outs[name[0]])
        )

    sides = {
        "window": forced(coalesced, "SHM_FROM", 1, gather, outs["w"], xs),
        "packed": forced(coalesced, "SHM_FROM", 0, gather, outs["p"], xs),
        "mpi4py": lambda one=one, one_out=one_out: comm.Allgather(one, one_out),
    }
    compare(comm, rounds, total, count, sides, right)
coalesced.SHM_FROM = 16 << 10
pycoll.destroy_process_group()
