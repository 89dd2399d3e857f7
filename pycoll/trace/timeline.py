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
other rank's clock against its own (the round trip of the fewest
microseconds out of several, over a duplicate of its communicator), and every
rank writes its times on rank 0's clock, so the files line up.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import _mpi, crosscheck, debug
from ..groups import STATE, not_initialized
from . import recorder

ENV = "PYCOLL_TRACE"
PINGS = 8  # round trips per rank when measuring clocks
TAG = 0

_state: Dict[str, Any] = {"dir": None, "offset": 0.0, "origin": 0.0}


def is_tracing() -> bool:
    return recorder.TRACING


def _offsets(pg: Any) -> Tuple[float, float]:
    """(this rank's clock minus rank 0's, rank 0's clock at the start): rank
    0 pings each rank, keeping the offset seen in its shortest round trip."""
    comm = pg.comm.Dup()  # its own: no message of pycoll's can match these
    try:
        return _measure(comm)
    finally:
        comm.Free()


def _measure(comm: Any) -> Tuple[float, float]:
    me, size = comm.Get_rank(), comm.Get_size()
    clock = recorder.clock
    buf = np.zeros(1)
    if me == 0:
        offsets = np.zeros(size)
        for peer in range(1, size):
            best = float("inf")
            for _ in range(PINGS):
                t0 = clock()
                comm.Send([buf, _mpi.MPI.DOUBLE], peer, TAG)
                comm.Recv([buf, _mpi.MPI.DOUBLE], peer, TAG)
                t1 = clock()
                if t1 - t0 < best:
                    best = t1 - t0
                    offsets[peer] = buf[0] - (t0 + t1) / 2
        mine = np.array([0.0, clock()])
        for peer in range(1, size):
            comm.Send([np.array([offsets[peer], mine[1]]), _mpi.MPI.DOUBLE], peer, TAG)
        return 0.0, float(mine[1])
    for _ in range(PINGS):
        comm.Recv([buf, _mpi.MPI.DOUBLE], 0, TAG)
        buf[0] = clock()
        comm.Send([buf, _mpi.MPI.DOUBLE], 0, TAG)
    got = np.zeros(2)
    comm.Recv([got, _mpi.MPI.DOUBLE], 0, TAG)
    return float(got[0]), float(got[1])


def start(directory: str) -> None:
    """Start recording this rank's timeline into ``directory``.

    Collective over the default group (every rank calls it), which measures
    the ranks' clocks against rank 0's.

    Raises:
        RuntimeError: pycoll is not initialized, or a timeline is being recorded.
        ValueError: ``directory`` is empty.
    """
    pg = STATE.default
    if pg is None:
        raise not_initialized("pycoll.trace.start")
    if recorder.TRACING:
        raise RuntimeError(
            f"pycoll.trace.start: a timeline is being recorded already (into "
            f"{_state['dir']}); stop it first"
        )
    if not directory:
        raise ValueError("pycoll.trace.start: give the directory the timeline goes into")
    if pg._flight is None:
        raise RuntimeError(
            f"pycoll.trace.start: the timeline is made from the flight recorder, which "
            f"{recorder.RECORDS_ENV}=0 turned off; unset it to trace"
        )
    os.makedirs(directory, exist_ok=True)
    offset, origin = _offsets(pg)
    _state.update(dir=directory, offset=offset, origin=origin)
    del recorder.EVENTS[:]
    recorder.TRACING = True
    debug.set_tracing(True)  # synchronous calls take the path that times them


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


def _bytes(entry: List[Any]) -> Optional[int]:
    """The entry's bytes: as recorded, else from its key (dtype and count)."""
    if entry[recorder.NBYTES] is not None:
        return int(entry[recorder.NBYTES])
    key = entry[recorder.KEY]
    dtype, count = crosscheck.dtype_and_count(key)
    if dtype is None or not count:
        return None
    try:
        return count * np.dtype(dtype).itemsize
    except TypeError:
        return {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}.get(dtype, 0) * count or None


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
                extra["call"] = crosscheck.describe(e[recorder.KEY], group._ranks)
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
    meta = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": track}}
        for track, tid in tracks.items()
    ]
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "pycoll": {"rank": rank, "job": recorder.JOB, "clock_offset_s": _state["offset"]}
        },
    }
