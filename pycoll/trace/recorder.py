"""The flight recorder: the last operations of every group, always on.

Each group keeps a ring of its last N operations (``pg._flight``, a deque of
``PYCOLL_FLIGHT_RECORDS`` entries, default 1024; 0 turns the recorder off):
collectives and point-to-point operations in issue order. An entry is

    [seq, op, key, peer, nbytes, issued, ended, state, group, path]

(``key`` is the call check's summary of the call: pycoll.crosscheck.describe
turns it into ``all_reduce(SUM, float32, 6 elements)``; ``issued``/``ended``
are time.monotonic() seconds; ``path`` the algorithm the call took,
pycoll.paths's name for it, ``"mpi"`` for MPI's own call, where the call
went through :func:`issue`: always while a timeline is recorded, None on the
fast paths), made by :func:`issue` and closed by
:func:`complete`; or, on the synchronous fast path
(collectives._common.plain), where every nanosecond counts, just its key:
one append of an object that exists already, no clock. Its seq is found by
counting back (each collective appends one entry, in seq order, and the
full entries carry theirs). Such an entry is complete once a later
collective was issued on the group, or the progress board says it ended; the
one still running is timed by its wait (``pg._fwait``, set once a wait grows
long) and marked when it times out. A send or receive done at its first
test (``send``/``recv``, and ``isend``/``irecv`` whose Work comes back
complete) is recorded once done as a tuple ``(op, peer, nbytes)``, complete
and untimed (:func:`p2p_done`; pycoll.collectives.p2p).

The record is dumped, as a readable report and as JSON, one file pair per
rank (:func:`dump`): when an operation times out (beside the diagnosis), on
SIGUSR1, at pycoll-run ``--timeout``, and by ``pycoll.dump_flight_record()``.
``python -m pycoll.trace flight DIR`` reads every rank's dump and says which
rank is behind, on which group, at which sequence number, doing what.

While a timeline is being recorded (pycoll.trace.timeline), each completed
entry is also kept in :data:`EVENTS`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from typing import Any, Dict, List, Optional, Tuple

from .. import _env, crosscheck, progress

RECORDS_ENV = "PYCOLL_FLIGHT_RECORDS"
DIR_ENV = "PYCOLL_FLIGHT_DIR"
STACKS_FD_ENV = "PYCOLL_STACKS_FD"  # set by pycoll-run's boot: where its stack dumps go
# Kept per group by default. The cost per call grows with it (the ring and the
# keys it keeps crowd the caches): on the 8-byte all_reduce at 2 ranks, +0.05 us
# at 512, +0.15 us at 1024, +0.29 us at 2048 (docs/benchmarks.md, "Timeline and
# flight recorder").
DEFAULT_RECORDS = 1024

# An entry's fields.
SEQ, OP, KEY, PEER, NBYTES, ISSUED, ENDED, STATE, GROUP, PATH = range(10)
# Its states (an operation starts when it is issued: pycoll hands it to MPI then).
STARTED, COMPLETED, TIMED_OUT, FAILED = range(4)
STATES = ("started", "completed", "timed out", "failed")

clock = time.monotonic
TRACING = False  # a timeline is being recorded: completed entries go to EVENTS
EVENTS: List[List[Any]] = []
JOB = ""  # this job's id, the same on every rank (set by init_process_group)
RANK = 0  # this process's global rank (set by init_process_group)

_groups: weakref.WeakSet[Any] = weakref.WeakSet()  # every group with a ring
# Re-entrant: the SIGUSR1 handler runs in the main thread, maybe during a dump there.
_dump_lock = threading.RLock()


def records_from_env() -> int:
    """PYCOLL_FLIGHT_RECORDS: entries kept per group (0: off); default 1024.

    Raises:
        ValueError: the value is not a whole number of entries, 0 or more.
    """
    return _env.number(
        RECORDS_ENV, int, DEFAULT_RECORDS, lambda v: v >= 0,
        f"the number of operations the flight recorder keeps per group "
        f"(e.g. {RECORDS_ENV}=4096), or 0 to turn it off",
    )  # fmt: skip


def attach(pg: Any) -> None:
    """Give a new group its ring (``pg._flight``; None with the recorder off)."""
    n = records_from_env()
    pg._flight = deque(maxlen=n) if n else None
    pg._fwait = None
    if n:
        _groups.add(pg)


def records(pg: Any) -> bool:
    """Whether ``pg`` keeps a flight record (the recorder is not off)."""
    return pg._flight is not None


def issue(
    pg: Any,
    op: str,
    seq: Optional[int],
    key: int = 0,
    peer: Optional[int] = None,
    nbytes: Optional[int] = None,
    arrived: Optional[float] = None,
    path: Optional[str] = None,
) -> Optional[List[Any]]:
    """Record an operation issued on ``pg``; its entry (None with the recorder off).
    ``arrived``: when the call began, if before now (a DETAIL check ran first);
    ``path``: the algorithm a collective takes (None: a point-to-point one)."""
    ring = pg._flight
    if ring is None:
        return None
    entry = [seq, op, key, peer, nbytes, arrived or clock(), None, STARTED, pg, path]
    ring.append(entry)
    return entry


def complete(entry: Optional[List[Any]], state: int = COMPLETED) -> None:
    """Record that ``entry``'s operation ended (completed, timed out, failed);
    its first end stands (a timeout, then the error it raises through the call)."""
    if entry is not None and entry[ENDED] is None:
        entry[ENDED] = clock()
        entry[STATE] = state
        if TRACING:
            EVENTS.append(entry)


def _full(pg: Any, seq: int, key: int) -> List[Any]:
    """A fast-path entry (its key, at ``seq``) as a full one: complete unless
    it is the group's latest and its progress record says it still runs;
    started when its wait began, if that grew long."""
    state, issued = COMPLETED, None
    if seq == pg._seq:
        rec = pg._rec
        word = rec[pg._word] if rec is not None else None
        if word is None or (word >> 8 == seq and word & progress.BUSY):
            state = STARTED
        wait = pg._fwait
        if wait is not None and wait[0] == seq:
            issued = wait[1]
    return [seq, crosscheck.op_of(key), key, None, None, issued, None, state, pg, None]


def p2p_done(pg: Any, compact: Tuple[str, Optional[int], int]) -> List[Any]:
    """A send or receive recorded compact once done, ``(op, peer, nbytes)``,
    as a full entry: complete, untimed."""
    op, peer, nbytes = compact
    return [None, op, 0, peer, nbytes, None, None, COMPLETED, pg, None]


def _expanded(pg: Any, items: List[Any]) -> List[List[Any]]:
    """The ring's entries (a copy, oldest first) as full ones. A collective's
    fast-path entry's seq is found by counting back from the group's: each collective
    appends one entry, in seq order, and the full entries carry theirs."""
    out: List[List[Any]] = [[]] * len(items)
    expected = pg._seq
    for i in range(len(items) - 1, -1, -1):
        entry = items[i]
        if isinstance(entry, int):
            out[i] = _full(pg, expected, entry)
            expected -= 1
        elif isinstance(entry, tuple):
            out[i] = p2p_done(pg, entry)
        else:
            out[i] = entry
            if entry[SEQ] is not None:
                expected = entry[SEQ] - 1
    return out


def find(pg: Any, op: str, seq: Optional[int]) -> Optional[List[Any]]:
    """The latest entry of ``op`` at ``seq`` on ``pg`` not yet ended (for a
    point-to-point operation, seq None: the latest of that op), as a full
    entry (a fast-path one is replaced in the ring by its full form)."""
    ring = pg._flight
    if ring is None:
        return None
    items = list(ring)
    full = _expanded(pg, items)
    for i in range(len(items) - 1, -1, -1):
        entry = full[i]
        if entry[OP] == op and entry[SEQ] == seq and entry[ENDED] is None:
            if entry is not items[i]:
                try:
                    ring[i - len(items)] = entry  # from the end: older ones may have dropped
                except IndexError:
                    pass
            return entry
    return None


# -- dumps ----------------------------------------------------------------------------


def directory() -> str:
    """Where dumps go: PYCOLL_FLIGHT_DIR, else <tmp>/pycoll-flight."""
    return os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), "pycoll-flight")


def _entry_json(entry: List[Any], ranks: List[int], now: float) -> Dict[str, Any]:
    issued, ended = entry[ISSUED], entry[ENDED]
    return {
        "seq": entry[SEQ],
        "op": entry[OP],
        "call": crosscheck.describe(entry[KEY], ranks) if entry[KEY] else entry[OP],
        "peer": entry[PEER],
        "bytes": entry[NBYTES],
        "state": STATES[entry[STATE]],
        "path": entry[PATH],
        "issued_s_ago": None if issued is None else round(now - issued, 6),
        "duration_s": None if ended is None or issued is None else round(ended - issued, 6),
    }


def snapshot(reason: str = "") -> Dict[str, Any]:
    """This rank's flight record as a JSON-able dict."""
    now = clock()
    groups = []
    for pg in list(_groups):
        ring = pg._flight
        if ring is None or getattr(pg, "_destroyed", False):
            continue
        entries = _expanded(pg, list(ring))
        groups.append(
            {
                "name": pg.group_name,
                "desc": pg.group_desc,
                "ranks": list(pg._ranks),
                "seq": pg._seq,
                "kept": ring.maxlen,
                "broken": None if pg._broken is None else str(pg._broken).splitlines()[0],
                "entries": [_entry_json(e, pg._ranks, now) for e in entries],
            }
        )
    return {
        "format": "pycoll-flight-1",
        "job": JOB,
        "rank": RANK,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.time(),
        "reason": reason,
        "groups": groups,
    }


def report(record: Dict[str, Any], last: int = 20) -> str:
    """A rank's record as text: per group, its last ``last`` operations, newest first."""
    lines = [
        f"pycoll flight record of rank {record['rank']} (pid {record['pid']} on "
        f"{record['host']}, job {record['job']}), "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record['time']))}",
    ]
    if record["reason"]:
        lines.append(f"why: {record['reason']}")
    for group in record["groups"]:
        shown = group["entries"][-last:]
        lines.append(
            f"group {group['desc']!r} (ranks {_span(group['ranks'])}): seq {group['seq']}; "
            f"its last {len(shown)} operations, newest first"
            + (f"; broken: {group['broken']}" if group["broken"] else "")
        )
        for e in reversed(shown):
            seq = "p2p" if e["seq"] is None else f"seq {e['seq']}"
            peer = "" if e["peer"] is None else f" with rank {e['peer']}"
            ago = "" if e["issued_s_ago"] is None else f", issued {_seconds(e['issued_s_ago'])} ago"
            took = "" if e["duration_s"] is None else f", took {_seconds(e['duration_s'])}"
            lines.append(f"  {seq:>10}  {e['call']}{peer}: {e['state']}{ago}{took}")
    return "\n".join(lines) + "\n"


def _span(ranks: List[int]) -> str:
    if ranks == list(range(len(ranks))) and len(ranks) > 2:
        return f"0-{len(ranks) - 1}"
    return ",".join(map(str, ranks))


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def dump(reason: str = "", where: Optional[str] = None) -> str:
    """Write this rank's flight record (``flight-<job>-rank<r>.json`` and
    ``.txt``) into ``where`` (default: :func:`directory`); return the JSON's path."""
    folder = where or directory()
    with _dump_lock:
        os.makedirs(folder, exist_ok=True)
        record = snapshot(reason)
        base = os.path.join(folder, f"flight-{JOB or 'nojob'}-rank{RANK}")
        texts = {base + ".json": json.dumps(record, indent=1), base + ".txt": report(record)}
        for path, text in texts.items():
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)  # a reader never sees half a dump
    return base + ".json"


def dump_quietly(reason: str) -> Optional[str]:
    """:func:`dump`, for the error paths: a dump that fails is reported on
    stderr and never hides the error being raised."""
    try:
        return dump(reason)
    except Exception as exc:  # a full disk must not mask a timeout
        sys.stderr.write(f"pycoll: the flight record could not be written: {exc!r}\n")
        return None


# -- SIGUSR1 ----------------------------------------------------------------------------


def _on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001 (a signal handler's signature)
    path = dump_quietly(f"signal {signal.Signals(signum).name} (a request for a dump)")
    if path is not None:
        sys.stderr.write(f"pycoll: rank {RANK}: flight record written to {path}\n")
        sys.stderr.flush()


def install_signal() -> bool:
    """Dump the flight record on SIGUSR1, unless the program handles that
    signal itself. Under pycoll-run, whose boot prints every thread's stack
    on SIGUSR1 (faulthandler), the stacks still come first: faulthandler is
    registered again, chained to this handler. Returns whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return False
    pid, _, fd = os.environ.get(STACKS_FD_ENV, "").partition(":")
    stacks = int(fd) if pid == str(os.getpid()) and fd.isdigit() else None  # boot's own process
    if stacks is not None:
        faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, _on_signal)
    if stacks is not None:
        try:
            faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=True)
        except (OSError, ValueError):
            pass
    return True
