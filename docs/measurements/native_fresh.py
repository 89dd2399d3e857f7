"""What the compiled fast path (pycoll.native) gives a call made again on the
same array, and what it costs one made on a new array each time.

Rounds of six blocks in an order rotated round by round: mpi4py's blocking
call, and pycoll's on its plain path (a group without the compiled path) and
on its compiled path (a group with it attached), each on arrays kept across
calls and on arrays made afresh for each call (as ``all_reduce(np.array([loss]))``
or a functional collective's output makes them). Every block's results are
checked. Rank 0 prints, per case, the median over rounds of the slowest
rank's mean per call (us) and the median of the per-round ratios to mpi4py's
call on the same kind of arrays. The collectives (the third argument, by
default all_reduce): all_reduce (in place), broadcast, all_gather
(all_gather_into_tensor against Allgather), reduce_scatter
(reduce_scatter_tensor against Reduce_scatter_block) and all_to_all
(all_to_all_single against Alltoall), the last three out of place; the
sizes are a rank's part's bytes. A measurement for docs/benchmarks.md, not
part of pycoll:

    mpiexec -n 2 python docs/measurements/native_fresh.py 9 8,1024
    mpiexec -n 2 python docs/measurements/native_fresh.py 7 8 broadcast,all_gather,...
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
NAMES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")
names = (sys.argv[3] if len(sys.argv) > 3 else "all_reduce").split(",")
assert set(names) <= set(NAMES), f"collectives: {', '.join(NAMES)}"
CALLS = 5000
n = comm.size


def arrays(name, count):
    """A call's arrays, set as every call sets them: (main, input) for the
    two-array collectives, (x, None) for the others."""
    if name == "all_reduce":
        return np.ones(count, np.float32), None
    if name == "broadcast":
        return np.full(count, 7 if comm.rank == 0 else 0, np.float32), None
    if name == "reduce_scatter":
        return np.empty(count, np.float32), np.ones(count * n, np.float32)
    return np.empty(count * n, np.float32), np.full(count * (1 if name == "all_gather" else n),
                                                     comm.rank, np.float32)  # fmt: skip


def raw_call(name, x, inp):
    if name == "all_reduce":
        raw.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM)
    elif name == "broadcast":
        raw.Bcast([x, MPI.FLOAT], 0)
    elif name == "all_gather":
        raw.Allgather([inp, MPI.FLOAT], [x, MPI.FLOAT])
    elif name == "reduce_scatter":
        raw.Reduce_scatter_block([inp, MPI.FLOAT], [x, MPI.FLOAT], MPI.SUM)
    else:
        raw.Alltoall([inp, MPI.FLOAT], [x, MPI.FLOAT])


def pycoll_call(name, x, inp, g):
    if name == "all_reduce":
        pycoll.all_reduce(x, group=g)
    elif name == "broadcast":
        pycoll.broadcast(x, src=0, group=g)
    elif name == "all_gather":
        pycoll.all_gather_into_tensor(x, inp, group=g)
    elif name == "reduce_scatter":
        pycoll.reduce_scatter_tensor(x, inp, group=g)
    else:
        pycoll.all_to_all_single(x, inp, group=g)


def expected(name, count):
    if name in ("all_reduce", "reduce_scatter"):
        return np.full(count, n, np.float32)
    if name == "broadcast":
        return np.full(count, 7, np.float32)
    return np.repeat(np.arange(n, dtype=np.float32), count)


def case(name, way, fresh, count):
    kept = arrays(name, count)
    template = arrays(name, count)
    g = plain if way == "plain" else compiled

    def call():
        if fresh:
            x, inp = arrays(name, count)
        else:
            x, inp = kept
            x[...] = template[0]  # (set as a new array would be)
            if inp is not None:
                inp[...] = template[1]
        if way == "mpi4py":
            raw_call(name, x, inp)
        else:
            pycoll_call(name, x, inp, g)
        return x

    return call


def block(call, want):
    x = call()
    assert (x == want).all(), x  # checked, on every rank
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        call()
    return comm.allreduce((time.perf_counter() - t0) / CALLS, op=MPI.MAX)


for name in names:
    for nbytes in sizes:
        count = nbytes // 4
        want = expected(name, count)
        cases = {
            f"{way}, {'new arrays' if fresh else 'same arrays'}": case(name, way, fresh, count)
            for fresh in (False, True)
            for way in ("mpi4py", "plain", "compiled")
        }
        times = {case_name: [] for case_name in cases}
        order = list(cases)
        for r in range(rounds):
            for case_name in order[r % len(order) :] + order[: r % len(order)]:
                times[case_name].append(block(cases[case_name], want))
        if comm.rank == 0:
            print(f"# {name} float32, {nbytes} B a rank's part, {n} ranks, {rounds} rounds of "
                  f"{CALLS} calls")  # fmt: skip
            for case_name in order:
                base = "mpi4py, " + case_name.split(", ")[1]
                ratio = statistics.median(a / b for a, b in zip(times[case_name], times[base]))
                print(f"{case_name:26} {statistics.median(times[case_name]) * 1e6:7.2f} us  "
                      f"{ratio:5.2f}")  # fmt: skip
pycoll.destroy_process_group()
