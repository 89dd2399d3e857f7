"""What every reduction path does around its messages: scale a PREMUL_SUM's
input first, divide an AVG's result last, describe the call for DETAIL's
check, receive beside an output that overlaps its input, and pick MPI's
reduce-scatter form. Shared by pycoll.collectives.reduce and the paths
(ring, doubling, pairwise, to_root, scattered, shm)."""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import _mpi, kernels
from ..arrays import may_alias
from ..crosscheck import COUNT, OP_BITS
from ..groups import ProcessGroup
from ..ops import Plan, plan
from ..reduceop import ReduceOp
from ..work import Work
from . import scratch
from ._common import run, sig


class AllReduce(NamedTuple):
    """An all_reduce as its paths start it (pycoll.paths: ``start(pg, job)``);
    ``win``: the group's window, for the window's path."""

    tensor: np.ndarray
    op: ReduceOp
    how: Plan
    async_op: bool
    key: int
    win: Any = None


class ReduceScatter(NamedTuple):
    """A reduce-scatter of ``parts`` (one array shaped like ``output`` per
    rank) into ``output``, as its paths start it."""

    func: str
    output: np.ndarray
    parts: List[np.ndarray]
    op: ReduceOp
    how: Plan
    async_op: bool
    desc: Callable[[], str]
    win: Any = None


class Reduce(NamedTuple):
    """A reduce of ``tensor`` to group rank ``root`` (global rank ``dst``), as
    its paths start it."""

    tensor: np.ndarray
    dst: int
    root: int
    op: ReduceOp
    how: Plan
    async_op: bool
    key: int


def scaled(x: np.ndarray, scale: complex) -> np.ndarray:
    """A scaled copy of an input that must not be modified."""
    return kernels.scale(x, scale)


def prescaler(x: np.ndarray, scale: Optional[complex]) -> Optional[Callable[[], None]]:
    """Scale an in-place buffer once the call is known to go ahead."""
    if scale is None:
        return None

    def prepare() -> None:
        kernels.scale(x, scale, out=x)

    return prepare


def averager(out: np.ndarray, n: int) -> Callable[[], None]:
    def finish() -> None:
        kernels.divide(out, n, out=out)

    return finish


def all_reduce_desc(op: ReduceOp, tensor: np.ndarray) -> Callable[[], str]:
    """all_reduce's description for DETAIL's check, whichever way it runs."""
    return lambda: f"all_reduce({op.name}, {sig(tensor)})"


def reduce_desc(op: ReduceOp, dst: int, tensor: np.ndarray) -> str:
    """reduce's description for DETAIL's check, whichever way it runs."""
    return f"reduce({op.name}, dst={dst}, {sig(tensor)})"


def aside(
    pg: Any, output: np.ndarray, parts: List[np.ndarray]
) -> Tuple[bool, Optional[np.ndarray], Optional[Callable[[], None]]]:
    """Whether a reduce-scatter's ``output`` is this rank's part itself
    (torch's in-place form); and where it overlaps the ``parts`` otherwise,
    an array shaped like it to receive into and what copies that in once
    the call is done (else None, None)."""
    me = pg._rank
    mine = parts[me].ctypes.data == output.ctypes.data
    if not any(may_alias(part, output) for d, part in enumerate(parts) if not (mine and d == me)):
        return mine, None, None
    aside = scratch.beside(pg, output)

    def then() -> None:
        output[...] = aside
        scratch.give(pg, aside)

    return mine, aside, then


def mpi_reduce_scatter(
    comm: Any, n: int, how: Plan, send: np.ndarray, recv: np.ndarray
) -> Tuple[Callable[..., Any], Callable[..., Any], tuple]:
    """MPI's nonblocking and blocking reduce-scatter of ``send`` into ``recv``
    (this rank's part), and their arguments: the v-form with equal counts
    where MPICH runs it pairwise (pycoll._mpi.reduce_scatter_v), else the
    block form."""
    send_spec, recv_spec = [send, how.datatype], [recv, how.datatype]
    if _mpi.reduce_scatter_v(recv.nbytes):
        args: tuple = (send_spec, recv_spec, [recv.size] * n, how.mpi_op)
        return comm.Ireduce_scatter, comm.Reduce_scatter, args
    args = (send_spec, recv_spec, how.mpi_op)
    return comm.Ireduce_scatter_block, comm.Reduce_scatter_block, args


def plan_of(op: ReduceOp, dtype: np.dtype, func: str) -> Plan:
    """The op's plan for the dtype: the one it keeps, else made (pycoll.ops.plan)."""
    try:
        return op._plans[dtype]
    except (AttributeError, KeyError):
        return plan(op, dtype, func)


def reduce_scatter_block(
    pg: ProcessGroup,
    func: str,
    send: np.ndarray,
    output: np.ndarray,
    how: Plan,
    async_op: bool,
    call: Callable[[], str],
    into: Optional[np.ndarray] = None,
    then: Optional[Callable[[], None]] = None,
) -> Optional[Work]:
    """Reduce ``send`` (group size x output.size elements, already scaled if
    need be) and leave this rank's part in ``output``; through ``into`` (an
    array shaped like ``output``, copied into it at the end) where ``output``
    is part of ``send``, since MPI's buffers must not overlap. ``then`` runs
    last, once ``output`` holds the result (a coalesced call copies out)."""
    comm = pg.comm
    n = pg._size
    finish: Optional[Callable[[], None]] = averager(output, n) if how.average else None
    if into is not None:

        def finish() -> None:
            if how.average:
                kernels.divide(into, n, out=output)  # the copy and the division in one pass
            else:
                output[...] = into
            scratch.give(pg, into)

    if then is not None:
        first = finish

        def finish() -> None:
            if first is not None:
                first()
            then()

    recv = output if into is None else into
    start, _, args = mpi_reduce_scatter(comm, n, how, send, recv)
    return run(
        pg,
        func,
        send.nbytes,
        start,
        args,
        async_op,
        finish,
        [output],
        call,
        key=how.key | OP_BITS[func] | output.size & COUNT,
    )
