"""pycoll's three ways of running a large all_reduce, each forced, against
each other in one run: MPI's own call (through pycoll), pycoll's ring
(pycoll.collectives.ring) and the node's shared window
(pycoll.collectives.shm); and what pycoll chooses by default.

The thresholds of pycoll.collectives.reduce are set per case for the call
(and put back after it), so every case is pycoll.all_reduce in place. Every
case's result is checked first on every rank; then rounds of a block of
calls each, the order rotated every round; each round's figure is the
case's time over MPI's in that round, and rank 0 prints the median over
rounds with MPI's algbw. For float32 and float64 SUM a last column is raw
mpi4py's blocking ``Allreduce`` in place, which a caller without pycoll
makes. Each case has arrays of its own: on one array a call the compiled
path keeps (pycoll.native, up to 2 MiB) would be made again that way
whatever the case's thresholds. (The timed calls reduce their own results
again: values grow to infinity, which costs the kernels no more.) A
measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/all_reduce_paths.py            # float32 SUM
    mpiexec -n 3 python docs/measurements/all_reduce_paths.py 5 1M,4M,16M,64M float16 avg

WINDOW_CHUNKS=256K,512K adds the window forced with those chunk sizes
(pycoll.collectives.shm.CHUNK), each on a group of its own, since a group's
window keeps the chunk it was made with.
"""

import os
import sys

import numpy as np
from measuring import rounds_and_sizes, world

import pycoll
from pycoll.arrays import BFLOAT16
from pycoll.bench import parse_size
from pycoll.bench.table import bandwidth_header, bandwidth_row, time_block
from pycoll.collectives import doubling, shm
from pycoll.paths import rule as R

MPI, comm, n, me = world()
rounds, sizes = rounds_and_sizes(5, "1M,4M,8M,16M,32M,64M")
name = sys.argv[3] if len(sys.argv) > 3 else "float32"
dtype = BFLOAT16 if name == "bfloat16" else np.dtype(name)
op = pycoll.ReduceOp.AVG if len(sys.argv) > 4 and sys.argv[4] == "avg" else pycoll.ReduceOp.SUM
KNOBS = ("SHM_BYTES", "SHM_BYTES_MPICH", "SHM_BYTES_PAIR", "RING_BYTES", "SPLIT_BYTES",
         "SPLIT_BYTES_TWO_RANKS", "DOUBLING_BYTES")  # fmt: skip
DEFAULT = {k: getattr(R, k) for k in KNOBS}
NEVER = 1 << 62
FORCED = {
    "mpi": dict.fromkeys(KNOBS, NEVER),
    "ring": {**dict.fromkeys(KNOBS, NEVER), "RING_BYTES": 1, "SPLIT_BYTES": 1,
             "SPLIT_BYTES_TWO_RANKS": 1},
    "window": {**dict.fromkeys(KNOBS, NEVER), "SHM_BYTES": 1},
    "doubling": {**dict.fromkeys(KNOBS, NEVER), "DOUBLING_BYTES": 1},
    "default": DEFAULT,
}  # fmt: skip


RING_FROM, DOUBLES = R.ring_from, R.doubles


def case(knobs):
    def call(x, group=None):
        for k, v in knobs.items():
            setattr(R, k, v)
        if knobs["RING_BYTES"] == 1:  # (forced on any MPI, not those of ops.RING_MPIS only)
            R.ring_from = lambda: 1
        if knobs["DOUBLING_BYTES"] == 1:  # (forced on any MPI and wait mode)
            R.doubles = doubling.applies
        try:
            pycoll.all_reduce(x, op=op, group=group)
        finally:
            for k, v in DEFAULT.items():
                setattr(R, k, v)
            R.ring_from, R.doubles = RING_FROM, DOUBLES

    return call


cases = {k: case(v) for k, v in FORCED.items()}
for text in filter(None, os.environ.get("WINDOW_CHUNKS", "").split(",")):
    chunk, made = parse_size(text), shm.CHUNK
    group = pycoll.new_group(list(range(n)))
    shm.CHUNK = chunk  # the group's window is made now, with this chunk
    shm.window(group, "all_reduce")
    shm.CHUNK = made
    window = case(FORCED["window"])
    cases[f"win@{text}"] = lambda x, window=window, group=group: window(x, group)
if op == pycoll.ReduceOp.SUM and dtype in (np.float32, np.float64):
    raw = comm.Dup()
    cases["mpi4py"] = lambda x, group=None: raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)
want = 1 if op == pycoll.ReduceOp.AVG else n  # every rank gives ones: exact in any order
if me == 0:
    print(f"# {n} ranks, {name} {op.name}, {rounds} rounds: a case's time over MPI's (median)")
    print(bandwidth_header("mpi", "MPI", list(cases)))
for nbytes in sizes:
    arrays = {k: np.ones(nbytes // dtype.itemsize, dtype) for k in cases}
    for k, call in cases.items():
        x = arrays[k]
        call(x)
        if comm.allreduce(not np.all(x.astype(np.float32) == want), MPI.LOR):
            raise SystemExit(f"{k} gave a wrong result on some rank at {nbytes} bytes")
    times = {k: [] for k in cases}
    blocks = list(cases.items())
    for r in range(rounds):
        k = r % len(blocks)
        for key, call in blocks[k:] + blocks[:k]:
            iters = max(3, min(20000, (64 << 20) // nbytes))
            t = time_block(lambda call=call, x=arrays[key]: call(x), iters, 1, comm)
            times[key].append(comm.allreduce(t, MPI.MAX))
    if me == 0:
        print(bandwidth_row(nbytes, times, "mpi"), flush=True)
pycoll.destroy_process_group()
