"""What every reduction path does around its messages: start the path
pycoll.paths chose (timed where it is a live trial), scale a PREMUL_SUM's
input first, divide an AVG's result last, describe the call for DETAIL's
check, receive beside an output that overlaps its input, and pick MPI's
reduce-scatter form. Shared by pycoll.collectives.reduce and the paths
(ring, doubling, pairwise, to_root, scattered, shm)."""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import _mpi, autotune, kernels, paths
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
    me = pg.rank()
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
    n = pg.size()
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


def along(
    pg: ProcessGroup,
    chosen: Any,
    tensor: np.ndarray,
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    key: int,
) -> Optional[Work]:
    """all_reduce by the path pycoll.paths chose; timed where the call is a
    live trial (pycoll.autotune), whose MPI call takes its general path. (A
    function of its own: the closures would make all_reduce's variables
    cells, 0.2 us on every small call.)"""
    if chosen.name == "mpi":
        step = lambda: run(  # noqa: E731
            pg, "all_reduce", tensor.nbytes, pg.comm.Iallreduce,
            (_mpi.IN_PLACE, [tensor, how.datatype], how.mpi_op), async_op,
            None, [tensor], all_reduce_desc(op, tensor), key=key,
        )  # fmt: skip
    else:
        start = paths.path("all_reduce", chosen.name).start
        step = lambda: start(pg, AllReduce(tensor, op, how, async_op, key, chosen.win))  # noqa: E731
    return autotune.timed(pg, "all_reduce", chosen.trial, chosen.name, step)


def scatter_along(
    pg: ProcessGroup,
    func: str,
    chosen: Any,
    output: np.ndarray,
    parts: List[np.ndarray],
    whole: Optional[np.ndarray],
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    desc: Callable[[], str],
) -> Optional[Work]:
    """A reduce-scatter of ``parts`` (``whole``: the input they are parts
    of, reduce_scatter_tensor's; None for the list form) into ``output`` by
    the path pycoll.paths chose: one of pycoll's, or MPI's own call where
    the call is a live trial (its general path; else the caller's own paths
    to MPI's call serve it), timed where it is a timed trial."""
    if chosen.name != "mpi":
        start = paths.path(func, chosen.name).start
        step = lambda: start(  # noqa: E731
            pg, ReduceScatter(func, output, parts, op, how, async_op, desc, chosen.win)
        )
    else:
        send = np.concatenate([x.reshape(-1) for x in parts]) if whole is None else whole
        into = (
            scratch.beside(pg, output) if whole is not None and may_alias(whole, output) else None
        )
        step = lambda: reduce_scatter_block(  # noqa: E731
            pg, func, send, output, how, async_op, desc, into
        )
    return autotune.timed(pg, func, chosen.trial, chosen.name, step)
