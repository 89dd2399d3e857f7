"""Reductions: all_reduce, reduce, reduce_scatter, reduce_scatter_tensor
(all_reduce_coalesced: pycoll.collectives.reduce_coalesced).

Each applies a ReduceOp across the group's ranks; how the op is carried out
for the dtype (MPI op, pre-scaling, averaging) comes from pycoll.ops.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from .. import _mpi, crosscheck, debug, kernels, native, paths, persistent
from ..arrays import (
    MPI_TYPES,
    check_input,
    check_list,
    check_output,
    check_same_dtype,
    check_same_shape,
    check_size,
    may_alias,
    own_part,
    plain_arrays,
)
from ..crosscheck import COUNT, OP_BITS
from ..dispatch import collective
from ..groups import STATE, ProcessGroup, resolve
from ..ops import order_matters, plan
from ..paths import Call
from ..paths import rule as R
from ..persistent import LIMIT as PLAN_LIMIT
from ..reduceop import ReduceOp
from ..spec import IN, INOUT, LIST, OUT, Array
from ..work import Work
from . import doubling, pair, pairwise, ring, scattered, scratch, shm, to_root  # noqa: F401 (paths)
from ._common import lean, plain, root_of, run, sig
from ._reduction import (
    Reduce,
    all_reduce_desc,
    along,
    averager,
    mpi_reduce_scatter,
    plan_of,
    prescaler,
    reduce_desc,
    reduce_scatter_block,
    scaled,
    scatter_along,
)

__all__ = [
    "all_reduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
]


_ALL_REDUCE = OP_BITS["all_reduce"]  # the call check's key (pycoll.crosscheck)
_REDUCE_SCATTER_TENSOR = OP_BITS["reduce_scatter_tensor"]

# Up to this size a two-rank AVG of float32/float64 runs as one user op; above
# it MPI's builtin SUM (Rabenseifner: each rank reduces half the buffer, where
# a user op gets recursive doubling and reduces all of it) plus a division
# measured faster. float16/bfloat16 are user ops anyway: always. A large
# AVG takes pycoll's ring before this applies.
MEAN_OF_TWO_BYTES = 32 << 20


def _mean_of_two(x: np.ndarray) -> bool:
    if x.dtype.kind == "c":
        return False  # complex: AVG stays a SUM plus a per-component division
    return x.dtype.itemsize == 2 or x.nbytes < MEAN_OF_TWO_BYTES


@collective(Array("tensor", INOUT), aware=True, chunked=True)
def all_reduce(
    tensor: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``tensor`` across the group, in place, so every rank holds the result.

    Args:
        tensor: input and output; C-contiguous and writeable.
        op: the reduction (default SUM).
        group: the group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``; None otherwise, and on ranks outside ``group``.

    Example (2 ranks)::

        >>> t = np.array([1.0, 2.0]) * (rank + 1)   # rank 0: [1, 2]; rank 1: [2, 4]
        >>> pycoll.all_reduce(t)
        >>> t                                         # both ranks: [3, 6]
    """
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "all_reduce")  # raises before init; None for a non-member
        if pg is None:
            return None
    # The common case (a plain writeable contiguous array, a cached plan, a
    # synchronous call, debug off) is checked inline and goes straight to
    # MPI: this is the call training loops make thousands of times a step.
    if type(tensor) is not np.ndarray or not ((f := tensor.flags).c_contiguous and f.writeable):
        tensor = check_output("all_reduce", "tensor", tensor)
    # The same call as before on this array? Compiled (pycoll.native). Else
    # ``kept`` is False where native.call may keep it below (None: an array
    # first seen now, as one made afresh for each call, is not offered).
    kept = None
    if pg._native is not None and debug.PLAIN:
        if not async_op:
            if kept := native.again(pg, "all_reduce", tensor, _mpi.IN_PLACE, op):
                return None
        elif async_op is True and (
            kept := native.again(pg, "all_reduce", tensor, _mpi.IN_PLACE, op, work=True)
        ):
            return kept  # (a Work: started by the compiled code, waited for in Python)
    try:
        how = op._plans[tensor.dtype]
    except (AttributeError, KeyError):
        how = plan(op, tensor.dtype, "all_reduce")
    key = how.key | _ALL_REDUCE | tensor.size & COUNT
    plans = pg._plans
    if plans is not None and how.plain:  # a repeated small call: pycoll.persistent
        made = plans.made.get(key)
        if made is None and tensor.nbytes <= PLAN_LIMIT:
            made = persistent.for_all_reduce(pg, key, tensor, how.datatype, how.mpi_op)
        if made is not None:
            if (
                not async_op
                and debug.PLAIN
                and native.call_plan(
                    pg, "all_reduce", made, tensor, _mpi.IN_PLACE, op, tensor, tensor
                )
            ):
                return None
            desc = all_reduce_desc(op, tensor) if async_op or not debug.PLAIN else None
            return made.call(pg, "all_reduce", tensor, tensor, async_op, desc)
    # Large calls: the path pycoll.paths chooses (the tuning table, the live
    # trials, the built-in rule). The sizes are compared first, so small calls
    # (the hot path) make no call.
    nbytes = tensor.nbytes
    if (
        how.split
        or nbytes >= pg._tuned_from
        or nbytes >= pg._live_from
        or nbytes >= R.RING_BYTES
        or nbytes >= R.SHM_BYTES_PAIR
        or nbytes >= R.SHM_BYTES_MPICH
        or nbytes >= R.SHM_BYTES
        or 0 < R.DOUBLING_BYTES <= nbytes
    ):
        call = Call("all_reduce", op.name, tensor.dtype, nbytes, pg._size, how, pg._aliases)
        chosen = paths.choose(pg, call)
        if chosen.name != "mpi" or chosen.trial is not None:
            return along(pg, chosen, tensor, op, how, async_op, key)
        if chosen.by != "rule":
            nbytes = 0  # MPI's own call, as the table or the trials say: not the exchange
    mpi_op, plainly, average = how.mpi_op, how.plain, how.average
    if average and pg._size == 2 and _mean_of_two(tensor):
        # Two ranks: each element is combined exactly once, so AVG is one user
        # op, (a + b) / 2, and no second pass over the result.
        mpi_op, plainly, average = kernels.mean_of_two_op(tensor.dtype), True, False
    if (
        plainly
        and nbytes == tensor.nbytes
        and pair.applies("all_reduce", pg._size, nbytes)
        and not pg._aliases
    ):
        ordered = order_matters(op.name, tensor.dtype)
        return pair.all_reduce(
            pg,
            tensor,
            mpi_op,
            how.datatype,
            ordered,
            async_op,
            key,
            all_reduce_desc(op, tensor),
            op,
            kept,
        )
    comm = pg.comm
    # (The compiled path keeps no call of the live trials' sizes: a kept call
    # would skip its class's count on one rank, and the ranks' rechecks
    # would fall on different calls: pycoll.autotune.)
    if kept is False and tensor.nbytes >= pg._live_from:
        kept = None
    if plainly and not async_op and debug.PLAIN:
        if kept is False and native.call(
            pg, "all_reduce", key, native.ALL_REDUCE, _mpi.IN_PLACE, tensor, tensor.size,
            how.datatype, mpi_op, 0, tensor, _mpi.IN_PLACE, op,
        ):  # fmt: skip
            return None
        plain(
            pg,
            "all_reduce",
            key,
            comm.Iallreduce,
            comm.Allreduce,
            _mpi.IN_PLACE,
            [tensor, how.datatype],
            mpi_op,
        )
        return None
    if plainly and async_op is True and debug.PLAIN:  # (run's own first step, taken here)
        work = kept is False and native.call(
            pg, "all_reduce", key, native.ALL_REDUCE, _mpi.IN_PLACE, tensor, tensor.size,
            how.datatype, mpi_op, 0, tensor, _mpi.IN_PLACE, op, work=True,
        )  # fmt: skip
        if work:  # kept, and started by the compiled code
            return work
        return lean(
            pg, "all_reduce", tensor.nbytes, comm.Iallreduce,
            (_mpi.IN_PLACE, [tensor, how.datatype], mpi_op), True, None, [tensor], key,
        )  # fmt: skip
    return run(
        pg,
        "all_reduce",
        tensor.nbytes,
        comm.Iallreduce,
        (_mpi.IN_PLACE, [tensor, how.datatype], mpi_op),
        async_op,
        averager(tensor, pg._size) if average else None,
        [tensor],
        all_reduce_desc(op, tensor),
        prescaler(tensor, how.prescale),
        key=key,
    )


@collective(Array("tensor", IN, root=("dst", INOUT)), aware=True)
def reduce(
    tensor: np.ndarray,
    dst: int,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``tensor`` across the group into ``tensor`` on rank ``dst`` only.

    Args:
        tensor: input on every rank; on ``dst`` also the output (so it must
            be writeable there). Other ranks' arrays are left unchanged.
        dst: global rank that receives the result.
    """
    func = "reduce"
    if (pg := STATE.default) is None or group is not None:
        if (pg := resolve(group, func)) is None:  # raises before init; None: not a member
            return None
    looked = False  # for the same call as before on this array, known by the global dst
    kept = None  # False where native.call may keep the call (see all_reduce)
    if (
        pg._native is not None
        and not async_op
        and type(dst) is int
        and type(tensor) is np.ndarray
        and (f := tensor.flags).c_contiguous
        and (f.writeable or dst != pg._ranks[pg._rank])
        and debug.PLAIN
    ):
        looked = True
        into = _mpi.IN_PLACE if dst == pg._ranks[pg._rank] else None
        if kept := native.again(pg, func, tensor, into, (op, dst)):  # (a dst kept: a group rank)
            return None
    root = root_of(pg, dst, "dst", func)
    is_root = root == pg._rank
    if type(tensor) is not np.ndarray or not (
        (f := tensor.flags).c_contiguous and (f.writeable or not is_root)
    ):
        check = check_output if is_root else check_input  # only dst writes
        tensor = check(func, "tensor", tensor)
    into = _mpi.IN_PLACE if is_root else None  # (where the result goes, besides the input)
    if (  # the same call as before on this array: compiled (pycoll.native)
        not looked  # (dst given as another integer type)
        and pg._native is not None
        and not async_op
        and debug.PLAIN
        and (kept := native.again(pg, func, tensor, into, (op, dst)))
    ):
        return None
    how = plan_of(op, tensor.dtype, func)
    mpitype = how.datatype
    comm = pg.comm
    key = crosscheck.key(func, tensor.dtype, tensor.size, root, op.name)
    nbytes = tensor.nbytes
    if (  # (the sizes first: small calls make no call)
        0 < R.TO_ROOT_BYTES <= nbytes
        or 0 < R.TO_ROOT_BYTES_OPEN_MPI <= nbytes
        or 0 < R.SCATTERED_BYTES <= nbytes
    ) and pg._size > 1:
        call = Call(func, op.name, tensor.dtype, nbytes, pg._size, how, pg._aliases)
        chosen = paths.choose(pg, call)
        if chosen.name != "mpi":
            start = paths.path(func, chosen.name).start
            return start(pg, Reduce(tensor, dst, root, op, how, async_op, key))
    if pg._plans is not None and how.plain and tensor.nbytes <= PLAN_LIMIT:  # repeated?
        made = persistent.for_reduce(pg, key, tensor, mpitype, how.mpi_op, root)
        if made is not None:
            out = tensor if is_root else None  # (only dst's array is written)
            if (  # kept as the lanes above look for it
                not async_op
                and debug.PLAIN
                and native.call_plan(pg, func, made, tensor, into, (op, dst), tensor, out)
            ):
                return None
            return made.call(pg, func, tensor, out, async_op, lambda: reduce_desc(op, dst, tensor))
    if how.plain and pair.applies("reduce", pg._size, tensor.nbytes) and not pg._aliases:
        return pair.reduce(pg, func, tensor, root, how.mpi_op, mpitype, async_op, key,
                           lambda: reduce_desc(op, dst, tensor), (op, dst), kept)  # fmt: skip
    if how.plain and not async_op and debug.PLAIN:  # the common case, straight to MPI
        if kept is False and native.call(
            pg, func, key, native.REDUCE, tensor if into is None else into,
            tensor if is_root else None, tensor.size, mpitype, how.mpi_op, root,
            tensor, into, (op, dst),
        ):  # fmt: skip
            return None
        if is_root:
            plain(pg, func, key, comm.Ireduce, comm.Reduce, _mpi.IN_PLACE, [tensor, mpitype],
                  how.mpi_op, root)  # fmt: skip
        else:
            plain(pg, func, key, comm.Ireduce, comm.Reduce, [tensor, mpitype], None, how.mpi_op,
                  root)  # fmt: skip
        return None
    args: tuple
    prepare = None
    if is_root:
        prepare = prescaler(tensor, how.prescale)
        args = (_mpi.IN_PLACE, [tensor, mpitype], how.mpi_op, root)
        finish = averager(tensor, pg._size) if how.average else None
    else:
        send = tensor if how.prescale is None else scaled(tensor, how.prescale)
        args = ([send, mpitype], None, how.mpi_op, root)
        finish = None
    return run(
        pg,
        func,
        tensor.nbytes,
        comm.Ireduce,
        args,
        async_op,
        finish,
        [tensor],
        lambda: reduce_desc(op, dst, tensor),
        prepare,
        key=key,
    )


@collective(Array("output", OUT), Array("input_list", IN, LIST))
def reduce_scatter(
    output: np.ndarray,
    input_list: List[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``input_list[i]`` across the group into ``output`` on group rank i.

    Args:
        output: receives this rank's reduced slice.
        input_list: one array per rank of the group, each shaped like ``output``.
    """
    func = "reduce_scatter"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg._size
    # The common case (a plain contiguous writeable output, a list of n plain
    # contiguous arrays of its dtype and shape) needs no more checks.
    fast = (
        type(output) is np.ndarray
        and (f := output.flags).c_contiguous
        and f.writeable
        and (dtype := output.dtype) in MPI_TYPES
        and plain_arrays(input_list, n, dtype, output.shape, writeable=False)
    )
    if fast:
        inputs = input_list
        if native.again_list(pg, func, output, inputs, op, async_op):  # (compiled: as before)
            return None
    else:
        output = check_output(func, "output", output)
        inputs = [
            check_input(func, f"input_list[{i}]", x)
            for i, x in enumerate(check_list(func, "input_list", input_list, n))
        ]
        dtype = check_same_dtype(func, [output] + inputs)
        check_same_shape(func, "input_list", inputs, output.shape, "output")
    how = plan_of(op, dtype, func)
    desc = lambda: f"{func}({op.name}, output {sig(output)})"  # noqa: E731
    chosen = paths.choose(pg, Call(func, op.name, dtype, n * output.nbytes, n, how, pg._aliases))
    if chosen.name != "mpi" or chosen.trial is not None:
        return scatter_along(pg, func, chosen, output, inputs, None, op, how, async_op, desc)
    if (  # (only what every rank shares: each lays out its arrays as it will)
        how.plain
        and pair.applies(func, n, n * output.nbytes)
        and not pg._aliases
        and not order_matters(op.name, dtype)
    ):
        key = how.key | OP_BITS[func] | output.size & COUNT
        form = "aside" if any(may_alias(x, output) for x in inputs) else "apart"
        kept = False if fast else None  # (again_list found no call kept with this list)
        return pair.reduce_scatter(pg, func, output, inputs, None, form, how.mpi_op,
                                   how.datatype, async_op, key, desc, op, kept)  # fmt: skip
    if how.plain and not async_op and debug.PLAIN:
        # Synchronous, MPI's own op (pycoll.collectives._common.plain), as
        # reduce_scatter_tensor's common case: the generic path's bookkeeping
        # cost 5.2 us a call of 8 B on one rank, this one 3.4 us; kept by the
        # compiled path (the inputs copied side by side into a buffer the
        # call keeps, there), ... (docs/measurements/list_forms.py).
        key = how.key | OP_BITS[func] | output.size & COUNT
        # (no call of the live trials' sizes kept, as in all_reduce)
        if fast and pg._native is not None and n * output.nbytes < pg._live_from:
            what = native.REDUCE_SCATTER
            if _mpi.reduce_scatter_v(output.nbytes):  # (as _mpi_reduce_scatter chooses)
                what = native.REDUCE_SCATTER_V
            if native.call(pg, func, key, what, None, output, output.size, how.datatype, how.mpi_op,
                           0, output, inputs[0], op, items=tuple(inputs)):  # fmt: skip
                return None
        send = np.concatenate([x.reshape(-1) for x in inputs])  # (never the output: a copy)
        start, blocking, args = mpi_reduce_scatter(pg.comm, n, how, send, output)
        plain(pg, func, key, start, blocking, *args)
        return None
    send = np.concatenate([x.reshape(-1) for x in inputs])  # (never the output: a copy)
    if how.prescale is not None:
        kernels.scale(send, how.prescale, out=send)
    return reduce_scatter_block(pg, func, send, output, how, async_op, desc)


@collective(Array("output", OUT), Array("input", IN), aware=True)
def reduce_scatter_tensor(
    output: np.ndarray,
    input: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``input`` across the group and scatter the result in equal parts.

    Args:
        output: receives this rank's part; ``output.size * group size`` must
            equal ``input.size``.
        input: the array to reduce; rank i receives elements
            ``[i * output.size, (i + 1) * output.size)`` of the flattened sum.
    """
    func = "reduce_scatter_tensor"
    if (pg := STATE.default) is None or group is not None:
        if (pg := resolve(group, func)) is None:  # raises before init; None: not a member
            return None
    n = pg._size
    kept = None  # False where native.call may keep the call (see all_reduce)
    if (  # the same call as before on these arrays: compiled (pycoll.native)
        pg._native is not None
        and (not async_op or async_op is True)  # (with a Work: pycoll.native.again's work)
        and debug.PLAIN
        and type(output) is np.ndarray
        and (
            # torch's in-place form, the output a new view of the input each
            # call: the call kept on the input, known by the output's place
            kept := _in_input(output, input)
            and output.size * n == input.size
            and output.flags.writeable
            and native.again(
                pg, func, input, _mpi.IN_PLACE, op, input=output, place=output, work=async_op
            )
            # else two arrays (views of one buffer that do not overlap included)
            or native.again(pg, func, output, input, op, input=input, work=async_op)
        )
    ):
        return kept if async_op else None
    # Two plain contiguous arrays of one dtype, the output writeable, sizes
    # that fit: no more checks (the common case, inline as all_reduce's).
    if not (
        type(output) is np.ndarray
        and type(input) is np.ndarray
        and (f := output.flags).c_contiguous
        and f.writeable
        and input.flags.c_contiguous
        and (dtype := output.dtype) == input.dtype
        and dtype in MPI_TYPES
        and input.size == output.size * n
    ):
        output = check_output(func, "output", output)
        input = check_input(func, "input", input)
        dtype = check_same_dtype(func, [output, input])
        check_size(func, "input", input, output.size * n, "output.size x group size")
    how = plan_of(op, dtype, func)
    desc = lambda: f"{func}({op.name}, output shape={output.shape}, input {sig(input)})"  # noqa: E731
    nbytes = input.nbytes
    if (  # (the sizes first: small calls, the hot path, make no call)
        nbytes >= R.SCATTER_SHM_BYTES_OPEN_MPI
        or 0 < R.PAIRWISE_BYTES <= nbytes
        or 0 < R.PAIRWISE_BYTES_OPEN_MPI <= nbytes
        or nbytes >= pg._tuned_rs_from
        or nbytes >= pg._live_from
    ):
        chosen = paths.choose(pg, Call(func, op.name, dtype, nbytes, n, how, pg._aliases))
        if chosen.name != "mpi" or chosen.trial is not None:
            flat, count = input.reshape(-1), output.size
            parts = [flat[d * count : (d + 1) * count] for d in range(n)]
            return scatter_along(pg, func, chosen, output, parts, input, op, how, async_op, desc)
    if pg._plans is not None and how.plain and input.nbytes <= PLAN_LIMIT:  # repeated?
        key = how.key | OP_BITS[func] | output.size & COUNT
        made = persistent.for_reduce_scatter(pg, key, output, how.datatype, how.mpi_op)
        if made is not None:
            if not async_op and debug.PLAIN:  # kept as the lane above looks for it
                if _in_input(output, input):
                    kept = native.call_plan(pg, func, made, input, _mpi.IN_PLACE, op, input,
                                            output, place=output)  # fmt: skip
                else:
                    kept = native.call_plan(pg, func, made, output, input, op, input, output)
                if kept:
                    return None
            return made.call(pg, func, input, output, async_op, desc)
    if (  # (only what every rank shares: each lays out its arrays as it will)
        how.plain
        and pair.applies(func, n, nbytes)
        and not pg._aliases
        and not order_matters(op.name, dtype)
    ):
        form = "apart"
        if _in_input(output, input) and own_part(output, input, pg._rank):
            form = "in place"
        elif may_alias(input, output):
            form = "aside"
        flat, count = input.reshape(-1), output.size
        halves = (flat[:count], flat[count:])
        key = how.key | _REDUCE_SCATTER_TENSOR | output.size & COUNT
        return pair.reduce_scatter(pg, func, output, halves, input, form, how.mpi_op,
                                   how.datatype, async_op, key, desc, op, kept)  # fmt: skip
    if how.plain and (not async_op or async_op is True) and debug.PLAIN:
        # The common case, straight to MPI (pycoll.collectives._common.plain):
        # the generic path's bookkeeping was a third of this call's cost at 8 B.
        # torch's in-place form receives beside the input, as below (a buffer
        # of the kept call's own: with a Work, not kept, pycoll.native.call).
        aliased = may_alias(input, output)
        key = how.key | _REDUCE_SCATTER_TENSOR | output.size & COUNT
        if pg._native is not None and nbytes < pg._live_from:  # (as in all_reduce)
            what = native.REDUCE_SCATTER
            if _mpi.reduce_scatter_v(output.nbytes):  # (as _mpi_reduce_scatter chooses)
                what = native.REDUCE_SCATTER_V
            if not aliased:  # (kept: the output's answer from the lane above)
                kept = kept is False and native.call(
                    pg, func, key, what, input, output, output.size, how.datatype, how.mpi_op,
                    0, output, input, op, work=async_op,
                )  # fmt: skip
            else:  # in place: kept receiving beside, as below (the lane above finds it;
                # an input first seen in this call is left by native.call at once)
                kept = _in_input(output, input) and native.call(
                    pg, func, key, what, input, None, output.size, how.datatype, how.mpi_op,
                    0, input, _mpi.IN_PLACE, op, beside=output, place=output, work=async_op,
                )  # fmt: skip
            if kept:
                return kept if async_op else None
        if not async_op:
            into = scratch.beside(pg, output) if aliased else None
            recv = output if into is None else into
            start, blocking, args = mpi_reduce_scatter(pg.comm, n, how, input, recv)
            plain(pg, func, key, start, blocking, *args)
            if into is not None:
                output[...] = into
                scratch.give(pg, into)
            return None
    send, into = input, None
    if how.prescale is not None:
        send = scaled(input, how.prescale)
    elif may_alias(input, output):
        # torch's in-place form (output this rank's part of input): MPI takes
        # the input as it is and leaves the result beside it, to be copied
        # in; 1/n of the input copied, where a private copy of the whole
        # input cost 1.3-1.9x a raw in-place call from 2 MiB.
        into = scratch.beside(pg, output)
    return reduce_scatter_block(pg, func, send, output, how, async_op, desc, into)


def _in_input(output: np.ndarray, input: Any) -> bool:
    """Whether ``output`` is a view of ``input``'s memory, as torch's in-place
    reduce-scatter makes it (a view of ``input``, or of what ``input`` views)."""
    base = output.base
    return base is not None and (base is input or base is getattr(input, "base", None))
