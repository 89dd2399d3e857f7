"""Ways to run torch's in-place reduce_scatter_tensor (the output this rank's
part of the input) on MPI, timed against each other in one run.

- ``raw``: MPI_IN_PLACE, blocking (what pycoll-bench's mpi4py side does), then
  the part copied from the start of the buffer to this rank's place; the input
  outside that part is overwritten;
- ``raw nb``: the same with the nonblocking call (pycoll's waits are bounded,
  so it makes nonblocking calls);
- ``copy aside``: the whole input copied into a new array, reduced from there
  into this rank's part (pycoll before this change);
- ``beside, new``: the input reduced as it is into a new array of the part's
  size, then copied into place;
- ``beside, kept``: the same into one array kept across calls (pycoll now,
  pycoll.collectives.scratch);
- ``pycoll``: pycoll.reduce_scatter_tensor itself.

Every case's result is checked first. The cases run in rounds (a block of
calls each, the order rotated every round); each round's figure is raw's time
over the case's, and the median over rounds is printed with each case's median
time per call, on rank 0. A measurement for docs/benchmarks.md, not part of
pycoll:

    mpiexec -n 2 python docs/measurements/rs_in_place.py            # 9 rounds, 2M,8M,32M
    mpiexec -n 4 python docs/measurements/rs_in_place.py 9 2M,8M,32M
"""

import sys

import numpy as np
from measuring import print_medians
from mpi4py import MPI

import pycoll
from pycoll.bench import parse_size
from pycoll.bench.table import time_block

pycoll.init_process_group()
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "2M,8M,32M").split(",")]
F = MPI.FLOAT


def cases(count):
    kept = np.empty(count, np.float32)

    def raw(x, blocking):
        if blocking:
            comm.Reduce_scatter_block(MPI.IN_PLACE, [x, count, F])
        else:
            comm.Ireduce_scatter_block(MPI.IN_PLACE, [x, count, F]).Wait()
        if me:
            x[me * count : (me + 1) * count] = x[:count]

    def aside(x):
        send = x.copy()
        comm.Ireduce_scatter_block([send, F], [x[me * count : (me + 1) * count], F]).Wait()

    def beside(x, into):
        into = np.empty(count, np.float32) if into is None else into
        request = comm.Ireduce_scatter_block([x, F], [into, F])
        request.Wait()  # (into stays referenced until here)
        x[me * count : (me + 1) * count] = into

    return {
        "raw": lambda x: raw(x, True),
        "raw nb": lambda x: raw(x, False),
        "copy aside": aside,
        "beside, new": lambda x: beside(x, None),
        "beside, kept": lambda x: beside(x, kept),
        "pycoll": lambda x: pycoll.reduce_scatter_tensor(x[me * count : (me + 1) * count], x),
    }


times = {}
for nbytes in sizes:
    count = nbytes // 4 // n
    base = (np.arange(count * n) % 7 + me).astype(np.float32)
    want = sum((np.arange(count * n) % 7 + r) for r in range(n)).astype(np.float32)
    blocks = []
    for name, call in cases(count).items():
        x = base.copy()
        call(x)
        mine = slice(me * count, (me + 1) * count)
        wrong = not np.array_equal(x[mine], want[mine])
        if comm.allreduce(wrong, MPI.LOR):  # every rank stops, none waits
            raise SystemExit(f"{name} gave a wrong result on some rank")
        blocks.append(((nbytes, name), call))
    for r in range(rounds):
        k = r * len(blocks) // rounds
        for key, call in blocks[k:] + blocks[:k]:
            x = base.copy()
            t = time_block(lambda call=call, x=x: call(x), 5, 1, comm)
            times.setdefault(key, []).append(comm.allreduce(t, MPI.MAX))

if me == 0:
    title = f"{n} ranks, {rounds} rounds: median ms per call | raw's time / the case's (median)"
    rows = {nbytes: f"{nbytes >> 20:5d}M  " for nbytes in sizes}
    print_medians(title, times, rows, list(cases(1)), "raw", 1e3, 2, 14, base_over=True)
pycoll.destroy_process_group()
