"""All-to-all: all_to_all (lists) and all_to_all_single (one array, split on dim 0).

When the amount each pair of ranks exchanges is given per pair (lists of
arrays, or explicit split sizes), the ranks first check with each other that
every sender and receiver agree on it: a disagreement would otherwise be a
silent partial result or an MPI truncation error on one rank only. That
check costs one small all-to-all and an all-gather of one integer; the even
all_to_all_single needs none.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .. import _mpi, crosscheck, debug, native, persistent, watch
from ..arrays import (
    MPI_TYPES,
    check_input,
    check_list,
    check_output,
    check_same_dtype,
    check_size,
    detach,
    may_alias,
    mpi_datatype,
)
from ..dispatch import collective
from ..groups import STATE, ProcessGroup, resolve
from ..persistent import LIMIT as PLAN_LIMIT
from ..spec import IN, LIST, OUT, Array
from ..work import Work
from . import scratch
from ._common import DETAIL, plain, run, sig

__all__ = ["all_to_all", "all_to_all_single"]


# The form of MPI's call every rank makes for an even all-to-all (see
# all_to_all_single), from what every rank shares:
# - IN_PLACE: MPI's in-place call (an out-of-place input copied into the
#   output first). Two ranks on MPICH up to PAIR_IN_PLACE_BYTES: with the copy,
#   0.73-0.83x the out-of-place call's time (nonblocking and blocking alike),
#   1.46x at 128 KiB; on 3 ranks 1.05-1.16x, on Open MPI 1.2-1.6x.
# - PARTS: from PARTS_FROM bytes, MPI's v-form with this rank's own part left
#   out on both sides (the output's own part copied from the input by pycoll,
#   as MPI's call would; an in-place input's other parts sent from a copy).
#   It measured level with the out-of-place call for an out-of-place caller,
#   and spared an in-place one most of the copy
#   (docs/measurements/all_to_all_forms.py).
# - OUT_OF_PLACE otherwise (an in-place input sent from a copy).
OUT_OF_PLACE, IN_PLACE, PARTS = range(3)
PAIR_IN_PLACE_BYTES = 64 << 10
PARTS_FROM = 128 << 10


def _form(n: int, nbytes: int) -> int:
    """The form of MPI's call every rank makes for an even all-to-all of
    ``nbytes`` on a group of ``n`` ranks (host memory)."""
    if nbytes >= PARTS_FROM:
        return PARTS
    if n == 2 and nbytes <= PAIR_IN_PLACE_BYTES and _mpi.VENDOR == "MPICH":
        return IN_PLACE
    return OUT_OF_PLACE


def _send(
    pg: ProcessGroup, input: np.ndarray, output: np.ndarray, overlaps: bool, form: int
) -> Any:
    """Make ready what MPI sends from, and return it: MPI_IN_PLACE, an
    out-of-place input first copied into the output (IN_PLACE); the input,
    its own part first copied into the output's (PARTS); the input
    (OUT_OF_PLACE). An input that overlaps the output is sent from a copy
    (of the parts that are sent) in a buffer the group keeps for large calls
    (pycoll.collectives.scratch: give it back once the call is done; a new
    one each call would be mapped page by page). Device memory through
    CUDA-aware MPI, which no CPU copy may touch, is sent as given (in place
    where the input is the output)."""
    if form == IN_PLACE:
        if input is not output:
            np.copyto(output, input)  # (numpy minds an overlap)
        return _mpi.MPI.IN_PLACE
    if pg._aliases:
        return _mpi.MPI.IN_PLACE if input is output else input
    if not overlaps and form == OUT_OF_PLACE:
        return input
    part = input.size // pg._size
    lo, hi = part * pg._rank, part * (pg._rank + 1)
    if not overlaps:  # (PARTS)
        output.reshape(-1)[lo:hi] = input.reshape(-1)[lo:hi]
        return input
    held = scratch.beside(pg, input)
    if form == PARTS:  # (this rank's own part is neither sent nor received)
        flat, copy = input.reshape(-1), held.reshape(-1)
        copy[:lo], copy[hi:] = flat[:lo], flat[hi:]
    else:
        np.copyto(held, input)
    return held


def _kept(
    pg: ProcessGroup, input: np.ndarray, output: np.ndarray, form: int
) -> Tuple[Any, Optional[Tuple[Any, Any, int]], Optional[Tuple[int, int]]]:
    """pycoll.native.call's send buffer, copy_in and skip for
    :func:`_send`'s work (arrays that do not overlap unless they are one),
    made by the compiled call before it starts."""
    if form == IN_PLACE:
        return _mpi.IN_PLACE, None if input is output else (output, input, input.nbytes), None
    part = input.nbytes // pg._size
    lo = part * pg._rank
    if input is output:  # (sent from a copy the call keeps: in the v-form, of the parts sent)
        return None, (None, input, input.nbytes), (lo, part) if form == PARTS else None
    if form == PARTS:  # (its own part copied into the output's)
        address = _mpi.MPI.buffer
        return input, (address(output).address + lo, address(input).address + lo, part), None
    return input, None, None


def _spec(buffer: Any, v: Any, datatype: Any) -> Any:
    """MPI's buffer argument: ``MPI_IN_PLACE`` as it is, an array with its
    datatype, and with ``v`` (counts, displacements) for the v-form."""
    if buffer is _mpi.MPI.IN_PLACE:
        return buffer
    return [buffer, datatype] if v is None else [buffer, v, datatype]


def _displacements(counts: Sequence[int]) -> List[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def _agree(pg: ProcessGroup, func: str, send_counts: List[int], recv_counts: List[int]) -> None:
    """Raise on every rank if any pair of ranks disagrees on what it exchanges.

    Runs as part of the operation (under the group's lock, after its DETAIL
    check), which is undone on every rank if this raises."""
    MPI = _mpi.MPI
    n = pg._size
    mine = np.array([send_counts, recv_counts], np.int64).T.copy()
    theirs = np.empty((n, 2), np.int64)
    seq = pg._seq
    watch.call(pg, func, seq, pg.comm.Ialltoall, [mine, MPI.INT64_T], [theirs, MPI.INT64_T])
    problems = []
    for i in range(n):
        peer = pg._ranks[i]
        if theirs[i, 0] != recv_counts[i]:
            problems.append(
                f"this rank expects {recv_counts[i]} elements from rank {peer}, "
                f"which sends {theirs[i, 0]}"
            )
        if theirs[i, 1] != send_counts[i]:
            problems.append(
                f"this rank sends {send_counts[i]} elements to rank {peer}, "
                f"which expects {theirs[i, 1]}"
            )
    flags = np.empty(n, np.int64)
    count = np.array([len(problems)], np.int64)
    watch.call(pg, func, seq, pg.comm.Iallgather, [count, MPI.INT64_T], [flags, MPI.INT64_T])
    if flags.any():
        if problems:
            raise ValueError(f"{func}: split sizes disagree between ranks: " + "; ".join(problems))
        bad = [pg._ranks[i] for i in np.flatnonzero(flags)]
        raise ValueError(
            f"{func}: split sizes disagree between ranks {bad} (see the error "
            f"on those ranks); nothing was exchanged"
        )


@collective(Array("output_tensor_list", OUT, LIST), Array("input_tensor_list", IN, LIST))
def all_to_all(
    output_tensor_list: List[np.ndarray],
    input_tensor_list: List[np.ndarray],
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Send ``input_tensor_list[i]`` to group rank i; receive into ``output_tensor_list``.

    Args:
        output_tensor_list: one array per rank; entry i receives what group
            rank i sent to this rank (sizes may differ from pair to pair).
        input_tensor_list: one array per rank; entry i goes to group rank i.
    """
    func = "all_to_all"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg._size
    outs = [
        check_output(func, f"output_tensor_list[{i}]", x)
        for i, x in enumerate(check_list(func, "output_tensor_list", output_tensor_list, n))
    ]
    ins = [
        check_input(func, f"input_tensor_list[{i}]", x)
        for i, x in enumerate(check_list(func, "input_tensor_list", input_tensor_list, n))
    ]
    dtype = check_same_dtype(func, outs + ins)
    desc = f"{func}({n} arrays each way, {dtype})" if debug.LEVEL >= DETAIL else None
    scounts = [x.size for x in ins]
    rcounts = [x.size for x in outs]
    send = np.concatenate([x.reshape(-1) for x in ins])
    recv = scratch.take(pg, sum(rcounts) * dtype.itemsize, dtype)  # (kept for large calls)
    rdispls = _displacements(rcounts)

    def finish() -> None:
        for out, start, count in zip(outs, rdispls, rcounts):
            out.reshape(-1)[...] = recv[start : start + count]
        scratch.give(pg, recv)

    mpitype = mpi_datatype(dtype)
    comm = pg.comm
    return run(
        pg,
        func,
        send.nbytes,
        comm.Ialltoallv,
        ([send, (scounts, _displacements(scounts)), mpitype], [recv, (rcounts, rdispls), mpitype]),
        async_op,
        finish,
        outs,
        call=desc,
        prepare=lambda: _agree(pg, func, scounts, rcounts),
        key=crosscheck.key(func, dtype),  # array sizes may differ by rank
    )


def _row_size(func: str, name: str, x: np.ndarray) -> int:
    if x.ndim == 0:
        raise ValueError(
            f"{func}: {name} is 0-dimensional; split sizes split dimension 0, "
            f"so pass an array with at least one dimension"
        )
    return int(np.prod(x.shape[1:], dtype=np.int64))


def _splits(
    func: str, name: str, splits: Optional[Sequence[int]], x: np.ndarray, n: int
) -> List[int]:
    """Rows per rank along dim 0: given, or an even split of ``x``."""
    rows = x.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(
                f"{func}: dimension 0 of {name.split('_split')[0]} ({rows}) "
                f"does not divide evenly among {n} ranks; pass {name}"
            )
        return [rows // n] * n
    splits = check_list(func, name, splits, n)
    for s in splits:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"{func}: {name} must hold non-negative ints, got {splits}")
    if sum(splits) != rows:
        raise ValueError(
            f"{func}: {name} sums to {sum(splits)} but dimension 0 of the array is {rows}"
        )
    return [int(s) for s in splits]


@collective(Array("output", OUT), Array("input", IN), aware=True)
def all_to_all_single(
    output: np.ndarray,
    input: np.ndarray,
    output_split_sizes: Optional[List[int]] = None,
    input_split_sizes: Optional[List[int]] = None,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Split ``input`` on dimension 0, send part i to group rank i, and
    concatenate what arrives, in rank order, into ``output``.

    Args:
        output: receives the parts, in group-rank order.
        input: the array to split.
        output_split_sizes: rows received from each rank (default: even).
        input_split_sizes: rows sent to each rank (default: even).

    Example (2 ranks, uneven)::

        >>> # rank 0: input [0, 1, 2], input_split_sizes [1, 2], output_split_sizes [1, 1]
        >>> # rank 1: input [10, 11],  input_split_sizes [1, 1], output_split_sizes [2, 1]
        >>> # after:  rank 0 output [0, 10]; rank 1 output [1, 2, 11]
    """
    func = "all_to_all_single"
    if (pg := STATE.default) is None or group is not None:
        if (pg := resolve(group, func)) is None:  # raises before init; None: not a member
            return None
    n = pg._size
    even = output_split_sizes is None and input_split_sizes is None
    kept = None  # False where native.call may keep the call (see reduce.all_reduce)
    if (  # the same call as before on these arrays: compiled (pycoll.native)
        even
        and pg._native is not None
        and (not async_op or async_op is True)  # (with a Work: pycoll.native.again's work)
        and debug.PLAIN
        and (
            kept := native.again(
                pg,
                func,
                output,
                _mpi.IN_PLACE if input is output else input,
                None,
                input=input,
                work=async_op,
            )
        )
    ):
        return kept if async_op else None
    # The common case (even parts of two plain contiguous arrays of one dtype,
    # the output writeable, sizes that fit) needs no more checks.
    if not (
        even
        and type(output) is np.ndarray
        and type(input) is np.ndarray
        and (f := output.flags).c_contiguous
        and f.writeable
        and input.flags.c_contiguous
        and (dtype := output.dtype) == input.dtype
        and (mpitype := MPI_TYPES.get(dtype)) is not None
        and input.size == output.size
        and not input.size % n
    ):
        output = check_output(func, "output", output)
        input = check_input(func, "input", input)
        dtype = check_same_dtype(func, [output, input])
        mpitype = mpi_datatype(dtype)
        if even:  # (the common case's test above covered these)
            if input.size % n:
                raise ValueError(
                    f"{func}: input holds {input.size} elements, which do not "
                    f"divide evenly among {n} ranks; pass input_split_sizes and "
                    f"output_split_sizes"
                )
            check_size(func, "output", output, input.size, "the size of input")
    comm = pg.comm
    if even:
        desc = f"{func}(even, {sig(input)})" if debug.LEVEL >= DETAIL else None
        key = crosscheck.key(func, dtype, input.size)
        if pg._plans is not None and input.nbytes <= PLAN_LIMIT:  # a repeated small call?
            made = persistent.for_all_to_all(
                pg, key, input, mpitype, _form(n, input.nbytes) == IN_PLACE
            )
            if made is not None:
                if (  # kept as the lane above looks for it
                    not async_op
                    and debug.PLAIN
                    and native.call_plan(
                        pg,
                        func,
                        made,
                        output,
                        _mpi.IN_PLACE if input is output else input,
                        None,
                        input,
                        output,
                    )
                ):
                    return None
                return made.call(pg, func, input, output, async_op, desc)
        # Every rank makes the same form of MPI's call: MPI takes MPI_IN_PLACE
        # only where every rank passes it, and each rank's call may be in
        # place or not (as torch's). MPICH's blocking in-place all-to-all runs
        # another algorithm than its out-of-place one, and ranks that mixed
        # the two waited for each other for good. So the form follows what
        # every rank shares (:func:`_form`). Device memory through CUDA-aware
        # MPI, which no CPU copy may touch, is passed as given.
        overlaps = input is output or may_alias(input, output)
        form = OUT_OF_PLACE
        if not pg._aliases:
            form = _form(n, input.nbytes)
        elif overlaps and input is not output:
            raise ValueError(
                f"{func}: input overlaps output without being it, in device "
                f"memory, which pycoll cannot copy aside; pass separate arrays"
            )
        count = output.size // n
        v = None
        start, blocking = comm.Ialltoall, comm.Alltoall
        if form == PARTS:
            counts = [count] * n
            counts[pg._rank] = 0  # (this rank's own part: neither sent nor received)
            v = (counts, [count * r for r in range(n)])
            start, blocking = comm.Ialltoallv, comm.Alltoallv
        if (not async_op or async_op is True) and debug.PLAIN:
            if (  # (a kept call holds the output and the input or its copy)
                kept is False
                and (input is output or not overlaps)
                and native.may_keep(2 * input.nbytes)
            ):
                send, copy_in, skip = _kept(pg, input, output, form)
                kept = native.call(
                    pg, func, key, native.ALL_TO_ALL_V if form == PARTS else native.ALL_TO_ALL,
                    send, output, count, mpitype, None, 0, output,
                    _mpi.IN_PLACE if input is output else input, None, copy_in=copy_in,
                    skip=skip, work=async_op,
                )  # fmt: skip
                if kept:
                    return kept if async_op else None
            if not async_op:
                held = _send(pg, input, output, overlaps, form)
                plain(pg, func, key, start, blocking, _spec(held, v, mpitype),
                      _spec(output, v, mpitype))  # fmt: skip
                if held is not input and held is not _mpi.MPI.IN_PLACE:
                    scratch.give(pg, held)
                return None
        held = _send(pg, input, output, overlaps, form)
        return run(
            pg,
            func,
            input.nbytes,
            start,
            (_spec(held, v, mpitype), _spec(output, v, mpitype)),
            async_op,
            None if held is input or held is _mpi.MPI.IN_PLACE else lambda: scratch.give(pg, held),
            [output],
            call=desc,
            key=key,
        )
    input = detach(input, output)
    in_row = _row_size(func, "input", input)
    out_row = _row_size(func, "output", output)
    if in_row != out_row:
        raise ValueError(
            f"{func}: rows of input hold {in_row} elements but rows of output "
            f"hold {out_row}; dimensions after the first must match"
        )
    scounts = [s * in_row for s in _splits(func, "input_split_sizes", input_split_sizes, input, n)]
    rcounts = [
        s * out_row for s in _splits(func, "output_split_sizes", output_split_sizes, output, n)
    ]
    # Sizes may differ by rank, so DETAIL leaves them out; _agree checks them.
    desc = (
        f"{func}(split sizes, rows of shape {input.shape[1:]}, {dtype})"
        if debug.LEVEL >= DETAIL
        else None
    )
    return run(
        pg,
        func,
        input.nbytes,
        comm.Ialltoallv,
        (
            [input, (scounts, _displacements(scounts)), mpitype],
            [output, (rcounts, _displacements(rcounts)), mpitype],
        ),
        async_op,
        None,
        [output],
        call=desc,
        prepare=lambda: _agree(pg, func, scounts, rcounts),
        key=crosscheck.key(func, dtype, in_row),  # split sizes may differ by rank
    )
