"""All-reduces of K arrays in turn, as a program that reduces a model's
gradients one by one makes them: pycoll's time a call, and how many calls the
group's compiled path kept (pycoll.native._keep) while they ran.

A group keeps at most native.KEPT_CALLS arrays' calls and native.KEPT_TOTAL
bytes of their buffers; this shows what a program that cycles through more
costs. Every call's result is checked on every rank. Not part of pycoll:

    mpiexec -n 2 python docs/measurements/many_arrays.py BYTES K[,K...] [CALLS]

BYTES: each array's size; K: how many arrays; CALLS: about how many calls
are timed (20,000), after 20 rounds over the arrays. Run with
``PYCOLL_NATIVE=0`` for the Python path alone.
"""

from __future__ import annotations

import sys
import time
from typing import List

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import native

KEPT = [0]  # the calls the group kept while counted
_real_keep = native._keep


def _counting_keep(*args: object) -> bool:
    KEPT[0] += 1
    return _real_keep(*args)


def rounds(arrays: List[np.ndarray], count: int, me: int, total: int) -> int:
    """All-reduce each array in turn, ``count`` times over; the wrong results."""
    wrong = 0
    for _ in range(count):
        for a in arrays:
            a.fill(me)
            pycoll.all_reduce(a)
            wrong += int(a[0] != total or a[-1] != total)
    return wrong


def main() -> None:
    pycoll.init_process_group()
    comm = MPI.COMM_WORLD
    n, me = comm.size, comm.rank
    nbytes = int(sys.argv[1])
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    total = n * (n - 1) // 2  # the sum of every rank's value
    native._keep = _counting_keep
    for k in [int(x) for x in sys.argv[2].split(",")]:
        arrays = [np.empty(nbytes // 8, np.float64) for _ in range(k)]
        wrong = rounds(arrays, 20, me, total)
        KEPT[0] = 0
        count = max(2, calls // k)
        comm.Barrier()
        t = time.perf_counter()
        wrong += rounds(arrays, count, me, total)
        spent = comm.allreduce(time.perf_counter() - t, MPI.MAX)
        wrong = comm.allreduce(wrong)
        if me == 0:
            print(
                f"{nbytes} B x {k} arrays: {spent / (count * k) * 1e6:.1f} us a call, "
                f"{KEPT[0]} of {count * k} calls kept, wrong {wrong}",
                flush=True,
            )
    native._keep = _real_keep
    pycoll.destroy_process_group()


main()
