"""MPICH's reduce-scatter forms against each other, and pycoll's call with and
without the pairwise v-form (pycoll._mpi.reduce_scatter_v), in one run.

- ``raw``: MPI_Reduce_scatter_block, blocking (pycoll-bench's mpi4py side);
- ``raw nb block``: MPI_Ireduce_scatter_block, waited for: MPICH's default
  nonblocking algorithm, which pycoll used for every size before;
- ``raw nb v``: MPI_Ireduce_scatter with equal counts, run pairwise (pycoll
  asks MPICH for that when it starts MPI: MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM);
- ``pycoll``: pycoll.reduce_scatter_tensor as it is;
- ``pycoll, block``: the same call with the v-form turned off for it.

Out of place, float32 SUM, inputs written before the first call. Every case's
result is checked first on every rank. The cases run in rounds (a block of
calls each, the order rotated every round); each round's figure is the case's
time over raw's, and the median over rounds is printed with each case's
median time per call, on rank 0. A measurement for docs/benchmarks.md, not
part of pycoll:

    mpiexec -n 2 python docs/measurements/rs_pairwise.py            # 9 rounds, 64K..16M
    mpiexec -n 4 python docs/measurements/rs_pairwise.py 9 64K,256K,1M,4M,16M
"""

import sys

import numpy as np
from measuring import print_medians

import pycoll
from pycoll import _mpi
from pycoll.bench import parse_size
from pycoll.bench.table import time_block

pycoll.init_process_group()  # MPI starts as pycoll starts it
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
sizes = [
    parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "64K,256K,1M,4M,16M").split(",")
]
F = MPI.FLOAT
if me == 0 and not _mpi.REDUCE_SCATTER_PAIRWISE:
    print("# the pairwise v-form is off here (not MPICH, or the variable is set otherwise)")


def block_form(x, out):
    _mpi.REDUCE_SCATTER_PAIRWISE, was = False, _mpi.REDUCE_SCATTER_PAIRWISE
    try:
        pycoll.reduce_scatter_tensor(out, x)
    finally:
        _mpi.REDUCE_SCATTER_PAIRWISE = was


def cases(count):
    counts = [count] * n
    return {
        "raw": lambda x, out: comm.Reduce_scatter_block([x, F], [out, F]),
        "raw nb block": lambda x, out: comm.Ireduce_scatter_block([x, F], [out, F]).Wait(),
        "raw nb v": lambda x, out: comm.Ireduce_scatter([x, F], [out, F], counts).Wait(),
        "pycoll": lambda x, out: pycoll.reduce_scatter_tensor(out, x),
        "pycoll, block": block_form,
    }


times = {}
for nbytes in sizes:
    count = nbytes // 4 // n
    x = (np.arange(count * n) % 7 + me).astype(np.float32)
    want = sum((np.arange(count * n) % 7 + r) for r in range(n)).astype(np.float32)
    want = want[me * count : (me + 1) * count]
    out = np.full(count, -1, np.float32)
    blocks = []
    for name, call in cases(count).items():
        out[...] = -1
        call(x, out)
        if comm.allreduce(not np.array_equal(out, want), MPI.LOR):  # every rank stops
            raise SystemExit(f"{name} gave a wrong result on some rank")
        blocks.append(((nbytes, name), call))
    for r in range(rounds):
        k = r * len(blocks) // rounds
        for key, call in blocks[k:] + blocks[:k]:
            iters = max(5, (16 << 20) // nbytes)
            t = time_block(lambda call=call, x=x, out=out: call(x, out), iters, 1, comm)
            times.setdefault(key, []).append(comm.allreduce(t, MPI.MAX))
    if comm.allreduce(not np.array_equal(out, want), MPI.LOR):
        raise SystemExit("a timed call gave a wrong result on some rank")

if me == 0:
    title = f"{n} ranks, {rounds} rounds: median us per call | the case's time / raw's (median)"
    rows = {nbytes: f"{nbytes >> 10:6d}K " for nbytes in sizes}
    print_medians(title, times, rows, list(cases(1)), "raw", 1e6, 1, 15)
pycoll.destroy_process_group()
