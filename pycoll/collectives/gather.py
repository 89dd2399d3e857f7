"""Gathers: all_gather, all_gather_into_tensor, all_gather_coalesced, gather."""

from __future__ import annotations

import functools
from typing import Any, List, Optional

import numpy as np

from .. import _mpi, crosscheck, debug, native, persistent
from ..arrays import (
    MPI_TYPES,
    apart,
    check_input,
    check_list,
    check_output,
    check_same_dtype,
    check_same_shape,
    check_size,
    detach,
    is_slot,
    mpi_datatype,
    own_part,
    plain_arrays,
)
from ..dispatch import collective
from ..groups import STATE, ProcessGroup, resolve
from ..persistent import LIMIT as PLAN_LIMIT
from ..spec import IN, LIST, LISTS, OUT, UNKNOWN, Array
from ..work import Work
from . import coalesced, scratch
from ._common import DETAIL, group_rank, plain, run, sig

__all__ = ["all_gather", "all_gather_into_tensor", "all_gather_coalesced", "gather"]

_BYTES = np.dtype(np.uint8)


def _stacked(pg: ProcessGroup, n: int, like: np.ndarray) -> np.ndarray:
    """Where ``n`` arrays like ``like`` are received, one after another, as
    bytes (a buffer the group keeps for its large calls:
    pycoll.collectives.scratch; a small one straight from numpy, as
    scratch.beside gives it)."""
    nbytes = n * like.nbytes
    if nbytes < scratch.KEEP_FROM_LEAST:
        return np.empty(nbytes, _BYTES)
    return scratch.take(pg, nbytes, _BYTES)


def _unpack(pg: ProcessGroup, stacked: np.ndarray, outputs: List[np.ndarray]) -> None:
    """Copy each array received in ``stacked`` out to its output (by mpi4py's
    buffers: a third of numpy's indexing and copy for small arrays), then
    give the buffer back."""
    buffer = _mpi.MPI.buffer
    whole = buffer(stacked)
    nbytes = stacked.nbytes
    step = nbytes // len(outputs) if outputs else 0
    at = 0
    for out in outputs:
        buffer(out)[:] = whole[at : at + step]
        at += step
    if nbytes >= scratch.KEEP_FROM_LEAST:  # (a smaller one came from numpy: _stacked)
        scratch.give(pg, stacked)


def _unpacker(pg: ProcessGroup, stacked: np.ndarray, outputs: List[np.ndarray]):
    """:func:`_unpack` of these arrays, for a call's finishing step."""
    return functools.partial(_unpack, pg, stacked, outputs)


def _check_outputs(
    func: str, name: str, outputs: list, like: np.ndarray, n: int
) -> List[np.ndarray]:
    """The list ``outputs``: ``n`` C-contiguous writeable arrays of
    ``like``'s dtype and shape (a list of plain arrays passes at once)."""
    if plain_arrays(outputs, n, like.dtype, like.shape, writeable=True):
        return outputs
    outs = [
        check_output(func, f"{name}[{i}]", x)
        for i, x in enumerate(check_list(func, name, outputs, n))
    ]
    check_same_dtype(func, [like] + outs)
    check_same_shape(func, name, outs, like.shape, "tensor")
    return outs


@collective(Array("tensor_list", OUT, LIST), Array("tensor", IN))
def all_gather(
    tensor_list: List[np.ndarray],
    tensor: np.ndarray,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Gather ``tensor`` from every rank into ``tensor_list`` on every rank.

    Args:
        tensor_list: one output array per rank of the group, each with the
            shape and dtype of ``tensor``; entry i receives group rank i's.
        tensor: this rank's contribution.

    Example (2 ranks)::

        >>> out = [np.zeros(2), np.zeros(2)]
        >>> pycoll.all_gather(out, np.full(2, rank))
        >>> out                      # both ranks: [array([0., 0.]), array([1., 1.])]
    """
    func = "all_gather"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg._size
    # The common case (a plain contiguous input, a list of n plain contiguous
    # writeable arrays of its dtype and shape) needs no more checks.
    fast = (
        type(tensor) is np.ndarray
        and tensor.flags.c_contiguous
        and (mpitype := MPI_TYPES.get(dtype := tensor.dtype)) is not None
        and plain_arrays(tensor_list, n, dtype, tensor.shape, writeable=True)
    )
    if fast:
        outs = tensor_list
        if native.again_list(pg, func, tensor, outs, None, async_op):  # (compiled: as before)
            return None
    else:
        tensor = check_input(func, "tensor", tensor)
        outs = _check_outputs(func, "tensor_list", tensor_list, tensor, n)
        mpitype = mpi_datatype(tensor.dtype)
    key = crosscheck.key(func, tensor.dtype, tensor.size)
    comm = pg.comm
    if not async_op and debug.PLAIN:
        # Synchronous (pycoll.collectives._common.plain): on 2 ranks the
        # generic path below took 2.9x a raw mpi4py all-gather and copy-out
        # at 8 B, this one 1.9x, and 1.6x at 64 KiB, now 1.4x; kept by the
        # compiled path (received into a buffer the call keeps, copied out
        # there), ... (docs/measurements/list_forms.py).
        if (
            fast
            and pg._native is not None
            and native.call(pg, func, key, native.ALL_GATHER, tensor, None, tensor.size, mpitype,
                            None, 0, tensor, outs[0], None, items=tuple(outs), into_items=True)
        ):  # fmt: skip
            return None
        stacked = _stacked(pg, n, tensor)
        plain(pg, func, key, comm.Iallgather, comm.Allgather, [tensor, mpitype],
              [stacked, mpitype])  # fmt: skip
        _unpack(pg, stacked, outs)
        return None
    stacked = _stacked(pg, n, tensor)
    desc = f"{func}({sig(tensor)})" if debug.LEVEL >= DETAIL else None
    return run(
        pg,
        func,
        stacked.nbytes,
        comm.Iallgather,
        ([tensor, mpitype], [stacked, mpitype]),
        async_op,
        _unpacker(pg, stacked, outs),
        outs,
        call=desc,
        key=key,
    )


@collective(Array("output_tensor", OUT), Array("input_tensor", IN), aware=True)
def all_gather_into_tensor(
    output_tensor: np.ndarray,
    input_tensor: np.ndarray,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Gather every rank's ``input_tensor`` into one array, in group-rank order.

    Args:
        output_tensor: holds ``group size x input_tensor.size`` elements, e.g.
            shaped ``(size * d0, ...)`` (concatenated) or ``(size, d0, ...)``
            (stacked); written with no extra copy.
        input_tensor: this rank's contribution.
    """
    func = "all_gather_into_tensor"
    if (pg := STATE.default) is None or group is not None:
        if (pg := resolve(group, func)) is None:  # raises before init; None: not a member
            return None
    n = pg._size
    out, inp = output_tensor, input_tensor
    kept = None  # False where native.call may keep the call (see reduce.all_reduce)
    if (  # the same call as before on these arrays: compiled (pycoll.native)
        pg._native is not None
        and type(inp) is np.ndarray
        and (not async_op or async_op is True)  # (with a Work: pycoll.native.again's work)
        and debug.PLAIN
        and (
            kept := native.again(pg, func, out, inp, None, input=inp, work=async_op)
            if inp.base is not out
            # torch's in-place idiom, the input a new view each call: known
            # by its place, that of this rank's part when the call was kept
            else (
                inp.size * n == out.size
                and native.again(
                    pg, func, out, _mpi.IN_PLACE, None, input=inp, place=inp, work=async_op
                )
            )
        )
    ):
        return kept if async_op else None
    # Two plain contiguous arrays, one dtype, sizes that fit, and either apart
    # (each owning its memory, or views of tensors that do not overlap) or
    # the input this rank's part of the output (torch's in-place idiom): no
    # more checks.
    in_place = False
    fast = (
        type(out) is np.ndarray
        and type(inp) is np.ndarray
        and (f := out.flags).c_contiguous
        and f.writeable
        and inp.flags.c_contiguous
        and out.dtype == inp.dtype
        and (datatype := MPI_TYPES.get(inp.dtype)) is not None
        and out.size == inp.size * n
        and (
            (in_place := inp.base is out and out.base is None and own_part(inp, out, pg._rank))
            or apart(inp, out)
        )
    )
    if not fast:
        out = check_output(func, "output_tensor", output_tensor)
        inp = check_input(func, "input_tensor", input_tensor)
        check_same_dtype(func, [out, inp])
        check_size(func, "output_tensor", out, inp.size * n, "input_tensor.size x group size")
        datatype = mpi_datatype(inp.dtype)
    key = crosscheck.key(func, inp.dtype, inp.size)
    desc = None
    if debug.LEVEL >= DETAIL:
        desc = f"{func}(output shape={out.shape}, input {sig(inp)})"
    if pg._plans is not None and out.nbytes <= PLAN_LIMIT:  # a repeated small call?
        made = persistent.for_all_gather(pg, key, inp, datatype)
        if made is not None:
            if (  # kept as the lane above looks for it
                not async_op
                and debug.PLAIN
                and fast
                and native.call_plan(
                    pg,
                    func,
                    made,
                    out,
                    _mpi.IN_PLACE if in_place else inp,
                    None,
                    inp,
                    out,
                    place=inp if in_place else None,
                )
            ):
                return None
            return made.call(pg, func, inp, out, async_op, desc)
    comm = pg.comm
    # Every rank sends in place: MPI takes MPI_IN_PLACE only where every rank
    # of the call passes it, and each rank's call may be in place or not (as
    # torch's); MPICH's blocking all-gathers that mixed the two waited for
    # each other for good. Out of place, the input is first copied into this
    # rank's part of the output, the copy MPI's out-of-place call makes.
    # (Device memory through CUDA-aware MPI, which no CPU copy may touch, is
    # passed as each rank gives it.) Which path a call takes depends only on
    # what every rank shares, never on how its arrays are laid out: under
    # PYCOLL_WAIT=blocking a synchronous call is MPI's blocking one on every
    # rank, which MPI does not match with a nonblocking one.
    if not fast:
        in_place = is_slot(inp, out, pg._rank)
    into = not in_place and not pg._aliases  # (the input copied into its part first)
    if (not async_op or async_op is True) and debug.PLAIN:  # (debug OFF, no timeline)
        if fast and kept is False:
            given = _mpi.IN_PLACE if in_place else inp
            kept = native.call(
                pg, func, key, native.ALL_GATHER, _mpi.IN_PLACE if into else given,
                out, inp.size, datatype, None, 0, out, given, None,
                place=inp if in_place else None,
                copy_in=(_mpi.MPI.buffer(out).address + pg._rank * inp.nbytes, inp, inp.nbytes)
                if into else None, work=async_op,
            )  # fmt: skip
            if kept:
                return kept if async_op else None
        if not async_op:
            send = _send(inp, out, pg._rank, into, fast, in_place, datatype)
            plain(pg, func, key, comm.Iallgather, comm.Allgather, send, [out, datatype])
            return None
    send = _send(inp, out, pg._rank, into, fast, in_place, datatype)
    return run(
        pg,
        func,
        out.nbytes,
        comm.Iallgather,
        (send, [out, datatype]),
        async_op,
        None,
        [out],
        call=desc,
        key=key,
    )


def _send(
    inp: np.ndarray,
    out: np.ndarray,
    rank: int,
    into: bool,
    fast: bool,
    in_place: bool,
    datatype: Any,
) -> Any:
    """all_gather_into_tensor's send argument: ``MPI_IN_PLACE`` where the
    input is this rank's part of the output, or once it is copied there
    (``into``); else (device memory) the input, or a copy of it where it
    overlaps the output. Arrays that passed the fast checks do not overlap
    (arrays.apart) and are copied by mpi4py's buffers, a third of
    numpy's views and copy at 8 bytes; numpy minds an overlap otherwise."""
    if into:
        if fast:
            lo = rank * inp.nbytes
            _mpi.MPI.buffer(out)[lo : lo + inp.nbytes] = _mpi.MPI.buffer(inp)
        else:
            k = inp.size
            np.copyto(out.reshape(-1)[k * rank : k * rank + k], inp.reshape(-1))
        return _mpi.MPI.IN_PLACE
    if in_place:
        return _mpi.MPI.IN_PLACE
    return [detach(inp, out), datatype]


def _kept_lists(
    output_tensor_lists: Any,
    input_tensor_list: Any,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Any:
    """all_gather_coalesced's shortcut (pycoll.spec.Spec.known): lists the
    group keeps a plan for (pycoll.collectives.coalesced) run at once; UNKNOWN
    for any other call."""
    func = "all_gather_coalesced"
    pg = resolve(group, func)
    found = None
    if pg is not None:
        found = coalesced.kept(pg, func, None, input_tensor_list, output_tensor_lists)
    if found is None:
        return UNKNOWN
    return found[4].run(pg, func, found[6], async_op, found[5])


@collective(
    Array("output_tensor_lists", OUT, LISTS),
    Array("input_tensor_list", IN, LIST),
    known=_kept_lists,
)
def all_gather_coalesced(
    output_tensor_lists: List[List[np.ndarray]],
    input_tensor_list: List[np.ndarray],
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """All-gather several arrays (of any dtypes) in a single MPI operation.
    The group keeps what it worked out for its last few lists: the same
    array objects given again skip the checks (update them in place).

    Args:
        output_tensor_lists: one list per rank of the group;
            ``output_tensor_lists[r][i]`` receives rank r's
            ``input_tensor_list[i]`` and must have its shape and dtype.
        input_tensor_list: this rank's arrays.
    """
    func = "all_gather_coalesced"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg._size
    inputs = coalesced.checked(func, "input_tensor_list", input_tensor_list, check_input)
    per_rank = check_list(func, "output_tensor_lists", output_tensor_lists, n)
    outputs = []
    for r, outs in enumerate(per_rank):
        name = f"output_tensor_lists[{r}]"
        outs = coalesced.checked(
            func, name, check_list(func, name, outs, len(inputs)), check_output
        )
        for i, (out, x) in enumerate(zip(outs, inputs)):
            if out.dtype != x.dtype or out.shape != x.shape:
                check_same_dtype(func, [x, out])
                raise ValueError(
                    f"{func}: output_tensor_lists[{r}][{i}] has shape "
                    f"{out.shape} but input_tensor_list[{i}] has {x.shape}"
                )
        outputs.append(outs)
    desc = None
    if debug.LEVEL >= DETAIL:
        desc = f"{func}(inputs={[(x.shape, str(x.dtype)) for x in inputs]})"
    # One MPI all-gather of every array's bytes, so arrays of different dtypes
    # travel in one message (pycoll.collectives.coalesced); rank r's array i
    # is copied straight to output_tensor_lists[r][i].
    targets = np.array([coalesced.addresses(outs) for outs in outputs], np.int64)
    plan = coalesced.Gather(n, inputs, targets.reshape(n, len(inputs)))
    coalesced.remember(pg, func, None, inputs, outputs, plan, desc, outputs)
    return plan.run(pg, func, outputs, async_op, desc)


@collective(Array("tensor", IN), Array("gather_list", OUT, LIST))
def gather(
    tensor: np.ndarray,
    gather_list: Optional[List[np.ndarray]] = None,
    dst: int = 0,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Gather ``tensor`` from every rank into ``gather_list`` on rank ``dst``.

    Args:
        tensor: this rank's contribution.
        gather_list: on ``dst``, one output array per rank of the group, each
            shaped like ``tensor``; on every other rank, None.
        dst: global rank that receives.
    """
    func = "gather"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg._size
    root = group_rank(pg, dst, "dst", func)
    mine = root == pg._rank
    # The common case (a plain contiguous input and, on dst, a list of n plain
    # contiguous writeable arrays of its dtype and shape) needs no more checks.
    fast = (
        type(tensor) is np.ndarray
        and tensor.flags.c_contiguous
        and (mpitype := MPI_TYPES.get(dtype := tensor.dtype)) is not None
        and (
            plain_arrays(gather_list, n, dtype, tensor.shape, writeable=True)
            if mine
            else gather_list is None
        )
    )
    if fast and (  # the same call on the same arrays as before: compiled (pycoll.native)
        native.again_list(pg, func, tensor, gather_list, root, async_op)
        if gather_list is not None  # (on dst, by fast)
        else pg._native is not None
        and not async_op
        and debug.PLAIN
        and native.again(pg, func, tensor, None, root)
    ):
        return None
    if not fast:
        tensor = check_input(func, "tensor", tensor)
        mpitype = mpi_datatype(tensor.dtype)
    comm = pg.comm
    if root != pg._rank and gather_list is not None:
        raise ValueError(
            f"{func}: gather_list must be None on ranks other than dst ({dst}); only dst receives"
        )
    # A gather_list that only dst can refuse: dst still takes part (into a
    # buffer of its own), so the other ranks' sends pair with this call, not
    # with dst's next one, then raises. The others only send: nothing they
    # hold is wrong, and telling them would cost every gather a message back.
    refused: Optional[Exception] = None
    outs: List[np.ndarray] = []
    if root == pg._rank:
        try:
            if gather_list is None:
                raise ValueError(
                    f"{func}: gather_list is required on dst ({dst}): pass one array per "
                    f"rank, shaped like tensor"
                )
            outs = (
                gather_list  # (found plain already, by fast)
                if fast
                else _check_outputs(func, "gather_list", gather_list, tensor, n)
            )
        except (TypeError, ValueError) as exc:
            refused = exc
    if not async_op and debug.PLAIN:
        # Synchronous (pycoll.collectives._common.plain), as all_gather's list
        # form: the generic path's bookkeeping was most of a small call's cost.
        key = crosscheck.OP_BITS[func]
        if fast and pg._native is not None:  # kept from its second call (pycoll.native)
            items = tuple(outs) if mine else None
            if native.call(pg, func, key, native.GATHER, tensor, None, tensor.size, mpitype,
                           None, root, tensor, outs[0] if mine else None, root, items=items,
                           into_items=True):  # fmt: skip
                return None
        if root != pg._rank:
            plain(pg, func, key, comm.Igather, comm.Gather, [tensor, mpitype], None, root)
            return None
        stacked = _stacked(pg, n, tensor)
        plain(pg, func, key, comm.Igather, comm.Gather, [tensor, mpitype],
              [stacked, mpitype], root)  # fmt: skip
        if refused is not None:
            scratch.give(pg, stacked)
            raise refused
        _unpack(pg, stacked, outs)
        return None
    desc = f"{func}(dst={dst}, {sig(tensor)})" if debug.LEVEL >= DETAIL else None
    if root != pg._rank:
        return run(
            pg,
            func,
            tensor.nbytes,
            comm.Igather,
            ([tensor, mpitype], None, root),
            async_op,
            None,
            [],
            call=desc,
        )
    stacked = _stacked(pg, n, tensor)
    unpack = _unpacker(pg, stacked, outs)

    def finish() -> None:
        if refused is not None:
            raise refused
        unpack()

    return run(
        pg,
        func,
        stacked.nbytes,
        comm.Igather,
        ([tensor, mpitype], [stacked, mpitype], root),
        async_op,
        finish,
        outs,
        call=desc,
    )
