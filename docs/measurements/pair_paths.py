"""Small all_reduce, reduce and reduce_scatter_tensor on two ranks: pycoll's
exchange (pycoll.collectives.pair) against MPI's nonblocking call through
pycoll, each forced, and raw mpi4py's blocking call, in one run.

For each size and collective the cases are: ``mpi`` and ``pair`` on an
array made once and given again (kept and made by the compiled code from
its second call: pycoll.native), ``mpi:new`` and ``pair:new`` on an array
made afresh for each call (the plain Python path; the array's making is in
the time), and ``mpi4py``, a blocking ``Allreduce``/``Reduce`` in place on
an array given again (the reduce-scatter: ``Reduce_scatter_block`` out of
place; in place, ``rs:in``, MPI's in-place call and this rank's part copied
to where torch's in-place form leaves it, pycoll's output a new view of
the input's part each call, as torch makes it). The bytes are the input's.
Every case's result (mpi4py's too) is checked on
every rank first, on an array given again (made compiled from its second
call) and on a new one; then rounds of a block of calls each
(pycoll.bench.table.rotated: the order rotated every round, a block's time
the slowest rank's mean per call); each round's figure is the case's time
over mpi4py's in that round, and rank 0 prints the median over rounds, with
mpi4py's time in microseconds; the last two columns are the exchange's time
over MPI's call through pycoll, given again and made afresh (medians of the
per-round ratios). A measurement for docs/benchmarks.md, not part of pycoll:

    mpiexec -n 2 python docs/measurements/pair_paths.py 7 8,512,4K,32K
    PAIR_BELOW=4M mpiexec -n 2 python docs/measurements/pair_paths.py 5 64K,256K,1M
    FUNCS=rs,rs:in PAIR_BELOW=1M mpiexec -n 2 python docs/measurements/pair_paths.py 7 8,8K,128K

(``mpi`` is pycoll's default path with the exchange off: from 64 KiB that
may be another of pycoll's paths, such as its reduce to a root on MPICH.)
"""

import os
import sys

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll.bench import parse_size
from pycoll.bench.table import rotated
from pycoll.collectives import pair

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
if n != 2:
    raise SystemExit("run it on two ranks")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
sizes = [parse_size(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "8,512,4K,32K").split(",")]
BELOW = parse_size(os.environ.get("PAIR_BELOW", "64K"))  # the path forced below this size
ON = lambda func, ranks, nbytes: ranks == 2 and nbytes < BELOW  # noqa: E731
OFF = lambda func, ranks, nbytes: False  # noqa: E731
raw = comm.Dup()


def arrays(func, count):
    """A call's arrays, ones: the array (all_reduce, reduce), or the input
    and the output (a reduce-scatter's; in place, the output None: a view
    made at the call)."""
    x = np.ones(count, np.float32)
    if func == "rs":
        return x, np.ones(count // 2, np.float32)
    return x, None


def pycoll_call(func, x, y):
    if func == "all_reduce":
        pycoll.all_reduce(x)
    elif func == "reduce":
        pycoll.reduce(x, dst=0)
    elif func == "rs":
        pycoll.reduce_scatter_tensor(y, x)
    else:  # (torch's in-place form: the output a new view each call)
        half = x.size // 2
        pycoll.reduce_scatter_tensor(x[me * half : (me + 1) * half], x)


def raw_call(func, x, y):
    if func == "all_reduce":
        raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)
    elif func == "reduce":
        if me == 0:
            raw.Reduce(MPI.IN_PLACE, x, MPI.SUM, 0)
        else:
            raw.Reduce(x, None, MPI.SUM, 0)
    elif func == "rs":
        raw.Reduce_scatter_block(x, y, MPI.SUM)
    else:
        half = x.size // 2
        raw.Reduce_scatter_block(MPI.IN_PLACE, x, MPI.SUM)
        if me:
            x[half:] = x[:half]


def result(func, x, y):
    """Where the call's result is."""
    if func == "rs":
        return y
    if func == "rs:in":
        half = x.size // 2
        return x[me * half : (me + 1) * half]
    return x


def cases(func, count):
    """name -> run(iters), each with arrays of its own."""
    made = {}

    def kept(rule):
        x, y = arrays(func, count)

        def run(iters):
            pair.applies = rule
            for _ in range(iters):
                pycoll_call(func, x, y)

        return run

    def new(rule):
        def run(iters):
            pair.applies = rule
            for _ in range(iters):
                pycoll_call(func, *arrays(func, count))

        return run

    def mpi4py(iters):
        for _ in range(iters):
            raw_call(func, *mine)

    mine = arrays(func, count)
    made["mpi4py"] = mpi4py
    made["mpi"], made["pair"] = kept(OFF), kept(ON)
    made["mpi:new"], made["pair:new"] = new(OFF), new(ON)
    return made


def check(func, count, call, name):
    """``call`` on ones, 300 times on the same arrays (from its second call
    the compiled path makes it, once the group has attached it) and once on
    new ones: 2 everywhere (all_reduce; reduce's root; a reduce-scatter's
    part), 1 on reduce's other rank."""
    want = 1.0 if func == "reduce" and me != 0 else 2.0
    x, y = arrays(func, count)
    wrong = False
    for _ in range(300):
        x[...] = 1
        call(func, x, y)
        wrong |= not np.all(result(func, x, y) == want)
    x, y = arrays(func, count)
    call(func, x, y)
    wrong |= not np.all(result(func, x, y) == want)
    if comm.allreduce(wrong, MPI.LOR):
        raise SystemExit(f"{name}: {func} gave a wrong result on some rank at {count * 4} bytes")


def with_rule(rule):
    """pycoll's call with the exchange forced on or off."""

    def call(func, x, y):
        pair.applies = rule
        pycoll_call(func, x, y)

    return call


if me == 0:
    print(f"# 2 ranks, float32 SUM, {rounds} rounds: a case's time over mpi4py's blocking call")
for func in os.environ.get("FUNCS", "all_reduce,reduce").split(","):
    for nbytes in sizes:
        count = nbytes // 4
        for name, call in (("pair", with_rule(ON)), ("mpi", with_rule(OFF)), ("mpi4py", raw_call)):
            check(func, count, call, name)
        runs = cases(func, count)
        iters = max(20, min(2000, (16 << 20) // max(nbytes, 1) // 8))
        for run in runs.values():  # (warm: the compiled path keeps its calls from the second)
            run(200)
        times = rotated(runs, iters, rounds, comm)
        if me == 0:
            ref = times["mpi4py"]
            row = f"{func:>10s} {nbytes:>6d} B  mpi4py {np.median(ref) * 1e6:6.2f} us"
            for k in runs:
                if k != "mpi4py":
                    ratios = [b / a for a, b in zip(ref, times[k])]
                    row += f"  {k} {np.median(ratios):.2f}"
            for k, base in (("pair", "mpi"), ("pair:new", "mpi:new")):
                ratios = [b / a for a, b in zip(times[base], times[k])]
                row += f"  {k}/{base} {np.median(ratios):.2f}"
            print(row, flush=True)
pycoll.destroy_process_group()
