"""Point-to-point: send, recv, isend, irecv, P2POp, batch_isend_irecv.

Peers are named by global rank, as in torch.distributed. Point-to-point
operations are not counted in a group's sequence number.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _mpi, debug, watch
from ..arrays import MPI_TYPES, check_input, check_output, mpi_datatype
from ..dispatch import collective
from ..groups import STATE, ProcessGroup, resolve
from ..spec import IN, OUT, Array
from ..trace import recorder
from ..trace.recorder import clock
from ..work import Work
from ._common import MONITOR_TAG, check_tag, group_rank

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def _peer(pg: ProcessGroup, rank: Any, name: str, func: str) -> int:
    peer = group_rank(pg, rank, name, func)
    if peer == pg._rank:
        raise ValueError(
            f"{func}: {name}={rank} is this process's own rank; a rank cannot "
            f"{'send to' if name == 'dst' else 'receive from'} itself"
        )
    return peer


def _source(pg: ProcessGroup, src: Any, func: str) -> int:
    return _mpi.MPI.ANY_SOURCE if src is None else _peer(pg, src, "src", func)


# The call a pipeline stage makes every micro-batch (a plain contiguous array
# of an MPI type, a peer of the group named by an int, an int tag in range)
# is checked inline, in one condition, as the collectives' common case is;
# anything else takes the checks that name what is wrong. (The three small
# helpers this condition replaces cost 0.15-0.2 us a call.)


def _name(index: Optional[int]) -> str:
    return "tensor" if index is None else f"[{index}].tensor"


def _outgoing(
    pg: ProcessGroup, tensor: Any, dst: Any, tag: Any, func: str, index: Optional[int] = None
) -> Tuple[np.ndarray, Any, int, int]:
    """send's and isend's arguments, checked: (the array, its MPI datatype,
    the peer's group rank, the tag). ``index``: the op's in a batch's list."""
    if (
        type(dst) is int
        and type(tag) is int
        and 0 <= tag < MONITOR_TAG
        and type(tensor) is np.ndarray
        and tensor.flags.c_contiguous
        and (datatype := MPI_TYPES.get(tensor.dtype)) is not None
        and (peer := pg._group_rank_of.get(dst)) is not None
        and peer != pg._rank
    ):
        return tensor, datatype, peer, tag
    peer = _peer(pg, dst, "dst", func)
    tensor = check_input(func, _name(index), tensor)
    return tensor, mpi_datatype(tensor.dtype), peer, check_tag(tag, func)


def _incoming(
    pg: ProcessGroup,
    tensor: Any,
    src: Any,
    tag: Any,
    func: str,
    index: Optional[int] = None,
) -> Tuple[np.ndarray, Any, int, int]:
    """recv's and irecv's arguments, checked: (the array, its MPI datatype,
    the source's group rank or MPI.ANY_SOURCE, the tag). ``index``: the op's
    in a batch's list, where ``src`` must name a rank."""
    if (
        type(src) is int
        and type(tag) is int
        and 0 <= tag < MONITOR_TAG
        and type(tensor) is np.ndarray
        and (f := tensor.flags).c_contiguous
        and f.writeable
        and (datatype := MPI_TYPES.get(tensor.dtype)) is not None
        and (source := pg._group_rank_of.get(src)) is not None
        and source != pg._rank
    ):
        return tensor, datatype, source, tag
    source = _source(pg, src, func) if index is None else _peer(pg, src, "src", func)
    tensor = check_output(func, _name(index), tensor)
    return tensor, mpi_datatype(tensor.dtype), source, check_tag(tag, func)


def _p2p(
    pg: ProcessGroup,
    op: str,
    start: Callable,
    spec: List[Any],
    peer: Optional[int],
    source: int,
    tag: int,
    status: Any = None,
) -> None:
    """Start one point-to-point operation (``start``: the group's Isend or
    Irecv, of the buffer ``spec``, [array, datatype] or [array, count,
    datatype], with group rank ``source``: ``peer``, or any rank when
    ``peer`` is None) and wait for it within the group's timeout.

    Its flight recorder entry: one done at its first test (a small send, a
    receive whose message is here) is recorded once done, compact and
    untimed (pycoll.trace.recorder.p2p_done), as the collectives' fast path
    records its calls; one that waits gets a full entry before its wait, so
    a timeout's record shows it under way. While a timeline is recorded,
    every entry is a full, timed one."""
    if pg._broken is not None:
        raise watch.broken(pg, op)
    issued = clock() if recorder.TRACING else None
    try:
        request = start(spec, source, tag)
        # A small send is done at once: no wait to set up.
        done = request.Test() if status is None else request.Test(status)
    except _mpi.MPI.Exception as exc:
        entry = recorder.issue(pg, op, None, 0, _known(pg, peer), spec[0].nbytes, issued)
        recorder.complete(entry, recorder.FAILED)
        raise watch.backend_error(op, None, exc) from None
    ring = pg._flight
    if done and issued is None:
        if ring is not None:
            ring.append((op, None if peer is None else pg._ranks[peer], spec[0].nbytes))
        return
    entry = recorder.issue(pg, op, None, 0, _known(pg, peer), spec[0].nbytes, issued)
    if not done:
        try:
            watch.wait(pg, op, None, [request], None, None if status is None else [status], peer)
        except BaseException:
            recorder.complete(entry, recorder.FAILED)  # (a timeout has marked it already)
            raise
    recorder.complete(entry)


def _known(pg: ProcessGroup, peer: Optional[int]) -> Optional[int]:
    """The global rank of group rank ``peer`` (None for any rank)."""
    return None if peer is None else pg._ranks[peer]


@collective(Array("tensor", IN), aware=True, synchronous=True)
def send(
    tensor: np.ndarray,
    dst: int,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    stream: Any = None,
) -> None:
    """Send ``tensor`` to global rank ``dst``; returns once the buffer may be reused."""
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "send")
        if pg is None:
            return None
    tensor, datatype, peer, tag = _outgoing(pg, tensor, dst, tag, "send")
    _p2p(pg, "send", pg.comm.Isend, [tensor, datatype], peer, peer, tag)
    return None


@collective(Array("tensor", OUT), aware=True, synchronous=True)
def recv(
    tensor: np.ndarray,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    stream: Any = None,
) -> int:
    """Receive into ``tensor`` from global rank ``src`` (any rank if None).

    Returns:
        The global rank of the sender (-1 on a rank outside ``group``).
    """
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "recv")
        if pg is None:
            return -1
    tensor, datatype, source, tag = _incoming(pg, tensor, src, tag, "recv")
    spec = [tensor, datatype]
    if source != _mpi.MPI.ANY_SOURCE:  # a named sender: no status to read
        _p2p(pg, "recv", pg.comm.Irecv, spec, source, source, tag)
        return pg._ranks[source]
    status = _mpi.MPI.Status()
    _p2p(pg, "recv", pg.comm.Irecv, spec, None, source, tag, status)
    return pg._ranks[status.Get_source()]


@collective(Array("tensor", IN), aware=True)
def isend(
    tensor: np.ndarray,
    dst: int,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    stream: Any = None,
) -> Optional[Work]:
    """Start sending ``tensor`` to ``dst``; do not modify it until the Work completes."""
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "isend")
        if pg is None:
            return None
    tensor, datatype, peer, tag = _outgoing(pg, tensor, dst, tag, "isend")
    return _start_send(pg, tensor, datatype, peer, tag)


@collective(Array("tensor", OUT), aware=True)
def irecv(
    tensor: np.ndarray,
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    tag: int = 0,
    stream: Any = None,
) -> Optional[Work]:
    """Start receiving into ``tensor`` from ``src`` (any rank if None).

    The Work's ``source_rank()`` gives the sender's global rank once complete.
    """
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "irecv")
        if pg is None:
            return None
    tensor, datatype, source, tag = _incoming(pg, tensor, src, tag, "irecv")
    return _start_recv(pg, tensor, datatype, source, tag)


def _start_send(pg: ProcessGroup, tensor: np.ndarray, datatype: Any, peer: int, tag: int) -> Work:
    if pg._broken is not None:
        raise watch.broken(pg, "isend")
    issued = clock() if recorder.TRACING else None
    try:
        req = pg.comm.Isend([tensor, datatype], peer, tag)
        done = req.Test()  # a small send is done at once
    except _mpi.MPI.Exception as exc:
        raise watch.backend_error("isend", None, exc) from None
    return _started(pg, "isend", req, done, tensor, None, peer, pg._ranks[peer], issued)


def _start_recv(pg: ProcessGroup, tensor: np.ndarray, datatype: Any, source: int, tag: int) -> Work:
    if pg._broken is not None:
        raise watch.broken(pg, "irecv")
    issued = clock() if recorder.TRACING else None
    # A receive from a named peer needs no status: its sender is known (Work.source_rank).
    status = None
    try:
        req = pg.comm.Irecv([tensor, datatype], source, tag)
        if source == _mpi.MPI.ANY_SOURCE:
            peer = known = None
            status = (pg._ranks.__getitem__, [_mpi.MPI.Status()])
            done = req.Test(status[1][0])
        else:
            peer, known = source, pg._ranks[source]
            done = req.Test()  # the message may be here already
    except _mpi.MPI.Exception as exc:
        raise watch.backend_error("irecv", None, exc) from None
    return _started(pg, "irecv", req, done, tensor, status, peer, known, issued)


def _started(
    pg: ProcessGroup,
    op: str,
    request: Any,
    done: bool,
    tensor: np.ndarray,
    status: Any,
    peer: Optional[int],
    known: Optional[int],
    issued: Optional[float],
) -> Work:
    """The Work of an isend or irecv just started and tested once (``done``,
    that test's answer). One done there, which a small send and a receive
    whose message has arrived are, is recorded compact, as :func:`_p2p`
    records a send done at once, and comes back complete (Work.done), but
    for a timeline's timed entries and a debug level's logged completion
    (Work.peer)."""
    if done and issued is None and not debug.LEVEL:
        ring = pg._flight
        if ring is not None:
            ring.append((op, known, tensor.nbytes))
        return Work.done(op, None, [tensor], pg, tensor.nbytes, None, status, peer)
    entry = recorder.issue(pg, op, None, 0, known, tensor.nbytes, issued)
    return Work.peer(op, request, done, tensor, pg, status, peer, entry)


class P2POp:
    """One send or receive for :func:`batch_isend_irecv`.

    Args:
        op: ``pycoll.isend`` or ``pycoll.irecv`` (``send``/``recv`` are taken
            as the same).
        tensor: the array to send, or to receive into.
        peer: global rank of the other side.
        group: the group (default: the world).
        tag: message tag.
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag")

    def __init__(
        self,
        op: Callable,
        tensor: np.ndarray,
        peer: int,
        group: Optional[ProcessGroup] = None,
        tag: int = 0,
    ):
        # (identity tests: a tuple of the four would be built on every call)
        self.op: Callable
        if op is isend or op is send:
            self.op = isend
        elif op is irecv or op is recv:
            self.op = irecv
        else:
            raise ValueError(
                "P2POp: op must be pycoll.isend or pycoll.irecv, got "
                f"{getattr(op, '__name__', op)!r}"
            )
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Start every send and receive in the list; return one Work per op.

    All ops are checked before any is started, so a bad entry sends nothing.
    """
    func = "batch_isend_irecv"
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError(f"{func}: expects a non-empty list of P2POp")
    planned: List[tuple] = []
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise TypeError(f"{func}: entry {i} is a {type(p).__name__}, not a P2POp")
        pg = resolve(p.group, func)
        if pg is None:
            continue
        sending = p.op is isend
        if sending:
            tensor, datatype, peer, tag = _outgoing(pg, p.tensor, p.peer, p.tag, func, i)
        else:  # (a receive writes its array)
            tensor, datatype, peer, tag = _incoming(pg, p.tensor, p.peer, p.tag, func, i)
        planned.append((sending, pg, tensor, datatype, peer, tag))
    # A plain loop: a comprehension unpacking each entry into start(*args)
    # cost 0.8 us more an entry (CPython 3.11).
    works = []
    for sending, pg, tensor, datatype, peer, tag in planned:
        works.append((_start_send if sending else _start_recv)(pg, tensor, datatype, peer, tag))
    return works
