"""What the compiled fast path (pycoll.native) gives a call made again on the
same array, and what it costs one made on a new array each time.

Rounds of six blocks in an order rotated round by round: mpi4py's blocking
Allreduce, and pycoll's all_reduce on its plain path (a group without the
compiled path) and on its compiled path (a group with it attached), each on
one array kept across calls and on an array made afresh for each call (as
``all_reduce(np.array([loss]))`` makes it). Every block's results are
checked. Rank 0 prints, per case, the median over rounds of the slowest
rank's mean per call (us) and the median of the per-round ratios to mpi4py's
call on the same kind of array. A measurement for docs/benchmarks.md, not
part of pycoll:

    mpiexec -n 2 python docs/measurements/native_fresh.py 9 8,1024
"""

import statistics
import sys
import time

import numpy as np

import pycoll
from pycoll import _mpi, native

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
raw = comm.Dup()
plain = pycoll.new_group()
compiled = pycoll.new_group()
native.MODE = native.ON
native.attach(compiled)
assert compiled._native is not None, "the compiled path did not load"
native.MODE = native.OFF  # (the plain group must not take it at its exchanges)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "8,1024").split(",")]
CALLS = 5000
n = comm.size


def case(way, fresh, count):
    kept = np.ones(count, np.float32)

    def array():
        return np.ones(count, np.float32) if fresh else kept

    if way == "mpi4py":

        def call():
            x = array()
            x[:] = 1
            raw.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM)
            return x
    else:
        g = plain if way == "plain" else compiled

        def call():
            x = array()
            x[:] = 1
            pycoll.all_reduce(x, group=g)
            return x

    return call


def block(call):
    x = call()
    assert (x == n).all(), x  # checked, on every rank
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        call()
    return comm.allreduce((time.perf_counter() - t0) / CALLS, op=MPI.MAX)


for nbytes in sizes:
    cases = {
        f"{way}, {'new array' if fresh else 'same array'}": case(way, fresh, nbytes // 4)
        for fresh in (False, True)
        for way in ("mpi4py", "plain", "compiled")
    }
    times = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(block(cases[name]))
    if comm.rank == 0:
        print(f"# all_reduce float32 SUM, {nbytes} B, {n} ranks, {rounds} rounds of {CALLS} calls")
        for name in names:
            base = "mpi4py, " + name.split(", ")[1]
            ratio = statistics.median(a / b for a, b in zip(times[name], times[base]))
            print(f"{name:26} {statistics.median(times[name]) * 1e6:7.2f} us  {ratio:5.2f}")
pycoll.destroy_process_group()
