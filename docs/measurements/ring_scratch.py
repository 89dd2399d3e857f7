"""pycoll's ring all_reduce receiving into kept buffers against new ones, in
one run: the same all_reduce (float16 SUM and float32 AVG, which take the ring
from its threshold), with pycoll.collectives.scratch keeping the ring's
buffers (``kept``, pycoll now) or handing out new memory every call (``new``,
pycoll before: the pool's threshold raised past every size).

Every result is checked first; the cases run in rounds (a block of calls
each, order rotated every round); printed on rank 0: each case's median ms
per call and the median over rounds of new's time over kept's. A
measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/ring_scratch.py            # 9 rounds, 8M,32M
    mpiexec -n 4 python docs/measurements/ring_scratch.py 9 4M,16M
"""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp
from pycoll.bench import parse_size
from pycoll.bench.table import time_block
from pycoll.collectives import reduce as reduce_module
from pycoll.collectives import scratch

pycoll.init_process_group()
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "8M,32M").split(",")]
reduce_module.SPLIT_BYTES = reduce_module.SPLIT_BYTES_TWO_RANKS = 1  # the ring at every size
reduce_module.SHM_BYTES = 1 << 62  # never the shared-memory path
KEPT = scratch.POOL_FROM


def call(x, op, pool_from):
    scratch.POOL_FROM = pool_from
    pycoll.all_reduce(x, op)


times = {}
for nbytes in sizes:
    blocks = []
    for dtype, op in ((np.float16, ReduceOp.SUM), (np.float32, ReduceOp.AVG)):
        size = nbytes // np.dtype(dtype).itemsize
        base = (np.arange(size) % 5 + me).astype(dtype)
        want = sum((np.arange(size) % 5 + r) for r in range(n)).astype(dtype)
        if op == ReduceOp.AVG:
            want = want / dtype(n)
        for way, pool_from in (("kept", KEPT), ("new", 1 << 62)):
            x = base.copy()
            call(x, op, pool_from)
            if comm.allreduce(not np.array_equal(x, want), MPI.LOR):
                raise SystemExit(f"{way} {np.dtype(dtype)} {op.name} gave a wrong result")
            key = (nbytes, f"{np.dtype(dtype)} {op.name}", way)
            blocks.append((key, base, lambda x, op=op, p=pool_from: call(x, op, p)))
    for r in range(rounds):
        k = r * len(blocks) // rounds
        for key, base, run in blocks[k:] + blocks[:k]:
            x = base.copy()
            t = time_block(lambda run=run, x=x: run(x), 4, 1, comm)
            times.setdefault(key, []).append(comm.allreduce(t, MPI.MAX))

if me == 0:
    print(f"{n} ranks, {rounds} rounds: median ms per call; new's time / kept's (median)")
    for nbytes, case in sorted({k[:2] for k in times}):
        kept, new = times[(nbytes, case, "kept")], times[(nbytes, case, "new")]
        ratio = np.median([b / a for a, b in zip(kept, new)])
        print(
            f"{nbytes >> 20:4d}M {case:13s} kept {np.median(kept) * 1e3:8.2f}  "
            f"new {np.median(new) * 1e3:8.2f}  new/kept {ratio:.2f}"
        )
scratch.POOL_FROM = KEPT
pycoll.destroy_process_group()
