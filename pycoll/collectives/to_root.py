"""pycoll's own reduce on a group of two ranks, for large arrays.

The rank that is not the root sends its array to the root in pieces of
``CHUNK`` bytes; the root receives each piece aside and folds it into its
own array with pycoll's kernel (pycoll.kernels.reduce), the next piece's
receive started before the fold. MPI's own reduce falls to 1-1.5 GB/s from
16-32 MiB on 2 ranks of the CI VM (MPICH 5.0.2 and Open MPI 5.0.11), where
this took a fraction of its time (docs/benchmarks.md, "Which path wins
where");
pycoll.paths chooses it by size.

Only the root's array changes (the other rank's is only read); the pieces
the root receives go into a buffer of two pieces, not one the size of the
array. Messages go over the group's side communicator (pycoll.watch.
side_comm) with a tag from the call's sequence number, as the ring's
(pycoll.collectives.ring): two calls in flight never match. One collective:
one sequence number, one DETAIL check, one Work whose stages are the pieces
(pycoll.work).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _mpi, kernels, paths
from ..groups import ProcessGroup
from ..work import Work
from . import scratch
from ._common import run
from ._reduction import Reduce, prescaler, reduce_desc, scaled
from .ring import side

__all__ = ["ToRoot", "CHUNK"]

CHUNK = 4 << 20  # bytes a piece carries (the pairwise exchange's, pycoll.collectives.pairwise)


class ToRoot:
    """One reduce on two ranks as a first MPI operation (:meth:`start`), the
    pieces after it (:attr:`stages`) and the fold of the last
    (:meth:`finish`), for :func:`pycoll.collectives._common.run`, which
    counts, checks and waits for them.

    Args:
        pg: the group (two ranks).
        data: this rank's array, 1-d and C-contiguous: on the root the
            input and the result; elsewhere what is sent (the input, or a
            PREMUL_SUM's scaled copy).
        root: the root's rank in the group.
        scratch: on the root, room for :meth:`needs` elements of the array's
            dtype; None elsewhere.
        fold: on the root, ``fold(src, dst)`` combines ``src`` into ``dst``
            in place (``dst = op(src, dst)``); None elsewhere.
    """

    def __init__(
        self,
        pg: Any,
        data: np.ndarray,
        root: int,
        scratch: Optional[np.ndarray],
        fold: Optional[Callable[[np.ndarray, np.ndarray], None]],
    ) -> None:
        self.pg, self.data, self.scratch, self.fold = pg, data, scratch, fold
        self.is_root = pg.rank() == root
        self.peer = 1 - pg.rank()
        per = self.piece(data)
        self._pieces: List[Tuple[int, int]] = [
            (a, min(a + per, data.size)) for a in range(0, data.size, per)
        ]
        self.comm: Any = None
        self.tag = 0
        self._at = 0
        self.stages = [self._next for _ in range(len(self._pieces) - 1)]

    @staticmethod
    def piece(data: np.ndarray) -> int:
        """Elements a piece carries."""
        return max(1, min(CHUNK // data.dtype.itemsize, data.size))

    @staticmethod
    def needs(data: np.ndarray) -> int:
        """Elements of scratch the root needs (two pieces)."""
        return 2 * ToRoot.piece(data) if data.size > ToRoot.piece(data) else data.size

    def start(self) -> Any:
        """Start the first piece (called under the group's lock, once the
        call is counted: the tag comes from its sequence number)."""
        pg = self.pg
        if not self._pieces:  # nothing to send
            return _mpi.MPI.REQUEST_NULL
        self.comm, self.tag = side(pg, "reduce")
        return self._move(0)

    def _slot(self, i: int) -> np.ndarray:
        """Where piece ``i`` is received on the root."""
        assert self.scratch is not None
        a, b = self._pieces[i]
        base = (i % 2) * self.piece(self.data)
        return self.scratch[base : base + b - a]

    def _move(self, i: int) -> Any:
        """Send piece ``i``, or start receiving it on the root."""
        byte = _mpi.MPI.BYTE
        if self.is_root:
            return self.comm.Irecv([self._slot(i).view(np.uint8), byte], self.peer, self.tag)
        a, b = self._pieces[i]
        return self.comm.Isend([self.data[a:b].view(np.uint8), byte], self.peer, self.tag)

    def _fold(self, i: int) -> None:
        assert self.fold is not None
        a, b = self._pieces[i]
        self.fold(self._slot(i), self.data[a:b])

    def _next(self) -> List[Any]:
        """Start the next piece, then (on the root) fold the one just received."""
        i = self._at
        self._at += 1
        request = self._move(i + 1)
        if self.is_root:
            self._fold(i)
        return [request]

    def finish(self) -> None:
        """Fold the last piece on the root (once it has come)."""
        if self._pieces and self.is_root:
            self._fold(len(self._pieces) - 1)


def reduce(pg: ProcessGroup, job: Reduce) -> Optional[Work]:
    """reduce on two ranks by pycoll's own path (pycoll.collectives.
    to_root). The root's array is scaled first for a PREMUL_SUM (once the
    call check has passed) and each piece is folded into it (an AVG's
    division in the same pass: each element is folded once); the other
    rank sends its array, or a PREMUL_SUM's scaled copy, and keeps it."""
    tensor, dst, root, op, how, async_op, key = job
    flat = tensor.reshape(-1)
    if root == pg.rank():
        fold = kernels.folder(how.kernel_op(op), tensor.dtype, 2 if how.average else None)
        room = scratch.take(pg, ToRoot.needs(flat) * tensor.dtype.itemsize, tensor.dtype)
        steps = ToRoot(pg, flat, root, room, fold)
        prepare = prescaler(tensor, how.prescale)

        def finish() -> None:
            steps.finish()
            scratch.give(pg, room)

    else:
        send = flat if how.prescale is None else scaled(flat, how.prescale)
        steps = ToRoot(pg, send, root, None, None)  # (it only sends: nothing to fold)
        prepare, finish = None, steps.finish
    return run(
        pg, "reduce", tensor.nbytes, steps.start, (), async_op, finish, [tensor],
        lambda: reduce_desc(op, dst, tensor), prepare, steps.stages or None, key, path="to_root",
    )  # fmt: skip


PATH = paths.register(paths.Path(
    "to_root", ("reduce",), paths.own_carries, reduce, None,
    "the other rank sends its array in pieces, the root folds each in",
))  # fmt: skip
