"""barrier, and monitored_barrier: a barrier that names the ranks that did not come."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable, Optional, Union

import numpy as np

from .. import _mpi, crosscheck, debug, native, watch
from ..errors import DistTimeoutError, monitored_barrier_words
from ..groups import STATE, ProcessGroup, resolve
from ..work import Work, to_seconds
from ._common import MONITOR_TAG, claim, plain, run

__all__ = ["barrier", "monitored_barrier"]

_KEY = crosscheck.OP_BITS["barrier"]  # the call check's key: a barrier has nothing else


def barrier(
    group: Optional[ProcessGroup] = None, async_op: bool = False, device_ids: Any = None
) -> Optional[Work]:
    """Block until every rank of the group has called barrier.

    Args:
        group: the group (default: the world).
        async_op: return a Work that completes once all ranks have arrived.
        device_ids: accepted for torch.distributed compatibility; unused.
    """
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "barrier")  # raises before init; None for a non-member
        if pg is None:
            return None
    comm = pg.comm
    # The common case, straight to MPI; not under PYCOLL_WAIT=blocking, where
    # the fast paths' blocking calls end the job on a timeout: a barrier's
    # timeout raises there as everywhere (it is how programs wait for a peer).
    if not async_op and debug.PLAIN and not watch.BLOCKING:
        if pg._native is not None and (
            native.again(pg, "barrier", native.NOTHING, None, None)
            or native.call(
                pg,
                "barrier",
                _KEY,
                native.BARRIER,
                None,
                None,
                0,
                None,
                None,
                0,
                native.NOTHING,
                None,
                None,
            )  # fmt: skip
        ):
            return None
        plain(pg, "barrier", _KEY, comm.Ibarrier, comm.Barrier)
        return None
    return run(pg, "barrier", 0, comm.Ibarrier, (), async_op, call="barrier()")


def monitored_barrier(
    group: Optional[ProcessGroup] = None,
    timeout: Optional[Union[timedelta, float]] = None,
    wait_all_ranks: bool = False,
) -> None:
    """A barrier that names the ranks that did not arrive instead of hanging.

    Every rank tells the group's first rank it has arrived; that rank waits at
    most ``timeout`` for all of them, then confirms to each. It counts as one
    collective in the group's sequence number.

    Args:
        group: the group (default: the world).
        timeout: how long to wait (a timedelta or seconds; default: the
            group's timeout).
        wait_all_ranks: report every missing rank instead of the first.

    Raises:
        DistTimeoutError: on the group's first rank, naming the first rank
            (or all ranks) that did not arrive in time, e.g. "Rank 3 failed to
            pass monitoredBarrier in 1000 ms"; on the other ranks, when the
            confirmation did not come in time. ``ranks`` holds the missing ranks.
    """
    func = "monitored_barrier"
    if (pg := resolve(group, func)) is None:
        return None
    seconds = to_seconds(pg.timeout if timeout is None else timeout)
    # No DETAIL fingerprint here (call=None): exchanging it would wait for
    # the very ranks this barrier exists to report.
    with pg._lock:
        claim(pg)
        seq = watch.begin(pg, func, None)
        if pg.size() > 1:
            if pg.rank() == 0:
                _collect_arrivals(pg, seq, seconds, wait_all_ranks)
            else:
                _arrive(pg, seq, seconds)
        watch.end(pg, seq)
    return None


def _poll_until(done: Callable[[], bool], seconds: float) -> bool:
    """Call ``done()`` until it is True or ``seconds`` pass; say which."""
    start = time.monotonic()
    pause = 1e-6
    while not done():
        if time.monotonic() - start >= seconds:
            return False
        time.sleep(pause)  # pacing only: completion is what done() reports
        pause = min(pause * 2, 1e-3)
    return True


class _Listener:
    """A receive of int64 sequence numbers from one peer that skips stale ones
    (left over from an earlier monitored_barrier that timed out)."""

    def __init__(self, comm: Any, peer: int, seq: int) -> None:
        self.comm, self.peer, self.seq = comm, peer, seq
        self.buf = np.empty(1, np.int64)
        self.req = self._post()

    def _post(self) -> Any:
        return self.comm.Irecv([self.buf, _mpi.MPI.INT64_T], self.peer, MONITOR_TAG)

    def arrived(self) -> bool:
        while self.req.Test():
            if self.buf[0] == self.seq:
                return True
            self.req = self._post()  # a stale message: listen again
        return False

    def cancel(self) -> None:
        self.req.Cancel()
        self.req.Wait()


def _collect_arrivals(pg: ProcessGroup, seq: int, seconds: float, wait_all: bool) -> None:
    MPI = _mpi.MPI
    start = time.monotonic()
    waiting = {r: _Listener(pg.comm, r, seq) for r in range(1, pg.size())}

    def all_arrived() -> bool:
        for r in [r for r, listener in waiting.items() if listener.arrived()]:
            del waiting[r]
        return not waiting

    if not _poll_until(all_arrived, seconds):
        for listener in waiting.values():
            listener.cancel()
        pg._strays = True  # their tokens may still come
        missing = [pg.ranks[r] for r in sorted(waiting)]
        named = missing if wait_all else missing[:1]
        said = monitored_barrier_words(named, seconds)
        if seconds <= 0:  # no time to wait for anyone: gloo's words for a spent budget first
            said = f"Rank {pg.ranks[0]} timed out in monitoredBarrier after 0 ms: {said}"
        raise DistTimeoutError(
            f"{said} (group {pg.group_name!r}, seq {seq})",
            "monitored_barrier",
            seq,
            time.monotonic() - start,
            missing,
            seconds,
        )
    token = np.array([seq], np.int64)
    sends = [pg.comm.Isend([token, MPI.INT64_T], r, MONITOR_TAG) for r in range(1, pg.size())]
    MPI.Request.Waitall(sends)


def _arrive(pg: ProcessGroup, seq: int, seconds: float) -> None:
    MPI = _mpi.MPI
    start = time.monotonic()
    token = np.array([seq], np.int64)
    # Small enough to be sent eagerly: it completes even if the first rank
    # has already given up on this barrier.
    pg.comm.Isend([token, MPI.INT64_T], 0, MONITOR_TAG).Free()
    confirmation = _Listener(pg.comm, 0, seq)
    if not _poll_until(confirmation.arrived, seconds):
        confirmation.cancel()
        pg._strays = True  # the first rank's confirmation may still come
        raise DistTimeoutError(
            f"monitored_barrier: rank {pg.ranks[pg.rank()]} waited "
            f"{round(seconds * 1000)} ms for rank {pg.ranks[0]} to confirm that every "
            f"rank of group {pg.group_name!r} arrived (seq {seq}); rank {pg.ranks[0]} "
            f"reports which ranks did not",
            "monitored_barrier",
            seq,
            time.monotonic() - start,
            timeout=seconds,
        )
