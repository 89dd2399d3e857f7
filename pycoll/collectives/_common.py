"""The pipeline shared by every collective.

Each collective checks its arguments (pycoll.arrays), then calls :func:`run`,
which counts the operation on its group, makes the MPI call (blocking, or
nonblocking with a Work when ``async_op=True``), turns MPI errors into
DistBackendError, finishes up (divisions, unpacking) and logs at INFO.
"""

from __future__ import annotations

import operator
import time
from typing import Any, Callable, Optional

from .. import _mpi, debug
from ..errors import DistBackendError
from ..groups import ProcessGroup
from ..work import Work

DETAIL = debug.DebugLevel.DETAIL

# Point-to-point tags from MONITOR_TAG up are pycoll's own; MPI guarantees
# tags up to 32767. Users get 0..MONITOR_TAG-1.
RESERVED_TAG = 32767  # object messages (send_object_list / recv_object_list)
MONITOR_TAG = 32766  # monitored_barrier


def backend_error(op: str, seq: Optional[int], exc: BaseException) -> DistBackendError:
    where = f"{op} (seq {seq})" if seq is not None else op
    return DistBackendError(f"{where} failed in MPI: {exc}", op, seq)


def run(
    pg: ProcessGroup,
    op: str,
    nbytes: int,
    blocking: Callable,
    nonblocking: Callable,
    args: tuple,
    async_op: bool,
    finish: Optional[Callable[[], None]] = None,
    result: Any = None,
) -> Optional[Work]:
    """Sequence and issue one MPI collective; return a Work if ``async_op``."""
    pg._seq += 1
    seq = pg._seq
    if async_op:
        try:
            request = nonblocking(*args)
        except _mpi.MPI.Exception as exc:
            raise backend_error(op, seq, exc) from None
        return Work(op, seq, [request], finish, result, pg.group_name, nbytes)
    t0 = time.perf_counter() if debug.LEVEL else 0.0
    try:
        blocking(*args)
    except _mpi.MPI.Exception as exc:
        raise backend_error(op, seq, exc) from None
    if finish is not None:
        finish()
    if debug.LEVEL:
        debug.log_collective(op, pg.group_name, seq, nbytes, time.perf_counter() - t0)
    return None


def sig(x: Any) -> str:
    """An array's part of a DETAIL fingerprint."""
    return f"shape={x.shape}, {x.dtype}"


def detail(pg: ProcessGroup, op: str, call: str, async_op: bool = False) -> None:
    """At ``PYCOLL_DEBUG=DETAIL``, check that every member is about to make the
    same call (``call`` names the arguments that must agree) before it is made."""
    if async_op:
        call += " [async_op=True]"
    debug.check_fingerprint(pg.comm, pg._ranks, pg.group_name, op, pg._seq + 1, call)


def plain(pg: ProcessGroup, op: str, call: Callable, *args: Any) -> None:
    """The synchronous fast path: count the collective and call MPI directly.

    For calls already known to need nothing else (checked arrays, debug OFF,
    no finishing step); everything else goes through :func:`run`.
    """
    pg._seq += 1
    try:
        call(*args)
    except _mpi.MPI.Exception as exc:
        raise backend_error(op, pg._seq, exc) from None


def done(pg: ProcessGroup, op: str, seq: int, nbytes: int, t0: float) -> None:
    """Close an operation made of several blocking MPI calls (object collectives)."""
    if debug.LEVEL:
        debug.log_collective(op, pg.group_name, seq, nbytes, time.perf_counter() - t0)


def group_rank(pg: ProcessGroup, rank: Any, name: str, func: str) -> int:
    """Translate a global rank argument (src, dst) into ``pg``'s numbering."""
    try:
        index = operator.index(rank) if not isinstance(rank, bool) else None
    except TypeError:
        index = None
    if index is None:
        raise TypeError(f"{func}: {name} must be an int (a global rank), got {rank!r}")
    local = pg._group_rank_of.get(index)
    if local is None:
        if pg._ranks == list(range(pg.size())):
            valid = f"0..{pg.size() - 1}"
        else:
            valid = f"one of {pg._ranks}"
        raise ValueError(
            f"{func}: {name}={index} is not a rank of the group; valid ranks are {valid}"
        )
    return local


def check_tag(tag: Any, func: str) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < MONITOR_TAG:
        raise ValueError(f"{func}: tag must be an int in 0..{MONITOR_TAG - 1}, got {tag!r}")
    return tag
