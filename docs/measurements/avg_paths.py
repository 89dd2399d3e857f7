"""Three ways to run an all_reduce SUM and AVG on more than two ranks, timed
against each other in one run.

- ``mpi``: what pycoll does below its ring's threshold: MPI's all_reduce (a
  user op for float16/bfloat16), then, for AVG, a division over the whole array.
- ``ring``: pycoll's ring (pycoll.collectives.ring), forced at every size.
- ``rsag``: MPI's nonblocking reduce-scatter, this rank's part divided (AVG)
  or copied into place, then MPI's nonblocking all-gather; and ``rsag-b``, the
  same with MPI's blocking calls (which pycoll cannot use: its waits are bounded).

Each case's result is checked against a float64 sum before it is timed. The
cases of one size, every dtype, run in rounds (10 calls each, order rotated
every round); each round's figure is float32 SUM's time over the case's, and
the median over rounds is printed, with each case's median time per call, on
rank 0. A measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 4 python docs/measurements/avg_paths.py              # 7 rounds, 1 and 2 MiB
    mpiexec -n 4 python docs/measurements/avg_paths.py 9 256K,1M,2M
"""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp, kernels
from pycoll.arrays import BFLOAT16
from pycoll.bench import parse_size
from pycoll.bench.table import time_block
from pycoll.collectives.reduce import _all_reduce_ring
from pycoll.collectives.ring import parts
from pycoll.crosscheck import COUNT, OP_BITS
from pycoll.groups import STATE
from pycoll.ops import plan

pycoll.init_process_group()
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1M,2M").split(",")]
dtypes = [np.dtype(np.float32), np.dtype(np.float16), BFLOAT16]
SUM, AVG = ReduceOp.SUM, ReduceOp.AVG


def rsag(x, op, blocking):
    how = plan(op, x.dtype, "all_reduce")
    counts, starts = parts(x.size, n)
    part = np.empty(counts[me], x.dtype)
    mine = x[starts[me] : starts[me] + counts[me]]
    if blocking:
        comm.Reduce_scatter([x, how.datatype], [part, how.datatype], counts, how.mpi_op)
    else:
        comm.Ireduce_scatter([x, how.datatype], [part, how.datatype], counts, how.mpi_op).Wait()
    if how.average:
        kernels.divide(part, n, out=mine)
    else:
        mine[...] = part
    gather = [x, counts, starts, how.datatype]
    if blocking:
        comm.Allgatherv(MPI.IN_PLACE, gather)
    else:
        comm.Iallgatherv(MPI.IN_PLACE, gather).Wait()


def _ring(pg, x, op):
    how = plan(op, x.dtype, "all_reduce")
    key = how.key | OP_BITS["all_reduce"] | x.size & COUNT  # as all_reduce sums the call up
    return _all_reduce_ring(pg, x, op, how, False, key)


def cases():
    pg = STATE.default
    out = {}
    for op in (SUM, AVG):
        out[f"mpi {op.name}"] = lambda x, op=op: pycoll.all_reduce(x, op)
        out[f"ring {op.name}"] = lambda x, op=op: _ring(pg, x, op)
        out[f"rsag {op.name}"] = lambda x, op=op: rsag(x, op, False)
        out[f"rsag-b {op.name}"] = lambda x, op=op: rsag(x, op, True)
    return out


calls = list(cases().items())
rng = np.random.default_rng(me)
times = {}
for nbytes in sizes:
    # every (dtype, case) pair of one size in each round, so that the ratios
    # across dtypes compare blocks timed minutes apart at most
    blocks = []
    for dtype in dtypes:
        # small integers: every sum is exact in every dtype, every mean within a rounding
        base = rng.integers(-8, 8, nbytes // dtype.itemsize + 3).astype(dtype)
        total = comm.allreduce(base.astype(np.float64), MPI.SUM)
        for name, call in calls:
            x = base.copy()
            call(x)
            want = total / n if name.endswith("AVG") else total
            wrong = not np.allclose(x.astype(np.float64), want, rtol=1e-2, atol=1e-2)
            if comm.allreduce(wrong, MPI.LOR):  # every rank stops, none waits
                raise SystemExit(f"{name} {dtype} gave a wrong result on some rank")
            blocks.append(((nbytes, dtype.name, name), base, call))
    for r in range(rounds):
        k = r * len(blocks) // rounds
        for key, base, call in blocks[k:] + blocks[:k]:
            x = base.copy()
            t = time_block(lambda call=call, x=x: call(x), 10, 2, comm)
            times.setdefault(key, []).append(comm.allreduce(t, MPI.MAX))

if me == 0:
    names = [name for name, _ in calls]
    print(f"{n} ranks, {rounds} rounds: median us per call | float32 mpi SUM's time / the case's")
    print(f"{'':16s}" + "".join(f"{k:>13s}" for k in names))
    for nbytes in sizes:
        for dtype in dtypes:
            ref = times[(nbytes, "float32", "mpi SUM")]
            row = [times[(nbytes, dtype.name, k)] for k in names]
            us = "".join(f"{np.median(t) * 1e6:13.0f}" for t in row)
            ratio = "".join(f"{np.median([a / b for a, b in zip(ref, t)]):13.2f}" for t in row)
            print(f"{nbytes >> 10:6d}K {dtype.name:9s}{us}\n{'':16s}{ratio}")
pycoll.destroy_process_group()
