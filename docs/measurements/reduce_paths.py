"""pycoll's two ways of running a large reduce on two ranks, each forced,
against mpi4py's own call in one run: MPI's call (through pycoll) and
pycoll's own path (pycoll.collectives.to_root: the other rank sends its
array in pieces, the root folds each in); and what pycoll chooses by
default. The root is rank 0; its array is the input and the result, as
mpi4py's ``Reduce(MPI.IN_PLACE, x)`` there.

The threshold of pycoll.collectives.reduce is set per case for the call
(and put back after it): 0 for MPI's call, 1 for pycoll's path. Every
case's result is checked first (the root's array reduced, the other's left
as it was); then rounds of a block of
calls each, the order rotated every round (pycoll.bench.table.rotated);
each round's figure is the case's time over mpi4py's in that round, and rank
0 prints the median over rounds with mpi4py's GB/s. Each case times arrays
of its own (a call the compiled path keeps, pycoll.native, is made again
that way whatever the case's threshold). A measurement for
docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/reduce_paths.py              # 5 rounds, 256K-64M
    mpiexec -n 2 python docs/measurements/reduce_paths.py 7 1M,4M,16M
    TO_ROOT_CHUNKS=256K,1M mpiexec -n 2 python docs/measurements/reduce_paths.py   # + pieces

TO_ROOT_CHUNKS adds pycoll's path forced with pieces of those sizes
(pycoll.collectives.to_root.CHUNK; two ranks).
"""

import os

import numpy as np
from measuring import rounds_and_sizes, world

import pycoll
from pycoll.bench import parse_size
from pycoll.bench.table import bandwidth_header, bandwidth_row, rotated
from pycoll.collectives import to_root
from pycoll.paths import rule as R

MPI, comm, n, me = world()
rounds, sizes = rounds_and_sizes(5, "256K,1M,4M,16M,64M")
DEFAULT = R.to_root_from, R.scattered_from


def case(threshold):
    def call(x):
        if threshold is not None:
            R.to_root_from = R.scattered_from = lambda: threshold
        try:
            pycoll.reduce(x, dst=0)
        finally:
            R.to_root_from, R.scattered_from = DEFAULT

    return call


def repeated(call, x):
    """A block of ``calls`` calls of ``call`` on this array (rotated's run)."""
    return lambda calls: [call(x) for _ in range(calls)]


def raw(x):
    comm.Reduce(MPI.IN_PLACE if me == 0 else x, x if me == 0 else None, MPI.SUM, 0)


own = "to_root" if n == 2 else "scattered"
cases = {"mpi4py": raw, "mpi": case(0), own: case(1), "default": case(None)}


def chunked(chunk):
    """pycoll's path forced with pieces of ``chunk`` bytes (to_root.CHUNK)."""
    forced = case(1)

    def call(x):
        made, to_root.CHUNK = to_root.CHUNK, chunk
        try:
            forced(x)
        finally:
            to_root.CHUNK = made

    return call


for text in filter(None, os.environ.get("TO_ROOT_CHUNKS", "").split(",")):
    cases[f"tr@{text}"] = chunked(parse_size(text))
if me == 0:
    print(f"# {n} ranks, float32 SUM to rank 0, {rounds} rounds: a case's time over mpi4py's")
    print(bandwidth_header("mpi4py", "mpi4py", list(cases)))
for nbytes in sizes:
    base = (np.arange(nbytes // 4) % 7 + me).astype(np.float32)
    want = (np.arange(nbytes // 4) % 7 * n + n * (n - 1) // 2).astype(np.float32)
    for k, call in cases.items():
        x = base.copy()
        call(x)
        if comm.allreduce(not np.array_equal(x, want if me == 0 else base), MPI.LOR):
            raise SystemExit(f"{k} gave a wrong result on some rank at {nbytes} bytes")
    # (The timed calls reduce the root's result again: values grow, which
    # costs the kernels no more.)
    runs = {k: repeated(call, base.copy()) for k, call in cases.items()}
    times = rotated(runs, max(3, (64 << 20) // nbytes), rounds, comm, warmup=1)
    if me == 0:
        print(bandwidth_row(nbytes, times, "mpi4py"), flush=True)
pycoll.destroy_process_group()
