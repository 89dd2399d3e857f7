"""The progress board: the side channel that turns a hang into a diagnosis.

Every rank publishes, in memory exposed to the others through an MPI
one-sided window over the default group, how far it has got on each group it
uses: the sequence number of the last collective it started there, which
operation it was, and whether it is still in progress. When an operation
times out, the rank that timed out reads its peers' records with MPI_Rget,
which needs nothing from the rank being read: it works while that rank
computes, sleeps, waits in another MPI call, or has exited (on one node the
window is shared memory that outlives the process's use of it).

The writer side is three stores into local memory per collective; nothing is
sent until a diagnosis is needed.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import socket
import sys
import threading
import time
import weakref
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _mpi

# Operation names as stored in the records. The order is part of the format:
# every rank must agree on it, so add names at the end only.
OPS = (
    "?",
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "scatter",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "gather",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send",
    "recv",
    "send_object_list",
    "recv_object_list",
    "fused_all_reduce",
    "trace_start",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
)
CODE = {name: i for i, name in enumerate(OPS)}

# Groups a rank can be followed on at once. A destroyed group's slot is free
# again; with every slot held by a live group, a new group takes the oldest
# one but the default group's, and the group it was taken from writes to
# SINK from then on (a word no diagnosis reads), so neither reads the other's.
SLOTS = 64
# BEAT counts up while this rank waits in pycoll (slowly: a waiting rank
# bumps it every few milliseconds, the blocking-mode watchdog every tick), so
# a reader can tell a rank that waits inside an operation from one that is
# stopped, or stuck in code outside pycoll's waits.
# EVICTED counts the slots this rank took from live groups (see SLOTS), and
# the LOST_KEPT words from LOST hold the ids of the last such groups (a ring):
# a group missing from a record is "not reached" there unless it is one of them.
# LEFT is set once this rank's teardown left the board to MPI_Finalize
# without the others (its MPI state is unknown: see Board.close).
PID, HOST, LAST, BEAT, EVICTED, LEFT = 0, 1, 2, 3, 4, 5
LOST, LOST_KEPT = 6, 16
HEADER = LOST + LOST_KEPT
SINK = HEADER + 2 * SLOTS
WORDS = SINK + 1
BUSY = 1
GAVE_UP = 0x80  # the operation timed out on this rank (bits 1-6 are the op code)
OP_MASK = 0x3F
# An operation's low byte while it runs: pack(seq, op, True) is seq << 8 | BUSY_CODE[op].
BUSY_CODE = {name: code << 1 | BUSY for name, code in CODE.items()}
# A rank's line where its record lost the group's slot to a later group.
UNFOLLOWED = (
    f"its progress record no longer follows this group (a later group took its slot: "
    f"more than {SLOTS} groups alive on that rank), so what it does there is unknown"
)
READ_TIMEOUT = 2.0  # seconds to wait for one peer's record
READ_AT_ONCE = 64  # records read side by side (a thread each) by Board.read_all
# How long a diagnosis watches the heartbeats of ranks that started the
# operation: longer than the blocking-mode watchdog's tick (watch.py).
BEAT_WATCH_S = 0.6
EXIT_WAIT = 5.0  # at exit, seconds to wait for the other ranks to free the board
# While a rank waits in teardown for ranks that may never come (the board's
# votes, a group's last call check, its window's free), how often it reads
# their records to see whether one left or gave up (and will not come).
LOOK_S = 0.05


def uid_of(name: str) -> int:
    """A group's identity on the board, the same on every member (names are)."""
    return zlib.crc32(name.encode()) << 31 | zlib.adler32(name.encode()) >> 1 | 1


def pack(seq: int, op: str, busy: bool) -> int:
    return seq << 8 | CODE.get(op, 0) << 1 | (BUSY if busy else 0)


def _host_id() -> int:
    return zlib.crc32(socket.gethostname().encode())


class Board:
    """This rank's record, and read access to every other rank's.

    Attributes:
        rec: this rank's record as a writeable memoryview of int64 words:
            pid, host id, the word index of the last operation started, then
            per group slot its id and ``seq << 8 | op code << 1 | busy``.
        hosts: every rank's host name where the ranks run on more than one
            host, else empty (a diagnosis then names no host).
    """

    def __init__(self, comm: Any, timeout: float) -> None:
        MPI = _mpi.MPI
        self.comm = comm.Dup()  # for the window and for agreeing to free it
        self.timeout = timeout
        self.win = MPI.Win.Allocate(WORDS * 8, 8, comm=self.comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.rec = memoryview(self.win.tomemory()).cast("B").cast("q")
        for i in range(WORDS):
            self.rec[i] = 0
        self.rec[PID] = os.getpid()
        self.rec[HOST] = _host_id()
        # Every rank's host name, to name the node in a diagnosis (a rank on
        # another node that cannot be read says nothing of where it runs).
        hosts = self.comm.allgather(socket.gethostname())
        self.hosts: List[str] = hosts if len(set(hosts)) > 1 else []
        # The slots claimed, oldest first, each with its group (weakly: its
        # word is moved to SINK if the slot is taken from it); the first
        # claim's (the default group's) is never taken.
        self._claims: List[Tuple[int, Any]] = []
        self.closed = False
        # Set once an operation timed out on this rank, or the call check
        # found a group's ranks disagreeing (pycoll.crosscheck): what happened,
        # for the line teardown prints when it then leaves the window (close).
        self.abandoned = ""
        atexit.register(self._end_epoch)

    def _end_epoch(self) -> None:
        """At exit without destroy_process_group: free the window if every
        rank gets here within a few seconds (MPICH's UCX layer warns about a
        window left to MPI_Finalize), else leave it."""
        self.close(EXIT_WAIT)

    def claim(self, uid: int, group: Any = None) -> int:
        """A slot for a new group (``group``: the object whose ``_word`` it
        sets, moved to SINK should the slot be taken from it); returns the
        index of its state word."""
        rec = self.rec
        for i in range(SLOTS):  # forget an earlier group of the same name
            if rec[HEADER + 2 * i] == uid:
                rec[HEADER + 2 * i] = 0
                self.release(HEADER + 2 * i + 1)
        held = {i for i, _ in self._claims}
        free = [i for i in range(SLOTS) if i not in held]
        if free:  # one never used, else a destroyed group's
            i = next((j for j in free if not rec[HEADER + 2 * j]), free[0])
        else:  # every slot a live group's: the oldest but the default group's
            i, owner = self._claims.pop(1)
            taken = owner() if owner is not None else None
            if taken is not None:
                taken._word = SINK
            rec[LOST + rec[EVICTED] % LOST_KEPT] = rec[HEADER + 2 * i]
            rec[EVICTED] += 1
        self._claims.append((i, weakref.ref(group) if group is not None else None))
        rec[HEADER + 2 * i] = uid
        rec[HEADER + 2 * i + 1] = 0
        return HEADER + 2 * i + 1

    def release(self, word: int) -> None:
        """Let a later group take the slot whose state word is ``word`` (its
        group is destroyed). What it holds stays readable until then: a
        rank that destroyed a group while others still wait in it is still
        seen where it left it."""
        i = (word - HEADER - 1) // 2
        if word != SINK and 0 <= i < SLOTS:
            self._claims = [(j, owner) for j, owner in self._claims if j != i]

    def read(self, rank: int, timeout: float = READ_TIMEOUT) -> Optional[np.ndarray]:
        """Rank ``rank``'s record (its default-group rank), or None if it
        cannot be read within ``timeout`` seconds (see :meth:`read_all`)."""
        return self.read_all([rank], timeout)[0]

    def read_all(
        self, ranks: List[int], timeout: float = READ_TIMEOUT, deadline: Optional[float] = None
    ) -> List[Optional[np.ndarray]]:
        """The records of ``ranks`` (default-group ranks), None for each that
        cannot be read within ``timeout`` seconds (or by ``deadline``,
        time.monotonic, where given and sooner); read side by side, so the
        ranks of a node cut off cost one timeout, not one each.

        Each read runs on a thread of its own, and this waits for them at most
        ``timeout``: across hosts over TCP, with no hardware RMA, MPI_Rget
        itself can block until the target makes progress (Open MPI was seen
        to block in it for good on a rank cut off from the network), so only
        a thread bounds it. A read that never returns leaves its thread
        parked (a daemon) and its buffer alive. At most READ_AT_ONCE at a time,
        each batch within ``timeout`` and by ``deadline``."""
        found: List[Optional[np.ndarray]] = []
        for first in range(0, len(ranks), READ_AT_ONCE):
            batch = ranks[first : first + READ_AT_ONCE]
            left = timeout
            if deadline is not None:
                left = min(timeout, max(0.0, deadline - time.monotonic()))
            outs = [np.zeros(WORDS, np.int64) for _ in batch]
            gots: List[List[bool]] = [[] for _ in batch]
            readers = [
                threading.Thread(
                    target=self._read_into,
                    args=(rank, out, left, got),
                    daemon=True,
                    name=f"pycoll-board-read-{rank}",
                )  # fmt: skip
                for rank, out, got in zip(batch, outs, gots)
            ]
            for reader in readers:
                reader.start()
            end = time.monotonic() + left + 0.5
            for reader, out, got in zip(readers, outs, gots):
                reader.join(max(0.0, end - time.monotonic()))
                if reader.is_alive() or not got or not got[0]:
                    keep_alive([out])  # MPI may still write into it
                    found.append(None)
                else:
                    found.append(out)
        return found

    def _read_into(self, rank: int, out: np.ndarray, timeout: float, got: List[bool]) -> None:
        MPI = _mpi.MPI
        try:
            req = self.win.Rget([out, MPI.INT64_T], rank, (0, WORDS, MPI.INT64_T))
            end = time.monotonic() + timeout
            while not req.Test():
                if time.monotonic() > end:
                    keep_alive([req, out])
                    got.append(False)
                    return
                time.sleep(1e-4)
        except MPI.Exception:
            got.append(False)
            return
        got.append(True)

    def close(self, timeout: Optional[float] = None) -> None:
        """Free the window, which is collective over the default group, only
        where every rank is known to free it too; otherwise leave it to
        MPI_Finalize. Never waits longer than ``timeout`` seconds per round
        (default: the default group's timeout).

        MPI_Win_free cannot be interrupted, so one rank freeing while another
        does not hangs the first for good. Two nonblocking rounds decide it:
        a MIN-reduction of every rank's vote, then, only where that came
        back 1, a barrier among the ranks that saw it. A rank that gives up
        in round one never enters round two, so the others give up there too
        instead of freeing a window it will not free.

        A rank whose operation timed out, or whose call check found the
        ranks disagreeing, makes no collective call here: its MPI state is
        unknown (MPICH was seen to crash in the vote's MPI_Iallreduce after
        mismatched broadcasts). It sets LEFT in its own record instead, a
        store into its own memory, and the others, while they wait for the
        votes, read their peers' records every LOOK_S and give up as soon as
        one says LEFT, instead of at their timeout.
        """
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._end_epoch)
        limit = self.timeout if timeout is None else timeout
        if self.abandoned:  # no vote: leave word in the record, and wait for nobody
            self.rec[LEFT] = 1
            self.win.Unlock_all()
            sys.stderr.write(
                f"pycoll: rank {self.comm.Get_rank()}: {self.abandoned} on this rank, "
                f"so MPI's state is unknown: teardown leaves pycoll's communicators and "
                f"window to MPI_Finalize instead of waiting on the other ranks\n"
            )
            sys.stderr.flush()
            return
        vote = np.ones(1, np.int32)
        agreed = np.zeros(1, np.int32)
        votes = self.comm.Iallreduce(vote, agreed, op=_mpi.MPI.MIN)
        if not self._votes_in(votes, limit) or not agreed[0]:
            keep_alive([votes, vote, agreed])
            self.win.Unlock_all()
            return
        barrier = self.comm.Ibarrier()
        if not _complete(barrier, limit):
            keep_alive([barrier])
            self.win.Unlock_all()
            return
        self.win.Unlock_all()
        self.rec.release()
        self.win.Free()
        self.comm.Free()

    def _votes_in(self, votes: Any, timeout: float) -> bool:
        """Poll the votes for at most ``timeout`` seconds; False at once when a
        peer's record says it left without voting (LEFT)."""
        me = self.comm.Get_rank()
        others = [r for r in range(self.comm.Get_size()) if r != me]

        def left(deadline: float) -> bool:
            found = self.read_all(others, deadline=deadline)
            return any(rec is not None and rec[LEFT] for rec in found)

        return wait_unless(votes, time.monotonic() + timeout, left)


def _complete(request: Any, timeout: float) -> bool:
    """Poll ``request`` for at most ``timeout`` seconds; True once it completed."""
    return wait_unless(request, time.monotonic() + timeout, None)


def wait_unless(request: Any, deadline: float, gone: Optional[Callable[[float], bool]]) -> bool:
    """Poll ``request`` (a teardown's exchange with ranks that may never come)
    until ``deadline`` (time.monotonic); True once it completed. False at the
    deadline, or as soon as ``gone(deadline)`` says a peer will not come (it
    reads their records: every LOOK_S, at most a tenth of the wait)."""
    look = time.monotonic() + LOOK_S
    while not request.Test():
        now = time.monotonic()
        if now > deadline:
            return False
        if gone is not None and now > look:
            if gone(deadline):
                return False
            done = time.monotonic()
            look = done + max(LOOK_S, 9 * (done - now))
        time.sleep(1e-4)
    return True


def peers_gave_up(board: Optional[Board], ranks: List[int], uid: int) -> Callable[[float], bool]:
    """For :func:`wait_unless`: whether an operation on group ``uid`` timed out
    on one of ``ranks`` (:func:`gave_up`), read from ``board`` while it is open."""

    def gone(deadline: float) -> bool:
        return board is not None and not board.closed and gave_up(board, ranks, uid, deadline)

    return gone


def keep_alive(objects: List[Any]) -> None:
    """Keep abandoned MPI requests (and the buffers they hold) alive for good.

    An operation that timed out may still be written to by MPI, even inside
    MPI_Finalize, which mpi4py calls after the interpreter has freed its
    objects: Open MPI was seen to crash there on a freed receive buffer. A
    reference that is never given back keeps the memory valid to the end.
    """
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def gave_up(board: Board, ranks: List[int], uid: int, deadline: float) -> bool:
    """Whether an operation on the group ``uid`` timed out on one of ``ranks``
    (its record has GAVE_UP in the group's word). Such a rank's group is
    broken, and it takes no part in the group's last call check
    (pycoll.crosscheck.final): the others need not wait for it. A record not
    read by ``deadline`` (time.monotonic), or no longer following the group,
    says nothing."""
    for rec in board.read_all(ranks, deadline=deadline):
        if rec is None:
            continue
        word = _word_of(rec, uid)
        if word >= 0 and word & GAVE_UP:
            return True
    return False


def _op_of(word: int) -> str:
    code = (word >> 1) & OP_MASK
    return OPS[code] if code < len(OPS) else "?"


def describe(
    ranks: List[int], uid: int, seq: int, op: str, board: Board, names: Dict[int, str]
) -> Any:
    """What each member of a group is doing, for a timeout of ``op`` at ``seq``.

    Returns (missing, other_op, stalled, text): the global ranks that have not
    started the operation at ``seq`` on the group; those that called another
    collective at that sequence number; those that started it but are not
    progressing in it (stopped, or stuck outside pycoll's waits: their
    heartbeat stood still for BEAT_WATCH_S); and one line per rank saying
    what it last started.
    """
    missing: List[int] = []
    other_op: Dict[int, str] = {}
    started: Dict[int, int] = {}  # rank -> its heartbeat, for those waiting at seq
    lines: Dict[int, str] = {}
    here = _host_id()
    for rank, rec in zip(ranks, board.read_all(ranks)):
        who = f"rank {rank} on {board.hosts[rank]}" if board.hosts else f"rank {rank}"
        if rec is None:
            missing.append(rank)
            lines[rank] = f"{who}: its progress record could not be read (no answer)"
            continue
        word_here = _word_of(rec, uid)
        if word_here < 0:
            if uid in rec[LOST : LOST + LOST_KEPT]:  # its slot was taken: where it is, unknown
                lines[rank] = f"{who}: {UNFOLLOWED}"
                continue
            word_here = 0  # it has not made the group yet
        reached = word_here >> 8
        status = "reached it" if reached >= seq else f"has not reached it (at seq {reached})"
        if reached < seq:
            missing.append(rank)
        elif reached == seq:
            if _op_of(word_here) not in (op, "?"):
                other_op[rank] = _op_of(word_here)
                status += f" but called {_op_of(word_here)} there, not {op}"
            elif word_here & GAVE_UP:
                status += " and timed out in it too"
            elif word_here & BUSY:
                started[rank] = int(rec[BEAT])
        last = int(rec[LAST])
        if last:
            word = int(rec[last])
            where = names.get(int(rec[last - 1]), "another group")
            state = "still in progress" if word & BUSY else "completed"
            status += f"; last started {_op_of(word)} (seq {word >> 8}) on {where}, {state}"
        else:
            status += "; has started no collective"
        if int(rec[HOST]) == here and rec[PID] and not _alive(int(rec[PID])):
            status += f"; its process (pid {int(rec[PID])}) has exited"
        lines[rank] = f"{who}: {status}"
    stalled: List[int] = []
    if started and not missing and not other_op:
        time.sleep(BEAT_WATCH_S)
        for (rank, beat), rec in zip(started.items(), board.read_all(list(started))):
            if rec is None or int(rec[BEAT]) != beat:
                continue  # waiting, or it has just moved on
            if _waiting_at(rec, uid, seq):
                stalled.append(rank)
                lines[rank] = lines[rank].replace(
                    "reached it",
                    f"reached it but is not progressing in it (no heartbeat for "
                    f"{BEAT_WATCH_S:g} s: stopped, or stuck outside pycoll's waits)",
                    1,
                )
    return missing, sorted(other_op), stalled, [lines[r] for r in ranks]


def hosts_of(board: Board, ranks: List[int]) -> str:
    """`` on node2`` (or `` on node2,node3``): where ``ranks`` run, when the
    job spans hosts; else nothing."""
    if not board.hosts:
        return ""
    return " on " + ",".join(dict.fromkeys(board.hosts[r] for r in ranks))


def _word_of(rec: np.ndarray, uid: int) -> int:
    """The state word of group ``uid`` in a record, or -1 where it follows no
    such group (a slot holds one group: Board.claim forgets a same-named one)."""
    for i in range(SLOTS):
        if rec[HEADER + 2 * i] == uid:
            return int(rec[HEADER + 2 * i + 1])
    return -1


def _waiting_at(rec: np.ndarray, uid: int, seq: int) -> bool:
    word = _word_of(rec, uid)
    return word >= 0 and word >> 8 == seq and bool(word & BUSY) and not word & GAVE_UP


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
