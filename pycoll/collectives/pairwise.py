"""pycoll's own reduce-scatter, by pairwise exchange, for large inputs.

In n - 1 steps this rank sends rank ``me + k`` its part of the input and
receives rank ``me - k``'s copy of this rank's part, and pycoll's kernel
(pycoll.kernels.reduce) folds what came into the output. It is MPICH's own
algorithm for large reduce-scatters, less what MPI's call adds around it:

- the output is reduced into where it is. torch's in-place form (the output
  this rank's part of the input) needs no buffer beside the input and no
  copy into place, since this rank's part is never sent; out of place, the
  first step receives straight into the output and folds this rank's part
  in, where MPI first copies that part into the output;
- each step's part is cut into pieces of ``CHUNK`` bytes, and a piece's
  exchange is started before the piece before it is folded in, so the
  kernel's pass overlaps the next message and reads what just came from the
  cache.

On 2 ranks of the 2-core CI VM (float32 SUM, either form) it took
0.58-0.76x mpi4py's time at 2-16 MiB on MPICH 5.0.2 and 0.16-0.25x at
64 MiB, where MPICH's call falls to 3 GB/s; 0.07-0.68x at 2-64 MiB on Open
MPI (docs/measurements/rs_paths.py). pycoll.paths chooses it by
size.

Messages go over the group's side communicator (pycoll.watch.side_comm) with
a tag from the call's sequence number, as the ring's (pycoll.collectives.
ring): between two ranks they come in the order they were sent, and two calls
in flight never match. One collective: one sequence number, one DETAIL check,
one Work whose stages are the steps (pycoll.work).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _mpi, kernels, paths
from ..crosscheck import COUNT, OP_BITS
from ..groups import ProcessGroup
from ..work import Work
from . import scratch
from ._common import run
from ._reduction import ReduceScatter, aside
from .ring import side

__all__ = ["Pairwise", "CHUNK"]

CHUNK = 4 << 20  # bytes a step exchanges at a time (1 MiB and 256 KiB measured slower)


class Pairwise:
    """One reduce-scatter as a first MPI operation (:meth:`start`), the steps
    after it (:attr:`stages`) and the fold of the last (:meth:`finish`), for
    :func:`pycoll.collectives._common.run`, which counts, checks and waits
    for them.

    Args:
        pg: the group.
        func: the collective (named in a timeout's diagnosis).
        parts: this rank's input, one array per rank of the group, each
            shaped like ``output`` (1-d, C-contiguous).
        output: receives this rank's reduced part: ``parts[rank]`` itself
            (reduced in place) or an array overlapping none of the parts.
        in_place: whether ``output`` is ``parts[rank]``.
        scratch: room for :meth:`needs` elements of the output's dtype (two
            pieces, or None where the group has 2 ranks out of place).
        fold: ``fold(src, dst, last)`` combines ``src`` into ``dst`` in place
            (``dst = op(src, dst)``); ``last`` is True for each piece's last
            fold (an AVG divides there, in the same pass).
    """

    def __init__(
        self,
        pg: Any,
        func: str,
        parts: List[np.ndarray],
        output: np.ndarray,
        in_place: bool,
        scratch: Optional[np.ndarray],
        fold: Callable[[np.ndarray, np.ndarray, bool], None],
    ) -> None:
        self.pg, self.func, self.parts, self.output, self.fold = pg, func, parts, output, fold
        self.in_place, self.scratch = in_place, scratch
        n, me = pg.size(), pg.rank()
        self.me = me
        per = self.piece(output)
        count = output.size
        # (peer it sends to, peer it receives from, first, end, step): the
        # pieces of step 1, then of step 2, ...
        self._steps: List[Tuple[int, int, int, int, int]] = [
            ((me + k) % n, (me - k) % n, a, min(a + per, count), k)
            for k in range(1, n)
            for a in range(0, count, per)
        ]
        self.last = n - 1
        self.comm: Any = None
        self.tag = 0
        self._at = 0
        self.stages = [self._next for _ in range(len(self._steps) - 1)]

    @staticmethod
    def piece(output: np.ndarray) -> int:
        """Elements a step exchanges at a time."""
        return max(1, min(CHUNK // output.dtype.itemsize, output.size))

    @staticmethod
    def needs(n: int, in_place: bool, output: np.ndarray) -> int:
        """Elements of scratch a call on ``n`` ranks needs (0: none)."""
        if n == 2 and not in_place:
            return 0  # every piece is received straight into the output
        return 2 * Pairwise.piece(output)

    def _into(self, i: int) -> np.ndarray:
        """Where piece ``i`` is received: the output itself for the first
        step out of place (this rank's part folded in after), else scratch."""
        _, _, a, b, k = self._steps[i]
        if k == 1 and not self.in_place:
            return self.output[a:b]
        assert self.scratch is not None
        base = (i % 2) * self.piece(self.output)
        return self.scratch[base : base + b - a]

    def start(self) -> Any:
        """Start the first step (called under the group's lock, once the call
        is counted: the tag comes from its sequence number)."""
        pg = self.pg
        if not self._steps:  # one rank, or nothing to send
            if not self.in_place:
                self.output[...] = self.parts[self.me]
            return _mpi.MPI.REQUEST_NULL
        self.comm, self.tag = side(pg, self.func)
        return self._exchange(0)

    def _exchange(self, i: int) -> Any:
        to, source, a, b, _ = self._steps[i]
        dtype = _mpi.MPI.BYTE
        send = self.parts[to][a:b].view(np.uint8)
        return self.comm.Isendrecv(
            [send, dtype], to, self.tag, [self._into(i).view(np.uint8), dtype], source, self.tag
        )

    def _fold(self, i: int) -> None:
        _, _, a, b, k = self._steps[i]
        into = self.output[a:b]
        if k == 1 and not self.in_place:
            self.fold(self.parts[self.me][a:b], into, k == self.last)
        else:
            self.fold(self._into(i), into, k == self.last)

    def _next(self) -> List[Any]:
        """Start the next piece's exchange, then fold the piece just received."""
        i = self._at
        self._at += 1
        request = self._exchange(i + 1)
        self._fold(i)
        return [request]

    def finish(self) -> None:
        """Fold the last piece (once the last exchange is done)."""
        if self._steps:
            self._fold(len(self._steps) - 1)


def reduce_scatter(pg: ProcessGroup, job: ReduceScatter) -> Optional[Work]:
    """``parts`` (one array shaped like ``output`` per rank) reduce-scattered
    into ``output`` by pycoll's pairwise exchange (pycoll.collectives.
    pairwise), folding with pycoll's kernels (an AVG's division in each
    element's last fold). An output that is this rank's part itself (torch's
    in-place form) is reduced where it is; one overlapping the parts
    otherwise receives aside and is copied in at the end. A PREMUL_SUM's
    parts are scaled into a copy first: the input is left as it is."""
    func, output, parts, op, how, async_op, desc, _ = job
    n = pg.size()
    dtype = output.dtype
    flats = [part.reshape(-1) for part in parts]
    if how.prescale is not None:
        send = np.concatenate(flats)
        kernels.scale(send, how.prescale, out=send)
        count = output.size
        flats = [send[d * count : (d + 1) * count] for d in range(n)]
    mine, beside, then = aside(pg, output, flats)
    into = (output if beside is None else beside).reshape(-1)
    in_place = mine and beside is None
    name = how.kernel_op(op)
    divisor = n if how.average else None

    def fold(src: np.ndarray, dst: np.ndarray, last: bool) -> None:
        kernels.reduce(name, src, dst, divisor if last else None)

    need = Pairwise.needs(n, in_place, into)
    room = scratch.take(pg, need * dtype.itemsize, dtype) if need else None
    steps = Pairwise(pg, func, flats, into, in_place, room, fold)

    def finish() -> None:
        steps.finish()
        if room is not None:
            scratch.give(pg, room)
        if then is not None:
            then()

    return run(
        pg, func, output.nbytes * n, steps.start, (), async_op, finish, [output], desc, None,
        steps.stages, how.key | OP_BITS[func] | output.size & COUNT, path="pairwise",
    )  # fmt: skip


def _two_ranks(c: paths.Call) -> bool:
    return c.ranks == 2


PATH = paths.register(
    paths.Path(
        "pairwise",
        ("reduce_scatter", "reduce_scatter_tensor"),
        paths.own_carries,
        reduce_scatter,
        None,
        "each rank sends every other its part, folding as they come",
        trials=_two_ranks,  # (on 4 ranks no faster than MPI's call or the window: rule.py)
    )
)
