"""Coalesced all-gather and reduce-scatter: many arrays, one MPI operation.

torch hands a group many arrays at once (c10d's
``allgather_into_tensor_coalesced`` and ``reduce_scatter_tensor_coalesced``,
which ``torch.distributed._coalescing_manager`` and the functional
``*_coalesced`` collectives reach). One MPI operation per array pays MPI's
latency and pycoll's per-call work for each: on 2 ranks, 1,000 arrays of
1 KiB took 47 ms as separate all-gathers against 0.3 ms for one all-gather of
their total size. Here a list is one operation:

1. the inputs are copied into one buffer by one compiled call
   (pycoll.kernels.copy_pieces) from a table of (target, source, bytes)
   pieces, which numpy builds from the arrays' addresses and sizes;
2. one MPI all-gather (of bytes, so any dtypes mix) or one reduce-scatter
   (one dtype; every op and dtype of reduce_scatter_tensor, pycoll's kernels
   included) moves it;
3. once it is complete, the results are copied out the same way.

On one node an all-gather of SHM_FROM bytes a rank or more skips all three:
each rank copies its arrays straight into its half of the group's shared
window and every rank's straight out to the outputs
(pycoll.collectives.shm.Gathered), so neither pycoll nor MPI copies through
a buffer between. So does a reduce-scatter of SHM_SCATTER_FROM bytes of
input a rank or more: each rank copies its inputs into the window laid out
as the packed blocks below, reduces its own block across every rank's copy
there, and copies it straight out (pycoll.collectives.shm.Blocks).

Layouts, for a group of n ranks:

- all-gather: each rank packs its inputs back to back (S bytes) and
  receives n such blocks, rank by rank; rank r's input i goes wherever the
  caller's table says (for an output per input, bytes ``[r*b_i, (r+1)*b_i)``
  of output i, where input i has b_i bytes);
- reduce-scatter: the send buffer holds n blocks, block r the r-th part of
  every input back to back, so MPI's block r is what rank r keeps; this
  rank's reduced block is copied out to the outputs (or the results are
  views of it: :func:`reduce_scatter_parts` without outputs).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _mpi, crosscheck, kernels
from ..arrays import (
    check_input,
    check_list,
    check_output,
    check_same_dtype,
    check_size,
    each_labelled,
    same_objects,
)
from ..dispatch import collective
from ..groups import ProcessGroup, resolve
from ..reduceop import ReduceOp
from ..spec import IN, LIST, OUT, UNKNOWN, Array
from ..work import Work
from . import scratch, shm
from ._common import run
from ._reduction import plan_of, reduce_scatter_block

__all__ = [
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "addresses",
    "all_gather_bytes",
    "reduce_scatter_parts",
    "checked",
    "signature",
]


_BYTE = np.dtype(np.uint8)
# Send and receive buffers from this many bytes are the group's kept ones
# (pycoll.collectives.scratch): new ones of 1,000 KiB cost 0.5 ms of page
# faults per call here, ten times the copy into them.
KEEP_FROM = scratch.KEEP_FROM_LEAST
# From this many bytes a rank, an all-gather whose ranks share one node copies
# each rank's arrays straight into the group's shared window and every rank's
# straight out to the outputs (pycoll.collectives.shm.Gathered): no pack, no
# MPI copies, no unpack. Measured against the packed path from 16 KiB to
# 16 MiB a rank (docs/measurements/gather_window.py): 0.46-0.86x its time on 2
# ranks (1.04 at 2 MiB), 0.42-0.59x on 4. 0 turns it off.
SHM_FROM = 16 << 10
# From this many bytes of input a rank, a reduce-scatter whose ranks share one
# node copies each rank's inputs straight into the group's shared window,
# reduces its own parts there and copies them straight out to the outputs
# (pycoll.collectives.shm.Blocks): no pack, no MPI copies, no unpack. Measured
# against the packed path from 16 KiB to 16 MiB
# (docs/measurements/scatter_window.py): from 256 KiB 0.42-0.72x its time on 2
# ranks, 0.52-0.90x on 3 and 4; at 128 KiB level on 3 and 4; below, slower (the
# barrier costs more than the copies saved). 0 turns it off.
SHM_SCATTER_FROM = 256 << 10


def addresses(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Each (C-contiguous) array's address, as int64. MPI's buffer costs a
    sixth of numpy's ``ctypes.data`` per array, which counts at 1,000 arrays."""
    address = _mpi.MPI.buffer
    return np.array([address(a).address for a in arrays], np.int64)


def _offsets(sizes: np.ndarray) -> Tuple[np.ndarray, int]:
    """Where each of ``sizes`` bytes starts when packed back to back, and the total."""
    offsets = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return offsets, int(sizes.sum())


def _ranks(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)[:, None]


class Gather:
    """One list's all-gather: the tables its calls copy by, made once from
    its checked arrays. ``inputs`` are C-contiguous host arrays of any
    dtypes; rank r's ``inputs[i]`` goes to address ``targets[r, i]`` (an
    (n, K) int64 table)."""

    def __init__(self, n: int, inputs: List[np.ndarray], targets: np.ndarray) -> None:
        sizes = np.array([x.nbytes for x in inputs], np.int64)
        self.sizes = sizes
        self.offsets, self.total = _offsets(sizes)
        self.sources = addresses(inputs)
        self.targets = targets.reshape(-1)
        self.received = (self.total * _ranks(n) + self.offsets).reshape(-1)  # in the buffer
        self.every = np.tile(sizes, n)
        self.n = n
        self._gathered: Any = None  # the copy tables into the group's shared window

    def run(
        self,
        pg: ProcessGroup,
        func: str,
        result: Any,
        async_op: bool,
        desc: Union[str, Callable[[], str], None],
    ) -> Optional[Work]:
        """One call, as the collective ``func``; ``result`` is what its Work
        hands back. On one node, from SHM_FROM bytes a rank, through the
        group's shared window (pycoll.collectives.shm.Gathered)."""
        total = self.total
        key = crosscheck.key(func, None, total)
        if total >= SHM_FROM > 0 and (win := shm.for_copies(pg, func)) is not None:
            data = self._gathered
            if data is None or data.win is not win:  # (tables into this window's memory)
                targets = self.targets.reshape(self.n, -1)
                data = shm.Gathered(win, self.sources, self.sizes, self.offsets, targets)
                self._gathered = data
            return shm.all_gather(pg, win, func, data, async_op, result, desc, key)
        send = scratch.take(pg, total, _BYTE, KEEP_FROM)
        kernels.copy_pieces(addresses([send]) + self.offsets, self.sources, self.sizes, total)
        recv = scratch.take(pg, self.n * total, _BYTE, KEEP_FROM)
        sources = addresses([recv]) + self.received

        def finish() -> None:
            kernels.copy_pieces(self.targets, sources, self.every, recv.nbytes)
            scratch.give(pg, send)
            scratch.give(pg, recv)

        byte = _mpi.MPI.BYTE
        return run(
            pg,
            func,
            recv.nbytes,
            pg.comm.Iallgather,
            ([send, byte], [recv, byte]),
            async_op,
            finish,
            result,
            desc,
            key=key,
        )


def all_gather_bytes(
    pg: ProcessGroup,
    func: str,
    inputs: List[np.ndarray],
    targets: np.ndarray,
    result: Any,
    async_op: bool,
    desc: Union[str, Callable[[], str], None],
) -> Optional[Work]:
    """:class:`Gather` of ``inputs`` into ``targets``, one call."""
    return Gather(pg.size(), inputs, targets).run(pg, func, result, async_op, desc)


class Scatter:
    """One list's reduce-scatter: the tables its calls copy by, made once
    from its checked arrays. ``inputs`` are C-contiguous host arrays of
    ``dtype``, each of n equal parts; this rank's part of input i goes to
    ``outputs[i]`` (None: the caller reads it from the returned buffer)."""

    def __init__(
        self,
        n: int,
        inputs: List[np.ndarray],
        outputs: Optional[List[np.ndarray]],
        dtype: np.dtype,
        op: ReduceOp,
        func: str,
    ) -> None:
        self.how = plan_of(op, dtype, func)  # raises for an undefined (op, dtype)
        self.dtype, self.op = dtype, op
        parts = np.array([x.nbytes for x in inputs], np.int64) // n
        self.parts = parts
        self.offsets, self.total = _offsets(parts)
        self.inputs = addresses(inputs)
        self.sources = (self.inputs + _ranks(n) * parts).reshape(-1)
        self.packed = (self.total * _ranks(n) + self.offsets).reshape(-1)  # in the buffer
        self.every = np.tile(parts, n)
        self.places = addresses(outputs) if outputs is not None else None
        self.result = outputs
        self.n = n
        self._blocks: Any = None  # the copy tables into the group's shared window
        self._apart: Optional[bool] = None  # whether the window path may write the outputs

    def apart(self, rank: int) -> bool:
        """Whether writing the outputs chunk by chunk (the window path) leaves
        every input byte a later chunk reads alone: the inputs and the
        outputs share no byte, except that an output may be exactly its
        input's part for ``rank`` (torch's in-place form), which only its
        own chunk reads. Otherwise the window path receives aside and copies
        out at the end (the path itself must not depend on it: it is this
        rank's alone)."""
        if self._apart is None:
            if self.places is None:  # (results in a new buffer)
                self._apart = True
            else:
                sizes = self.parts * self.n
                own = self.places == self.inputs + rank * self.parts
                starts = np.concatenate([self.inputs, self.places[~own]])
                lengths = np.concatenate([sizes, self.parts[~own]])
                starts = starts[lengths > 0]
                ends = (starts + lengths[lengths > 0])[np.argsort(starts, kind="stable")]
                starts = np.sort(starts, kind="stable")
                self._apart = bool(np.all(np.maximum.accumulate(ends)[:-1] <= starts[1:]))
        return self._apart

    def _through(
        self, pg: ProcessGroup, win: Any, func: str, async_op: bool, desc: Callable[[], str]
    ) -> Tuple[Optional[Work], Optional[np.ndarray]]:
        """:meth:`run` through the group's shared window ``win``
        (pycoll.collectives.shm.Blocks): the results straight into the
        outputs, or into a new buffer where there are none (returned), or
        aside and copied out at the end where the outputs overlap the inputs
        otherwise than in torch's in-place form (:meth:`apart`)."""
        how, dtype, total, places = self.how, self.dtype, self.total, self.places
        data = self._blocks
        if data is None or data.win is not win:  # (tables into this window's memory)
            data = shm.Blocks(
                win, self.inputs, self.parts, self.offsets, dtype, how.prescale, places
            )
            self._blocks = data
        key = how.key | crosscheck.OP_BITS[func] | (total // dtype.itemsize) & crosscheck.COUNT
        op = self.op
        if places is None:
            recv = np.empty(total // dtype.itemsize, dtype)
            work = shm.reduce_scatter(
                pg, win, func, data, op, how, recv, async_op, [recv], desc, key
            )
            return work, recv
        if self.apart(pg.rank()):
            work = shm.reduce_scatter(
                pg, win, func, data, op, how, None, async_op, self.result, desc, key
            )
            return work, None
        aside = scratch.take(pg, total, dtype, KEEP_FROM)
        received = addresses([aside]) + self.offsets

        def then() -> None:
            kernels.copy_pieces(places, received, self.parts, total)
            scratch.give(pg, aside)

        work = shm.reduce_scatter(
            pg, win, func, data, op, how, aside, async_op, self.result, desc, key, then
        )
        return work, None

    def run(
        self, pg: ProcessGroup, func: str, async_op: bool, desc: Callable[[], str]
    ) -> Tuple[Optional[Work], Optional[np.ndarray]]:
        """One call, as the collective ``func``: its Work (None if
        synchronous) and the buffer receiving this rank's parts back to back
        (the results, where there are no outputs; None where the window
        path puts them straight into the outputs)."""
        how, dtype, total = self.how, self.dtype, self.total
        if (
            self.n * total >= SHM_SCATTER_FROM > 0
            and (win := shm.for_scatter(pg, how, dtype, func)) is not None
        ):
            return self._through(pg, win, func, async_op, desc)
        send = scratch.take(pg, self.n * total, _BYTE, KEEP_FROM)
        targets = addresses([send]) + self.packed
        kernels.copy_pieces(targets, self.sources, self.every, send.nbytes)
        data = send.view(dtype)
        if how.prescale is not None:
            kernels.scale(data, how.prescale, out=data)
        places = self.places
        if places is None:  # the results are views of it: the caller's for good
            recv = np.empty(total // dtype.itemsize, dtype)
        else:
            recv = scratch.take(pg, total, dtype, KEEP_FROM)
            mine = addresses([recv]) + self.offsets

        def then() -> None:
            scratch.give(pg, send)
            if places is not None:
                kernels.copy_pieces(places, mine, self.parts, total)
                scratch.give(pg, recv)

        work = reduce_scatter_block(pg, func, data, recv, how, async_op, desc, then=then)
        return work, recv


def reduce_scatter_parts(
    pg: ProcessGroup,
    func: str,
    inputs: List[np.ndarray],
    outputs: Optional[List[np.ndarray]],
    dtype: np.dtype,
    op: ReduceOp,
    async_op: bool,
    desc: Callable[[], str],
) -> Tuple[Optional[Work], Optional[np.ndarray]]:
    """:class:`Scatter` of ``inputs`` into ``outputs``, one call: its Work and,
    where ``outputs`` is None, the array the results are views of."""
    return Scatter(pg.size(), inputs, outputs, dtype, op, func).run(pg, func, async_op, desc)


# A list given again (the very same array objects, in the same order: a
# training step's gradients or parameters) skips the checks of its arrays and
# the making of its tables, which cost about 1 us an array: from its second
# call the group keeps its plan, for its last KEPT such lists (and so their
# arrays), as all_reduce_coalesced keeps a FusedAllReduce. Keep the arrays
# and update them in place between calls.
_KEPT = "collectives.coalesced.kept"
KEPT = 4


class _Kept:
    """A group's plans for its last KEPT lists seen twice, newest first, as
    entries (func, op, inputs, outputs, plan, description, result), the
    lists as tuples (outputs a tuple of tuples where nested); and, for each
    collective, the last list seen without one."""

    def __init__(self) -> None:
        self.plans: List[Tuple[Any, ...]] = []
        self.last: Dict[str, Tuple[Any, ...]] = {}  # func -> its last list without one

    def find(self, func: str, op: Any, inputs: Any, outputs: Any) -> Any:
        """The entry for exactly these array objects, or None."""
        if type(inputs) not in (list, tuple) or type(outputs) not in (list, tuple):
            return None
        for i, entry in enumerate(self.plans):
            if _matches(entry, func, op, inputs, outputs):
                if i:
                    self.plans.insert(0, self.plans.pop(i))
                return entry
        return None

    def remember(self, entry: Tuple[Any, ...]) -> None:
        """Keep ``entry``'s plan if the last list seen was this one, else
        remember this one as the last."""
        func = entry[0]
        last = self.last.pop(func, None)
        if last is not None and _matches(last, func, entry[1], entry[2], entry[3]):
            self.plans.insert(0, entry)
            del self.plans[KEPT:]
        else:
            self.last[func] = entry[:4]


def _matches(entry: Tuple[Any, ...], func: str, op: Any, inputs: Any, outputs: Any) -> bool:
    if entry[0] != func or entry[1] is not op or not same_objects(entry[2], inputs):
        return False
    kept = entry[3]
    if kept and type(kept[0]) is tuple:  # (all_gather_coalesced's list per rank)
        return (
            len(kept) == len(outputs)
            and all(type(o) in (list, tuple) for o in outputs)
            and all(map(same_objects, kept, outputs))
        )
    return same_objects(kept, outputs)


def kept(pg: ProcessGroup, func: str, op: Any, inputs: Any, outputs: Any) -> Any:
    """The group's kept entry for this call's lists, or None."""
    plans = pg.attached(_KEPT)
    return plans.find(func, op, inputs, outputs) if plans is not None else None


def remember(
    pg: ProcessGroup,
    func: str,
    op: Any,
    inputs: List[Any],
    outputs: List[Any],
    plan: Any,
    desc: Any,
    result: Any,
) -> None:
    """:meth:`_Kept.remember` this call's lists and plan, for the group.
    ``outputs`` may be a list of lists (one per rank)."""
    plans = pg.attached(_KEPT)
    if plans is None:
        plans = pg.attach(_KEPT, _Kept())
    if outputs and isinstance(outputs[0], list):
        outs: Tuple[Any, ...] = tuple(tuple(o) for o in outputs)
    else:
        outs = tuple(outputs)
    plans.remember((func, op, tuple(inputs), outs, plan, desc, result))


def checked(
    func: str, name: str, arrays: Any, check: Callable[[str, str, Any], np.ndarray]
) -> List[np.ndarray]:
    """``check(func, name[i], arrays[i])`` of each item of the list ``arrays``,
    the names made only where one fails (pycoll.arrays.each_labelled)."""
    items = check_list(func, name, arrays)
    return each_labelled(items, lambda x, at: check(func, name + at, x))


def _pairs(
    func: str, outputs: Any, inputs: Any, out_name: str, in_name: str
) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """The checked (outputs, inputs) of a coalesced call: two lists of one
    length, not empty, each output of its input's dtype."""
    ins = checked(func, in_name, inputs, check_input)
    outs = checked(func, out_name, outputs, check_output)
    if len(outs) != len(ins):
        raise ValueError(
            f"{func}: {out_name} has {len(outs)} arrays for {len(ins)} in {in_name}; "
            f"pass one output per input"
        )
    if not ins:
        raise ValueError(f"{func}: {in_name} is empty; pass at least one array")
    for i, (out, x) in enumerate(zip(outs, ins)):
        if out.dtype != x.dtype:
            raise ValueError(
                f"{func}: {out_name}[{i}] has dtype {out.dtype} but {in_name}[{i}] has "
                f"{x.dtype}; each output must have its input's dtype"
            )
    return outs, ins


def _sizes(
    func: str, larger: List[np.ndarray], smaller: List[np.ndarray], n: int, name: str, why: str
) -> None:
    """Each ``larger[i]`` must hold ``n`` times ``smaller[i]``'s elements."""
    have = np.array([x.size for x in larger], np.int64)
    want = n * np.array([x.size for x in smaller], np.int64)
    wrong = np.flatnonzero(have != want)
    if len(wrong):
        i = int(wrong[0])
        check_size(func, f"{name}[{i}]", larger[i], int(want[i]), why.format(i=i))


def signature(arrays: List[np.ndarray]) -> str:
    """The arrays' shapes and dtypes, as DETAIL's check compares them."""
    return str([(tuple(a.shape), str(a.dtype)) for a in arrays])


def _kept_gather(
    output_tensors: Any,
    input_tensors: Any,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Any:
    """all_gather_into_tensor_coalesced's shortcut (pycoll.spec.Spec.known):
    lists the group keeps a plan for run at once; UNKNOWN for any other call."""
    func = "all_gather_into_tensor_coalesced"
    pg = resolve(group, func)
    entry = kept(pg, func, None, input_tensors, output_tensors) if pg is not None else None
    if entry is None:
        return UNKNOWN
    return entry[4].run(pg, func, entry[6], async_op, entry[5])


@collective(
    Array("output_tensors", OUT, LIST), Array("input_tensors", IN, LIST), known=_kept_gather
)
def all_gather_into_tensor_coalesced(
    output_tensors: List[np.ndarray],
    input_tensors: List[np.ndarray],
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """:func:`all_gather_into_tensor` of each pair (``output_tensors[i]``,
    ``input_tensors[i]``), all in one MPI operation (c10d's
    ``allgather_into_tensor_coalesced``). The arrays may differ in dtype.
    The group keeps what it worked out for its last few lists: the same
    array objects given again skip the checks (update them in place).

    Args:
        output_tensors: ``output_tensors[i]`` receives every rank's
            ``input_tensors[i]`` back to back in group-rank order: the group
            size times its elements, of its dtype.
        input_tensors: this rank's arrays.
    """
    func = "all_gather_into_tensor_coalesced"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg.size()
    outs, ins = _pairs(func, output_tensors, input_tensors, "output_tensors", "input_tensors")
    _sizes(func, outs, ins, n, "output_tensors", "input_tensors[{i}].size x group size")
    sizes = np.array([x.nbytes for x in ins], np.int64)
    plan = Gather(n, ins, addresses(outs) + _ranks(n) * sizes)
    desc = lambda: f"{func}(inputs={signature(ins)})"  # noqa: E731
    remember(pg, func, None, ins, outs, plan, desc, outs)
    return plan.run(pg, func, outs, async_op, desc)


def _kept_scatter(
    output_tensors: Any,
    input_tensors: Any,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Any:
    """reduce_scatter_tensor_coalesced's shortcut, as :func:`_kept_gather`."""
    func = "reduce_scatter_tensor_coalesced"
    pg = resolve(group, func)
    entry = kept(pg, func, op, input_tensors, output_tensors) if pg is not None else None
    if entry is None:
        return UNKNOWN
    return entry[4].run(pg, func, async_op, entry[5])[0]


@collective(
    Array("output_tensors", OUT, LIST), Array("input_tensors", IN, LIST), known=_kept_scatter
)
def reduce_scatter_tensor_coalesced(
    output_tensors: List[np.ndarray],
    input_tensors: List[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """:func:`reduce_scatter_tensor` of each pair (``output_tensors[i]``,
    ``input_tensors[i]``), all in one MPI operation (c10d's
    ``reduce_scatter_tensor_coalesced``). The arrays share one dtype. The
    group keeps what it worked out for its last few lists, as
    :func:`all_gather_into_tensor_coalesced` does.

    Args:
        output_tensors: ``output_tensors[i]`` receives this rank's part of
            the reduced ``input_tensors[i]``: group rank r gets elements
            ``[r * size, (r + 1) * size)``, where ``size`` is its own size.
        input_tensors: the arrays to reduce, each the group size times its
            output's size.
    """
    func = "reduce_scatter_tensor_coalesced"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg.size()
    outs, ins = _pairs(func, output_tensors, input_tensors, "output_tensors", "input_tensors")
    dtype = check_same_dtype(func, ins)
    _sizes(func, ins, outs, n, "input_tensors", "output_tensors[{i}].size x group size")
    plan = Scatter(n, ins, outs, dtype, op, func)
    desc = lambda: f"{func}({op.name}, inputs={signature(ins)})"  # noqa: E731
    remember(pg, func, op, ins, outs, plan, desc, outs)
    work, _ = plan.run(pg, func, async_op, desc)
    return work
