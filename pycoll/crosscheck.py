"""The default mode's check that every rank made the same collective calls.

Ranks that disagree about a collective (a different length, dtype, root,
reduction or collective, or a call one rank skipped) get wrong answers from
MPI without an error. ``PYCOLL_DEBUG=DETAIL`` compares every call before it
runs, at the price of an exchange per call; this module catches the same
disagreements in the default mode, a bounded number of calls later, for a
few stores per call.

How:

- Every collective a rank starts on a group is summed up in one 63-bit *key*
  (:func:`key`): the collective, its reduction, the dtype, the element count
  and the root. The call's path stores it in the group's ledger, slot
  ``seq % EVERY``: a list store on the fast path.
- At every sequence number ``seq % EVERY == EVERY - 1`` each rank starts a
  nonblocking all-gather of its last EVERY keys over the group's side
  communicator (a duplicate made with the group) and goes on. The exchange points are
  fixed sequence numbers, so every rank makes the same exchanges in the same
  order whatever its timing.
- A rank tests the exchange in flight whenever it waits long inside pycoll
  (pycoll.watch.wait), and at the next exchange point completes it before
  starting the next one: it waits there, within the group's timeout, only
  for ranks more than EVERY calls behind it (a broadcast root, which never
  waits in its calls, or a rank far ahead with async calls).
- Every rank gets the same gathered keys, so every rank finds the same
  disagreement and raises CollectiveMismatchError naming the first sequence
  number where the ranks differ, what each of them called there, and which
  ranks those were; the group is unusable afterwards (its MPI state is
  unknown). A disagreement is found on every rank at most ``2 * EVERY``
  calls after it happened (the exchange that holds it completes by the next
  exchange point), or earlier when the rank waits long in pycoll.
- :func:`final` exchanges the calls since the last exchange point, and how
  many calls each rank made, at ``destroy_process_group`` (within the group's
  timeout) and at exit (within a few seconds), so a short program is checked
  too.

``PYCOLL_CHECK_EVERY`` sets EVERY (a power of two, default 128; 0 turns the
check off). Its cost is in docs/benchmarks.md ("Call check, DETAIL and bounded
waits").
"""

from __future__ import annotations

import sys
import threading
from array import array
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _env, _mpi, progress
from .errors import CollectiveMismatchError, DistBackendError

__all__ = ["ENV_VAR", "key", "reduction_bits"]

ENV_VAR = "PYCOLL_CHECK_EVERY"
DEFAULT_EVERY = 128
# Exchanges a rank may have in flight when it reaches an exchange point before
# it waits for the oldest: 1, so that the one started EVERY calls earlier is
# complete by then on every rank, which is what bounds the check (2 * EVERY).
PENDING = 1
EXIT_WAIT = 5.0  # seconds the last exchange may take at exit
FINAL_WAIT = 10.0  # ... and at destroy_process_group (or the group's timeout, if shorter)

# A key, low bit first: count (29 bits, the element count modulo 2**29), the
# collective (6 bits, pycoll.progress.CODE), the reduction (4 bits), the
# dtype (8 bits), the root as a group rank (16 bits). Fixed fields, so a key
# received from another rank can be described here.
COUNT = (1 << 29) - 1
_OP_SHIFT, _REDOP_SHIFT, _DTYPE_SHIFT, _ROOT_SHIFT = 29, 35, 39, 47
_ROOT_MASK = (1 << 16) - 1

REDUCTIONS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
_REDOP_CODE = {name: i + 1 for i, name in enumerate(REDUCTIONS)}
DTYPES = (
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "longdouble",
    "complex64",
    "complex128",
    "clongdouble",
    "bfloat16",
)
_DTYPE_CODE = {name: i + 1 for i, name in enumerate(DTYPES)}
_OTHER_DTYPE = 255
# Where the root is an argument, and what torch.distributed calls it.
ROOTS = {
    "broadcast": "src",
    "scatter": "src",
    "broadcast_object_list": "src",
    "scatter_object_list": "src",
    "reduce": "dst",
    "gather": "dst",
    "gather_object": "dst",
}
OP_BITS = {name: code << _OP_SHIFT for name, code in progress.CODE.items()}


_CODE_OF: Dict[Any, int] = {}  # dtype -> code: a dtype's .name costs microseconds


def _dtype_code(dtype: Any) -> int:
    if dtype is None:
        return 0
    try:
        return _CODE_OF[dtype]
    except KeyError:
        code = _CODE_OF[dtype] = _DTYPE_CODE.get(np.dtype(dtype).name, _OTHER_DTYPE)
        return code


def reduction_bits(redop: str, dtype: Any) -> int:
    """The key's reduction and dtype fields, for a cached plan (pycoll.ops.Plan.key)."""
    return _REDOP_CODE.get(redop, 0) << _REDOP_SHIFT | _dtype_code(dtype) << _DTYPE_SHIFT


def key(
    op: str, dtype: Any = None, count: int = 0, root: int = 0, redop: Optional[str] = None
) -> int:
    """One call's key: ``op`` (a pycoll.progress.OPS name), the dtype and
    element count every rank must agree on, the root (a group rank) and the
    reduction's name."""
    bits = OP_BITS[op] | (root & _ROOT_MASK) << _ROOT_SHIFT | count & COUNT
    if redop is not None:
        bits |= _REDOP_CODE.get(redop, 0) << _REDOP_SHIFT
    return bits | _dtype_code(dtype) << _DTYPE_SHIFT


def op_of(k: int) -> str:
    """A key's operation (a pycoll.progress.OPS name; "?" for one it does not know)."""
    code = k >> _OP_SHIFT & progress.OP_MASK
    return progress.OPS[code] if code < len(progress.OPS) else "?"


def dtype_and_count(k: int) -> Tuple[Optional[str], int]:
    """A key's dtype name (None if it has none or pycoll does not name it) and element count."""
    dtype = k >> _DTYPE_SHIFT & 0xFF
    return (DTYPES[dtype - 1] if 0 < dtype <= len(DTYPES) else None), k & COUNT


def describe(k: int, ranks: List[int]) -> str:
    """A key as a call, e.g. ``all_reduce(SUM, float32, 6 elements)``;
    ``ranks`` turns the root into a global rank."""
    if k == 0:
        return "no collective"
    op = op_of(k)
    parts = []
    redop = k >> _REDOP_SHIFT & 0xF
    if redop:
        parts.append(REDUCTIONS[redop - 1] if redop <= len(REDUCTIONS) else "?")
    if op in ROOTS:
        root = k >> _ROOT_SHIFT & _ROOT_MASK
        parts.append(f"{ROOTS[op]}={ranks[root] if root < len(ranks) else root}")
    dtype = k >> _DTYPE_SHIFT & 0xFF
    if dtype:
        parts.append(DTYPES[dtype - 1] if dtype <= len(DTYPES) else "a dtype of its own")
    count = k & COUNT
    if count:
        parts.append(f"{count} element{'s' if count != 1 else ''}")
    return f"{op}({', '.join(parts)})"


def every_from_env() -> int:
    """PYCOLL_CHECK_EVERY: 0 (off) or a power of two; default 128."""
    return _env.number(
        ENV_VAR, int, DEFAULT_EVERY, lambda v: v == 0 or (v > 1 and not v & (v - 1)),
        "0 (no check) or a power of two from 2 up",
    )  # fmt: skip


# Read once per process by init_process_group (pycoll.groups); the fast paths
# read MASK through the group (ProcessGroup._keys has EVERY slots).
EVERY = DEFAULT_EVERY


def set_every(every: int) -> None:
    global EVERY
    EVERY = every


def idle_ledger() -> array:
    """A group's key slots with the check off: enough that the exchange point
    (a no-op then) comes rarely."""
    return array("q", bytes(8 * 1024))


class _Slot:
    """One exchange's buffers and request: this rank's row (seq, valid, then
    the keys, which the calls store straight into it: ``keys`` is the group's
    ledger while this slot is the one being filled), every rank's rows, and
    the all-gather, made once as a persistent request (MPI_Allgather_init:
    starting it again measured a few microseconds, a new MPI_Iallgather four
    times that) and started at each use."""

    __slots__ = ("mine", "keys", "everyone", "request", "persistent")

    def __init__(self, every: int) -> None:
        self.mine = np.zeros(every + 2, np.int64)
        self.keys = self.mine[2:].data
        self.everyone: Any = None  # every rank's rows, made on first use
        self.request: Any = None
        self.persistent = True

    def start(self, comm: Any) -> None:
        MPI = _mpi.MPI
        if self.everyone is None:
            self.everyone = np.zeros((comm.Get_size(), self.mine.size), np.int64)
        send, recv = [self.mine, MPI.INT64_T], [self.everyone, MPI.INT64_T]
        if self.request is None and self.persistent:
            try:
                self.request = comm.Allgather_init(send, recv)
            except (NotImplementedError, MPI.Exception):
                self.persistent = False  # an MPI before MPI-4: a new one each time
        if self.persistent:
            self.request.Start()
        else:
            self.request = comm.Iallgather(send, recv)

    def agree(self) -> bool:
        """Every rank's row is this rank's."""
        return bool(self.everyone.tobytes() == self.mine.tobytes() * len(self.everyone))


class Checker:
    """One group's exchanges: a pool of slots used in turn (PENDING + 1, so
    the slot filled next was always compared already), those in flight, and
    the error once one has found a disagreement. ``ledger()`` is the slot the
    group's calls store into."""

    def __init__(self, comm: Any) -> None:
        self.lock = threading.Lock()
        self.off = False  # MPI failed the check's traffic on this group
        self.abandoned = False  # an exchange was left unfinished (kept alive for good)
        self.pool = [_Slot(EVERY) for _ in range(PENDING + 1)]
        self.made = 0  # exchanges filled so far
        self.comm = comm  # the group's side communicator (made with the group)
        self.pending: List[_Slot] = []  # started, not compared yet
        self.error: Optional[CollectiveMismatchError] = None

    def ledger(self) -> memoryview:
        return self.pool[self.made % len(self.pool)].keys


def _issue(pg: Any, checker: Checker, seq: int, valid: int) -> None:
    """Start the exchange of the slot the calls have filled, as of ``seq``,
    and give the group's calls the next one."""
    slot = checker.pool[checker.made % len(checker.pool)]
    mine = slot.mine
    mine[0], mine[1] = seq, valid
    checker.made += 1
    pg._keys = checker.ledger()
    slot.start(checker.comm)
    checker.pending.append(slot)


def exchange(pg: Any, op: str, seq: int, wait: Callable[..., None]) -> None:
    """At an exchange point (``seq % EVERY == EVERY - 1``, the caller having
    stored this call's key): start the exchange of the last EVERY keys, test
    the earlier ones, and raise if one found a disagreement. ``wait`` is
    pycoll.watch.wait, which bounds a wait by the group's timeout: it is
    used only when PENDING exchanges are in flight."""
    checker = pg._check
    if checker is None or checker.off:
        return
    with checker.lock:
        try:
            _collect(pg, checker)
            while len(checker.pending) >= PENDING:
                _wait_oldest(pg, checker, lambda request: wait(pg, op, seq, [request]))
            _issue(pg, checker, seq, len(pg._keys))
        except _mpi.MPI.Exception as exc:
            raise _failed(checker, op, seq, exc) from None


def poll(pg: Any) -> None:
    """Test the group's exchanges in flight; raise if one found a
    disagreement. Called by a rank that waits long in pycoll: the others may
    have stopped at the mismatch, and this is how this rank hears of it."""
    checker = pg._check
    if checker is None or checker.off or not checker.lock.acquire(blocking=False):
        return
    try:
        _collect(pg, checker)
    except _mpi.MPI.Exception as exc:  # the wait goes on: say so, never fail it for this
        sys.stderr.write(f"pycoll: {_failed(checker, 'call check', pg._seq, exc)}\n")
    finally:
        checker.lock.release()


def _failed(checker: Checker, op: str, seq: int, exc: Exception) -> DistBackendError:
    """MPI failed the check's own traffic: the check stops on this group (its
    exchanges can no longer pair up), and the caller raises this."""
    _abandon(checker)  # which also turns the check off
    return DistBackendError(
        f"{op}: pycoll's call check (pycoll.crosscheck) could not exchange its keys over MPI: "
        f"{exc}. If MPI ran out of communicators, destroy the groups you no longer use "
        f"(pycoll.destroy_process_group(group)); {ENV_VAR}=0 turns the check off.",
        op,
        seq,
    )


def _collect(pg: Any, checker: Checker) -> None:
    """Compare the exchanges that have completed, oldest first."""
    if checker.error is not None:
        raise checker.error
    pending = checker.pending
    while pending and pending[0].request.Test():
        _compare(pg, checker, pending.pop(0))


def _wait_oldest(pg: Any, checker: Checker, wait: Callable[[Any], None]) -> None:
    """Wait for the oldest exchange (``wait(request)`` bounds the wait) and compare it."""
    slot = checker.pending[0]
    wait(slot.request)
    checker.pending.pop(0)
    _compare(pg, checker, slot)


def _compare(pg: Any, checker: Checker, slot: _Slot) -> None:
    if slot.agree():
        return
    error = mismatch(pg, slot.everyone)
    checker.error = error
    pg._broken = error
    board = pg._board
    if board is not None and not board.abandoned:  # the group's MPI state is unknown:
        board.abandoned = "the call check found a group's ranks disagreeing"  # wait on no one
    raise error


def _calls(row: np.ndarray, every: int) -> Dict[int, int]:
    """seq -> key for the calls a gathered row covers: at most ``every``,
    whatever the row says (a row MPI filled from some other collective's
    buffer, matched with the exchange, could claim 2**62 calls)."""
    last, valid = int(row[0]), min(int(row[1]), every)
    keys = row[2:]
    return {s: int(keys[s % every]) for s in range(max(1, last - valid + 1), last + 1)}


def mismatch(pg: Any, everyone: np.ndarray) -> CollectiveMismatchError:
    """The error for gathered rows that differ: the first sequence number at
    which the ranks' calls differ, or else how many calls each rank made."""
    ranks = pg._ranks
    every = everyone.shape[1] - 2
    calls = [_calls(row, every) for row in everyone]
    common = sorted(set.intersection(*(set(c) for c in calls)))
    name = f"the ranks of group {pg.group_desc!r}"
    for s in common:
        by_key: Dict[int, List[int]] = {}
        for i, c in enumerate(calls):
            by_key.setdefault(c[s], []).append(ranks[i])
        if len(by_key) == 1:
            continue
        parts = sorted(by_key.items(), key=lambda item: (-len(item[1]), item[1]))
        said = " while ".join(f"{_who(who)} called {describe(k, ranks)}" for k, who in parts)
        hint = _skipped(calls, parts, s, ranks)
        return CollectiveMismatchError(
            f"the ranks of group {pg.group_desc!r} called different collectives at seq {s}: "
            f"{said}.{hint} MPI ran them without an error, so the results from seq {s} on are "
            f"wrong; the group is unusable. (Found by pycoll's call check; "
            f"PYCOLL_DEBUG=DETAIL stops such a call before it runs.)",
            op_of(int(calls[pg._rank].get(s, 0))),
            s,
            {ranks[i]: describe(c[s], ranks) for i, c in enumerate(calls)},
        )
    made: Dict[int, List[int]] = {}
    for i, row in enumerate(everyone):
        made.setdefault(int(row[0]), []).append(ranks[i])
    said = ", ".join(f"{_who(who)} made {n}" for n, who in sorted(made.items()))
    last = min(made)
    return CollectiveMismatchError(
        f"{name} made different numbers of collectives on it: {said} (a rank skipped a "
        f"collective, or made one more); the group is unusable.",
        "?",
        last + 1,
        {ranks[i]: f"{int(row[0])} collectives" for i, row in enumerate(everyone)},
    )


def _who(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _skipped(
    calls: List[Dict[int, int]], parts: List[Tuple[int, List[int]]], s: int, ranks: List[int]
) -> str:
    """A hint where one side's calls from ``s`` on are the other's shifted by one."""
    if len(parts) != 2:
        return ""
    most = calls[ranks.index(parts[0][1][0])]
    few = calls[ranks.index(parts[1][1][0])]
    behind = [t for t in sorted(few) if t >= s and t + 1 in most]
    ahead = [t for t in sorted(most) if t >= s and t + 1 in few]
    lags = len(behind) >= 2 and all(few[t] == most[t + 1] for t in behind)
    leads = len(ahead) >= 2 and all(most[t] == few[t + 1] for t in ahead)
    if not (lags or leads):
        return ""
    if len(parts[0][1]) == len(parts[1][1]):  # no majority to go by
        return (
            f" From seq {s} on, each side's calls are the other's shifted by one: one side "
            f"skipped a collective at seq {s} (or made one more)."
        )
    who = _who(parts[1][1])
    if lags:
        return (
            f" From seq {s} on, {who} called what the others called one seq later: "
            f"{who} skipped the collective the others made at seq {s}."
        )
    return f" From seq {s} on, {who} called one collective more than the others."


def final(pg: Any, deadline: float) -> Optional[CollectiveMismatchError]:
    """The last exchange of a group being destroyed: the calls since the last
    exchange point and how many calls this rank made, by ``deadline``
    (time.monotonic). Returns the disagreement found (on every rank), or
    None: also when the other ranks did not take part in time, or MPI failed
    it (then nothing is known). A group whose operation timed out on this
    rank takes no part: the others give up on it as soon as they read so in
    its progress record (pycoll.progress.gave_up), or else at their deadline.
    """
    broken = pg._broken
    if isinstance(broken, CollectiveMismatchError):
        return broken
    checker = pg._check
    if checker is None or checker.off or broken is not None:
        return None
    seq = pg._seq
    # A member whose operation on the group timed out never takes part: its
    # progress record says so (GAVE_UP), and a rank waiting here looks at the
    # others' records now and then to give up at once instead of at deadline.
    me = pg._ranks[pg._rank]
    gone = progress.peers_gave_up(pg._board, [r for r in pg._ranks if r != me], pg._uid)

    def wait(request: Any) -> None:
        if not progress.wait_unless(request, deadline, gone):
            raise _GaveUp

    with checker.lock:
        try:
            _collect(pg, checker)
            while len(checker.pending) >= PENDING:
                _wait_oldest(pg, checker, wait)
            # A one-off all-gather, not the pool's persistent one: the others may
            # never come, and MPICH crashed in MPI_Finalize on a persistent
            # collective left active.
            last = _Slot(len(pg._keys))
            last.persistent = False
            last.mine[0], last.mine[1] = seq, seq % len(pg._keys) + 1
            last.mine[2:] = np.asarray(pg._keys)
            last.start(checker.comm)
            checker.pending.append(last)
            while checker.pending:
                _wait_oldest(pg, checker, wait)
        except CollectiveMismatchError as error:
            _abandon(checker)
            return error
        except (_GaveUp, _mpi.MPI.Exception):
            _abandon(checker)
    return None


class _GaveUp(Exception):
    pass


def _abandon(checker: Checker) -> None:
    """Keep the requests and buffers of unfinished exchanges alive for good."""
    held: List[Any] = []
    for slot in checker.pending:
        held += [slot.mine, slot.everyone, slot.request]
    progress.keep_alive(held)
    checker.abandoned = checker.abandoned or bool(held)
    checker.pending.clear()
    checker.off = True


def switch_off(pg: Any) -> None:
    """No more exchanges on ``pg`` (its calls still store their keys): for
    pycoll-bench's comparison of the check on and off in one run."""
    if pg._check is not None:
        pg._check.off = True


def free(pg: Any) -> bool:
    """Let go of a destroyed group's exchanges: unfinished ones are kept alive
    for good, the persistent requests of the others freed. Returns whether
    the side communicator may be freed (pycoll.world): not while an exchange
    abandoned on it may still run (MPICH was seen to crash in MPI_Finalize
    on a persistent all-gather left active on a freed communicator)."""
    checker = pg._check
    if checker is None:
        return True
    active = list(checker.pending)
    if active:
        _abandon(checker)
    for slot in checker.pool:
        if slot.persistent and slot.request is not None and slot not in active:
            slot.request.Free()
            slot.request = None
    if checker.abandoned:
        progress.keep_alive([pg._side])
    return not checker.abandoned
