"""One-to-all: broadcast and scatter."""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from .. import _mpi, crosscheck, debug, native, persistent
from ..arrays import (
    MPI_TYPES,
    SUPPORTED_DTYPES,
    check_input,
    check_list,
    check_output,
    check_same_dtype,
    check_same_shape,
    mpi_datatype,
    plain_arrays,
)
from ..dispatch import collective
from ..groups import STATE, ProcessGroup, resolve
from ..persistent import LIMIT as PLAN_LIMIT
from ..spec import IN, LIST, OUT, Array
from ..work import Work
from ._common import DETAIL, group_rank, plain, root_of, run, sig

__all__ = ["broadcast", "scatter"]

_STATUS = native.SCATTER_STATUS  # bytes of status before each scattered part (both paths)
_REFUSED = b"REFUSED!"
_SENT = frozenset(SUPPORTED_DTYPES)  # (a set: the common case's look-up)


def _scatter_inputs(
    func: str, tensor: np.ndarray, scatter_list: Any, src: int, n: int
) -> List[np.ndarray]:
    """src's scatter_list, checked against ``tensor`` (raises on src only; a
    list of plain arrays passes at once)."""
    if scatter_list is None:
        raise ValueError(
            f"{func}: scatter_list is required on src ({src}): pass one "
            f"array per rank, shaped like tensor"
        )
    if plain_arrays(scatter_list, n, tensor.dtype, tensor.shape, writeable=False):
        return scatter_list
    inputs = [
        check_input(func, f"scatter_list[{i}]", x)
        for i, x in enumerate(check_list(func, "scatter_list", scatter_list, n))
    ]
    check_same_dtype(func, [tensor] + inputs)
    check_same_shape(func, "scatter_list", inputs, tensor.shape, "tensor")
    return inputs


@collective(Array("tensor", OUT, root=("src", IN)), aware=True, chunked=True)
def broadcast(
    tensor: np.ndarray,
    src: int,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Copy ``tensor`` from rank ``src`` into ``tensor`` on every rank of the group.

    Args:
        tensor: the data on ``src``; the output (same shape and dtype) elsewhere.
        src: global rank that sends.
    """
    func = "broadcast"
    if (pg := STATE.default) is None or group is not None:
        if (pg := resolve(group, func)) is None:  # raises before init; None: not a member
            return None
    looked = False  # for the same call as before on this array, known by the global src
    kept = None  # False where native.call may keep the call (see reduce.all_reduce)
    if (
        pg._native is not None
        and (not async_op or async_op is True)  # (with a Work: pycoll.native.again's work)
        and type(src) is int
        and type(tensor) is np.ndarray
        and (f := tensor.flags).c_contiguous
        and (f.writeable or src == pg._ranks[pg._rank])
        and debug.PLAIN
    ):
        looked = True  # (a src kept was a rank of the group)
        if not async_op:
            if kept := native.again(pg, func, tensor, None, src):
                return None
        elif kept := native.again(pg, func, tensor, None, src, work=True):
            return kept
    root = root_of(pg, src, "src", func)
    mine = root == pg._rank
    # A plain contiguous array (writeable where it is written) needs no more checks.
    fast = (
        type(tensor) is np.ndarray
        and (f := tensor.flags).c_contiguous
        and (f.writeable or mine)
        and (datatype := MPI_TYPES.get(tensor.dtype)) is not None
    )
    if (  # the same call as before on this array: compiled (pycoll.native)
        fast
        and not looked  # (src given as another integer type)
        and pg._native is not None
        and (not async_op or async_op is True)
        and debug.PLAIN
        and (kept := native.again(pg, func, tensor, None, src, work=async_op))
    ):
        return kept if async_op else None
    if not fast:
        tensor = (
            check_input(func, "tensor", tensor) if mine else check_output(func, "tensor", tensor)
        )
        datatype = mpi_datatype(tensor.dtype)
    key = crosscheck.key(func, tensor.dtype, tensor.size, root)
    desc = f"{func}(src={src}, {sig(tensor)})" if debug.LEVEL >= DETAIL else None
    if pg._plans is not None and tensor.nbytes <= PLAN_LIMIT:  # a repeated small call?
        made = persistent.for_broadcast(pg, key, tensor, datatype, root)
        if made is not None:
            if (  # kept as the lanes above look for it
                fast
                and not async_op
                and debug.PLAIN
                and native.call_plan(
                    pg,
                    func,
                    made,
                    tensor,
                    None,
                    src,
                    tensor if mine else None,
                    None if mine else tensor,
                )
            ):
                return None
            return made.call(
                pg, func, tensor if mine else None, None if mine else tensor, async_op, desc
            )
    comm = pg.comm
    # Synchronous with debug OFF (no timeline being recorded): MPI's call
    # straight away, however this rank's array was checked (under
    # PYCOLL_WAIT=blocking, the blocking call every rank makes alike).
    if (not async_op or async_op is True) and debug.PLAIN:
        kept = fast and kept is False and native.call(
            pg, func, key, native.BROADCAST, None, tensor, tensor.size, datatype, None, root,
            tensor, None, src, work=async_op,
        )  # fmt: skip
        if kept:
            return kept if async_op else None
        if not async_op:
            plain(pg, func, key, comm.Ibcast, comm.Bcast, [tensor, datatype], root)
            return None
    return run(
        pg,
        func,
        tensor.nbytes,
        comm.Ibcast,
        ([tensor, datatype], root),
        async_op,
        None,
        [tensor],
        call=desc,
        key=key,
    )


def _refused_by_src(func: str, src: int) -> ValueError:
    """What a rank other than src raises when src refused its scatter_list."""
    return ValueError(
        f"{func}: src (rank {src}) refused its scatter_list (see the error raised there), "
        f"so nothing was scattered; tensor is left as it was"
    )


@collective(Array("tensor", OUT), Array("scatter_list", IN, LIST))
def scatter(
    tensor: np.ndarray,
    scatter_list: Optional[List[np.ndarray]] = None,
    src: int = 0,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Send ``scatter_list[i]`` from rank ``src`` to group rank i's ``tensor``.

    Args:
        tensor: output on every rank.
        scatter_list: on ``src``, one array per rank of the group, each shaped
            like ``tensor``; on every other rank, None.
        src: global rank that sends.
    """
    func = "scatter"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg._size
    root = group_rank(pg, src, "src", func)
    mine = root == pg._rank
    # Each part travels behind an 8-byte status word, so that when src refuses
    # its scatter_list (which only src can check) it still takes part, keeping
    # the group's calls in step, and every receiver raises rather than keeping
    # what it got: the status says the call failed.
    #
    # The common case (a plain contiguous writeable output of a dtype pycoll
    # sends and, on src, a list of n plain arrays of its dtype and shape) needs no more
    # checks; made again on the same arrays, it is compiled (pycoll.native,
    # whose calls carry the same status words: the two paths' calls pair).
    fast = (
        type(tensor) is np.ndarray
        and (f := tensor.flags).c_contiguous
        and f.writeable
        and tensor.dtype in _SENT
        and (
            plain_arrays(scatter_list, n, tensor.dtype, tensor.shape, writeable=False)
            if mine
            else scatter_list is None
        )
    )
    if fast and not async_op and pg._native is not None and debug.PLAIN:
        try:
            if (
                native.again_list(pg, func, tensor, scatter_list, root, False)
                if mine
                else native.again(pg, func, tensor, None, root)
            ) or native.call_scatter(
                pg,
                crosscheck.key(func, tensor.dtype, tensor.size, root),
                tensor,
                tuple(scatter_list) if scatter_list is not None else None,  # (plain, by fast)
                root,
            ):
                return None
        except native.Refused:  # (a root on the plain path refused its list)
            raise _refused_by_src(func, src) from None
    if not fast:
        tensor = check_output(func, "tensor", tensor)
    nbytes = tensor.nbytes
    send: Any = None
    refused: Optional[Exception] = None
    if mine:
        packed = np.zeros((n, _STATUS + nbytes), np.uint8)
        try:
            inputs = (
                scatter_list  # (found plain already, by fast)
                if fast and scatter_list is not None
                else _scatter_inputs(func, tensor, scatter_list, src, n)
            )
        except (TypeError, ValueError) as exc:
            refused = exc
            packed[:, :_STATUS] = np.frombuffer(_REFUSED, np.uint8)
        else:
            for part, x in zip(packed, inputs):
                part[_STATUS:] = x.reshape(-1).view(np.uint8)
        send = [packed, _mpi.MPI.BYTE]
    elif scatter_list is not None:
        raise ValueError(
            f"{func}: scatter_list must be None on ranks other than src ({src}); only src sends"
        )
    received = np.empty(_STATUS + nbytes, np.uint8)

    def finish() -> None:
        if refused is not None:
            raise refused
        if bytes(received[:_STATUS]) == _REFUSED:
            raise _refused_by_src(func, src)
        tensor.reshape(-1).view(np.uint8)[:] = received[_STATUS:]

    comm = pg.comm
    if not async_op and debug.PLAIN:
        # Synchronous (pycoll.collectives._common.plain), as the other list
        # forms: the generic path's bookkeeping was most of a small call's cost.
        recv = [received, _mpi.MPI.BYTE]
        plain(pg, func, crosscheck.key(func, tensor.dtype, tensor.size, root), comm.Iscatter,
              comm.Scatter, send, recv, root)  # fmt: skip
        finish()
        return None
    desc = f"{func}(src={src}, {sig(tensor)})" if debug.LEVEL >= DETAIL else None
    return run(
        pg,
        func,
        tensor.nbytes,
        comm.Iscatter,
        (send, [received, _mpi.MPI.BYTE], root),
        async_op,
        finish,
        [tensor],
        call=desc,
        key=crosscheck.key(func, tensor.dtype, tensor.size, root),
    )
