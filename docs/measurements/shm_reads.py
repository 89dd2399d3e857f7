"""How fast memory shared between ranks is read, against private memory.

pycoll's shared-memory all_reduce (pycoll.collectives.shm) reads every byte
it reduces out of an MPI-3 shared window. This measures, on 2 ranks of one
node, copying 1 MiB pieces into a private array (allocated once), cycling
through 64 MiB so the data comes from memory, not the cache:

- ``window``: out of the other rank's part of an MPI shared window, after
  that rank wrote it (what the all_reduce does);
- ``private``: out of this rank's own private array;
- ``first read``: the first pass over a part of a new window that its rank has
  not written, once (the pages are mapped in on that first touch).

Each rank copies in turn while the other waits in a barrier, 9 rounds,
alternating; the median GB/s of rank 0's rounds is printed (bytes copied per
second: each byte is read once and written once). A measurement for
docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/shm_reads.py
"""

import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
me, other = comm.rank, 1 - comm.rank
PIECE, TOTAL, ROUNDS = 1 << 20, 64 << 20, 9


def window(nbytes):
    """An MPI shared window of nbytes per rank; (window, my part, the other's)."""
    win = MPI.Win.Allocate_shared(nbytes, 1, comm=comm)
    mine = np.frombuffer(win.tomemory(), np.uint8)
    buf, _ = win.Shared_query(other)
    return win, mine, np.frombuffer(buf, np.uint8)


def copy_rate(src, dst):
    """GB/s copying src into dst in PIECE-sized pieces, every piece once."""
    start = time.perf_counter()
    for off in range(0, src.size, PIECE):
        np.copyto(dst, src[off : off + PIECE])
    return src.size / (time.perf_counter() - start) / 1e9


dst = np.zeros(PIECE, np.uint8)
private = np.ones(TOTAL, np.uint8)
win, mine, theirs = window(TOTAL)
mine[:] = me + 1  # each rank writes its own part, as the all_reduce's copy-in does
comm.Barrier()
assert theirs[0] == other + 1 and theirs[-1] == other + 1
rates = {"window": [], "private": [], "first read": []}
for _ in range(ROUNDS):
    fresh, _, fresh_theirs = window(TOTAL)  # untouched: every page is mapped on first read
    for name, src in (("window", theirs), ("private", private), ("first read", fresh_theirs)):
        for turn in (0, 1):
            comm.Barrier()
            if turn == me:
                rate = copy_rate(src, dst)
                if me == 0:
                    rates[name].append(rate)
    comm.Barrier()
    fresh.Free()
if me == 0:
    print(f"2 ranks, {ROUNDS} rounds, 1 MiB pieces of 64 MiB into a private array: median GB/s")
    for name, values in rates.items():
        print(f"  {name:11s} {np.median(values):6.1f}  (range {min(values):.1f}-{max(values):.1f})")
win.Free()
