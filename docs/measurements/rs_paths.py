"""pycoll's three ways of running a large reduce_scatter_tensor, each forced,
against mpi4py's own call in one run: MPI's call (through pycoll), the
node's shared window (pycoll.collectives.shm) and pycoll's pairwise exchange
(pycoll.collectives.pairwise); and what pycoll chooses by default. Out of
place and torch's in-place form (the output this rank's part of the input),
each against mpi4py's call of the same form: ``Reduce_scatter_block`` into a
separate array, and with ``MPI_IN_PLACE`` (whose result lands at the start
of the buffer, then copied to this rank's part, as a raw mpi4py user must).

The thresholds of pycoll.collectives.reduce are set per case for the call
(and put back after it). Every case's result is checked first on every
rank; then rounds of a block of calls each, the order rotated every round;
each round's figure is the case's time over mpi4py's of the same form in
that round, and rank 0 prints the median over rounds with mpi4py's GB/s of
input. A measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/rs_paths.py                 # 5 rounds, 1M-64M
    mpiexec -n 4 python docs/measurements/rs_paths.py 7 1M,4M,16M
"""

import sys

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll.bench import parse_size
from pycoll.bench.table import time_block
from pycoll.collectives import reduce as R

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SIZES = "256K,1M,4M,16M,64M"
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else SIZES).split(",")]
WINDOW = ("SCATTER_SHM_BYTES", "SCATTER_SHM_BYTES_OPEN_MPI")
PAIRWISE = ("PAIRWISE_BYTES", "PAIRWISE_BYTES_OPEN_MPI")
DEFAULT = {k: getattr(R, k) for k in WINDOW + PAIRWISE}
NEVER = 1 << 62
FORCED = {
    "mpi": {**dict.fromkeys(WINDOW, NEVER), **dict.fromkeys(PAIRWISE, 0)},
    "window": {**dict.fromkeys(WINDOW, 1), **dict.fromkeys(PAIRWISE, 0)},
    "pairwise": {**dict.fromkeys(WINDOW, NEVER), **dict.fromkeys(PAIRWISE, 1)},
    "default": DEFAULT,
}
F = MPI.FLOAT


def case(knobs, in_place):
    def call(x, out):
        for k, v in knobs.items():
            setattr(R, k, v)
        try:
            count = out.size
            if in_place:
                pycoll.reduce_scatter_tensor(x[me * count : (me + 1) * count], x)
            else:
                pycoll.reduce_scatter_tensor(out, x)
        finally:
            for k, v in DEFAULT.items():
                setattr(R, k, v)

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


forms = {"out of place": False, "in place": True}
if me == 0:
    print(f"# {n} ranks, float32 SUM, {rounds} rounds: a case's time over mpi4py's (median)")
for form, in_place in forms.items():
    cases = {"mpi4py": raw(in_place), **{k: case(v, in_place) for k, v in FORCED.items()}}
    if me == 0:
        print(f"# {form}")
        ways = "".join(f"{k:>9s}" for k in cases if k != "mpi4py")
        print(f"{'':>8s} {'mpi4py GB/s':>12s}{ways}")
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
        x = base.copy()
        times = {k: [] for k in cases}
        blocks = list(cases.items())
        for r in range(rounds):
            k = r % len(blocks)
            for key, call in blocks[k:] + blocks[:k]:
                iters = max(3, (64 << 20) // nbytes)
                t = time_block(lambda call=call, x=x, out=out: call(x, out), iters, 1, comm)
                times[key].append(comm.allreduce(t, MPI.MAX))
        if me == 0:
            ref = times["mpi4py"]
            row = f"{nbytes >> 20:6d}M {nbytes / np.median(ref) / 1e9:12.2f}"
            if nbytes < 1 << 20:
                row = f"{nbytes >> 10:6d}K {nbytes / np.median(ref) / 1e9:12.2f}"
            for k in cases:
                if k != "mpi4py":
                    row += f"{np.median([b / a for a, b in zip(ref, times[k])]):9.2f}"
            print(row, flush=True)
pycoll.destroy_process_group()
