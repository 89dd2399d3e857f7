"""Reading the ranks' flight records: which rank is behind, where, doing what.

``analyze(DIR)`` reads the ``flight-<job>-rank<r>.json`` dumps of one job
(the newest in DIR, unless ``job`` is given; pycoll.trace.recorder writes
them) and says, for each group: the furthest sequence number any rank
reached and what it was; the ranks behind it and what each was doing; the
ranks that left no record; and why the dumps were written (a timeout's
diagnosis, a signal).
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections import defaultdict
from typing import Any, Dict, List, Optional

_FILE = re.compile(r"flight-(.+)-rank(\d+)\.json$")


def load(directory: str, job: Optional[str] = None) -> Dict[int, Dict[str, Any]]:
    """One job's records in ``directory``, by rank (the newest job unless given).

    Raises:
        FileNotFoundError: no record (of that job) is there.
    """
    jobs: Dict[str, Dict[int, str]] = defaultdict(dict)
    for path in glob.glob(os.path.join(directory, "flight-*-rank*.json")):
        match = _FILE.search(path)
        if match:
            jobs[match.group(1)][int(match.group(2))] = path
    if job is None and jobs:
        job = max(jobs, key=lambda j: max(os.path.getmtime(p) for p in jobs[j].values()))
    if job not in jobs:
        raise FileNotFoundError(
            f"no flight record{'' if job is None else ' of job ' + job} in {directory} "
            "(pycoll writes them on a timeout, on SIGUSR1 and by pycoll.dump_flight_record())"
        )
    records = {}
    for rank, path in sorted(jobs[job].items()):
        with open(path) as f:
            records[rank] = json.load(f)
    return records


def _doing(group: Dict[str, Any]) -> str:
    """What a rank's last operation on a group was, as text."""
    if not group["entries"]:
        return "nothing recorded"
    e = group["entries"][-1]
    where = "p2p" if e["seq"] is None else f"seq {e['seq']}"
    peer = "" if e["peer"] is None else f" with rank {e['peer']}"
    ago = e["issued_s_ago"]
    when = "" if ago is None else f", issued {ago:.3g} s before the dump"
    return f"{where} {e['call']}{peer}, {e['state']}{when}"


def _ranks(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def analyze(directory: str, job: Optional[str] = None) -> str:
    """The analysis as text."""
    records = load(directory, job)
    first = next(iter(records.values()))
    lines = [
        f"pycoll flight records of job {first['job']} in {directory}: {_ranks(sorted(records))}"
    ]
    groups: Dict[str, Dict[int, Dict[str, Any]]] = defaultdict(dict)
    for rank, record in records.items():
        for group in record["groups"]:
            groups[group["name"]][rank] = group
    for by_rank in groups.values():
        any_group = next(iter(by_rank.values()))
        members = any_group["ranks"]
        furthest = max(g["seq"] for g in by_rank.values())
        ahead = sorted(r for r, g in by_rank.items() if g["seq"] == furthest)
        behind = sorted(r for r, g in by_rank.items() if g["seq"] < furthest)
        silent = [r for r in members if r not in by_rank]
        lines.append(f"group {any_group['desc']!r} (ranks {','.join(map(str, members))}):")
        lines.append(
            f"  furthest: seq {furthest}, reached by {_ranks(ahead)}: {_doing(by_rank[ahead[0]])}"
        )
        for rank in behind:
            group = by_rank[rank]
            lines.append(
                f"  BEHIND: rank {rank} is at seq {group['seq']} ({furthest - group['seq']} "
                f"behind): {_doing(group)}"
            )
        if silent:
            lines.append(
                f"  NO RECORD: {_ranks(silent)} left none (stopped or killed before dumping, "
                "or not running pycoll): if the others wait at the furthest seq, "
                f"{'it is' if len(silent) == 1 else 'they are'} the likely cause"
            )
        stuck = [
            r
            for r in ahead
            if by_rank[r]["entries"] and by_rank[r]["entries"][-1]["state"] != "completed"
        ]
        if not behind and not silent and stuck:
            lines.append(
                f"  every rank reached seq {furthest}; still in it on {_ranks(stuck)} "
                "(a rank stuck inside it, or different calls at that seq: "
                "PYCOLL_DEBUG=DETAIL checks)"
            )
        elif not behind and not silent:
            lines.append(f"  every rank reached seq {furthest} and completed it")
    reasons = defaultdict(list)
    for rank, record in records.items():
        reasons[
            record["reason"].splitlines()[0] if record["reason"] else "(no reason given)"
        ].append(rank)
    lines.append("why the records were written:")
    for reason, ranks in reasons.items():
        lines.append(f"  {_ranks(ranks)}: {reason}")
    return "\n".join(lines) + "\n"
