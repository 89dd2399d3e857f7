"""Bounded waits: every wait on MPI in pycoll ends by a deadline, with a diagnosis.

A blocking MPI call cannot be interrupted, so pycoll never makes one on a
group: each operation is started with MPI's nonblocking call and completed
by :func:`wait`, which polls it until it completes or the group's timeout
passes. On a timeout the rank reads every member's record on the progress
board (pycoll.progress) and raises DistTimeoutError naming the ranks that
have not reached the operation and what each of them last started. The group
is then *broken*: its MPI state is unknown, so every later call on it raises
at once with the same diagnosis. With ``PYCOLL_ABORT_ON_TIMEOUT=1`` the
diagnosis goes to stderr and the whole job is aborted instead, so a batch job
ends rather than burning its allocation.

Every operation on a group is issued under the group's lock (sequence number,
DETAIL check, progress record and the MPI call together), so threads sharing
a group cannot interleave their calls on it.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Tuple, Union

from . import _mpi, crosscheck, debug, progress
from .errors import (
    CollectiveMismatchError,
    DistBackendError,
    DistError,
    DistTimeoutError,
    user_frames,
)
from .groups import STATE, ProcessGroup
from .trace import recorder

ABORT_ENV = "PYCOLL_ABORT_ON_TIMEOUT"
EXCEPTHOOK_ENV = "PYCOLL_ABORT_ON_EXCEPTION"
WAIT_ENV = "PYCOLL_WAIT"
ABORT_CODE = 124  # what `timeout` returns: a job killed for running out of time
ABORT_GRACE_S = 1.0
DETAIL = debug.DebugLevel.DETAIL

_yield = os.sched_yield
_now = time.monotonic
WATCHDOG_TICK_S = 0.25
SPIN_S = 0.05  # poll flat out this long, then pause between polls
# Tests of a request before a wait first gives up the core. Where each rank
# has a core of its own, the peers are about to finish and a yield (a system
# call) costs more than many tests; where ranks outnumber cores, a peer may
# need this core to finish, so the wait yields between tests from the start.
SPIN_TESTS = 64
OVERSUBSCRIBED_TESTS = 2
spin_tests = range(OVERSUBSCRIBED_TESTS)
PAUSE_S = 2e-4


# PYCOLL_WAIT=blocking: the synchronous fast paths (pycoll.collectives._common.
# plain) call MPI's blocking collectives, and the watchdog thread ends the job
# if one of them outlives its group's timeout.
BLOCKING = False
# The blocking call in flight: (group, op, seq), or None. The watchdog times
# it from when it first sees it, which saves a clock read per call.
inflight: Optional[Tuple[ProcessGroup, str, int]] = None
_watchdog: Optional[threading.Thread] = None


def set_wait_mode_from_env() -> None:
    """Read ``PYCOLL_WAIT`` (``poll``, the default, or ``blocking``)."""
    global BLOCKING
    raw = os.environ.get(WAIT_ENV, "").strip().lower()
    if raw not in ("", "poll", "blocking"):
        raise ValueError(
            f"The value of {WAIT_ENV} must be 'poll' (the default: every wait is "
            f"bounded and a timeout raises DistTimeoutError) or 'blocking' (fast "
            f"blocking MPI calls; a timeout aborts the job), got {raw!r}"
        )
    BLOCKING = raw == "blocking"
    if BLOCKING:
        _start_watchdog()


def _start_watchdog() -> None:
    global _watchdog
    if _watchdog is None or not _watchdog.is_alive():
        _watchdog = threading.Thread(target=_watch_blocking, name="pycoll-watchdog", daemon=True)
        _watchdog.start()


def _watch_blocking() -> None:
    """Abort the job when a blocking call outlives its group's timeout: it
    cannot be interrupted, so ending the job is the only bounded outcome."""
    seen: Any = None
    since = 0.0
    while True:
        time.sleep(WATCHDOG_TICK_S)
        current = inflight
        board = STATE.board
        if current is not None and board is not None and not board.closed:
            board.rec[progress.BEAT] += 1  # waiting in a blocking call, not stopped
        if current is not seen:
            seen, since = current, _now()
            continue
        if current is None:
            continue
        pg, op, seq = current
        elapsed = _now() - since + WATCHDOG_TICK_S / 2  # seen first mid-tick, on average
        if elapsed >= pg._timeout_s:
            error = timed_out(pg, op, seq, elapsed, pg._timeout_s, [], abort=True)
            raise AssertionError(f"unreachable: {error}")  # timed_out exits


class _AbortingHook:
    """``sys.excepthook`` while the default group lives: print the traceback
    (through the hook that was there before; for pycoll's own errors it ends
    at the user's call: pycoll.errors.user_frames), then end the whole job.

    Without it, one rank's uncaught exception leaves the others waiting in
    their next collective until its timeout (30 minutes by default), as under
    plain mpiexec; ``python -m mpi4py`` and pycoll-run's script form end such a
    job at once, and so does this, whatever launched the job.
    """

    def __init__(self, previous: Callable[..., Any]) -> None:
        self.previous = previous

    def __call__(self, kind: Any, value: Any, tb: Any) -> None:
        tb = user_frames(tb, value)  # for pycoll's errors, without pycoll's frames
        if isinstance(value, BaseException):
            value.__traceback__ = tb  # what Python's own hook prints from
        self.previous(kind, value, tb)
        MPI = _mpi.MPI
        if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
            return
        world = MPI.COMM_WORLD
        if world.Get_size() == 1:
            return  # nobody to wait for: exit as Python does
        sys.stderr.write(
            f"pycoll: rank {world.Get_rank()}: uncaught {kind.__name__}; aborting the job "
            f"so that the other ranks do not wait for it ({EXCEPTHOOK_ENV}=0 turns this off)\n"
        )
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_S)  # for the launcher to forward the lines (see timed_out)
        world.Abort(1)
        os._exit(1)


def install_excepthook() -> None:
    """Make an uncaught exception end the job (see _AbortingHook), unless
    ``PYCOLL_ABORT_ON_EXCEPTION=0`` or Python is interactive (where every
    mistyped line would end the job)."""
    raw = os.environ.get(EXCEPTHOOK_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(
            f"The value of {EXCEPTHOOK_ENV} must be 1 (the default: an uncaught exception "
            f"on any rank aborts the job) or 0 (leave Python's handling alone), got {raw!r}"
        )
    interactive = hasattr(sys, "ps1") or sys.flags.interactive
    if raw == "0" or interactive or isinstance(sys.excepthook, _AbortingHook):
        return
    sys.excepthook = _AbortingHook(sys.excepthook)


def remove_excepthook() -> None:
    """Undo :func:`install_excepthook` (destroy_process_group)."""
    if isinstance(sys.excepthook, _AbortingHook):
        sys.excepthook = sys.excepthook.previous


def set_spinning(own_core: bool) -> None:
    """Spin on a request before yielding only if this rank has a core of its own."""
    global spin_tests
    spin_tests = range(SPIN_TESTS if own_core else OVERSUBSCRIBED_TESTS)


def backend_error(op: str, seq: Optional[int], exc: BaseException) -> DistBackendError:
    where = f"{op} (seq {seq})" if seq is not None else op
    return DistBackendError(f"{where} failed in MPI: {exc}", op, seq)


def broken(pg: ProcessGroup, op: str) -> DistError:
    """The error for any use of a group after one of its operations timed out,
    or after the call check found its ranks disagreeing (pycoll.crosscheck)."""
    first = pg._broken
    assert first is not None
    if isinstance(first, CollectiveMismatchError):
        return CollectiveMismatchError(
            f"{op}: group {pg.group_desc!r} is unusable: its ranks called different "
            f"collectives. Make a new group (or restart the job). What was found: {first}",
            first.op,
            first.seq,
            first.calls,
        )
    return DistTimeoutError(
        f"{op}: group {pg.group_desc!r} is unusable: an earlier operation on it timed "
        f"out and may still be pending in MPI. Make a new group (or restart the job). "
        f"The timeout was: {first}",
        first.op,
        first.seq,
        first.elapsed,
        first.ranks,
        first.timeout,
    )


def begin(
    pg: ProcessGroup, op: str, call: Union[str, Callable[[], str], None], key: int = 0
) -> int:
    """Count a collective on ``pg``, note its call-check ``key``
    (pycoll.crosscheck) and publish it; return its sequence number.

    The caller holds ``pg._lock``. At DETAIL, ``call()`` describes the call and
    the members compare descriptions first (see debug.check_fingerprint).
    """
    if pg._broken is not None:
        raise broken(pg, op)
    seq = pg._seq + 1
    rec = pg._rec
    if call is not None and debug.LEVEL >= DETAIL:
        text = call if isinstance(call, str) else call()
        # Published before the check: a rank waiting in it has reached the
        # call (the others' diagnoses say so), and where it times out there
        # its record says GAVE_UP, so the others' teardown need not wait for
        # it (crosscheck.final). A mismatch runs nothing: the record is put back.
        before = None
        if rec is not None:
            before = rec[pg._word], rec[progress.LAST]
            rec[pg._word] = progress.pack(seq, op, busy=True)
            rec[progress.LAST] = pg._word
        try:
            debug.check_fingerprint(
                pg._ranks, pg.group_name, op, seq, text, _exchanger(pg, op, seq)
            )
        except CollectiveMismatchError:
            if before is not None:
                rec[pg._word], rec[progress.LAST] = before
            raise
    return count(pg, op, key or crosscheck.OP_BITS[op])


def count(pg: ProcessGroup, op: str, key: int) -> int:
    """A call's issue step, its bookkeeping (the caller holds the group, as
    pycoll.collectives._common.hold does): raise at once on a broken group;
    else number the call, publish it on the progress board (this rank is in
    ``op`` at that seq), note its key in the call check's ledger and, at an
    exchange point, start the check's exchange. Returns the call's sequence
    number. Every path that starts a collective comes here (:func:`begin`
    after DETAIL's check), but the compiled one (pycoll.native.again, inline)."""
    if pg._broken is not None:
        raise broken(pg, op)
    seq = pg._seq = pg._seq + 1
    rec = pg._rec
    if rec is not None:
        rec[pg._word] = seq << 8 | progress.BUSY_CODE[op]  # progress.pack(seq, op, True)
        rec[progress.LAST] = pg._word
    slot = seq & pg._mask
    pg._keys[slot] = key
    if slot == pg._mask:
        crosscheck.exchange(pg, op, seq, wait)
    return seq


def end(pg: ProcessGroup, seq: int) -> None:
    """Publish that the collective at ``seq`` completed (unless a later one started)."""
    rec = pg._rec
    if rec is not None:
        word = rec[pg._word]
        if word >> 8 == seq:
            rec[pg._word] = word & ~progress.BUSY


def _exchanger(pg: ProcessGroup, op: str, seq: int) -> Callable[[Any, Any], None]:
    def exchange(mine: Any, everyone: Any) -> None:
        MPI = _mpi.MPI
        call(pg, op, seq, pg.comm.Iallgather, [mine, MPI.BYTE], [everyone, MPI.BYTE])

    return exchange


def side_comm(pg: ProcessGroup, op: Optional[str] = None, seq: Optional[int] = None) -> Any:
    """The group's duplicate communicator for pycoll's own traffic (the ring's
    messages, the call check's exchanges), so it never matches the user's.

    Made by MPI_Comm_idup on its first use, which comes at the same point of
    the group's sequence on every member. Returns None while that is under
    way, or with ``op`` waits for it within the group's timeout."""
    side = pg._side
    if side is None:
        side = pg._side = pg.comm.Idup()
    if isinstance(side, tuple):
        comm, request = side
        if op is not None:
            wait(pg, op, seq, [request])
        elif not request.Test():
            return None
        side = pg._side = comm
    return side


def call(pg: ProcessGroup, op: str, seq: Optional[int], start: Callable, *args: Any) -> Any:
    """Start one nonblocking MPI operation and wait for it, within the group's timeout."""
    try:
        request = start(*args)
    except _mpi.MPI.Exception as exc:
        raise backend_error(op, seq, exc) from None
    wait1(pg, op, seq, request)
    return request


def wait1(pg: ProcessGroup, op: str, seq: Optional[int], request: Any) -> None:
    """:func:`wait` for a single request: the hot path of every synchronous call."""
    test = request.Test
    try:
        for _ in spin_tests:
            if test():
                return
    except _mpi.MPI.Exception as exc:
        raise backend_error(op, seq, exc) from None
    wait1_yielding(pg, op, seq, request)


def wait1_yielding(pg: ProcessGroup, op: str, seq: Optional[int], request: Any) -> None:
    """:func:`wait1` once its first ``spin_tests`` tests have failed: yield the core
    between tests, then :func:`wait`."""
    test = request.Test
    try:
        for _ in range(31):
            _yield()
            if test():
                return
    except _mpi.MPI.Exception as exc:
        raise backend_error(op, seq, exc) from None
    wait(pg, op, seq, [request])


def tester(requests: List[Any], statuses: Optional[List[Any]] = None) -> Callable[[], bool]:
    """A callable testing whether ``requests`` have all completed.

    For one request (most waits; a receive's with its status), MPI_Test:
    through mpi4py, MPI_Testall of a list costs more per test, and MPICH 5.0's
    MPI_Testall fails a completed persistent collective request with
    MPI_ERR_IN_STATUS though its status says success (pycoll's persistent
    requests: the call check's exchanges, pycoll.persistent's plans)."""
    if len(requests) == 1:
        if statuses is None:
            return requests[0].Test
        return functools.partial(requests[0].Test, statuses[0])  # (a receive's)
    return functools.partial(_mpi.MPI.Request.Testall, requests, statuses)


def wait(
    pg: ProcessGroup,
    op: str,
    seq: Optional[int],
    requests: List[Any],
    timeout: Optional[float] = None,
    statuses: Optional[List[Any]] = None,
    peer: Optional[int] = None,
) -> None:
    """Wait for ``requests`` to complete, at most ``timeout`` seconds (default:
    the group's timeout); raise DistTimeoutError (or abort) when they do not.

    ``peer`` (a group rank) narrows the diagnosis of a point-to-point operation
    to the other side.
    """
    MPI = _mpi.MPI
    done = tester(requests, statuses)
    try:
        for _ in spin_tests:
            if done():
                return
        start = _now()
        limit = pg._timeout_s if timeout is None else timeout
        spins = 0
        while not done():
            spins += 1
            if spins & 31:
                _yield()  # give the core to a rank that shares it
                continue
            elapsed = _now() - start
            if elapsed >= limit:
                raise timed_out(pg, op, seq, elapsed, limit, requests, peer)
            if elapsed > SPIN_S:
                rec = pg._rec
                if rec is not None:
                    rec[progress.BEAT] += 1  # still here, waiting (progress.describe)
                if seq is not None and (pg._fwait is None or pg._fwait[0] != seq):
                    pg._fwait = (seq, start)  # when it began, for the flight recorder
                if pg._check is not None:
                    try:  # the others may have stopped at a mismatch: hear of it
                        crosscheck.poll(pg)
                    except CollectiveMismatchError:
                        progress.keep_alive(requests)
                        raise
                time.sleep(PAUSE_S)  # a long wait: poll gently
    except MPI.Exception as exc:
        raise backend_error(op, seq, exc) from None


def _ranks(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def timed_out(
    pg: ProcessGroup,
    op: str,
    seq: Optional[int],
    elapsed: float,
    limit: float,
    requests: List[Any],
    peer: Optional[int] = None,
    abort: bool = False,
) -> DistTimeoutError:
    """Diagnose a timeout, mark ``pg`` broken, and return the error to raise
    (or abort the job, under PYCOLL_ABORT_ON_TIMEOUT=1 or if ``abort``).

    The message gives both the measured wait (``elapsed``, a little longer than
    the timeout on a busy machine) and the timeout that was armed (``limit``)."""
    me = pg._ranks[pg._rank]
    what = f"{op} (seq {seq})" if seq is not None else op
    head = (
        f"{what} on group {pg.group_desc!r} timed out after {elapsed:.1f} s "
        f"(timeout {limit:g} s) on rank {me}"
    )
    board = STATE.board
    if peer is not None:
        members = [pg._ranks[peer]]
    else:
        members = [r for r in pg._ranks if r != me]
    missing: List[int] = []
    other_op: List[int] = []
    stalled: List[int] = []
    rec = pg._rec
    if rec is not None and seq is not None:
        # GAVE_UP, for the peers' diagnoses and their teardown (which then does
        # not wait for this rank's last call check: pycoll.crosscheck.final).
        # A wait that precedes the call's own record (the live trials' barrier
        # and decision, at the call's seq) writes the call's word first.
        if rec[pg._word] >> 8 < seq:
            rec[pg._word] = progress.pack(seq, op, True)
        if rec[pg._word] >> 8 == seq:
            rec[pg._word] |= progress.GAVE_UP
    if board is None:
        lines = ["(no progress board: the ranks' states are unknown)"]
    else:
        names = {g._uid: f"group {g.group_desc!r}" for g in STATE.groups.values()}
        if seq is None:  # point-to-point: only what the peer last started matters
            *_, lines = progress.describe(members, pg._uid, pg._seq + 1, op, board, names)
            lines = [re.sub(r"^(rank \d+(?: on \S+)?: )[^;]*; ", r"\1", line) for line in lines]
        else:
            missing, other_op, stalled, lines = progress.describe(
                members, pg._uid, seq, op, board, names
            )
    if seq is None:
        summary = (
            f"rank {members[0]} did not match it"
            if peer is not None
            else "no rank of the group matched it"
        )
    elif missing:
        who = "rank {}{} has" if len(missing) == 1 else "ranks {}{} have"
        where = progress.hosts_of(board, missing) if board is not None else ""
        summary = f"{who.format(','.join(map(str, missing)), where)} not reached seq {seq}"
    elif other_op:
        summary = (
            f"{_ranks(other_op)} called a different collective at seq {seq} (see below): "
            f"every rank must call the same collectives in the same order"
        )
        missing = other_op
    elif stalled:
        summary = (
            f"{_ranks(stalled)} started seq {seq} but {'is' if len(stalled) == 1 else 'are'} "
            f"not progressing in it (stopped, or stuck outside pycoll's waits)"
        )
        missing = stalled
    elif any(progress.UNFOLLOWED in line for line in lines):
        summary = (
            f"the progress board cannot tell where the ranks are (more than "
            f"{progress.SLOTS} groups alive); destroy groups no longer used"
        )
    else:
        summary = (
            f"every rank of the group has started seq {seq}: a rank is stuck inside it "
            f"or the ranks called different collectives (PYCOLL_DEBUG=DETAIL checks)"
        )
    message = f"{head}: {summary}." + "".join(f"\n  {line}" for line in lines)
    entry = recorder.find(pg, op, seq)
    if entry is not None:
        recorder.complete(entry, recorder.TIMED_OUT)
    if pg._flight is not None:  # this rank's record, beside the diagnosis
        path = recorder.dump_quietly(message)
        if path is not None:
            message += (
                f"\n  flight record: {path} (every rank's that dumped: python -m pycoll.trace "
                f"flight {os.path.dirname(path)})"
            )
    error = DistTimeoutError(message, op, seq, elapsed, missing, limit)
    pg._broken = error
    progress.keep_alive(requests)  # MPI may still write into their buffers, even in MPI_Finalize
    if board is not None:
        board.abandoned = "an operation timed out"  # teardown must not wait on the others
    if abort or os.environ.get(ABORT_ENV, "").strip() == "1":
        why = f"{WAIT_ENV}=blocking" if abort else f"{ABORT_ENV}=1"
        sys.stderr.write(f"pycoll: {message}\npycoll: {why}: aborting the job\n")
        sys.stderr.flush()
        # Give the launcher time to forward it: MPICH's Hydra was seen to drop
        # a rank's last lines of stderr (1 run in 8) when the job was aborted
        # right after they were written. The job is ending; a second is cheap.
        time.sleep(ABORT_GRACE_S)
        _mpi.MPI.COMM_WORLD.Abort(ABORT_CODE)
        # MPICH's MPI_Abort can return before the launcher ends the job: make
        # sure this rank goes no further.
        os._exit(ABORT_CODE)
    return error
