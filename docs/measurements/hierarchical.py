"""A hierarchical all_reduce across nodes, built from MPI's own calls,
against MPI's all_reduce and pycoll's in one run: is it worth a path?

The hierarchy is the classic one: reduce onto one leader per node (over the
node's communicator, MPI_Comm_split_type SHARED), all_reduce among the
leaders, broadcast inside each node. It is written with mpi4py's blocking
calls on the node's and the leaders' communicators, so it is the best such a
path could do inside pycoll without new kernels. Every variant's result is
checked on every rank first; then rounds of a block of calls each, the order
rotated every round; a round's figure is the slowest rank's mean time per
call, and rank 0 prints, per size, MPI's time and the median over rounds of
each variant's time over MPI's in that round. Run across nodes (the test
cluster of scripts/cluster-up, from node1):

    pycoll-run --hosts node1:2,node2:2 python docs/measurements/hierarchical.py [ROUNDS]

A measurement for docs/benchmarks.md, not part of pycoll.
"""

import statistics
import sys

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll.bench.table import slowest_block

pycoll.init_process_group()
MPI = _mpi.MPI
world = MPI.COMM_WORLD
me, n = world.rank, world.size
node = world.Split_type(MPI.COMM_TYPE_SHARED)
leaders = world.Split(0 if node.rank == 0 else MPI.UNDEFINED, me)
nodes = world.allreduce(1 if node.rank == 0 else 0)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
sizes = [8 << (2 * i) for i in range(12)] + [64 << 20]  # 8 B to 32 MiB in steps of 4, 64 MiB


def mpi(x):
    world.Allreduce(MPI.IN_PLACE, x)


def hierarchical(x):
    if node.rank == 0:
        node.Reduce(MPI.IN_PLACE, x, root=0)
        leaders.Allreduce(MPI.IN_PLACE, x)
    else:
        node.Reduce(x, None, root=0)
    node.Bcast(x, root=0)


def via_pycoll(x):
    pycoll.all_reduce(x)


def block(call, x):
    return lambda k: [call(x) for _ in range(k)]


VARIANTS = {"mpi": mpi, "hierarchical": hierarchical, "pycoll": via_pycoll}
if me == 0:
    print(
        f"{n} ranks on {nodes} nodes, {MPI.Get_library_version().splitlines()[0][:60]}", flush=True
    )
    print(
        f"{'bytes':>10} {'MPI us':>10} " + " ".join(f"{v + '/MPI':>16}" for v in VARIANTS),
        flush=True,
    )
for nbytes in sizes:
    count = max(1, nbytes // 4)
    arrays = {name: np.empty(count, np.float32) for name in VARIANTS}
    for name, call in VARIANTS.items():  # each result checked, on every rank
        arrays[name][:] = me + 1
        call(arrays[name])
        assert np.all(arrays[name] == n * (n + 1) / 2), (name, nbytes, arrays[name][:4])
    # A block fills about 20 ms of MPI's calls (agreed: the slowest rank's figure).
    iters = max(3, min(1000, int(0.02 / slowest_block(block(mpi, arrays["mpi"]), 3, world))))
    times = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            run = block(VARIANTS[name], arrays[name])
            times[name].append(slowest_block(run, iters, world))
    if me == 0:
        ratios = [
            statistics.median(a / b for a, b in zip(times[name], times["mpi"])) for name in VARIANTS
        ]
        base = statistics.median(times["mpi"]) * 1e6
        print(f"{nbytes:>10} {base:>10.1f} " + " ".join(f"{q:>16.2f}" for q in ratios), flush=True)
pycoll.destroy_process_group()
