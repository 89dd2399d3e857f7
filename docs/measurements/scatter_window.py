"""reduce_scatter_tensor_coalesced through the node's shared window
(pycoll.collectives.shm.Blocks) against its packed path (pack, MPI's
reduce-scatter, unpack), both against mpi4py's reduce-scatter of the total
size, at 16 KiB to 16 MiB of input a rank: where the window pays, hence
pycoll.collectives.coalesced.SHM_SCATTER_FROM.

The lists hold up to 1,000 float32 arrays (each of n equal parts, 1 KiB of
input a rank per array at first; larger totals: 1,000 arrays of total/1,000
bytes; the fourth argument sets another most, 1 for one array). The same
list objects every call, as a training loop gives them (the kept plan: no
per-array check). Every side's result is checked once on every
rank; then rounds of a block of calls each, the order rotated every round, a
block's time the slowest rank's mean per call. Printed on rank 0: median us
per call and the median per-round ratios. A measurement for
docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/scatter_window.py        # 5 rounds
    mpiexec -n 4 python docs/measurements/scatter_window.py 5 float32 16K,1M
    mpiexec -n 2 python docs/measurements/scatter_window.py 5 float32 1M,16M 1   # one array
"""

import sys

import numpy as np
from window_sides import compare, forced, header

import pycoll
from pycoll import _mpi
from pycoll.bench import parse_size
from pycoll.collectives import coalesced

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
dtype = np.dtype(sys.argv[2] if len(sys.argv) > 2 else "float32")
totals = (
    [parse_size(s) for s in sys.argv[3].split(",")]
    if len(sys.argv) > 3
    else [1 << s for s in range(14, 25)]
)
ARRAYS = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
FROM = coalesced.SHM_SCATTER_FROM

header(comm, f"{n} ranks, {dtype}, {rounds} rounds: us per call; ratios to mpi4py's "
       f"reduce-scatter", "input")  # fmt: skip
for total in totals:
    count = max(1, min(ARRAYS, total // 1024))
    each = total // count // dtype.itemsize // n * n  # elements of one input
    xs = [np.full(each, (me + 1) * (1 + i % 5), dtype) for i in range(count)]
    outs = {side: [np.empty(each // n, dtype) for _ in range(count)] for side in "wp"}
    one = np.concatenate([x.reshape(n, -1) for x in xs], axis=1).reshape(-1)  # packed by part
    one_out = np.empty(one.size // n, dtype)
    want = [np.full(each // n, n * (n + 1) // 2 * (1 + i % 5), dtype) for i in range(count)]
    scatter = pycoll.reduce_scatter_tensor_coalesced

    def right(name, outs=outs, one_out=one_out, want=want):
        if name == "mpi4py":
            return np.array_equal(one_out, np.concatenate(want))
        return all(np.array_equal(o, w) for o, w in zip(outs[name[0]], want))

    sides = {
        "window": forced(coalesced, "SHM_SCATTER_FROM", 1, scatter, outs["w"], xs),
        "packed": forced(coalesced, "SHM_SCATTER_FROM", 0, scatter, outs["p"], xs),
        "mpi4py": lambda one=one, one_out=one_out: comm.Reduce_scatter_block(one, one_out),
    }
    compare(comm, rounds, total, count, sides, right)
coalesced.SHM_SCATTER_FROM = FROM
pycoll.destroy_process_group()
