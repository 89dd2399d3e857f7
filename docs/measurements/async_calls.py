"""pycoll's collectives with ``async_op=True`` and their Work's ``wait()``,
against raw mpi4py's nonblocking call and its ``Wait()``.

The functional collectives (pycoll.functional) and every collective torch
issues through the backend "pycoll" without waiting at once (DDP's buckets)
take this form. Per collective, on arrays of 8 bytes a rank (the fixed cost),
the sides, every result checked once on every rank before the timing:

- ``pycoll``: ``pycoll.<collective>(..., async_op=True).wait()``;
- ``mpi4py``: the same MPI operation started by mpi4py (``Iallreduce`` with
  ``MPI_IN_PLACE``, ``Ibcast``, ``Iallgather``, ``Ireduce_scatter_block``,
  ``Ialltoall``) and its request's ``Wait()``, on the same arrays;
- with ``torch`` as the third argument (run it in ``.venv-torch``), for
  all_reduce only: ``dist``, ``dist.all_reduce(t, async_op=True).wait()``
  on a tensor over the backend "pycoll" (pycoll.torch), and ``gloo``, the
  same over a gloo group of the same ranks.

Then rounds, the order rotated each round; a figure is the median over
rounds of the slowest rank's mean per call, each ratio the median of the
per-round ratios to mpi4py's. Not part of pycoll:

    mpiexec -n 2 python docs/measurements/async_calls.py [ROUNDS] [BYTES] [torch]

ROUNDS (7); BYTES, each rank's array (default 8). With PYTHONPATH naming
another checkout it measures that one: alternate runs to compare two
versions.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Tuple

import numpy as np

import pycoll
from pycoll import _mpi
from pycoll.bench.table import _repeat, against, rotated

pycoll.init_process_group()
MPI = _mpi.MPI
comm = MPI.COMM_WORLD
n, me = comm.size, comm.rank
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
COUNT = max(1, int(sys.argv[2]) // 4) if len(sys.argv) > 2 else 2
TENSORS = len(sys.argv) > 3 and sys.argv[3] == "torch"
if TENSORS:
    import torch
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401  (registers the backend "pycoll")

    dist.init_process_group("pycoll", init_method="mpi://")  # (on pycoll's default group)
    GLOO = dist.new_group(backend="gloo")

# A side: its call, and a check that fills the inputs, calls it once and
# returns the number of elements of its result that differ from numpy's.
Side = Tuple[Callable[[], None], Callable[[], int]]


def mine(count: int, rank: int = me) -> np.ndarray:
    """Rank ``rank``'s input: small whole numbers, exact in float32 sums."""
    return (np.arange(count, dtype=np.float32) % 7 + rank).astype(np.float32)


def all_reduce() -> Dict[str, Side]:
    x = np.empty(COUNT, np.float32)
    want = sum(mine(COUNT, r) for r in range(n))

    def checked(call: Callable[[], None], into: Any) -> Side:
        def check() -> int:
            fresh = mine(COUNT)
            into[...] = fresh if isinstance(into, np.ndarray) else torch.from_numpy(fresh)
            call()
            return int((np.asarray(into) != want).sum())

        return call, check

    made = {
        "pycoll": checked(lambda: pycoll.all_reduce(x, async_op=True).wait(), x),
        "mpi4py": checked(lambda: comm.Iallreduce(MPI.IN_PLACE, x).Wait(), x),
    }
    if TENSORS:
        t = torch.empty(COUNT)
        made["dist"] = checked(lambda: dist.all_reduce(t, async_op=True).wait(), t)
        made["gloo"] = checked(lambda: dist.all_reduce(t, group=GLOO, async_op=True).wait(), t)
    return made


def broadcast() -> Dict[str, Side]:
    x = np.empty(COUNT, np.float32)
    want = mine(COUNT, 0)

    def checked(call: Callable[[], None]) -> Side:
        def check() -> int:
            x[...] = mine(COUNT)
            call()
            return int((x != want).sum())

        return call, check

    return {
        "pycoll": checked(lambda: pycoll.broadcast(x, 0, async_op=True).wait()),
        "mpi4py": checked(lambda: comm.Ibcast(x, 0).Wait()),
    }


def out_of_place(
    name: str, into: int, want: Callable[[], np.ndarray], raw: Callable[..., Any], **extra: Any
) -> Dict[str, Side]:
    """A collective from an input of COUNT elements (``n * COUNT`` for a
    reduce-scatter or an all-to-all) into an output of ``into`` elements."""
    size = COUNT * (n if name in ("reduce_scatter_tensor", "all_to_all_single") else 1)
    x = np.empty(size, np.float32)
    out = np.empty(into, np.float32)
    call_pycoll = getattr(pycoll, name)
    expected = want()

    def checked(call: Callable[[], None]) -> Side:
        def check() -> int:
            x[...] = mine(size)
            out[...] = -1
            call()
            return int((out != expected).sum())

        return call, check

    return {
        "pycoll": checked(lambda: call_pycoll(out, x, async_op=True, **extra).wait()),
        "mpi4py": checked(lambda: raw(x, out).Wait()),
    }


def cases() -> Dict[str, Dict[str, Side]]:
    per = n * COUNT
    return {
        "all_reduce": all_reduce(),
        "broadcast": broadcast(),
        "all_gather": out_of_place(
            "all_gather_into_tensor",
            per,
            lambda: np.concatenate([mine(COUNT, r) for r in range(n)]),
            comm.Iallgather,
        ),  # fmt: skip
        "reduce_scatter": out_of_place(
            "reduce_scatter_tensor",
            COUNT,
            lambda: sum(mine(per, r) for r in range(n))[me * COUNT : (me + 1) * COUNT],
            comm.Ireduce_scatter_block,
        ),  # fmt: skip
        "all_to_all": out_of_place(
            "all_to_all_single",
            per,
            lambda: np.concatenate([mine(per, r)[me * COUNT : (me + 1) * COUNT] for r in range(n)]),
            comm.Ialltoall,
        ),  # fmt: skip
    }


def main() -> None:
    if me == 0:
        print(f"# async_op=True and wait(), {n} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(f"# {4 * COUNT} B a rank; us per call (median of rounds); ratio to mpi4py's")
    for label, made in cases().items():
        wrong = comm.allreduce(sum(check() for _, check in made.values()))
        runs = {s: _repeat(call) for s, (call, _) in made.items()}
        times = rotated(runs, 10000 if COUNT < 1024 else 1000, ROUNDS, comm, warmup=200)
        if me == 0:
            print(f"{label:>15}  wrong {wrong}: " + against(times, "mpi4py", 1e6), flush=True)
    if TENSORS:
        dist.destroy_process_group()
    pycoll.destroy_process_group()


if __name__ == "__main__":
    main()
