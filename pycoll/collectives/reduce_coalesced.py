"""all_reduce_coalesced: several arrays of one dtype all-reduced in place as
one MPI operation. The arrays are packed into one buffer, reduced together
and unpacked, so many small arrays cost about as much as one array of their
total size; a list seen before runs through a FusedAllReduce kept for it
(pycoll.fusion)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

from .. import _mpi, kernels
from ..arrays import check_list, check_output, check_same_dtype, same_objects
from ..crosscheck import COUNT, OP_BITS
from ..dispatch import collective
from ..fusion import FusedAllReduce
from ..groups import ProcessGroup, resolve
from ..ops import plan
from ..reduceop import ReduceOp
from ..spec import INOUT, LIST, UNKNOWN, Array
from ..work import Work
from ._common import run

__all__ = ["all_reduce_coalesced"]


def _kept_list(
    tensors: Any,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Any:
    """all_reduce_coalesced's shortcut (pycoll.spec.Spec.known): a list
    whose FusedAllReduce the group keeps (the very same array objects, so
    numpy arrays all) runs through it at once, without the type check of
    every item; any other call is pycoll.spec.UNKNOWN."""
    pg = resolve(group, "all_reduce_coalesced")
    fusions = pg.attached(_FUSIONS) if pg is not None else None
    fused = fusions.find(tensors, op) if fusions is not None else None
    if fused is None or fused.busy():
        return UNKNOWN
    assert pg is not None
    return fused._run(pg, "all_reduce_coalesced", async_op, _coalesced(op, tensors, fused.dtype))


def _coalesced(op: ReduceOp, tensors: List[np.ndarray], dtype: np.dtype) -> Callable[[], str]:
    """all_reduce_coalesced's description for DETAIL's check, whichever way it runs."""
    return lambda: f"all_reduce_coalesced({op.name}, shapes={[t.shape for t in tensors]}, {dtype})"


@collective(Array("tensors", INOUT, LIST), known=_kept_list)
def all_reduce_coalesced(
    tensors: List[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """All-reduce several arrays of one dtype in a single MPI operation, in place.

    The arrays are packed into one buffer, reduced together and unpacked, so
    many small arrays cost about as much as one array of their total size.
    """
    func = "all_reduce_coalesced"
    if (pg := resolve(group, func)) is None:
        return None
    fusions = pg.attached(_FUSIONS)
    fused = fusions.find(tensors, op) if fusions is not None else None
    if fused is None:
        tensors = [
            check_output(func, f"tensors[{i}]", t)
            for i, t in enumerate(check_list(func, "tensors", tensors))
        ]
        if not tensors:
            raise ValueError(f"{func}: tensors is empty; pass at least one array")
        dtype = check_same_dtype(func, tensors)
        how = plan(op, dtype, func)
        if len(tensors) >= FUSE_FROM and sum(t.nbytes for t in tensors) <= FUSE_BYTES:
            if fusions is None:
                fusions = pg.attach(_FUSIONS, _Fusions())
            if fusions.seen_before(tensors, op):
                fused = fusions.add(FusedAllReduce(tensors, op, group), op)
    else:
        dtype = fused.dtype

    desc = _coalesced(op, tensors, dtype)
    if fused is not None and not fused.busy():
        return fused._run(pg, func, async_op, desc)
    how = plan(op, dtype, func)
    flat = np.concatenate([t.reshape(-1) for t in tensors])
    if how.prescale is not None:
        kernels.scale(flat, how.prescale, out=flat)
    n = pg.size()

    def finish() -> None:
        if how.average:
            kernels.divide(flat, n, out=flat)
        offset = 0
        for t in tensors:
            t.reshape(-1)[...] = flat[offset : offset + t.size]
            offset += t.size

    comm = pg.comm
    return run(
        pg,
        func,
        flat.nbytes,
        comm.Iallreduce,
        (_mpi.MPI.IN_PLACE, [flat, how.datatype], how.mpi_op),
        async_op,
        finish,
        tensors,
        desc,
        key=how.key | OP_BITS[func] | flat.size & COUNT,
    )


# A list all_reduce_coalesced has seen before (the same arrays, in the same
# order: a training step's gradients) runs, from its second call, through a
# FusedAllReduce kept for it: one compiled pack, one MPI call, one compiled
# unpack, and no per-array checks, which cost about 2 us an array. Lists of
# at least FUSE_FROM arrays and at most FUSE_BYTES in all; the group keeps
# the last FUSIONS of them (and so their arrays, and a buffer their size).
_FUSIONS = "all_reduce_coalesced.fusions"
FUSE_FROM = 8
FUSE_BYTES = 16 << 20
FUSIONS = 4


class _Fusions:
    """A group's FusedAllReduce for each of its last FUSIONS lists, newest first."""

    def __init__(self) -> None:
        self.kept: List[Any] = []  # [(arrays as a tuple, op, FusedAllReduce)]
        self.last: Any = None  # (arrays, op) of the last list without one

    def seen_before(self, tensors: List[np.ndarray], op: ReduceOp) -> bool:
        """Whether the last list without a FusedAllReduce was this one (then
        it gets one); else remember this one."""
        last = self.last
        if last is not None and last[1] is op and same_objects(last[0], tensors):
            self.last = None
            return True
        self.last = (tuple(tensors), op)
        return False

    def find(self, tensors: Any, op: ReduceOp) -> Optional[FusedAllReduce]:
        """The FusedAllReduce for exactly these array objects and this op, or None."""
        if type(tensors) not in (list, tuple):
            return None
        for i, (arrays, kept_op, fused) in enumerate(self.kept):
            if kept_op is op and same_objects(arrays, tensors):
                if i:
                    self.kept.insert(0, self.kept.pop(i))
                return fused
        return None

    def add(self, fused: FusedAllReduce, op: ReduceOp) -> FusedAllReduce:
        """Keep ``fused`` for its list, dropping the oldest beyond FUSIONS."""
        self.kept.insert(0, (tuple(fused._arrays), op, fused))
        del self.kept[FUSIONS:]
        return fused
