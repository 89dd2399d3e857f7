"""pycoll's calls receiving into buffers the group keeps against new ones, in
one run: pycoll.collectives.scratch keeping them (``kept``, pycoll now) or
handing out new memory every call (``new``, pycoll before: the pool's
threshold raised past every size). The calls:

- the ring all_reduce (float16 SUM and float32 AVG, which take it; forced at
  every size, the shared-memory path off);
- all_gather into a list (``nbytes`` per rank) and all_to_all between lists
  (``nbytes`` in all per rank), float32.

Every result is checked first; the cases run in rounds (a block of calls
each, order rotated every round); printed on rank 0: each case's median ms
per call and the median over rounds of new's time over kept's. A
measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/kept_buffers.py            # 9 rounds, 8M,32M
    mpiexec -n 4 python docs/measurements/kept_buffers.py 9 4M,16M
"""

import sys

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import ReduceOp
from pycoll.bench import parse_size
from pycoll.bench.table import time_block
from pycoll.collectives import scratch
from pycoll.paths import rule

pycoll.init_process_group()
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "8M,32M").split(",")]
rule.SPLIT_BYTES = rule.SPLIT_BYTES_TWO_RANKS = 1  # the ring at every size
rule.SHM_BYTES = 0  # never the shared-memory path (0 turns it off)
KEPT, NEW = scratch.POOL_FROM, 1 << 62


def ring(dtype, op, nbytes):
    """(make the input, call, check) for the ring all_reduce."""
    size = nbytes // np.dtype(dtype).itemsize
    want = sum((np.arange(size) % 5 + r) for r in range(n)).astype(dtype)
    if op == ReduceOp.AVG:
        want = want / dtype(n)
    return (
        lambda: (np.arange(size) % 5 + me).astype(dtype),
        lambda x: pycoll.all_reduce(x, op),
        lambda x: np.array_equal(x, want),
    )


def all_gather(nbytes):
    count = nbytes // 4
    outs = [np.zeros(count, np.float32) for _ in range(n)]
    return (
        lambda: np.full(count, me, np.float32),
        lambda x: pycoll.all_gather(outs, x),
        lambda x: all(np.array_equal(o, np.full(count, r, np.float32)) for r, o in enumerate(outs)),
    )


def all_to_all(nbytes):
    count = nbytes // 4 // n
    ins = [np.full(count, 10 * me + to, np.float32) for to in range(n)]
    outs = [np.zeros(count, np.float32) for _ in range(n)]
    return (
        lambda: ins,
        lambda x: pycoll.all_to_all(outs, x),
        lambda x: all(np.array_equal(o, np.full(count, 10 * r + me)) for r, o in enumerate(outs)),
    )


times = {}
for nbytes in sizes:
    blocks = []
    cases = {
        "ring float16 SUM": ring(np.float16, ReduceOp.SUM, nbytes),
        "ring float32 AVG": ring(np.float32, ReduceOp.AVG, nbytes),
        "all_gather list": all_gather(nbytes),
        "all_to_all lists": all_to_all(nbytes),
    }
    for case, (make, call, right) in cases.items():
        for way, pool_from in (("kept", KEPT), ("new", NEW)):
            scratch.POOL_FROM = pool_from
            x = make()
            call(x)
            if comm.allreduce(not right(x), MPI.LOR):
                raise SystemExit(f"{case} ({way}) gave a wrong result")

            def run(x, call=call, pool_from=pool_from):
                scratch.POOL_FROM = pool_from
                call(x)

            blocks.append(((nbytes, case, way), make, run))
    for r in range(rounds):
        k = r * len(blocks) // rounds
        for key, make, run in blocks[k:] + blocks[:k]:
            x = make()
            t = time_block(lambda run=run, x=x: run(x), 4, 1, comm)
            times.setdefault(key, []).append(comm.allreduce(t, MPI.MAX))

if me == 0:
    print(f"{n} ranks, {rounds} rounds: median ms per call; new's time / kept's (median)")
    for nbytes in sizes:
        for case in ("ring float16 SUM", "ring float32 AVG", "all_gather list", "all_to_all lists"):
            kept, new = times[(nbytes, case, "kept")], times[(nbytes, case, "new")]
            ratio = np.median([b / a for a, b in zip(kept, new)])
            print(
                f"{nbytes >> 20:4d}M {case:17s} kept {np.median(kept) * 1e3:8.2f}  "
                f"new {np.median(new) * 1e3:8.2f}  new/kept {ratio:.2f}"
            )
scratch.POOL_FROM = KEPT
pycoll.destroy_process_group()
