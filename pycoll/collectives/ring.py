"""pycoll's own ring all_reduce, for reductions MPI does slowly or cannot do.

A ring is a reduce-scatter (n - 1 steps: send one part to the right
neighbour, receive one from the left, combine it into this rank's copy) and
an all-gather (n - 1 steps passing the reduced parts on). Each rank moves
2 (n - 1) / n of the array, as MPI's own large-message algorithms do, but
over point-to-point messages, which on one node measured 2-4x faster than
MPICH's collectives on large buffers, and than Open MPI's nonblocking
all_reduce (docs/benchmarks.md, "Which path wins where"); and the combine is
pycoll's kernel (pycoll.kernels), not MPI's call of a user op.

Two callers: large host all_reduce, with pycoll's user ops or a float AVG
and with MPI's own ops (pycoll.collectives.reduce, synchronous or async),
and device arrays under CUDA-aware MPI (pycoll.gpu.ring), whose combine runs
on the GPU. The caller supplies the combine step and runs the Ring through
pycoll.collectives._common.run, which counts it and bounds its waits.

Messages go over the group's side communicator (pycoll.watch.side_comm, made
on first use, waited for within the group's timeout), so they never match
the user's point-to-point messages, and each ring's messages carry a tag from
its sequence number, so two rings in flight on one group (async calls) never
match each other's. The whole ring is one collective: one sequence number, one
DETAIL check, one Work whose stages are the ring's steps (pycoll.work), so a
synchronous call and an async one match on every rank.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _mpi, kernels, paths, watch
from ..groups import ProcessGroup
from ..work import Work
from . import scratch
from ._common import run
from ._reduction import AllReduce, all_reduce_desc, prescaler

__all__ = ["Ring", "Steps", "parts", "side"]

TAGS = _mpi.TAGS  # MPI guarantees tags below 32768


def side(pg: Any, func: str) -> Tuple[Any, int]:
    """The group's side communicator and this call's tag, from its sequence
    number: for the first step of a collective made of point-to-point
    messages (the ring, the pairwise exchange, the doubling, the reduce to
    a root), called under the group's lock once the call is counted."""
    seq = pg.sequence_number()
    return watch.side_comm(pg, func, seq), seq % TAGS


def parts(count: int, n: int) -> Tuple[List[int], List[int]]:
    """(counts, starts): ``count`` elements cut into ``n`` parts in rank order."""
    base, extra = divmod(count, n)
    counts = [base + (1 if i < extra else 0) for i in range(n)]
    starts = [base * i + min(i, extra) for i in range(n)]
    return counts, starts


class Steps:
    """A call made as exchange steps over the group's side communicator, for
    :func:`pycoll.collectives._common.run`: the first step's MPI operation
    (:meth:`start`) and one stage for each step after it (:attr:`stages`).
    A subclass gives ``steps`` (one entry per exchange; none on one rank),
    :meth:`_exchange` (start the step at ``self._at``) and ``_next`` (finish
    the step just done and start the next)."""

    def __init__(self, pg: Any, steps: List[Any]) -> None:
        self.pg = pg
        self._steps = steps
        self.comm: Any = None
        self.tag = 0
        self._at = 0
        self.stages = [self._next for _ in range(len(steps) - 1)]

    def start(self) -> Any:
        """Start the first step (called under the group's lock, once the call
        is counted: the tag comes from its sequence number)."""
        if not self._steps:  # one rank: nothing to send
            return _mpi.MPI.REQUEST_NULL
        self.comm, self.tag = side(self.pg, "all_reduce")
        return self._exchange()

    def _exchange(self) -> Any:
        raise NotImplementedError

    def _next(self) -> List[Any]:
        raise NotImplementedError


class Ring(Steps):
    """One ring all_reduce, in place, as a first MPI operation (:meth:`start`)
    and the steps after it (:attr:`stages`), for :func:`pycoll.collectives.
    _common.run`, which counts, checks and waits for them.

    Args:
        pg: the group.
        data: the array's bytes (a uint8 view MPI reads and writes).
        scratch: bytes for one received part (``len(data) // n + itemsize`` or more).
        itemsize: bytes per element; parts are cut on element boundaries.
        combine: ``combine(start, count)`` folds the first ``count`` elements
            received into ``scratch`` into elements ``start..start+count`` of
            the array, and returns once they are written.
        reduced: ``reduced(start, count)`` runs on this rank's fully reduced
            part before the all-gather (an AVG's division, on 1/n of the data).
    """

    def __init__(
        self,
        pg: Any,
        data: np.ndarray,
        scratch: np.ndarray,
        itemsize: int,
        combine: Callable[[int, int], None],
        reduced: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        self.data, self.scratch, self.itemsize = data, scratch, itemsize
        self.combine, self.reduced = combine, reduced
        n, me = pg.size(), pg.rank()
        self.counts, self.starts = parts(len(data) // itemsize, n)
        self.right, self.left = (me + 1) % n, (me - 1) % n
        self.own = (me + 1) % n  # the part that ends fully reduced on this rank
        # Reduce-scatter: at step k this rank sends part (me - k) and receives
        # part (me - k - 1) into scratch; the last step receives its own. Then
        # the all-gather: send part (me + 1 - k), receive part (me - k) in place.
        rs = [((me - k) % n, (me - k - 1) % n) for k in range(n - 1)]
        ag = [((me + 1 - k) % n, (me - k) % n) for k in range(n - 1)]
        steps = [(send, recv, True) for send, recv in rs]
        super().__init__(pg, steps + [(send, recv, False) for send, recv in ag])

    def _exchange(self) -> Any:
        send, recv, scattering = self._steps[self._at]
        item = self.itemsize
        lo, size = self.starts[send] * item, self.counts[send] * item
        if scattering:
            into = self.scratch[: self.counts[recv] * item]
        else:
            at = self.starts[recv] * item
            into = self.data[at : at + self.counts[recv] * item]
        byte = _mpi.MPI.BYTE
        return self.comm.Isendrecv(
            [self.data[lo : lo + size], byte],
            self.right,
            self.tag,
            [into, byte],
            self.left,
            self.tag,
        )

    def _next(self) -> List[Any]:
        """Finish the step just completed (a combine while scattering) and
        start the next one."""
        send, recv, scattering = self._steps[self._at]
        if scattering and self.counts[recv]:
            self.combine(self.starts[recv], self.counts[recv])
        self._at += 1
        own = self.own
        if self.reduced is not None and scattering and not self._steps[self._at][2]:
            if self.counts[own]:
                self.reduced(self.starts[own], self.counts[own])
        return [self._exchange()]


def all_reduce(pg: ProcessGroup, job: AllReduce) -> Optional[Work]:
    """all_reduce in pycoll's ring (pycoll.collectives.ring): a reduce-scatter
    whose steps combine with pycoll's kernels (an AVG's last one dividing too,
    so its division covers this rank's 1/n of the data, in the same pass),
    then an all-gather."""
    tensor, op, how, async_op, key, _ = job
    flat = tensor.reshape(-1)
    n = pg.size()
    name = how.kernel_op(op)
    part = scratch.take(pg, (flat.size // n + 1) * tensor.dtype.itemsize, tensor.dtype)

    def combine(start: int, count: int) -> None:
        # The last reduce-scatter step receives this rank's own part: an AVG
        # divides there, in the same pass as its last sum.
        last = how.average and start == ring.starts[ring.own]
        kernels.reduce(name, part[:count], flat[start : start + count], n if last else None)

    ring = Ring(pg, flat.view(np.uint8), part.view(np.uint8), tensor.dtype.itemsize, combine)
    return run(
        pg, "all_reduce", tensor.nbytes, ring.start, (), async_op, lambda: scratch.give(pg, part),
        [tensor], all_reduce_desc(op, tensor), prescaler(tensor, how.prescale), ring.stages, key,
        path="ring",
    )  # fmt: skip


PATH = paths.register(paths.Path(
    "ring", ("all_reduce",), paths.own_carries, all_reduce, None,
    "a reduce-scatter, then an all-gather, around a ring of the ranks",
))  # fmt: skip
