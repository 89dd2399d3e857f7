"""The pipeline shared by every collective.

Each collective checks its arguments (pycoll.arrays), then calls :func:`run`,
which, under the group's lock, counts the operation, checks it at DETAIL and
publishes it on the progress board, then starts MPI's nonblocking operation;
it waits for it within the group's timeout (pycoll.watch) or hands back a
Work when ``async_op=True``, turns MPI errors into DistBackendError,
finishes up (divisions, unpacking) and logs at INFO.
"""

from __future__ import annotations

import operator
import time
from contextlib import contextmanager
from threading import get_ident
from typing import Any, Callable, Iterator, List, Optional, Union

from .. import _mpi, crosscheck, debug, native, watch
from ..groups import ProcessGroup
from ..progress import BUSY_CODE, LAST
from ..trace import recorder
from ..work import Work

DETAIL = debug.DebugLevel.DETAIL

# Point-to-point tags from MONITOR_TAG up are pycoll's own; MPI guarantees
# tags up to 32767. Users get 0..MONITOR_TAG-1.
RESERVED_TAG = 32767  # object messages (send_object_list / recv_object_list)
MONITOR_TAG = 32766  # monitored_barrier


def run(
    pg: ProcessGroup,
    op: str,
    nbytes: int,
    start: Callable,
    args: tuple,
    async_op: bool,
    finish: Optional[Callable[[], None]] = None,
    result: Any = None,
    call: Union[str, Callable[[], str], None] = None,
    prepare: Optional[Callable[[], None]] = None,
    stages: Optional[List[Callable[[], List[Any]]]] = None,
    key: int = 0,
    path: str = "mpi",
) -> Optional[Work]:
    """Sequence and start one nonblocking MPI collective; wait for it within the
    group's timeout, or return a Work if ``async_op``.

    ``call`` describes the call for the DETAIL check; ``prepare`` runs once
    the check has passed, just before MPI is called (scaling the input of a
    PREMUL_SUM, so a refused call leaves the caller's data alone). ``stages``
    start further MPI operations, each once the previous ones are done (a
    reduce-scatter, then an all-gather); they run when the Work is driven.
    ``key`` sums the call up for the call check (pycoll.crosscheck.key);
    ``path`` names the algorithm for the flight record and the timeline
    (pycoll.paths: ``"mpi"``, MPI's own call).
    """
    if type(async_op) is not bool:
        raise TypeError(f"{op}: async_op must be True or False, got {async_op!r}")
    if prepare is None and stages is None and debug.PLAIN:
        return lean(pg, op, nbytes, start, args, async_op, finish, result, key)
    arrived = recorder.clock()  # before the DETAIL check, which waits for the others
    with pg._lock:
        claim(pg)
        seq = watch.begin(pg, op, call, key)
        entry = recorder.issue(
            pg, op, seq, key or crosscheck.OP_BITS[op], None, nbytes, arrived, path
        )
        if prepare is not None:
            try:
                prepare()
            except Exception:
                if pg._broken is None:  # refused on every rank: as if never called
                    pg._seq = seq - 1
                watch.end(pg, seq)
                recorder.complete(entry, recorder.FAILED)
                raise
        try:
            request = start(*args)
        except _mpi.MPI.Exception as exc:
            watch.end(pg, seq)
            recorder.complete(entry, recorder.FAILED)
            raise watch.backend_error(op, seq, exc) from None
        if stages:
            work = Work(
                op, seq, [request], finish, result, pg, nbytes, stages=stages, keep=args,
                entry=entry,
            )  # fmt: skip
            pg._staged.append(work)  # in issue order, under the lock
    if stages:
        if async_op:
            return work
        work.wait()
        return None
    if async_op:
        return Work(op, seq, [request], finish, result, pg, nbytes, keep=args, entry=entry)
    t0 = time.perf_counter() if debug.LEVEL else 0.0
    _wait(pg, op, seq, request, entry, finish)
    if debug.LEVEL:
        debug.log_collective(op, pg.group_desc, seq, nbytes, time.perf_counter() - t0)
    return None


def lean(
    pg: ProcessGroup,
    op: str,
    nbytes: int,
    start: Callable,
    args: tuple,
    async_op: bool,
    finish: Optional[Callable[[], None]],
    result: Any,
    key: int,
) -> Optional[Work]:
    """:func:`run` for a call of one MPI operation with debug off (nothing to
    check first, nothing to log): every asynchronous collective of a
    training step (the torch backend's, the functional collectives') and the
    synchronous calls :func:`plain` does not take. The issue step is
    :func:`hold`, watch.count and :func:`let_go` (the group's only thread
    skips the lock), with no DETAIL check (watch.begin's) and recorder.issue
    inlined; the flight recorder's entry is a full one, which the Work or
    the wait closes."""
    lock = hold(pg)
    try:
        key = key or crosscheck.OP_BITS[op]
        seq = watch.count(pg, op, key)
        if seq & pg._mask == pg._mask and pg._native is None:
            native.attach(pg)  # a group making many calls: the compiled path from here
        ring = pg._flight
        entry = None
        if ring is not None:
            entry = [seq, op, key, None, nbytes, recorder.clock(), None, recorder.STARTED, pg, None]
            ring.append(entry)
        try:
            request = start(*args)
        except _mpi.MPI.Exception as exc:
            watch.end(pg, seq)
            recorder.complete(entry, recorder.FAILED)
            raise watch.backend_error(op, seq, exc) from None
    finally:
        let_go(pg, lock)
    if async_op:
        return Work(op, seq, [request], finish, result, pg, nbytes, None, None, None, args, entry)
    _wait(pg, op, seq, request, entry, finish)
    return None


def _wait(pg: ProcessGroup, op: str, seq: int, request: Any, entry: Any, finish: Any) -> None:
    """The end of a synchronous call of :func:`run` and :func:`lean`: wait for
    its request within the group's timeout, then close its flight record's
    entry and make its finishing copy."""
    try:
        watch.wait1(pg, op, seq, request)
    except BaseException:
        recorder.complete(entry, recorder.FAILED)  # (a timeout has marked it already)
        raise
    watch.end(pg, seq)
    recorder.complete(entry)
    if finish is not None:
        finished(op, seq, finish)


def finished(op: str, seq: int, finish: Callable[[], None]) -> None:
    """Run a call's finishing step once MPI is done with it; an MPI error
    there (MPI_Reduce_local refusing a fold) is the call's DistBackendError,
    as an error of its MPI operation is."""
    try:
        finish()
    except _mpi.MPI.Exception as exc:
        raise watch.backend_error(op, seq, exc) from None


@contextmanager
def device_aliases(pg: Optional[ProcessGroup]) -> Iterator[None]:
    """Inside, ``pg``'s calls get arrays that alias device memory (CUDA-aware
    MPI is handed device pointers): pycoll's host-side paths, which would
    read or write them with the CPU, are off (pycoll.persistent's plans,
    which copy in and out; the shared-memory all_reduce). Every rank of such
    a group passes device arrays alike, so every rank skips them alike."""
    if pg is None:
        yield
        return
    plans, pg._plans, pg._aliases = pg._plans, None, True
    try:
        yield
    finally:
        pg._plans, pg._aliases = plans, False


def sig(x: Any) -> str:
    """An array's part of a DETAIL fingerprint."""
    return f"shape={x.shape}, {x.dtype}"


def claim(pg: ProcessGroup) -> None:
    """Called holding ``pg._lock``, before issuing anything on the group.

    The first thread to use a group owns it, and its synchronous fast calls
    (:func:`plain`) skip the lock, which costs more than the rest of the
    bookkeeping. When a second thread comes, it marks the group shared (from
    then on every call takes the lock) and waits for an owner's call under way
    to be issued. Under the GIL these plain attribute writes are seen in order:
    either the owner sees ``_shared`` after setting ``_busy`` and takes the
    lock, or the newcomer sees ``_busy`` and waits.
    """
    me = get_ident()
    owner = pg._owner
    if owner is None:
        pg._owner = me
        if native.MODE == native.ON:
            native.attach(pg)  # from the group's first call
    elif owner != me and not pg._shared:
        pg._shared = True
        while pg._busy:
            time.sleep(0)  # the owner's call is being issued (bounded by its timeout)


def hold(pg: ProcessGroup) -> Optional[Any]:
    """The first half of a call's issue step, before watch.count: the
    group's owner thread, alone on it, marks it busy and takes no lock (a
    second thread that comes meanwhile waits for the mark to clear: see
    :func:`claim`); any other thread takes the group's lock. Returns the lock
    to hand :func:`let_go`, None where the owner took none."""
    if pg._owner == get_ident() and not pg._shared:
        pg._busy = True  # then look again: a second thread may have just come
        if not pg._shared:
            return None
        pg._busy = False
    lock = pg._lock
    lock.acquire()
    claim(pg)
    return lock


def let_go(pg: ProcessGroup, lock: Optional[Any]) -> None:
    """The end of the issue step :func:`hold` began, once the call is started."""
    if lock is None:
        pg._busy = False
    else:
        lock.release()


def plain(
    pg: ProcessGroup, op: str, key: int, start: Callable, blocking: Callable, *args: Any
) -> int:
    """The synchronous fast path: count the collective, note its key for the
    call check (pycoll.crosscheck), start it, wait for it.

    For calls already known to need nothing else (checked arrays, debug OFF,
    no finishing step); everything else goes through :func:`run`. Under
    ``PYCOLL_WAIT=blocking`` it makes MPI's blocking call instead, watched by
    the watchdog thread. Returns the call's sequence number.

    The one place the issue step (:func:`hold`, watch.count, :func:`let_go`)
    is written out inline, but for the compiled path's (pycoll.native.again):
    the three calls cost 2,200-2,500 instructions of a call's 22,500-23,000
    (an 8-byte broadcast or all_reduce on 1 rank with PYCOLL_NATIVE=0, counted
    by callgrind). Keep it in step with them.
    """
    lock = None
    if pg._owner == get_ident() and not pg._shared:
        pg._busy = True  # then look again: a second thread may have just come
        if pg._shared:
            pg._busy = False
            lock = pg._lock
    else:
        lock = pg._lock
    if lock is not None:
        lock.acquire()
        claim(pg)
    blocks = watch.BLOCKING
    try:
        if pg._broken is not None:
            raise watch.broken(pg, op)
        seq = pg._seq = pg._seq + 1
        rec = pg._rec
        word = pg._word
        busy = seq << 8 | BUSY_CODE[op]  # progress.pack(seq, op, True), inlined
        rec[word] = busy
        rec[LAST] = word
        slot = seq & pg._mask
        pg._keys[slot] = key
        if slot == pg._mask:
            crosscheck.exchange(pg, op, seq, watch.wait)
            if pg._native is None:
                native.attach(pg)  # a group making many calls: the compiled path from here
        ring = pg._flight  # the flight recorder's entry: on this path, the key alone
        if ring is not None:
            ring.append(key)
        try:
            if blocks:
                watch.inflight = (pg, op, seq)
                blocking(*args)
                watch.inflight = None
            else:
                request = start(*args)
        except _mpi.MPI.Exception as exc:
            watch.inflight = None
            raise watch.backend_error(op, seq, exc) from None
    finally:
        if lock is None:
            pg._busy = False
        else:
            lock.release()
    if not blocks:
        # watch.wait1's first tests, inlined: most small calls end in them.
        test = request.Test
        try:
            for _ in watch.spin_tests:
                if test():
                    break
            else:
                watch.wait1_yielding(pg, op, seq, request)
        except _mpi.MPI.Exception as exc:
            raise watch.backend_error(op, seq, exc) from None
    if rec[word] == busy:
        rec[word] = busy - 1
    return seq


@contextmanager
def sequenced(pg: ProcessGroup, op: str, call: Optional[str], key: int = 0) -> Iterator[int]:
    """One collective made of several MPI operations (the object collectives):
    hold the group's lock, count and publish it, and yield its sequence number.
    Each MPI operation inside goes through ``watch.call``."""
    arrived = recorder.clock()  # before the DETAIL check, which waits for the others
    with pg._lock:
        claim(pg)
        seq = watch.begin(pg, op, call, key)
        entry = recorder.issue(
            pg, op, seq, key or crosscheck.OP_BITS[op], None, None, arrived, "mpi"
        )
        t0 = time.perf_counter() if debug.LEVEL else 0.0
        try:
            yield seq
        except BaseException:
            recorder.complete(entry, recorder.FAILED)  # (a timeout has marked it already)
            raise
        watch.end(pg, seq)
        recorder.complete(entry)
        if debug.LEVEL:
            debug.log_collective(op, pg.group_desc, seq, 0, time.perf_counter() - t0)


def root_of(pg: ProcessGroup, rank: Any, name: str, func: str) -> int:
    """A rooted collective's root (``rank``, a global rank) in ``pg``'s
    numbering. The common case (an int rank) is one lookup."""
    root = pg._group_rank_of.get(rank) if type(rank) is int else None
    if root is None:
        root = group_rank(pg, rank, name, func)  # raises the right error
    return root


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
