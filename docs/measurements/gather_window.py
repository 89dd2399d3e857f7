"""all_gather_into_tensor_coalesced through the node's shared window
(pycoll.collectives.shm.Gathered) against its packed path (pack, MPI's
all-gather, unpack), both against mpi4py's all-gather of the total size, at
16 KiB to 16 MiB a rank: where the window pays, hence
pycoll.collectives.coalesced.SHM_FROM.

The lists hold up to 1,000 float32 arrays of 1 KiB (larger totals: 1,000
arrays of total/1,000 bytes). The same list objects every call, as a training
loop gives them (the kept plan: no per-array check). Every side's result is
checked once on every rank; then rounds of a block of calls each, the order
rotated every round, a block's time the slowest rank's mean per call. Printed
on rank 0: median us per call and the median per-round ratios. A measurement
for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/gather_window.py        # 5 rounds
    mpiexec -n 4 python docs/measurements/gather_window.py 5
"""

import sys

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll.bench.table import _repeat, rotated
from pycoll.collectives import coalesced

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5

if me == 0:
    print(f"{n} ranks, float32, {rounds} rounds: us per call; ratios to mpi4py's one all-gather")
    print(f"{'a rank':>8s} {'arrays':>6s} {'window':>9s} {'packed':>9s} {'mpi4py':>9s}"
          f"  window/packed  window/mpi4py  packed/mpi4py")  # fmt: skip
for total in [1 << s for s in range(14, 25)]:
    count = min(1000, total // 1024)
    each = total // count // 4
    xs = [np.full(each, me * 10000 + i, np.float32) for i in range(count)]
    outs = {side: [np.empty(n * each, np.float32) for _ in range(count)] for side in "wp"}
    one = np.concatenate(xs)
    one_out = np.empty(n * one.size, np.float32)

    def side(threshold, outputs, inputs=xs):
        def one_call():
            coalesced.SHM_FROM = threshold
            pycoll.all_gather_into_tensor_coalesced(outputs, inputs)

        return one_call

    sides = {
        "window": side(1, outs["w"]),
        "packed": side(0, outs["p"]),
        "mpi4py": lambda one=one, one_out=one_out: comm.Allgather(one, one_out),
    }
    for name, call in sides.items():
        call()
        call()  # (the plan is kept from the second call)
        if name == "mpi4py":
            ok = np.array_equal(one_out.reshape(n, -1)[n - 1], one + (n - 1 - me) * 10000)
        else:
            got = outs["w" if name == "window" else "p"]
            ok = all(
                np.array_equal(o, np.repeat(np.arange(n, dtype=np.float32) * 10000 + i, each))
                for i, o in enumerate(got)
            )
        if comm.allreduce(not ok, MPI.LOR):
            raise SystemExit(f"{name} gave a wrong result at {total} bytes")
    calls = max(2, min(50, (32 << 20) // (n * total)))
    runs = {name: _repeat(call) for name, call in sides.items()}
    times = rotated(runs, calls, rounds, comm, warmup=1)
    if me == 0:
        med = {name: float(np.median(v)) * 1e6 for name, v in times.items()}

        def ratio(a, b, times=times):
            return float(np.median([x / y for x, y in zip(times[a], times[b])]))

        print(f"{total >> 10:6d} K {count:6d} {med['window']:9.0f} {med['packed']:9.0f} "
              f"{med['mpi4py']:9.0f}  {ratio('window', 'packed'):13.2f}  "
              f"{ratio('window', 'mpi4py'):13.2f}  {ratio('packed', 'mpi4py'):13.2f}")  # fmt: skip
coalesced.SHM_FROM = 16 << 10
pycoll.destroy_process_group()
