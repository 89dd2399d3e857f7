"""What the sequence numbers and the timeout watch cost an 8-byte all_reduce.

One checkout, one run: pycoll's all_reduce as it is, and the same call with
its fast path (pycoll.collectives._common.plain) swapped for one that only
counts the call and makes MPI's blocking call, the pipeline before process
groups had a record, a watch or a bounded wait. Everything else on the call's
path (argument checks, plan lookup, dispatch) is the same in both, so the
difference is the issue's "sequence-number bookkeeping and timeout watch".
Raw mpi4py's blocking and nonblocking calls are timed in the same blocks
(the nonblocking one polled with ``Test``, yielding the core between tests
only where ranks outnumber cores).

    mpiexec -n 2 python docs/measurements/watch_cost.py
    PYCOLL_WAIT=blocking mpiexec -n 2 python docs/measurements/watch_cost.py

Prints medians over BLOCKS (default 15) interleaved blocks of 20,000 calls,
on rank 0.
"""

import os

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll.bench.table import time_block
from pycoll.collectives import _common
from pycoll.collectives import reduce as reduce_module

pycoll.init_process_group()
comm = MPI.COMM_WORLD.Dup()
x = np.ones(2, np.float32)
IN_PLACE, FLOAT, SUM = MPI.IN_PLACE, MPI.FLOAT, MPI.SUM
watched = reduce_module.plain


def unwatched(pg, op, start, blocking, *args):
    pg._seq += 1
    try:
        blocking(*args)
    except MPI.Exception as exc:
        raise _common.watch.backend_error(op, pg._seq, exc) from None


def raw():
    comm.Allreduce(IN_PLACE, [x, FLOAT], SUM)


# Ranks that share cores must give them up while they wait (MPI's blocking
# calls do); ranks with a core each spin, as pycoll's waits do.
SPIN = pycoll.groups.STATE.local_size <= len(os.sched_getaffinity(0))


def raw_nonblocking():
    request = comm.Iallreduce(IN_PLACE, [x, FLOAT], SUM)
    while not request.Test():
        if not SPIN:
            os.sched_yield()


def call():
    pycoll.all_reduce(x)


def bench(f, n=20000):
    """Microseconds per call: pycoll-bench's timer (2,000 warm-up calls, a
    barrier, then ``n`` calls)."""
    return time_block(f, n, 2000, comm) * 1e6


rows = []
for _ in range(int(os.environ.get("BLOCKS", 15))):
    reduce_module.plain = unwatched
    bare = bench(call)
    reduce_module.plain = watched
    rows.append((bench(raw), bench(raw_nonblocking), bare, bench(call)))
raw_us, raw_nb_us, bare_us, pycoll_us = np.median(np.array(rows), axis=0)
library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
if comm.rank == 0:
    cost = pycoll_us - bare_us
    print(
        f"{comm.size} ranks, {library}, "
        f"PYCOLL_WAIT={os.environ.get('PYCOLL_WAIT', 'poll')}: "
        f"mpi4py Allreduce {raw_us:.2f} us, mpi4py Iallreduce+Test {raw_nb_us:.2f} us, "
        f"pycoll without the watch {bare_us:.2f} us, pycoll {pycoll_us:.2f} us: "
        f"watch {cost:+.2f} us ({cost / bare_us:+.0%})"
    )
pycoll.destroy_process_group()
