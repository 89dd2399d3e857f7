"""What gather_window.py and scatter_window.py share: one coalesced call
through the node's shared window and by its packed path, each against
mpi4py's one call of the total size, every side's result checked on every
rank, then rounds of a block of calls each, the order rotated every round
(pycoll.bench.table.rotated), and a row printed on rank 0: median us per
call and the median per-round ratios. Not part of pycoll."""

from typing import Any, Callable, Dict

import numpy as np

from pycoll import _mpi
from pycoll.bench.table import _repeat, rotated


def header(comm: Any, title: str, first: str) -> None:
    """The table's two header lines, on rank 0 (``first``: the size column)."""
    if comm.rank == 0:
        print(title)
        print(f"{first:>8s} {'arrays':>6s} {'window':>9s} {'packed':>9s} {'mpi4py':>9s}"
              f"  window/packed  window/mpi4py  packed/mpi4py")  # fmt: skip


def forced(module: Any, knob: str, value: int, call: Callable, *args: Any) -> Callable[[], None]:
    """``call(*args)`` with ``module.knob`` set to ``value`` first (the
    threshold from which the coalesced call takes the window: 1 forces the
    window, 0 the packed path)."""

    def one_call() -> None:
        setattr(module, knob, value)
        call(*args)

    return one_call


def compare(
    comm: Any,
    rounds: int,
    total: int,
    count: int,
    sides: Dict[str, Callable[[], None]],
    right: Callable[[str], bool],
) -> None:
    """Check each of ``sides`` ("window", "packed", "mpi4py") by
    ``right(name)`` after two calls (a list's plan is kept from its second),
    ending the run if any rank found one wrong; then time them and print
    the row for ``total`` bytes a rank in ``count`` arrays."""
    MPI = _mpi.MPI
    n = comm.size
    for name, call in sides.items():
        call()
        call()
        if comm.allreduce(not right(name), MPI.LOR):
            raise SystemExit(f"{name} gave a wrong result at {total} bytes")
    calls = max(2, min(50, (32 << 20) // (n * total)))
    runs = {name: _repeat(call) for name, call in sides.items()}
    times = rotated(runs, calls, rounds, comm, warmup=1)
    if comm.rank == 0:
        med = {name: float(np.median(v)) * 1e6 for name, v in times.items()}

        def ratio(a: str, b: str) -> float:
            return float(np.median([x / y for x, y in zip(times[a], times[b])]))

        print(f"{total >> 10:6d} K {count:6d} {med['window']:9.0f} {med['packed']:9.0f} "
              f"{med['mpi4py']:9.0f}  {ratio('window', 'packed'):13.2f}  "
              f"{ratio('window', 'mpi4py'):13.2f}  {ratio('packed', 'mpi4py'):13.2f}")  # fmt: skip
