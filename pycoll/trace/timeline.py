"""The timeline: every rank's operations as a Chrome trace / Perfetto JSON.

``PYCOLL_TRACE=DIR`` (read by init_process_group) or ``pycoll.trace(DIR)``
records every collective, point-to-point operation and RPC call this rank
completes, from the flight recorder's entries (pycoll.trace.recorder), and
writes ``DIR/trace-rank<r>.json`` when it stops (the block's end,
destroy_process_group, or exit). ``pycoll-run --trace DIR`` (or ``python -m
pycoll.trace merge DIR``) merges the ranks' files into ``DIR/trace.json``,
one track per rank and group, with each collective's wait for the last rank
to arrive.

Clocks: starting is collective over the default group. Rank 0 measures every
other host's clock against its own, once per host (ranks of one host share
its clock): each rank answers a few pings, over a duplicate of the default
communicator, and the host's offset is the one seen in the round trip of
the fewest microseconds among its ranks; rank 0's own host has offset 0.
Every rank writes its times on rank 0's clock, so the files line up, and
writes its host, offset and that round trip (the offset's error is at most
half of it), which ``python -m pycoll.trace summarize`` shows per host.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import _mpi, arrays, crosscheck, debug, watch
from ..collectives._common import sequenced
from ..groups import STATE, not_initialized
from . import recorder

ENV = "PYCOLL_TRACE"
PINGS = 8  # round trips per rank when measuring clocks
TAG = 0  # (on a communicator of its own)
_ITEMSIZE = {d.name: d.itemsize for d in arrays.SUPPORTED_DTYPES}

_state: Dict[str, Any] = {"dir": None, "offset": 0.0, "origin": 0.0, "rtt": 0.0}


def is_tracing() -> bool:
    return recorder.TRACING


OP = "trace_start"  # a collective of the default group (pycoll.progress.OPS)


def _problem(pg: Any, directory: str) -> Optional[str]:
    """Why this rank cannot start recording, or None (an empty ``directory``
    is refused by :func:`start` with a ValueError)."""
    if recorder.TRACING:
        return f"a timeline is being recorded already (into {_state['dir']}); stop it first"
    if not directory:
        return "give the directory the timeline goes into"
    if not recorder.records(pg):
        return (
            f"the timeline is made from the flight recorder, which {recorder.RECORDS_ENV}=0 "
            "turned off; unset it to trace"
        )
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        return f"the directory {directory!r} cannot be made: {exc}"
    return None


def _measure(pg: Any, seq: int, comm: Any) -> Tuple[float, float, float]:
    """(this host's clock minus rank 0's, rank 0's clock at the start, the
    round trip the offset was measured in): rank 0 pings each rank, keeping,
    per host, the offset seen in the shortest round trip among its ranks.
    Every wait is bounded by the group's timeout (pycoll.watch)."""
    MPI = _mpi.MPI
    me, size = comm.Get_rank(), comm.Get_size()
    clock = recorder.clock
    buf = np.zeros(3)

    def exchange(send_to: Optional[int], recv_from: Optional[int]) -> None:
        requests = []
        if recv_from is not None:
            requests.append(comm.Irecv([buf, MPI.DOUBLE], recv_from, TAG))
        if send_to is not None:
            requests.append(comm.Isend([buf, MPI.DOUBLE], send_to, TAG))
        watch.wait(pg, OP, seq, requests)

    here = float(_host_id())
    if me == 0:
        hosts = [here] * size
        best = {here: (0.0, 0.0)}  # host -> (round trip, offset): rank 0's host is the clock
        for peer in range(1, size):
            for _ in range(PINGS):
                t0 = clock()
                exchange(peer, None)
                exchange(None, peer)
                t1 = clock()
                hosts[peer] = host = float(buf[1])
                if host not in best or t1 - t0 < best[host][0]:
                    best[host] = (t1 - t0, buf[0] - (t0 + t1) / 2)
        origin = clock()
        for peer in range(1, size):
            rtt, offset = best[hosts[peer]]
            buf[:] = offset, origin, rtt
            exchange(peer, None)
        return 0.0, origin, 0.0
    for _ in range(PINGS):
        exchange(None, 0)
        buf[:2] = clock(), here
        exchange(0, None)
    exchange(None, 0)
    return float(buf[0]), float(buf[1]), float(buf[2])


def _host_id() -> int:
    """This host's name as a number (exact in a double), the same on its ranks."""
    return zlib.crc32(socket.gethostname().encode())


def start(directory: str) -> None:
    """Start recording this rank's timeline into ``directory``.

    Collective over the default group (every rank calls it; it counts in its
    sequence number): the ranks first agree that each can start, then rank 0
    measures the others' clocks against its own. Every wait is bounded by the
    group's timeout.

    Raises:
        RuntimeError: pycoll is not initialized; or on every rank, when a
            rank cannot start (a timeline is being recorded already, the
            flight recorder is off, the directory cannot be made): the
            message names the ranks and this rank's reason.
        ValueError: instead, on a rank given no directory.
        pycoll.DistTimeoutError: a rank did not call it within the timeout.
    """
    pg = STATE.default
    if pg is None:
        raise not_initialized("pycoll.trace.start")
    problem = _problem(pg, directory)
    with sequenced(pg, OP, None) as seq:  # counted: a timeout names who never came
        offset, origin, rtt = _agree_and_measure(pg, seq, directory, problem)
    _state.update(dir=directory, offset=offset, origin=origin, rtt=rtt)
    del recorder.EVENTS[:]
    recorder.TRACING = True
    debug.set_tracing(True)  # synchronous calls take the path that times them


def _agree_and_measure(
    pg: Any, seq: int, directory: str, problem: Optional[str]
) -> Tuple[float, float, float]:
    """Every rank learns whether any cannot start (and raises if one cannot);
    then the clocks are measured. On a communicator of its own."""
    comm, request = pg.comm.Idup()  # no message of pycoll's can match these
    watch.wait(pg, OP, seq, [request])
    try:
        refused = np.zeros(comm.Get_size(), np.int8)
        mine = np.array([problem is not None], np.int8)
        watch.wait(
            pg, OP, seq, [comm.Iallgather([mine, _mpi.MPI.INT8_T], [refused, _mpi.MPI.INT8_T])]
        )
        if refused.any():
            members = pg.ranks
            ranks = ",".join(str(members[r]) for r in np.flatnonzero(refused))
            why = f"; here: {problem}" if problem else ""
            kind = ValueError if problem is not None and not directory else RuntimeError
            raise kind(
                f"pycoll.trace.start: rank(s) {ranks} could not start recording, so no rank "
                f"did{why}"
            )
        return _measure(pg, seq, comm)
    finally:
        if not pg.is_broken():  # (after a timeout its requests may still be in use)
            comm.Free()


def stop() -> Optional[str]:
    """Stop recording and write this rank's file; its path (None if no
    timeline was being recorded). Not collective."""
    if not recorder.TRACING:
        return None
    recorder.TRACING = False
    debug.set_tracing(False)
    events, recorder.EVENTS[:] = list(recorder.EVENTS), []
    path = os.path.join(_state["dir"], f"trace-rank{recorder.RANK}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(chrome_trace(events), f)
    os.replace(path + ".tmp", path)
    return path


@contextlib.contextmanager
def tracing(directory: str) -> Iterator[None]:
    """Record the timeline while the block runs (collective: every rank enters it)."""
    start(directory)
    try:
        yield
    finally:
        stop()


def add(name: str, category: str, began: float, ended: float, **args: Any) -> None:
    """A span that is not a group's operation (an RPC, a staged GPU copy):
    an entry like the recorder's, whose group field holds the category (its
    track) and which carries its other ``args`` after the usual fields."""
    if recorder.TRACING:
        peer, nbytes = args.pop("peer", None), args.pop("nbytes", None)
        entry = [None, name, 0, peer, nbytes, began, ended, recorder.COMPLETED, category, args]
        recorder.EVENTS.append(entry)


class span:
    """``with span("copy to host", "gpu", nbytes):`` puts the block on the
    timeline while one is being recorded (else it costs a flag test)."""

    __slots__ = ("name", "category", "nbytes", "began")

    def __init__(self, name: str, category: str, nbytes: Optional[int] = None) -> None:
        self.name, self.category, self.nbytes = name, category, nbytes

    def __enter__(self) -> None:
        self.began = recorder.clock() if recorder.TRACING else 0.0

    def __exit__(self, *exc: Any) -> None:
        if self.began:
            add(self.name, self.category, self.began, recorder.clock(), nbytes=self.nbytes)


def _bytes(entry: List[Any]) -> Optional[int]:
    """The entry's bytes: as recorded, else from its key (dtype and count)."""
    if entry[recorder.NBYTES] is not None:
        return int(entry[recorder.NBYTES])
    key = entry[recorder.KEY]
    dtype, count = crosscheck.dtype_and_count(key)
    itemsize = _ITEMSIZE.get(dtype or "")
    return count * itemsize if itemsize and count else None


def chrome_trace(entries: List[List[Any]]) -> Dict[str, Any]:
    """This rank's events in the Chrome trace format (times in us on rank 0's clock)."""
    rank = recorder.RANK
    base = _state["offset"] + _state["origin"]
    tracks: Dict[str, int] = {}
    events: List[Dict[str, Any]] = []
    for e in entries:
        group = e[recorder.GROUP]
        if isinstance(group, str):  # add(): a category, not a group
            track, category, extra = group, group, dict(e[9]) if len(e) > 9 else {}
        else:
            category = "p2p" if e[recorder.SEQ] is None else "collective"
            track, extra = group.group_desc, {}
            extra["group"] = group.group_name
            if e[recorder.KEY]:
                extra["call"] = crosscheck.describe(e[recorder.KEY], group.ranks)
            extra["path"] = e[recorder.PATH]  # (None for a point-to-point one: left out)
        tid = tracks.setdefault(track, len(tracks))
        nbytes = _bytes(e) if not isinstance(group, str) else e[recorder.NBYTES]
        args = {"seq": e[recorder.SEQ], "bytes": nbytes, "peer": e[recorder.PEER],
                "state": recorder.STATES[e[recorder.STATE]], **extra}  # fmt: skip
        events.append(
            {
                "name": e[recorder.OP],
                "cat": category,
                "ph": "X",
                "pid": rank,
                "tid": tid,
                "ts": round((e[recorder.ISSUED] - base) * 1e6, 3),
                "dur": round((e[recorder.ENDED] - e[recorder.ISSUED]) * 1e6, 3),
                "args": {k: v for k, v in args.items() if v is not None},
            }
        )
    host = socket.gethostname()
    meta = [
        {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} ({host})"}}
    ]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": track}}
        for track, tid in tracks.items()
    ]
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "pycoll": {
                "rank": rank,
                "job": recorder.JOB,
                "host": host,
                "clock_offset_s": _state["offset"],
                "clock_rtt_s": _state["rtt"],
            }
        },
    }
