"""Coalesced all-gather and reduce-scatter: many arrays, one MPI operation.

torch hands a group many arrays at once (c10d's
``allgather_into_tensor_coalesced`` and ``reduce_scatter_tensor_coalesced``,
which ``torch.distributed._coalescing_manager`` and the functional
``*_coalesced`` collectives reach). One MPI operation per array pays MPI's
latency and pycoll's per-call work for each: on 2 ranks, 1,000 arrays of
1 KiB took 47 ms as separate all-gathers against 0.3 ms for one all-gather of
their total size (docs/benchmarks.md). Here a list is one operation:

1. the inputs are copied into one buffer by one compiled call
   (pycoll.kernels.copy_pieces) from a table of (target, source, bytes)
   pieces, which numpy builds from the arrays' addresses and sizes;
2. one MPI all-gather (of bytes, so any dtypes mix) or one reduce-scatter
   (one dtype; every op and dtype of reduce_scatter_tensor, pycoll's kernels
   included) moves it;
3. once it is complete, the results are copied out the same way.

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

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _mpi, crosscheck, kernels
from ..arrays import check_input, check_list, check_output, check_same_dtype, check_size
from ..dispatch import IN, LIST, OUT, Array, collective
from ..groups import ProcessGroup, resolve
from ..ops import ReduceOp
from ..work import Work
from . import scratch
from ._common import run
from .reduce import _plan, _reduce_scatter_block

__all__ = [
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "addresses",
    "all_gather_bytes",
    "reduce_scatter_parts",
    "checked",
]


_BYTE = np.dtype(np.uint8)
# Send and receive buffers from this many bytes are the group's kept ones
# (pycoll.collectives.scratch): new ones of 1,000 KiB cost 0.5 ms of page
# faults per call here, ten times the copy into them.
KEEP_FROM = scratch.KEEP_FROM_LEAST


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


def all_gather_bytes(
    pg: ProcessGroup,
    func: str,
    inputs: List[np.ndarray],
    targets: np.ndarray,
    result: Any,
    async_op: bool,
    desc: Union[str, Callable[[], str], None],
) -> Optional[Work]:
    """Every rank's ``inputs`` (checked C-contiguous host arrays, any dtypes)
    gathered in one MPI operation, as the collective ``func``: rank r's
    ``inputs[i]`` is copied to address ``targets[r, i]`` (an (n, K) int64
    table) once it is complete. ``result`` is what the Work hands back."""
    n = pg._size
    sizes = np.array([x.nbytes for x in inputs], np.int64)
    offsets, total = _offsets(sizes)
    send = scratch.take(pg, total, _BYTE, KEEP_FROM)
    kernels.copy_pieces(addresses([send]) + offsets, addresses(inputs), sizes, total)
    recv = scratch.take(pg, n * total, _BYTE, KEEP_FROM)
    sources = (addresses([recv]) + total * _ranks(n) + offsets).reshape(-1)
    every = np.tile(sizes, n)

    def finish() -> None:
        kernels.copy_pieces(targets.reshape(-1), sources, every, recv.nbytes)
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
        key=crosscheck.key(func, None, total),
    )


def reduce_scatter_parts(
    pg: ProcessGroup,
    func: str,
    inputs: List[np.ndarray],
    outputs: Optional[List[np.ndarray]],
    dtype: np.dtype,
    op: ReduceOp,
    async_op: bool,
    desc: Callable[[], str],
) -> Tuple[Optional[Work], np.ndarray]:
    """Every ``inputs[i]`` (checked C-contiguous host arrays of ``dtype``,
    each of n equal parts) reduced over the group in one operation, as the
    collective ``func``; this rank's part of input i goes to ``outputs[i]``
    once it is complete. Returns the Work (None if synchronous) and the
    buffer receiving this rank's parts back to back: with ``outputs`` None,
    the caller's results are views of it."""
    n = pg._size
    how = _plan(op, dtype, func)
    parts = np.array([x.nbytes for x in inputs], np.int64) // n
    offsets, total = _offsets(parts)
    send = scratch.take(pg, n * total, _BYTE, KEEP_FROM)
    targets = addresses([send]) + total * _ranks(n) + offsets
    sources = addresses(inputs) + _ranks(n) * parts
    kernels.copy_pieces(targets.reshape(-1), sources.reshape(-1), np.tile(parts, n), send.nbytes)
    data = send.view(dtype)
    if how.prescale is not None:
        kernels.scale(data, how.prescale, out=data)
    if outputs is None:  # the results are views of it: the caller's for good
        recv = np.empty(total // dtype.itemsize, dtype)
    else:
        recv = scratch.take(pg, total, dtype, KEEP_FROM)
        places, mine = addresses(outputs), addresses([recv]) + offsets

    def then() -> None:
        scratch.give(pg, send)
        if outputs is not None:
            kernels.copy_pieces(places, mine, parts, total)
            scratch.give(pg, recv)

    work = _reduce_scatter_block(pg, func, data, recv, how, async_op, desc, then=then)
    return work, recv


def checked(
    func: str, name: str, arrays: Any, check: Callable[[str, str, Any], np.ndarray]
) -> List[np.ndarray]:
    """``check(func, name[i], arrays[i])`` of each item of the list ``arrays``:
    run without naming the items (a name costs more than the check at 1,000
    arrays), and again with their names where one fails, to say which."""
    items = check_list(func, name, arrays)
    try:
        return [check(func, name, x) for x in items]
    except (TypeError, ValueError):
        for i, x in enumerate(items):
            check(func, f"{name}[{i}]", x)
        raise


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


def _shapes(arrays: List[np.ndarray]) -> str:
    return str([(tuple(a.shape), str(a.dtype)) for a in arrays])


@collective(Array("output_tensors", OUT, LIST), Array("input_tensors", IN, LIST))
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

    Args:
        output_tensors: ``output_tensors[i]`` receives every rank's
            ``input_tensors[i]`` back to back in group-rank order: the group
            size times its elements, of its dtype.
        input_tensors: this rank's arrays.
    """
    func = "all_gather_into_tensor_coalesced"
    pg = resolve(group, func)
    if pg is None:
        return None
    n = pg._size
    outs, ins = _pairs(func, output_tensors, input_tensors, "output_tensors", "input_tensors")
    _sizes(func, outs, ins, n, "output_tensors", "input_tensors[{i}].size x group size")
    sizes = np.array([x.nbytes for x in ins], np.int64)
    targets = addresses(outs) + _ranks(n) * sizes
    return all_gather_bytes(
        pg, func, ins, targets, outs, async_op, lambda: f"{func}(inputs={_shapes(ins)})"
    )


@collective(Array("output_tensors", OUT, LIST), Array("input_tensors", IN, LIST))
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
    ``reduce_scatter_tensor_coalesced``). The arrays share one dtype.

    Args:
        output_tensors: ``output_tensors[i]`` receives this rank's part of
            the reduced ``input_tensors[i]``: group rank r gets elements
            ``[r * size, (r + 1) * size)``, where ``size`` is its own size.
        input_tensors: the arrays to reduce, each the group size times its
            output's size.
    """
    func = "reduce_scatter_tensor_coalesced"
    pg = resolve(group, func)
    if pg is None:
        return None
    n = pg._size
    outs, ins = _pairs(func, output_tensors, input_tensors, "output_tensors", "input_tensors")
    dtype = check_same_dtype(func, ins)
    _sizes(func, ins, outs, n, "input_tensors", "output_tensors[{i}].size x group size")
    desc = lambda: f"{func}({op.name}, inputs={_shapes(ins)})"  # noqa: E731
    work, _ = reduce_scatter_parts(pg, func, ins, outs, dtype, op, async_op, desc)
    return work
