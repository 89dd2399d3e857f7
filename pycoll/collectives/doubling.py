"""pycoll's own all_reduce by recursive doubling, for groups of a power of two.

At step k this rank exchanges its whole array with rank ``me ^ 2**k`` and
folds what came into it with pycoll's kernel (pycoll.kernels.reduce): after
log2(n) steps every rank holds the reduction of all n arrays. Each step is
one message each way, sent at once by both ranks, where a binomial tree (a
reduce to one rank, then a broadcast back) takes two messages one after the
other on two ranks, and 2 log2(n) on n.

It is for Open MPI, whose nonblocking all_reduce (libnbc) takes its binomial
tree for every call made in place, as pycoll's are, unless an algorithm is
chosen for it: there it cost 1.5-2.0x Open MPI's blocking all_reduce's time
at 8-512 KiB on 2 ranks of the CI VM (docs/measurements/all_reduce_paths.py).
pycoll.paths chooses it by size.

The results are the same on every rank, bit for bit. At each step the two
ranks of a pair fold the same two values, each the reduction of one half of
the ranks they stand for. Most of pycoll's ops give the same bits in either
order (SUM and PRODUCT of integers and IEEE floats, complex included, but
for which NaN's payload comes out; the logical and bitwise ops). MIN and MAX
of floats do not: min(0.0, -0.0) is -0.0 and min(-0.0, 0.0) is 0.0. For
those (``ordered``) both ranks of a pair fold the lower half's value first:
the lower rank folds into the copy it received, which then holds its result,
and the array is copied back once at the end where the last result is not
in it. An AVG divides in the last fold: every rank divides the same sum.

Messages go over the group's side communicator (pycoll.watch.side_comm)
with a tag from the call's sequence number, as the ring's (pycoll.
collectives.ring). One collective: one sequence number, one DETAIL check,
one Work whose stages are the steps (pycoll.work).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

from .. import _mpi, kernels, paths
from ..groups import ProcessGroup
from ..ops import order_matters
from ..work import Work
from . import scratch
from ._common import run
from ._reduction import AllReduce, all_reduce_desc, prescaler
from .ring import Steps

__all__ = ["Doubling", "applies"]


def applies(n: int) -> bool:
    """Whether a group of ``n`` ranks can run it (more than one rank, a power of two)."""
    return n > 1 and n & (n - 1) == 0


class Doubling(Steps):
    """One all_reduce, in place, as a first MPI operation (:meth:`start`),
    the steps after it (:attr:`stages`) and the last fold (:meth:`finish`),
    for :func:`pycoll.collectives._common.run`, which counts, checks and
    waits for them.

    Args:
        pg: the group (its size a power of two: :func:`applies`).
        data: the array, 1-d and C-contiguous: the input, and the result.
        scratch: room for the peer's copy: an array like ``data``.
        fold: ``fold(src, dst, last)`` combines ``src`` into ``dst`` in
            place (``dst = op(src, dst)``); ``last`` is True for the last
            step (an AVG divides there).
        ordered: the op's result depends on its operands' order (MIN and
            MAX of floats): both ranks of a pair fold the lower half first.
    """

    def __init__(
        self,
        pg: Any,
        data: np.ndarray,
        scratch: np.ndarray,
        fold: Callable[[np.ndarray, np.ndarray, bool], None],
        ordered: bool,
    ) -> None:
        self.fold, self.ordered = fold, ordered
        n, me = pg.size(), pg.rank()
        self.me = me
        self._arrays = (data, scratch)
        self._bytes = (data.view(np.uint8), scratch.view(np.uint8))
        self._holds = 0  # which of the two holds this rank's value so far
        super().__init__(pg, [me ^ bit for bit in (1 << k for k in range(n.bit_length() - 1))])

    def _exchange(self) -> Any:
        peer, byte, held = self._steps[self._at], _mpi.MPI.BYTE, self._holds
        return self.comm.Isendrecv(
            [self._bytes[held], byte], peer, self.tag, [self._bytes[1 - held], byte], peer, self.tag
        )

    def _fold(self, last: bool) -> None:
        """Fold the copy just received into this rank's value."""
        held = self._holds
        mine, theirs = self._arrays[held], self._arrays[1 - held]
        if self.ordered and self.me < self._steps[self._at]:
            self.fold(mine, theirs, last)  # the lower half's first; the result in theirs
            self._holds = 1 - held
        else:
            self.fold(theirs, mine, last)

    def _next(self) -> List[Any]:
        """Fold the copy just received, then start the next step."""
        self._fold(False)
        self._at += 1
        return [self._exchange()]

    def finish(self) -> None:
        """Fold the last step's copy (once its exchange is done), and copy the
        result into the array where it lies in the scratch."""
        if self._steps:
            self._fold(True)
            if self._holds:
                self._arrays[0][...] = self._arrays[1]


def all_reduce(pg: ProcessGroup, job: AllReduce) -> Optional[Work]:
    """all_reduce by pycoll's recursive doubling (pycoll.collectives.
    doubling), folding with pycoll's kernels (an AVG dividing in the last
    fold)."""
    tensor, op, how, async_op, key, _ = job
    flat = tensor.reshape(-1)
    n = pg.size()
    name = how.kernel_op(op)
    peer = scratch.take(pg, tensor.nbytes, tensor.dtype, scratch.KEEP_FROM_LEAST)
    fold_in = kernels.folder(name, tensor.dtype)
    average = kernels.folder(name, tensor.dtype, n) if how.average else fold_in

    def fold(src: np.ndarray, dst: np.ndarray, last: bool) -> None:
        (average if last else fold_in)(src, dst)

    steps = Doubling(pg, flat, peer, fold, order_matters(name, tensor.dtype))

    def finish() -> None:
        try:
            steps.finish()
        finally:
            scratch.give(pg, peer)

    return run(
        pg,
        "all_reduce",
        tensor.nbytes,
        steps.start,
        (),
        async_op,
        finish,
        [tensor],
        all_reduce_desc(op, tensor),
        prescaler(tensor, how.prescale),
        steps.stages or None,  # (two ranks: one step, run's lean path)
        key,
        path="doubling",
    )


PATH = paths.register(paths.Path(
    "doubling", ("all_reduce",), paths.own_carries, all_reduce, None,
    "recursive doubling: each rank folds its peer's copy in",
))  # fmt: skip
