"""What stands between pycoll's small synchronous call and mpi4py's: the floor.

Per collective (an 8-byte all_reduce and reduce of MAX, a broadcast), on an
array given again, as a training loop gives it, four sides in rotated rounds:

- ``mpi4py``: mpi4py's blocking call;
- ``pycoll``: pycoll's call as a user makes it (its compiled path, pycoll.native);
- ``lean``: the same call with pycoll.native.again swapped for a copy of it
  without its guard against a second thread, its call check ledger store and
  its flight recorder entry: what moving that bookkeeping into the compiled
  code could save at most;
- ``compiled``: the compiled start of the same kept call (the very words the
  pycoll side starts) from a Python function that does nothing else: no
  argument checks, no lookup of the call, no group sequence number, no
  ledger, no flight ring, no thread guard. A Python layer over that compiled
  code with anything to do is slower than this side.

Every side is called through one Python function per call (a lambda for
mpi4py's and pycoll's), so they differ in what that call does.

Every side's result is checked on every rank in every block (``wrong``).

    PYCOLL_NATIVE=1 mpiexec -n 2 python docs/measurements/fixed_floor.py [ROUNDS] [CALLS]
    PYCOLL_WAIT=blocking PYCOLL_NATIVE=1 mpiexec -n 2 python docs/measurements/fixed_floor.py

Prints, on rank 0, each side's median microseconds per call (the slowest
rank's mean over a block) and the median of its per-round ratio to mpi4py's.
"""

import inspect
import sys
import textwrap
from typing import Any, Callable, Dict, List

import numpy as np
from mpi4py import MPI

import pycoll
from pycoll import native, watch
from pycoll.bench.table import rotated
from pycoll.world import STATE

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
CALLS = int(sys.argv[2]) if len(sys.argv) > 2 else 20000

pycoll.init_process_group()
pg = STATE.default
if native.MODE != native.ON:
    sys.exit("set PYCOLL_NATIVE=1: the compiled path from the first call")
comm = MPI.COMM_WORLD.Dup()
rank, size = comm.rank, comm.size
MAX = pycoll.ReduceOp.MAX

# The lean side: pycoll.native.again without the three pieces of bookkeeping,
# each cut checked to be there, so that a change to again fails here loudly.
CUTS = [
    (
        "    if pg._owner != get_ident() or pg._shared:\n"
        "        return False  # the locked path, in plain\n",
        "",
    ),
    (
        "    pg._busy = True  # then look again: a second thread may have just come\n"
        "    if pg._shared:\n        pg._busy = False\n        return False\n",
        "",
    ),
    ("        ring = pg._flight", "        ring = None"),
    ("        pg._keys[slot] = key\n", ""),
]
source = textwrap.dedent(inspect.getsource(native.again))
for cut, kept in CUTS:
    if cut not in source:
        sys.exit(f"pycoll.native.again has changed; this cut is not in it:\n{cut}")
    source = source.replace(cut, kept)
scope = dict(vars(native))
exec(source, scope)
LEAN, AGAIN = scope["again"], native.again

x = np.zeros(2, np.float32)  # all_reduce
y = np.zeros(2, np.float32)  # reduce
b = np.zeros(2, np.float32)  # broadcast


def pycoll_calls() -> None:
    pycoll.all_reduce(x, MAX)
    pycoll.reduce(y, 0, MAX)
    pycoll.broadcast(b, 0)


for _ in range(300):  # kept (from their second call) and compiled
    pycoll_calls()


def words(array: Any, op: str) -> Any:
    """The kept call of ``op`` on ``array``: pycoll.native's tuple."""
    known = pg._native.calls[id(array)]
    while known[native._OP] != op:
        known = known[native._NEXT]
    return known


def loop(call: Callable[[], None]) -> Callable[[int], None]:
    def make(n: int) -> None:
        for _ in range(n):
            call()

    return make


seqs = [1 << 40]  # the compiled side's own sequence numbers (the progress board's)


def compiled(array: Any, op: str) -> Callable[[int], None]:
    """The compiled side: ``n`` calls of a Python function that starts the
    kept call's words and waits for them where the compiled tests did not
    see them done, as pycoll's own path does."""

    def make(n: int) -> None:
        known = words(array, op)
        # (Under PYCOLL_WAIT=blocking MPI's blocking call, as pycoll's side makes.)
        start = native._block if watch.BLOCKING else native._start
        word, st = pg._word, pg._native.st
        address, code = known[native._ADDRESS], known[native._CODE]

        def call() -> None:
            seq = seqs[0] = seqs[0] + 1
            busy = seq << 8 | code
            err = start(address, busy, word)
            if err:
                native._unfinished(pg, st, op, seq, busy, err, address, None)

        loop(call)(n)

    return make


wrong = [0]
blocks = [0]


def checked(collective: str, make: Callable[[int], None]) -> Callable[[int], None]:
    """A side: set its inputs, make ``n`` calls, check the result."""

    def run(n: int) -> None:
        blocks[0] += 1
        token = float(blocks[0])
        x[:] = rank + 1
        y[:] = rank + 1
        b[:] = token if rank == 0 else -1
        make(n)
        if collective == "all_reduce":
            good = (x == size).all()
        elif collective == "reduce":
            good = (y == (size if rank == 0 else rank + 1)).all()
        else:
            good = (b == token).all()
        wrong[0] += not good

    return run


def lean(call: Callable[[], None]) -> Callable[[int], None]:
    def make(n: int) -> None:
        native.again = LEAN
        try:
            for _ in range(n):
                call()
        finally:
            native.again = AGAIN

    return make


def mpi_reduce() -> None:
    if rank == 0:
        comm.Reduce(MPI.IN_PLACE, y, MPI.MAX, 0)
    else:
        comm.Reduce(y, None, MPI.MAX, 0)


cases: Dict[str, Dict[str, Callable[[int], None]]] = {
    "all_reduce": {
        "mpi4py": loop(lambda: comm.Allreduce(MPI.IN_PLACE, x, MPI.MAX)),
        "pycoll": loop(lambda: pycoll.all_reduce(x, MAX)),
        "lean": lean(lambda: pycoll.all_reduce(x, MAX)),
        "compiled": compiled(x, "all_reduce"),
    },
    "reduce": {
        "mpi4py": loop(mpi_reduce),
        "pycoll": loop(lambda: pycoll.reduce(y, 0, MAX)),
        "lean": lean(lambda: pycoll.reduce(y, 0, MAX)),
        "compiled": compiled(y, "reduce"),
    },
    "broadcast": {
        "mpi4py": loop(lambda: comm.Bcast(b, 0)),
        "pycoll": loop(lambda: pycoll.broadcast(b, 0)),
        "lean": lean(lambda: pycoll.broadcast(b, 0)),
        "compiled": compiled(b, "broadcast"),
    },
}
lines: List[str] = []
for collective, sides in cases.items():
    runs = {name: checked(collective, make) for name, make in sides.items()}
    times = rotated(runs, CALLS, ROUNDS, comm, warmup=1)
    base = times["mpi4py"]
    for name, t in times.items():
        ratio = np.median([a / m for a, m in zip(t, base)])
        lines.append(f"{collective:10s} {name:9s} {np.median(t) * 1e6:7.3f} us {ratio:6.2f}x")
library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
wrong_all = comm.allreduce(wrong[0])
if rank == 0:
    print(
        f"# fixed_floor: {size} ranks, {library}, "
        f"PYCOLL_WAIT={'blocking' if watch.BLOCKING else 'poll'}; 8 B; "
        f"{ROUNDS} rotated rounds of {CALLS} calls; median us per call (slowest "
        f"rank), median of per-round ratios to mpi4py; wrong results: {wrong_all}"
    )
    print("\n".join(lines))
pycoll.destroy_process_group()
