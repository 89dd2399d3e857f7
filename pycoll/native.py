"""The fast path of calls made again on the same arrays, compiled (``PYCOLL_NATIVE``).

A training loop makes the same small synchronous collective on the same
arrays thousands of times. In :func:`pycoll.collectives._common.plain` each
such call pays for its bookkeeping in Python (sequence number, progress
board, call check, flight recorder) and for mpi4py's handling of its
arguments (a message spec per buffer, a Request object, a return to Python
between tests): at 8 bytes, more than MPI's own call costs.

Here a call made a second time on the same arrays is kept: its words for
the compiled code (what it starts, its buffers' addresses, MPI's count,
datatype, op and root), holding its arrays so that their addresses stay
valid. From then on :func:`again` finds it by its main array, does in
Python only what touches Python objects (the group's owner and sequence
number, the call check's ledger, the flight recorder's ring) and makes one
call into compiled code (pycoll.kernels.starts) that publishes the operation
on the progress board, starts MPI's nonblocking collective and tests it.
Where the tests run out, the wait goes on in Python within the group's
timeout, as on the plain path (watch.wait1_yielding): the same MPI
operations, the same checks and diagnoses, from fewer instructions.

When. A group takes the compiled path from the first call check exchange
point its synchronous calls reach (its 128th call; its 1024th with the check
off): numba is imported, and the code loaded from numba's disk cache or
compiled, only by a job that makes many calls, once per process.
``PYCOLL_NATIVE=1`` takes it from a group's first call (loaded at init),
``0`` never. Under ``PYCOLL_WAIT=blocking`` the compiled code makes MPI's
blocking call, with the GIL released, watched by the watchdog thread as the
plain path's blocking calls are. On a group with persistent plans
(``PYCOLL_PERSISTENT=1``) it makes only the calls a made plan serves:
the compiled code copies the input into the plan's buffer, starts the
plan's request (``MPI_Start``), tests it and copies the result out. Not at
DETAIL, and only on the calls the plain path serves.

Works. ``all_reduce``, ``broadcast``, ``all_gather_into_tensor``,
``reduce_scatter_tensor`` and ``all_to_all_single`` with ``async_op=True``
on a kept call are started and tested here as synchronous ones, then
handed back as a Work (pycoll.work): complete where the tests saw the call
done, which a small call mostly is, else waiting in Python for the request
the compiled code left. MPI moves a nonblocking collective only inside its
calls: a Work handed back after one test left each rank's next test behind
Python's steps, 19 us an 8-byte all_reduce on 2 ranks, against 11.5 tested
here (docs/measurements/async_calls.py).
"""

from __future__ import annotations

import os
import warnings
import weakref
from operator import is_
from sys import getrefcount
from threading import get_ident
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _mpi, debug, watch
from .groups import ProcessGroup
from .kernels.words import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    ALL_TO_ALL_V,
    BARRIER,
    BROADCAST,
    CALL_WORDS,
    COPY_BYTES,
    COPY_FROM,
    COPY_TO,
    COUNTS,
    FOLD_IN,
    FOLD_INOUT,
    GATHER,
    IN_ROWS,
    IN_SKIP,
    IN_TABLE,
    IN_TO,
    OUT_ROWS,
    OUT_TABLE,
    PAIR,
    PLAN,
    REDUCE,
    REDUCE_SCATTER,
    REDUCE_SCATTER_V,
    REFUSED,
    SCATTER,
    SCATTER_STATUS,
    SOURCE,
    START,
    STATUS_AT,
)
from .progress import BUSY_CODE, WORDS
from .trace import recorder
from .work import Work

# What native.call starts (its ``what``: pycoll.kernels.words), and the bytes
# of a scattered part's status word, are names of this module's interface too.
__all__ = [
    "ALL_REDUCE", "BROADCAST", "REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "BARRIER",
    "REDUCE_SCATTER_V", "START", "ALL_TO_ALL_V", "GATHER", "SCATTER", "PAIR", "SCATTER_STATUS",
    "ENV", "NOTHING", "Refused", "configure", "attach", "detach", "again", "again_list", "call",
    "call_pair", "call_plan", "call_scatter", "loaded",
]  # fmt: skip


class Refused(Exception):
    """A kept scatter's root refused its list (its status word said so): the
    call is done and nothing was copied out; the collective raises its own
    error, as its plain path does."""


# A kept call (a tuple): its words' address, the call check's key, its main
# array, other buffer, extra and collective (what again knows it by), main's
# dtype, its progress code, what it holds besides (its words, then what they
# point into: the buffer it receives into, MPI's counts, a plan's input and
# output), the call kept before it on the same main array or None, the
# persistent plan it starts or None, the bytes of buffer it holds, for a
# list form the list's arrays (a tuple; else None), and whether it has a
# buffer of its own that MPI sends from or receives into (then it makes no
# Works: two of them under way would share that buffer).
_ADDRESS, _KEY, _MAIN, _OTHER, _EXTRA, _OP, _DTYPE, _CODE, _WORDS, _NEXT, _PLAN, _HELD = range(12)
_ITEMS, _OWN = 12, 13
# Calls kept on one array (the collectives a program makes on it): beyond,
# the oldest is dropped.
KEPT_PER_ARRAY = 4

# What a call with no array (a barrier) is known by.
NOTHING = np.empty(0, np.uint8)

ENV = "PYCOLL_NATIVE"
# Calls kept per group (each with its buffers: see call), and the most bytes
# of buffer one kept call may hold (its arrays and any copy it keeps: an
# in-place all-to-all of 1 MiB holds 2 MiB). Larger calls take the plain
# path, where pycoll's Python costs a few microseconds of calls of 100 us and
# more. At 1 MiB it still showed: the in-place all-to-all took 1.19-1.24x
# MPICH's in-place call and the out-of-place one 1.11x on the plain path,
# 1.04x and 1.01-1.02x kept; from 2 MiB keeping gained nothing measurable
# (docs/benchmarks.md, "The fixed cost of a small call").
KEPT_CALLS = 1024
KEPT_BYTES = 2 << 20
KEPT_TOTAL = 16 << 20  # the most bytes of buffer one group's kept calls hold
# A group whose kept calls are full starts over (a program whose arrays
# change), but at most once in this many calls: a program that cycles through
# more calls than a group keeps (a model's 1,500 gradients all-reduced one by
# one) would otherwise keep every call afresh, 1.4-1.8x the plain path's time
# (docs/measurements/many_arrays.py).
# Between, the calls kept stay kept and the others take the plain path.
RENEW_CALLS = 16 * KEPT_CALLS
SEEN = 4096  # arrays seen once (weakly) a group remembers
# The most bytes of the array a group saw last that it holds until it sees
# another (see _sighted): at most this much of a program's memory outlives
# its use by one call of the group.
HELD_BYTES = 64 << 10
AUTO, ON, OFF = "auto", "1", "0"
MODE = AUTO

# Set by _load(): pycoll.kernels.starts, whether MPI's handles are 64 bits
# wide, MPI_IN_PLACE's value, the mask that reads a handle as the C type holds
# it, and mpi4py's buffer (an address in 100 ns, where numpy's own interfaces
# take 900).
_starts: Any = None
# starts.start and starts.block compiled for three int64 arguments, called
# without numba's dispatch on argument types (80-100 ns of a call's 800 on one
# rank of the CI VM).
_start: Any = None
_block: Any = None
_wide = False
_in_place = 0
_handle_mask = 0
_buffer: Any = None
_failed: Optional[str] = None


def configure() -> None:
    """Read ``PYCOLL_NATIVE`` (at init): ``auto`` (the default), ``1`` or ``0``.
    Under ``1`` the compiled code is loaded now, so that a failure is an error
    at init rather than in a collective."""
    global MODE
    raw = os.environ.get(ENV, "").strip().lower() or AUTO
    if raw not in (AUTO, ON, OFF):
        raise ValueError(
            f"{ENV}={raw!r}: set it to auto (the default: compiled from a group's first "
            f"call check exchange), 1 (from a group's first call) or 0 (never)"
        )
    MODE = raw
    if MODE == ON:
        _load(strict=True)


def loaded() -> bool:
    """Whether this process has loaded the compiled path."""
    return _starts is not None


def _load(strict: bool = False) -> bool:
    """Import and bind pycoll.kernels.starts (numba) once; False where it cannot
    be (warned once, or raised under ``strict``)."""
    global _starts, _start, _block, _wide, _in_place, _handle_mask, _buffer, _failed
    if _starts is not None:
        return True
    if _failed is not None and not strict:
        return False
    try:
        MPI = _mpi.load()
        if np.dtype(np.intp).itemsize != 8:
            raise RuntimeError("it needs a 64-bit platform")
        from numba import types

        from .kernels import starts

        starts.bind()
        words = (types.int64, types.int64, types.int64)
        start, block = starts.start.compile(words), starts.block.compile(words)
    except Exception as exc:  # (numba missing or broken, an MPI without a symbol)
        _failed = f"pycoll: the compiled fast path is off ({type(exc).__name__}: {exc})"
        if strict:
            raise RuntimeError(
                f"{_failed}; unset {ENV} (or set {ENV}=0) to run without it"
            ) from exc
        warnings.warn(f"{_failed}; the calls take the Python path", RuntimeWarning, stacklevel=3)
        return False
    _wide = MPI._sizeof(MPI.Comm) == 8
    _in_place = int(MPI.IN_PLACE)
    _handle_mask = (1 << 63) - 1 if _wide else 0xFFFFFFFF
    _buffer = MPI.buffer
    _starts, _start, _block = starts, start, block
    return True


def attach(pg: ProcessGroup) -> None:
    """Give ``pg``'s synchronous fast calls the compiled path, where it applies
    (pycoll.collectives._common calls this at a group's first call under
    ``PYCOLL_NATIVE=1``, and at its call check exchanges otherwise). On a
    group with persistent plans (``PYCOLL_PERSISTENT=1``) it keeps only the
    calls a made plan serves (:func:`call_plan`)."""
    if MODE == OFF or pg._native is not None or pg._destroyed:
        return
    if not _load():
        return
    st = np.zeros(_starts.STATE_WORDS + WORDS, np.int64)
    st[_starts.WIDE] = _wide
    st[_starts.COMM] = pg.comm.handle & _handle_mask
    # The progress record lives as long as the group (world._free drops this
    # state where it lets the record go); without a board, the stores land in
    # the state's own spare words.
    record = pg._rec if pg._rec is not None else st[_starts.STATE_WORDS :]
    st[_starts.RECORD] = _buffer(record).address
    st[_starts.SPINS] = len(watch.spin_tests)
    pg._native = _State(st)


class _State:
    """A group's compiled path: its state words (pycoll.kernels.starts) and
    their address, the calls it keeps by their main array's id (the latest
    first, each linking to the one kept before it on that array), and the
    arrays seen once (:func:`_sighted`)."""

    __slots__ = ("st", "address", "calls", "seen", "last", "last_seq", "held", "renewed", "place")

    def __init__(self, st: Any) -> None:
        self.st = st
        self.address = _buffer(st).address
        self.calls: Dict[int, Tuple[Any, ...]] = {}
        self.seen: Dict[int, Any] = {}
        # The array seen last (held: see _sighted) and the sequence number of
        # the call it was seen in.
        self.last: Any = None
        self.last_seq = 0
        self.held = 0  # bytes of buffer the kept calls hold
        self.renewed = 0  # the group's sequence number when its calls last started over
        # The view :func:`again` last knew a call by (``place``), its ``extra``
        # and the key made of them: a view given again (the same object, held
        # here, so its address cannot have changed) skips reading its address
        # and making the key (210-250 ns of the in-place all-gather's and
        # reduce-scatter's 1.4-1.5 us on one rank). It holds that one view,
        # and so its array, until another takes its place or the group goes.
        self.place: Optional[Tuple[Any, Any, Any]] = None


def detach(pg: ProcessGroup) -> None:
    """Take ``pg`` back to the Python path (its state dropped)."""
    pg._native = None


def again(
    pg: ProcessGroup,
    op: str,
    main: Any,
    other: Any,
    extra: Any,
    known: Any = None,
    input: Any = None,
    place: Any = None,
    items: Any = None,
    work: bool = False,
) -> Any:
    """Make a synchronous collective on the compiled path where this group
    keeps the same call on ``main`` (an array, its dict key): the same
    collective ``op``, the same ``other`` buffer (an array, ``_mpi.IN_PLACE``
    or None), the same ``extra`` (the reduction or the root: what else
    decides the call), ``main`` of the same dtype. True once the call is
    done; False where the caller must go on (a call not kept; another thread
    holds or shares the group; an exchange point, which the plain path
    makes). None where ``main`` is first seen in this call (an array made
    afresh for each call): :func:`call` would not keep it, so the caller need
    not offer it there. :class:`Refused` for a kept scatter whose root
    refused its list (:func:`call_scatter`).

    With ``work`` (a call with ``async_op=True``) it starts the call and
    tests it as a synchronous call's (see the module's docstring), and
    returns its Work (pycoll.work) instead of True: complete where the tests
    saw the call done, else waiting for MPI's request within the group's
    timeout as the Python path's Works do; either closes a full flight
    recorder entry. Not for a kept call with a buffer of its own, which two
    Works under way would share, nor for one a persistent plan serves.

    Collectives call this once their arguments are checked and before the
    rest of their path (:func:`call` keeps the calls): a kept call is one
    the rest would send here again. The collectives of an output ``main``
    and an ``input`` array call it before their own checks, giving
    ``input``: then first what can change for the same two objects is
    checked (their types, contiguity, the output's writeable flag, an input
    dtype reassigned in place). ``place``, an array that is a new view each
    call (torch's in-place all-gather input and reduce-scatter output), has
    the call known by ``(extra, its address)``, the address read only once a
    call is kept on ``main``. ``items``, a list form's list (its arrays
    checked by the caller), must hold the very arrays the call was kept
    with.
    """
    state = pg._native
    if state is None:
        return False
    if known is None:
        # (A kept call holds its main array: no other object has its id.)
        known = state.calls.get(id(main))
        if known is None:
            if type(main) is not np.ndarray:
                return False  # (not checked yet: call() sees it once it is)
            if pg._aliases:
                return None  # (over device memory: never kept, nor held)
            # Not kept: an array not seen in an earlier call is answered None
            # here, where the miss is known, and not offered to call().
            return False if _sighted(pg, state, main) else None
        if input is not None and not (
            type(main) is np.ndarray
            and type(input) is np.ndarray
            and (f := main.flags).c_contiguous
            and f.writeable
            and input.flags.c_contiguous
            and input.dtype is main.dtype
        ):
            return False
        if place is not None:
            last = state.place
            if last is not None and last[0] is place and last[1] is extra:
                extra = last[2]  # (the view of the last call: its address unchanged)
            else:
                key = (extra, int(_buffer(place).address))
                state.place = (place, extra, key)
                extra = key
        while known is not None and (
            known[_OTHER] is not other
            or known[_EXTRA] is not extra
            and known[_EXTRA] != extra
            or known[_OP] is not op
            and known[_OP] != op
        ):
            known = known[_NEXT]  # another call kept on this array?
        if known is None or known[_DTYPE] is not main.dtype:
            return False
        if items is not None and not _same_items(known, items):
            return False
    if known[_PLAN] is not None and (work or known[_PLAN].work is not None):
        return False  # the plan's asynchronous use still under way: Plan.call ends it
    if work and known[_OWN]:
        return False
    if pg._owner != get_ident() or pg._shared:
        return False  # the locked path, in plain
    pg._busy = True  # then look again: a second thread may have just come
    if pg._shared:
        pg._busy = False
        return False
    try:
        if pg._broken is not None:
            raise watch.broken(pg, op)
        seq = pg._seq + 1
        slot = seq & pg._mask
        if slot == pg._mask:
            return False  # the call check's exchange point: plain makes it
        pg._seq = seq
        key = known[_KEY]
        pg._keys[slot] = key
        ring = pg._flight  # the flight recorder's entry: the key alone, but for a Work
        entry = None
        if ring is not None:
            if work:  # (a full one, which the Work closes)
                entry = [seq, op, key, None, known[_MAIN].nbytes, recorder.clock(), None,
                         recorder.STARTED, pg, None]  # fmt: skip
                ring.append(entry)
            else:
                ring.append(key)
        busy = seq << 8 | known[_CODE]
        if watch.BLOCKING and not work:  # MPI's blocking call, watched by the watchdog thread
            watch.inflight = (pg, op, seq)
            err = _block(known[_ADDRESS], busy, pg._word)
            watch.inflight = None
        else:
            err = _start(known[_ADDRESS], busy, pg._word)
    finally:
        pg._busy = False
    if work:
        return _work(pg, state.st, op, seq, err, known, entry)
    if err:
        if err == REFUSED:
            raise Refused(op)
        _unfinished(pg, state.st, op, seq, busy, err, known[_ADDRESS], known[_PLAN])
    return True


def _work(
    pg: ProcessGroup, st: Any, op: str, seq: int, err: int, known: Tuple[Any, ...], entry: Any
) -> Work:
    """The Work of the kept call ``known`` :func:`again` started (``err`` as
    starts.start returned it). A call with no buffer of its own makes no
    copy once done (its words' copy is a reduce-scatter's output beside its
    input, and its table a list form's parts), so the Work has nothing to
    finish; it holds the kept call, and so every array MPI reads or writes,
    until it completes, though the group drop the call meanwhile."""
    main = known[_MAIN]
    if err == 0:  # done in its tests, its busy bit cleared
        return Work.done(op, seq, [main], pg, main.nbytes, entry)
    if err != -1:
        watch.end(pg, seq)
        recorder.complete(entry, recorder.FAILED)
        raise watch.backend_error(op, seq, _mpi.MPI.Exception(err))
    request = _mpi.MPI.Request.fromhandle(int(st[_starts.REQUEST]) & _handle_mask)
    return Work(op, seq, [request], None, [main], pg, main.nbytes, None, None, None, known, entry)


def again_list(
    pg: ProcessGroup, op: str, main: Any, items: Any, extra: Any, async_op: bool
) -> bool:
    """:func:`again` for a list form whose list ``items`` the caller found
    plain (pycoll.arrays.plain_arrays), ``main`` the array beside it, where a
    call may take the compiled path (synchronous, debug off)."""
    return (
        pg._native is not None
        and not async_op
        and debug.PLAIN
        and again(pg, op, main, items[0], extra, items=items)
    )


def may_keep(nbytes: int) -> bool:
    """Whether a call whose buffers hold ``nbytes`` may be kept (at most
    KEPT_BYTES): a caller may skip preparing :func:`call`'s arguments for
    one that cannot be."""
    return nbytes <= KEPT_BYTES


def call(
    pg: ProcessGroup,
    op: str,
    key: int,
    what: int,
    send: Any,
    recv: Any,
    count: int,
    datatype: Any,
    mpi_op: Any,
    root: int,
    main: Any,
    other: Any,
    extra: Any,
    beside: Any = None,
    place: Any = None,
    copy_in: Optional[Tuple[Any, Any, int]] = None,
    skip: Optional[Tuple[int, int]] = None,
    items: Optional[Tuple[Any, ...]] = None,
    into_items: bool = False,
    work: bool = False,
) -> Any:
    """Keep a collective for :func:`again` and make it there (with ``work``,
    a call with ``async_op=True``: as :func:`again`'s, its Work), once
    it is made a second time on the same ``main`` array (an array seen once,
    as one made afresh for each call, takes the plain path: keeping it would
    cost more than the compiled path saves). False where the caller's plain
    path must make it.

    ``key`` is the call check's key of the call; ``send`` and ``recv`` the
    buffers MPI gets (arrays, ``_mpi.IN_PLACE``, or None); ``datatype`` and
    ``mpi_op`` mpi4py's objects (None where the collective takes none);
    ``count`` and ``root`` as MPI takes them; ``main``, ``other`` and
    ``extra`` what :func:`again` will know the call by. ``beside``, an
    output that lies in the input (torch's in-place reduce-scatter), has
    the call receive into a buffer it keeps (``recv`` is then None) and
    copy that to ``beside`` once done. ``copy_in``, (target, source,
    bytes), has the call copy that many bytes from ``source`` (an array or
    an address) to ``target`` before it starts: an array, or an address in
    ``main`` or ``other`` (an out-of-place all-gather's input into this
    rank's part of the output, sent in place); or None, a buffer the call
    keeps, which MPI sends from (``send`` is then None: an in-place
    all-to-all's input sent from a copy). ``skip``, (offset, bytes), leaves
    that part of the copy's range uncopied (what MPI neither sends nor
    receives: the v-form all-to-all's own part). ``place`` as for
    :func:`again`. ``items``, a list form's arrays (``other`` its first),
    all of one size, have the call keep a buffer of them side by side:
    MPI receives into it and it is copied out to them once the call is
    done (``into_items``: ``recv`` is then None), or they are copied into
    it before the call starts and MPI sends from it (``send`` None).
    (REDUCE_SCATTER_V's per-rank counts, all ``count``, and ALL_TO_ALL_V's
    counts and displacements, ``count`` to each rank but this one, are made
    here and held.)

    Not, on a group with persistent plans, a call of the collectives whose
    calls every rank counts until their plan is made (pycoll.persistent's
    COUNTED, up to its LIMIT bytes): a kept call would skip the count on a
    rank whose array is kept while another rank's is made afresh. There
    :func:`call_plan` keeps the calls a made plan serves. Nor on arrays over
    device memory (pycoll.gpu's CUDA-aware calls: ``pg._aliases``), which
    the compiled copies must not touch.
    """
    state = pg._native
    if state is None or pg._aliases:
        return False  # (arrays over device memory: no CPU copy may touch them)
    if state.last is main and state.last_seq == pg._seq and items is None:
        return False  # (first seen by again() in this very call: see _sighted)
    own = beside is not None or items is not None or copy_in is not None and copy_in[0] is None
    if work and own:
        return False  # (a buffer of its own, which two Works under way would share)
    if pg._plans is not None and pg._plans.counts(op, main.nbytes):
        return False  # (a call pycoll.persistent counts on every rank: call_plan's, if any)
    found = _found(pg, state, main, other, extra, place, op, items)
    if found is None:
        return False
    extra, held = found
    if beside is not None:
        held += beside.nbytes
    if items is not None:  # (their buffer, and the arrays besides other, counted already)
        total = sum(x.nbytes for x in items)
        held += total + total - other.nbytes
    if copy_in is not None and copy_in[0] is None:
        held += copy_in[2]
    if not may_keep(held) or not _room(pg, state, main, held):
        return False
    if beside is not None:
        recv = np.empty(beside.shape, beside.dtype)
    target = None
    if copy_in is not None:
        target, source, nbytes = copy_in
        if target is None:
            target = send = np.empty(nbytes, np.uint8)
    stacked = rows = None
    if items is not None:
        part = items[0].nbytes
        stacked = np.empty(len(items) * part, np.uint8)
        at = _address(stacked)
        places = [(_address(x), at + i * part) for i, x in enumerate(items)]
        rows = np.array([(a, b, part) if into_items else (b, a, part) for a, b in places], np.int64)
        if into_items:
            recv = stacked
        else:
            send = stacked
    counts = None
    if what == REDUCE_SCATTER_V:
        counts = np.full(pg._size, count, np.intc)
    elif what == ALL_TO_ALL_V:
        counts = np.concatenate([np.full(pg._size, count, np.intc),
                                 np.arange(pg._size, dtype=np.intc) * count])  # fmt: skip
        counts[pg._rank] = 0  # (this rank's own part: not sent, not received)
        count = pg._size
    mask = _handle_mask
    words = _words(
        what,
        send,
        recv,
        count,
        0 if datatype is None else datatype.handle & mask,
        0 if mpi_op is None else mpi_op.handle & mask,
        root,
        state.address,
        beside,
        recv if beside is not None else None,
        counts,
    )
    if copy_in is not None:
        words[IN_TO:IN_SKIP] = (
            target if type(target) is int else _address(target),
            source if type(source) is int else _address(source),
            nbytes,
        )
        if skip is not None:
            words[IN_SKIP:IN_TABLE] = skip
    if rows is not None:
        table = (OUT_TABLE, OUT_ROWS) if into_items else (IN_TABLE, IN_ROWS)
        words[table[0]], words[table[1]] = _address(rows), len(rows)
    holds = (target, recv, counts, stacked, rows)
    return _keep(pg, state, op, key, main, other, extra, words, holds, held, None, items, own, work)


def call_plan(
    pg: ProcessGroup,
    op: str,
    plan: Any,
    main: Any,
    other: Any,
    extra: Any,
    inp: Any,
    out: Any,
    place: Any = None,
) -> bool:
    """:func:`call` for a call that ``plan``, a made persistent collective
    (pycoll.persistent.Plan), serves: the compiled code copies ``inp`` into
    the plan's send buffer, starts the plan's request and tests it, and
    copies its receive buffer to ``out`` (None for either: no copy), as
    ``Plan.call`` does. Every rank uses a made plan for its key, kept or not,
    so keeping skips no count. ``main``, ``other``, ``extra`` and ``place``
    as for :func:`call`."""
    state = pg._native
    if state is None:
        return False
    found = _found(pg, state, main, other, extra, place, op, None)
    if found is None:
        return False
    extra, held = found
    if not _room(pg, state, main, held):
        return False
    words = _words(START, None, None, 0, 0, 0, 0, state.address, out,
                   plan.recv if out is not None else None, None)  # fmt: skip
    words[PLAN] = plan.request.handle & _handle_mask
    if inp is not None:
        words[IN_TO:IN_SKIP] = (_address(plan.send), _address(inp), inp.nbytes)
    holds = (inp, out)
    return _keep(pg, state, op, plan.key, main, other, extra, words, holds, held, plan, None, True)


def call_scatter(
    pg: ProcessGroup, key: int, main: Any, items: Optional[Tuple[Any, ...]], root: int
) -> bool:
    """:func:`call` for a synchronous scatter into ``main`` from group rank
    ``root``, whose list ``items`` (on the root; None elsewhere) the caller
    found plain. Each part travels behind an 8-byte status word, as on the
    plain path (pycoll.collectives.scatter), so that the two paths' calls
    pair on any mix of ranks: the root's call keeps a buffer of its parts,
    each behind a word of 0, and copies its list into it before each start;
    every rank's call receives its word and part into a buffer it keeps and
    copies the part to ``main`` once done, unless the word is not 0 (a root
    on the plain path refused its list: then :class:`Refused` is raised,
    ``main`` untouched). Known again as :func:`again` (or, on the root,
    :func:`again_list`) finds it: by ``main``, the root as its extra, and on
    the root the list's first array as its other buffer and every array of
    the list as its items."""
    state = pg._native
    if state is None or pg._aliases:
        return False
    other = items[0] if items is not None else None
    found = _found(pg, state, main, other, root, None, "scatter", items)
    if found is None:
        return False
    extra, held = found
    part = main.nbytes
    step = SCATTER_STATUS + part
    held += step  # (the receive buffer)
    if items is not None:  # (their buffer, and the arrays besides other)
        held += len(items) * step + (len(items) - 1) * part
    if not may_keep(held) or not _room(pg, state, main, held):
        return False
    received = np.zeros(step, np.uint8)
    send = rows = None
    if items is not None:
        send = np.zeros(len(items) * step, np.uint8)  # (the words stay 0: only parts are copied)
        at = _address(send) + SCATTER_STATUS
        rows = np.array([(at + i * step, _address(x), part) for i, x in enumerate(items)], np.int64)
    words = _words(SCATTER, send, received, step, _mpi.MPI.BYTE.handle & _handle_mask, 0, root,
                   state.address, main, received, None)  # fmt: skip
    words[COPY_FROM] += SCATTER_STATUS
    words[STATUS_AT] = _address(received)
    if rows is not None:
        words[IN_TABLE], words[IN_ROWS] = _address(rows), len(rows)
    holds = (send, received, rows)
    return _keep(
        pg, state, "scatter", key, main, other, extra, words, holds, held, None, items, True
    )


def call_pair(
    pg: ProcessGroup,
    op: str,
    key: int,
    main: Any,
    other: Any,
    extra: Any,
    exchange: Tuple[Any, int, Any, int, Any],
    fold: Optional[Tuple[Any, Any, Any]],
    back: Any,
    place: Any = None,
    items: Optional[Tuple[Any, ...]] = None,
) -> bool:
    """:func:`call` for a call of two ranks made as one exchange
    (pycoll.collectives.pair): ``exchange`` is (send, dest, recv, source,
    datatype), a side's rank MPI_PROC_NULL where it has none; ``fold``, (op,
    in, inout) for MPI_Reduce_local once the exchange is done, or None;
    ``back`` an array ``inout`` is copied to after the fold, or None. The
    messages go over the group's side communicator, which the plain path
    made at the call's first sighting (none yet: not kept). ``main``,
    ``other``, ``extra`` and ``place`` as for :func:`call`; ``items``, a
    list form's arrays (``other`` its first), which the words point into
    and the kept call holds."""
    state = pg._native
    side = pg._side
    if state is None or pg._aliases or side is None or isinstance(side, tuple):
        return False
    found = _found(pg, state, main, other, extra, place, op, items)
    if found is None:
        return False
    extra, held = found
    send, dest, recv, source, datatype = exchange
    if fold is not None and recv is not main:  # (the peer's copy, in a buffer of the call's own)
        held += recv.nbytes
    if items is not None:  # (the arrays besides other)
        held += sum(x.nbytes for x in items) - other.nbytes
    if not may_keep(held) or not _room(pg, state, main, held):
        return False
    mask = _handle_mask
    mpi_op = 0 if fold is None else fold[0].handle & mask
    folded = None if fold is None else fold[2]  # (copied to ``back``, where given)
    words = _words(PAIR, send, recv, send.size, datatype.handle & mask, mpi_op, dest,
                   state.address, back, folded if back is not None else None, None)  # fmt: skip
    words[SOURCE] = source
    if fold is not None:
        words[FOLD_IN], words[FOLD_INOUT] = _address(fold[1]), _address(folded)
    state.st[_starts.SIDE] = side.handle & mask
    holds = (recv,)
    # A call with a fold makes no Works (own): a Work whose request completed
    # in Python would skip the fold, which the compiled code makes once done.
    return _keep(pg, state, op, key, main, other, extra, words, holds, held, None, items,
                 fold is not None)  # fmt: skip


def _found(
    pg: ProcessGroup,
    state: _State,
    main: Any,
    other: Any,
    extra: Any,
    place: Any,
    op: str,
    items: Any,
) -> Optional[Tuple[Any, int]]:
    """What :func:`call` and :func:`call_plan` keep a call by: its ``extra``
    (with ``place``'s address, if given) and the bytes of the arrays it
    holds; None where the call is not to be kept: seen for the first time
    (:func:`_again_on`), or kept already, words and all, and declined by
    :func:`again` for a reason of the moment (the call check's exchange
    point, another thread) that the plain path serves. A list form's call
    (``items``) is kept once every array of its list was seen before too:
    arrays made afresh for each call are not kept.)"""
    if place is not None:
        extra = (extra, _address(place))
    seen = _again_on(pg, state, main)
    if items is not None and not all([_again_on(pg, state, x) for x in items]) or not seen:
        return None
    link = state.calls.get(id(main))
    while link is not None:
        if (
            _same(link, other, extra, op)
            and link[_DTYPE] is main.dtype
            and (items is None or _same_items(link, items))
        ):
            return None
        link = link[_NEXT]
    return extra, main.nbytes + (other.nbytes if type(other) is np.ndarray else 0)


def _same(link: Tuple[Any, ...], other: Any, extra: Any, op: str) -> bool:
    """Whether the kept call ``link`` is the call of ``other``, ``extra``
    and ``op`` on its main array (its dtype aside)."""
    return (
        link[_OTHER] is other
        and (link[_EXTRA] is extra or link[_EXTRA] == extra)
        and link[_OP] == op
    )


def _same_items(link: Tuple[Any, ...], items: Any) -> bool:
    """Whether the kept call ``link`` was kept with the very arrays ``items``."""
    kept = link[_ITEMS]
    return kept is not None and len(kept) == len(items) and all(map(is_, kept, items))


def _room(pg: ProcessGroup, state: _State, main: Any, held: int) -> bool:
    """Whether the group may keep one more call on ``main``, holding ``held``
    bytes: within KEPT_CALLS arrays and KEPT_TOTAL bytes, or once they are
    full, by starting over where it last did so RENEW_CALLS calls ago or
    more (then every kept call is dropped)."""
    calls = state.calls
    if state.held + held <= KEPT_TOTAL and (len(calls) < KEPT_CALLS or id(main) in calls):
        return True
    if pg._seq - state.renewed < RENEW_CALLS:
        return False  # (full again soon after starting over: the plain path serves the rest)
    calls.clear()
    state.held = 0
    state.renewed = pg._seq
    return True


def _again_on(pg: ProcessGroup, state: _State, main: Any) -> bool:
    """Whether ``main`` was seen in an earlier call on this group
    (:func:`_sighted`) and this thread owns the group."""
    return _sighted(pg, state, main) and pg._owner == get_ident() and not pg._shared


def _sighted(pg: ProcessGroup, state: _State, main: Any) -> bool:
    """Whether ``main`` was seen in an earlier call on this group; else note
    it, with the group's sequence number (the call it is seen in). Arrays
    larger than a kept call may hold are never kept, nor noted.

    The array seen last, up to HELD_BYTES, is held (``state.last``) until
    another is seen: its identity is sure without a weak reference. Then it
    is dropped where nothing else holds it (an array made afresh for each
    call: it goes once pycoll lets it go, so noting it would serve nothing),
    else noted weakly (``state.seen``: a program's array, which it may pass
    again). A weak reference made on every array made afresh, and cleared
    with it, cost 1.5 us of an 8-byte all_reduce's 25 on 2 ranks of the CI
    VM (docs/measurements/native_fresh.py)."""
    if state.last is main:
        return state.last_seq != pg._seq
    seen = state.seen
    was = seen.get(id(main))
    if was is not None and was[0]() is main:
        return was[1] != pg._seq
    nbytes = main.nbytes
    if nbytes > KEPT_BYTES:
        return False
    if state.last is not None and _references(state) > _HELD_HERE:
        _note(seen, state.last, state.last_seq)
    if nbytes <= HELD_BYTES:
        state.last, state.last_seq = main, pg._seq
    else:
        state.last = None
        _note(seen, main, pg._seq)
    return False


def _note(seen: Dict[int, Any], x: Any, seq: int) -> None:
    """Remember ``x``, seen in the call of sequence number ``seq``, weakly."""
    if len(seen) >= SEEN:
        seen.clear()
    seen[id(x)] = (weakref.ref(x), seq)


def _references(holder: Any) -> int:
    """``holder.last``'s reference count, as read from here (no other frame
    of this module holds it while _sighted asks)."""
    return getrefcount(holder.last)


class _Probe:
    """What _HELD_HERE is measured with: an object only its ``last`` holds."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = object()


# What _references reads for an array only a group's ``last`` holds, on this
# interpreter (how a call counts its own references varies between
# versions); more, and something else holds it too.
_HELD_HERE = _references(_Probe())


def _words(
    what: int,
    send: Any,
    recv: Any,
    count: int,
    datatype: int,
    mpi_op: int,
    root: int,
    state: int,
    copy_to: Any,
    copy_from: Any,
    counts: Any,
) -> Any:
    """A call's words (WHAT to COUNTS; the plan's and copy_in's words zero)."""
    words = np.zeros(CALL_WORDS, np.int64)
    words[:COPY_TO] = (what, _address(send), _address(recv), count, datatype, mpi_op, root, state)
    if copy_to is not None:
        words[COPY_TO] = _address(copy_to)
        words[COPY_FROM] = _address(copy_from)
        words[COPY_BYTES] = copy_to.nbytes
    words[COUNTS] = _address(counts)
    return words


def _keep(
    pg: ProcessGroup,
    state: _State,
    op: str,
    key: int,
    main: Any,
    other: Any,
    extra: Any,
    words: Any,
    holds: Tuple[Any, ...],
    held: int,
    plan: Any,
    items: Optional[Tuple[Any, ...]],
    own: bool,
    work: bool = False,
) -> Any:
    """Keep a call's words (and what they point into: ``holds``, ``held``
    bytes of it counted; ``own``, whether one of those is a buffer MPI sends
    from or receives into) for :func:`again`, and make it there."""
    # Kept, a call holds its arrays: their addresses stay valid (numpy will
    # not resize an array another object holds), and the memory held stays
    # bounded (KEPT_CALLS calls, KEPT_TOTAL bytes: see _room). A call kept
    # before on the same array stays behind it (up to KEPT_PER_ARRAY), unless
    # it is this call again (its dtype reassigned): a program that makes
    # several collectives on one array keeps each. What the calls dropped
    # held is counted off.
    calls = state.calls
    before: List[Tuple[Any, ...]] = []
    link = calls.get(id(main))
    while link is not None:
        if len(before) < KEPT_PER_ARRAY - 1 and not _same(link, other, extra, op):
            before.append(link)
        else:
            state.held -= link[_HELD]
        link = link[_NEXT]
    rest = None
    for link in reversed(before):
        rest = link[:_NEXT] + (rest,) + link[_PLAN:]
    known = (
        _buffer(words).address, key, main, other, extra, op, main.dtype, BUSY_CODE[op],
        (words, holds), rest, plan, held, items, own,
    )  # fmt: skip
    calls[id(main)] = known
    state.held += held
    return again(pg, op, main, other, extra, known, work=work)


def _address(x: Any) -> int:
    """A buffer argument's address: MPI_IN_PLACE's value, 0 for None."""
    if x is _mpi.IN_PLACE:
        return _in_place
    if x is None:
        return 0
    return int(_buffer(x).address)


def _unfinished(
    pg: ProcessGroup, st: Any, op: str, seq: int, busy: int, err: int, address: int, plan: Any
) -> None:
    """A call the compiled tests did not see done: wait for it in Python (and
    make its copy), or raise MPI's error as the plain path does. (A plan's
    request is its own Request object's: persistent, it outlives the call.)"""
    if err != -1:
        raise watch.backend_error(op, seq, _mpi.MPI.Exception(err))
    if plan is not None:
        request = plan.request
    else:
        request = _mpi.MPI.Request.fromhandle(int(st[_starts.REQUEST]) & _handle_mask)
    watch.wait1_yielding(pg, op, seq, request)
    code = _starts.finish(address)
    rec, word = pg._rec, pg._word
    if rec is not None and rec[word] == busy:
        rec[word] = busy - 1
    if code == REFUSED:
        raise Refused(op)
    if code:  # (MPI's error from a fold once done: pycoll.collectives.pair)
        raise watch.backend_error(op, seq, _mpi.MPI.Exception(code))
