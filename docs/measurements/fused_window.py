"""FusedAllReduce through the node's shared window against its packed path
(the fusion buffer through MPI's all_reduce), and both against one MPI
all_reduce of the total size, in one run: where the window pays.

- ``mpi4py``: one ``Allreduce`` of an array of the total size (the yardstick);
- ``window``: a FusedAllReduce whose arrays are copied straight into the
  shared window and out of it (pycoll.collectives.shm.Scattered), at every size;
- ``packed``: a FusedAllReduce packing into its buffer, MPI's all_reduce,
  unpacking (what it does below pycoll.fusion.SHM_BYTES, or across nodes).

float32 SUM over arrays of 1 KiB (``ARRAYS`` of them per size). Every case's
result is checked first on every rank. The cases run in rounds (a block of
calls each, the order rotated every round); each round's figure is the case's
time over mpi4py's, and the median over rounds is printed with each case's
median time per call, on rank 0. A measurement for docs/benchmarks.md, not
part of pycoll:

    mpiexec -n 2 python docs/measurements/fused_window.py      # 9 rounds, 32..16384 arrays
    mpiexec -n 4 python docs/measurements/fused_window.py 9 64,256,1024,4096
"""

import sys

import numpy as np
from measuring import print_medians

import pycoll
from pycoll import _mpi, fusion
from pycoll.bench.table import time_block

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
counts = [
    int(s)
    for s in (sys.argv[2] if len(sys.argv) > 2 else "32,64,128,256,512,1024,4096,16384").split(",")
]


def through(threshold, fused):
    """``fused``'s call with the window's thresholds (crowded or not) set to
    ``threshold`` bytes (0: never the window)."""

    def call():
        was = fusion.SHM_BYTES, fusion.SHM_BYTES_CROWDED
        fusion.SHM_BYTES = fusion.SHM_BYTES_CROWDED = threshold
        try:
            fused.all_reduce()
        finally:
            fusion.SHM_BYTES, fusion.SHM_BYTES_CROWDED = was

    return call


times = {}
for arrays in counts:
    grads = [np.zeros(256, np.float32) for _ in range(arrays)]
    one = np.zeros(256 * arrays, np.float32)
    cases = {
        "mpi4py": (lambda one=one: comm.Allreduce(MPI.IN_PLACE, one, MPI.SUM), [one]),
        "window": (through(1, pycoll.FusedAllReduce(grads)), grads),
        "packed": (through(0, pycoll.FusedAllReduce(grads)), grads),
    }
    for name, (call, outputs) in cases.items():
        for i, x in enumerate(outputs):
            x[...] = me + 1 + i % 7
        call()
        wrong = any(not np.all(x == n * (n + 1) // 2 + n * (i % 7)) for i, x in enumerate(outputs))
        if comm.allreduce(wrong, MPI.LOR):  # every rank stops
            raise SystemExit(f"{name} gave a wrong result on some rank at {arrays} arrays")
        for x in outputs:
            x[...] = 0  # timed on zeros: the sums stay finite
    blocks = list(cases.items())
    for r in range(rounds):
        k = r % len(blocks)
        for name, (call, _) in blocks[k:] + blocks[:k]:
            iters = max(5, 4096 // arrays)
            t = time_block(call, iters, 1, comm)
            times.setdefault((arrays, name), []).append(comm.allreduce(t, MPI.MAX))

if me == 0:
    title = f"{n} ranks, {rounds} rounds: median us per call | the case's time / mpi4py's (median)"
    rows = {arrays: f"{arrays:6d} KiB" for arrays in counts}
    print_medians(title, times, rows, ["mpi4py", "window", "packed"], "mpi4py", 1e6, 1, 12)
pycoll.destroy_process_group()
