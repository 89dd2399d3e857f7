"""pycoll's three ways of running a large reduce_scatter_tensor, each forced,
against mpi4py's own call in one run: MPI's call (through pycoll), the
node's shared window (pycoll.collectives.shm) and pycoll's pairwise exchange
(pycoll.collectives.pairwise); and what pycoll chooses by default. Out of
place and torch's in-place form (the output this rank's part of the input),
each against mpi4py's call of the same form: ``Reduce_scatter_block`` into a
separate array, and with ``MPI_IN_PLACE`` (whose result lands at the start
of the buffer, then copied to this rank's part, as a raw mpi4py user must).

Each way is forced through a tuning table set on the world's group for the
call (pycoll.tuning.decide, as ``python -m pycoll.bench.tune`` forces them),
the default with no table. Every case's result is checked first on every
rank; then rounds of a block of calls each, the order rotated every round
(pycoll.bench.table.rotated); each round's figure is the case's time over
mpi4py's of the same form in that round, and rank 0 prints the median over
rounds with mpi4py's GB/s of input. Each case times arrays of its own. A
measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/rs_paths.py                 # 5 rounds, 1M-64M
    mpiexec -n 4 python docs/measurements/rs_paths.py 7 1M,4M,16M
"""

import sys

import numpy as np

import pycoll
from pycoll import _mpi, tuning
from pycoll.bench import parse_size
from pycoll.bench.table import bandwidth_header, bandwidth_row, rotated

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
world = pycoll.group.WORLD
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SIZES = "256K,1M,4M,16M,64M"
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else SIZES).split(",")]
WAYS = {"mpi": ([0], ["mpi"]), "window": ([0], ["window"]), "pairwise": ([0], ["pairwise"]),
        "default": None}  # fmt: skip
F = MPI.FLOAT


def case(table, in_place):
    def call(x, out):
        tuning.decide(world, "reduce_scatter", table)
        try:
            count = out.size
            if in_place:
                pycoll.reduce_scatter_tensor(x[me * count : (me + 1) * count], x)
            else:
                pycoll.reduce_scatter_tensor(out, x)
        finally:
            tuning.decide(world, "reduce_scatter", None)

    return call


def raw(in_place):
    def call(x, out):
        count = out.size
        if in_place:
            comm.Reduce_scatter_block(MPI.IN_PLACE, [x, count, F])
            if me:
                x[me * count : (me + 1) * count] = x[:count]
        else:
            comm.Reduce_scatter_block([x, F], [out, F])

    return call


def repeated(call, x, out):
    """A block of ``calls`` calls of ``call`` on these arrays (rotated's run)."""
    return lambda calls: [call(x, out) for _ in range(calls)]


forms = {"out of place": False, "in place": True}
if me == 0:
    print(f"# {n} ranks, float32 SUM, {rounds} rounds: a case's time over mpi4py's (median)")
for form, in_place in forms.items():
    cases = {"mpi4py": raw(in_place), **{k: case(v, in_place) for k, v in WAYS.items()}}
    if me == 0:
        print(f"# {form}")
        print(bandwidth_header("mpi4py", "mpi4py", list(cases)))
    for nbytes in sizes:
        count = nbytes // 4 // n
        base = (np.arange(count * n) % 7 + me).astype(np.float32)
        want = (np.arange(count * n) % 7 * n + n * (n - 1) // 2).astype(np.float32)
        mine = slice(me * count, (me + 1) * count)
        out = np.zeros(count, np.float32)
        for k, call in cases.items():
            x = base.copy()
            out[...] = 0
            call(x, out)
            got = x[mine] if in_place else out
            if comm.allreduce(not np.array_equal(got, want[mine]), MPI.LOR):
                raise SystemExit(f"{k} ({form}) gave a wrong result on some rank at {nbytes} B")
        # Arrays of each case's own: on shared ones a call the compiled path
        # keeps (pycoll.native, up to 2 MiB) would be made again that way
        # whatever the case's table.
        runs = {k: repeated(call, base.copy(), out.copy()) for k, call in cases.items()}
        times = rotated(runs, max(3, (64 << 20) // nbytes), rounds, comm, warmup=1)
        if me == 0:
            print(bandwidth_row(nbytes, times, "mpi4py"), flush=True)
pycoll.destroy_process_group()
