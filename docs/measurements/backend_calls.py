"""What the backend "pycoll" adds to torch's calls at 8 bytes, call by call.

Per call, on torch CPU tensors of two float32s a rank (the fixed cost), the
sides, interleaved round by round (the order rotated):

- ``dist``: torch's API on the default group (backend "pycoll");
- ``null``: the same call on a group of a Python backend whose methods
  return a completed Work at once: torch's wrapper and its call into Python,
  the floor any Python backend pays;
- ``pycoll``: pycoll's own call on the same tensors (a Work's ``wait()``
  for the asynchronous row).

The calls: ``all_reduce``, the same with ``async_op=True`` and ``wait()``
(DDP's buckets, the comm hooks), ``broadcast``, ``all_gather_into_tensor``,
``reduce_scatter_tensor`` (through torch 2.13's ``all_gather_single`` and
``reduce_scatter_single``), ``all_to_all_single``, ``barrier`` and, on an even
number of ranks, ``send+recv``: a round trip between neighbours (rank 0
sends then receives, rank 1 the mirror image). Every dist and pycoll side's
result is checked once on every rank before the timing. A figure is the
median over rounds of the slowest rank's mean per call; ``glue``, what the
backend adds, is dist less null and pycoll (for ``send+recv``, dist less
pycoll and twice null: a round trip's critical path holds both ranks'
calls, while the null side's never waits). Not part of pycoll; run with
torch installed (``.venv-torch``):

    mpiexec -n 2 python docs/measurements/backend_calls.py [ROUNDS] [CALLS]

ROUNDS (5); CALLS, a comma-separated choice of the rows (all by default).
With PYTHONPATH naming another checkout it measures that one: alternate
runs to compare two versions.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch
import torch.distributed as dist
from measuring import ping_pong

import pycoll
import pycoll.torch  # noqa: F401  (registers the backend "pycoll")
from pycoll import _mpi
from pycoll.bench.table import _repeat, rotated
from pycoll.torch.work import done

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
CHOSEN = sys.argv[2].split(",") if len(sys.argv) > 2 else None
_DONE = done([])


def _done(*args: Any, **kwargs: Any) -> Any:
    return _DONE


class Null(dist.ProcessGroup):
    """A backend that does nothing: every call is complete at once."""

    def getBackendName(self) -> str:
        return "null"

    allreduce = broadcast = all_gather_single = reduce_scatter_single = alltoall_base = _done
    barrier = send = recv = _done


dist.Backend.register_backend(
    "null", lambda store, rank, size, timeout: Null(rank, size), devices=["cpu"]
)
dist.init_process_group("pycoll", init_method="mpi://")
NULL = dist.new_group(backend="null")
world = _mpi.MPI.COMM_WORLD
n, me = world.size, world.rank
peer = me ^ 1
first = me % 2 == 0

# torch 2.13's names for the single-tensor forms (the older ones warn).
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
x = torch.empty(2)
big = torch.empty(2 * n)
out = torch.empty(2 * n)
part = torch.empty(2)
got = torch.empty(2)


# Each row: (what to set before the check, dist's call given a group or
# None, pycoll's call, the check of the result).
def fill_x() -> None:
    x.fill_(me + 1)


def fill_big() -> None:
    big.copy_(torch.arange(2 * n, dtype=torch.float32) + me)


Row = Tuple[Callable[[], None], Callable[[Any], Any], Callable[[], Any], Callable[[], bool]]
ROWS: Dict[str, Row] = {
    "all_reduce": (
        fill_x,
        lambda g: dist.all_reduce(x, group=g),
        lambda: pycoll.all_reduce(x),
        lambda: bool((x == n * (n + 1) / 2).all()),
    ),
    "all_reduce async": (
        fill_x,
        lambda g: dist.all_reduce(x, group=g, async_op=True).wait(),
        lambda: pycoll.all_reduce(x, async_op=True).wait(),
        lambda: bool((x == n * (n + 1) / 2).all()),
    ),
    "broadcast": (
        fill_x,
        lambda g: dist.broadcast(x, 0, group=g),
        lambda: pycoll.broadcast(x, 0),
        lambda: bool((x == 1).all()),
    ),
    "all_gather_into_tensor": (
        fill_x,
        lambda g: all_gather_single(out, x, group=g),
        lambda: pycoll.all_gather_into_tensor(out, x),
        lambda: bool((out == torch.arange(n).repeat_interleave(2) + 1).all()),
    ),
    "reduce_scatter_tensor": (
        fill_big,
        lambda g: reduce_scatter_single(part, big, group=g),
        lambda: pycoll.reduce_scatter_tensor(part, big),
        lambda: bool((part == n * (torch.arange(2) + 2 * me) + n * (n - 1) / 2).all()),
    ),
    "all_to_all_single": (
        fill_big,
        lambda g: dist.all_to_all_single(out, big, group=g),
        lambda: pycoll.all_to_all_single(out, big),
        lambda: bool(
            (out == torch.arange(n).repeat_interleave(2) + 2 * me + torch.arange(2).repeat(n)).all()
        ),
    ),
    "barrier": (
        lambda: None,
        lambda g: dist.barrier(group=g),
        lambda: pycoll.barrier(),
        lambda: True,
    ),
}
if n % 2 == 0:

    def send_recv(send: Callable[..., Any], recv: Callable[..., Any]) -> Callable[[], None]:
        return ping_pong(send, recv, x, got, peer, first)

    # Each group's pair made once, not inside the timed call.
    PAIRS = {
        g: send_recv(
            lambda t, p, g=g: dist.send(t, p, group=g), lambda t, p, g=g: dist.recv(t, p, group=g)
        )
        for g in (None, NULL)
    }
    ROWS["send+recv"] = (
        fill_x,
        lambda g: PAIRS[g](),
        send_recv(pycoll.send, pycoll.recv),
        lambda: bool((got == peer + 1).all()),
    )

names = [name for name in ROWS if CHOSEN is None or name in CHOSEN]
wrong = 0
sides: Dict[str, Callable[[int], None]] = {}
for name in names:
    setup, through, own, check = ROWS[name]
    for call in (lambda t=through: t(None), own):
        setup()
        call()
        wrong += not check()
    sides[f"{name}|dist"] = _repeat(lambda t=through: t(None))
    sides[f"{name}|null"] = _repeat(lambda t=through: t(NULL))
    sides[f"{name}|pycoll"] = _repeat(own)
wrong = world.allreduce(wrong)
times = rotated(sides, 20000 if n < 3 else 5000, ROUNDS, world, warmup=200)
if me == 0:
    print(
        f"# backend 'pycoll', {n} ranks, torch {torch.__version__}, 8 B a rank; us per call "
        f"(median of {ROUNDS} rounds); glue = dist - null - pycoll (send+recv: - 2 null); "
        f"wrong results: {wrong}"
    )
    print(f"{'call':>24} {'dist':>8} {'null':>8} {'pycoll':>8} {'glue':>8}")
    for name in names:
        d, z, p = (float(np.median(times[f"{name}|{s}"])) * 1e6 for s in ("dist", "null", "pycoll"))
        floor = 2 * z if name == "send+recv" else z
        print(f"{name:>24} {d:8.2f} {z:8.2f} {p:8.2f} {d - floor - p:8.2f}")
dist.destroy_process_group()
if wrong:
    raise SystemExit(f"backend_calls.py: {wrong} wrong results")
