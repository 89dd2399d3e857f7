"""The live tuning (pycoll.autotune) against the built-in rule and raw
mpi4py, in one run: the measurement behind the live tuning's figures in
docs/benchmarks.md ("Which path wins where").

Two groups of every rank: one made with the live tuning on (``"live"``, as
PYCOLL_TUNING=live makes it; on two ranks the default's), one with it off
(the built-in rule, as PYCOLL_TUNING=off makes it). For each size, float32
SUM in place:

1. the live group's first calls, until its trials have decided (each path's
   first untimed call, its timed rounds, the deciding call), timed in all,
   beside as many of mpi4py's blocking Allreduce: what the trials cost;
2. rounds of blocks in rotated order: mpi4py's Allreduce, pycoll on the
   rule's group, pycoll on the live group; each block after one untimed call
   and a barrier, the slowest rank's mean per call.

Every side's result is checked on every rank (each call doubles an array of
ones on two ranks: the block's last value is known). Rank 0 prints per size
the median over rounds of each side's time over mpi4py's, the live group's
choice and its trials' times over the built-in rule's path's (the largest
over the ranks),
and the trials' cost. With ``rs`` as the third argument the same for
reduce_scatter_tensor out of place (sizes of input; mpi4py's
Reduce_scatter_block; inputs of ones, so every output holds the rank count).
Sizes are powers of two: each its own class. A measurement for
docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/live_tuning.py 7 1M,2M,4M,8M,16M,32M
    mpiexec -n 2 python docs/measurements/live_tuning.py 7 1M,4M,16M,64M rs
"""

import statistics
import sys
import time

import numpy as np

import pycoll
from pycoll import _mpi, autotune, tuning
from pycoll.bench import parse_size

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
raw = comm.Dup()
n = comm.size
made = {}
for mode in ("off", "live"):
    before = tuning.LIVE_MODE
    tuning.install_live(mode)
    made[mode] = pycoll.new_group()
    tuning.install_live(before)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1M,4M,16M").split(",")]
RS = len(sys.argv) > 3 and sys.argv[3] == "rs"
SIDES = ("mpi4py", "rule", "live")
K = 16  # calls a block: n**(K+1) stays exact in float32 for n up to 4
OUT = {}  # reduce_scatter_tensor's output for each input's size


def call_of(side, x):
    out = OUT.get(x.size)
    if side == "mpi4py":
        if RS:
            return lambda: raw.Reduce_scatter_block(x, out, MPI.SUM)
        return lambda: raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)
    g = made["off" if side == "rule" else "live"]
    if RS:
        return lambda: pycoll.reduce_scatter_tensor(out, x, group=g)
    return lambda: pycoll.all_reduce(x, group=g)


def check(x, calls):
    """The result after ``calls`` calls since x was set to ones."""
    got, want = (OUT[x.size], float(n)) if RS else (x, float(n) ** calls)
    assert float(got[0]) == want and float(got[-1]) == want, (float(got[0]), want)


def block(side, x, k):
    x[:] = 1.0
    call = call_of(side, x)
    call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        call()
    took = (time.perf_counter() - t0) / k
    check(x, k + 1)
    return comm.allreduce(took, op=MPI.MAX)


def trials_cost(x, y, decided):
    """The live group's calls until its class decides (it has ``decided``
    classes before), and as many of mpi4py's: (seconds, seconds, calls)."""
    live = made["live"]
    calls = 0
    x[:] = 1.0
    comm.Barrier()
    t0 = time.perf_counter()
    live_call, raw_call = call_of("live", x), call_of("mpi4py", y)
    while len(autotune.chosen(live)) < decided + 1:
        live_call()
        calls += 1
        if calls % K == 0:
            check(x, K)
            x[:] = 1.0
    spent = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    y[:] = 1.0
    comm.Barrier()
    t0 = time.perf_counter()
    for i in range(calls):
        raw_call()
        if (i + 1) % K == 0:
            check(y, K)
            y[:] = 1.0
    return spent, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX), calls


for decided, nbytes in enumerate(sizes):
    x = np.ones(nbytes // 4, np.float32)
    y = np.ones(nbytes // 4, np.float32)
    OUT[x.size] = np.zeros(x.size // n, np.float32)
    spent, theirs, calls = trials_cost(x, y, decided)
    ratios = {s: [] for s in SIDES}
    for r in range(rounds):
        order = SIDES[r % 3 :] + SIDES[: r % 3]
        times = {s: block(s, x, K) for s in order}
        for s in SIDES:
            ratios[s].append(times[s] / times["mpi4py"])
        mpi4py_us = times["mpi4py"] * 1e6
    if comm.rank == 0:
        ((path, base, tried),) = [
            v for k, v in autotune.chosen(made["live"]).items() if k[2] == nbytes.bit_length()
        ]
        print(
            f"{nbytes:>9} B  mpi4py {mpi4py_us:8.1f} us  "
            f"rule {statistics.median(ratios['rule']):.2f} "
            f"({min(ratios['rule']):.2f}-{max(ratios['rule']):.2f})  "
            f"live {statistics.median(ratios['live']):.2f} "
            f"({min(ratios['live']):.2f}-{max(ratios['live']):.2f})  "
            f"chose {path} (over the rule's {base}: "
            f"{', '.join(f'{p} {t:.2f}' for p, t in tried.items() if p != base)})  "
            f"trials: {calls} calls, {spent / theirs:.2f}x mpi4py's",
            flush=True,
        )
pycoll.destroy_process_group()
