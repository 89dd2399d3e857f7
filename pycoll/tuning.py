"""What ``PYCOLL_TUNING`` sets: a tuning table, which path a large all_reduce
or reduce-scatter takes on this machine, measured on it (``python -m
pycoll.bench.tune``), as MPICH's and Open MPI's tuning files do for their own
algorithms; or which groups the live trials (pycoll.autotune) cover
(:func:`read_live`, :func:`live_from`).

pycoll's built-in rule (pycoll.paths.rule) was measured on two
machines, and a path that wins on one can lose on the other: the shared
window all_reduce took 0.68-0.92x MPICH's time at 1-8 MiB on 2 ranks of a
2-core VM and 1.26-1.41x on 2 ranks of a 16-core Xeon, so the rule keeps
MPI's own call there and leaves the VM's gain unused
(docs/measurements/all_reduce_paths.py).
A table measured on the machine itself chooses per size and rank count.

``PYCOLL_TUNING=FILE`` names the table (``live`` and ``off`` name none:
they set the live tuning, pycoll.autotune, which a table turns off); rank 0 of the world reads it at
``init_process_group`` and sends it to every rank, so every rank chooses
alike (a path chosen differently on two ranks would leave them in different
operations until the timeout). A table that cannot be used raises there, on
every rank, naming the problem. It applies to jobs whose ranks share one
node, where it was measured; a job over several nodes warns and keeps the
built-in rule.

The file is JSON::

    {"pycoll_tuning": 1,
     "all_reduce": {"2": [[1048576, "window"], [16777216, "ring"]], "4": ...},
     "reduce_scatter": {"2": [[262144, "mpi"], [1048576, "pairwise"]], ...},
     "measured": {...}}

For a group of that many ranks, an all_reduce of at least the first
entry's bytes takes the path of the last entry at or below its size:
``"ring"`` (pycoll's ring, pycoll.collectives.ring) or ``"window"`` (the
node's shared window, pycoll.collectives.shm) for every op the path can
carry: where it beat MPI's own float32 SUM it beats the float16, bfloat16
and AVG that MPI runs as user ops the more. ``"mpi"``: MPI's own call, for
MPI's own ops. Anything else (smaller calls, other group sizes, an op the
path cannot carry, a window the group cannot have, a user op where the
table keeps MPI's call) keeps the built-in rule.

A reduce_scatter_tensor or reduce_scatter of at least the first entry's
bytes of input (every rank's parts together) takes MPI's own call
(``"mpi"``), the window (``"window"``, pycoll.collectives.shm.Block; MPI's
call where the group cannot have one) or pycoll's pairwise exchange
(``"pairwise"``, pycoll.collectives.pairwise), whatever its op (MPI's call
where the kernels cannot reduce it: an AVG of complex numbers). What the tool
records of its run ("measured") is kept and not read; any other key is an
error (a misspelt collective would otherwise be ignored).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "ENV",
    "PATHS",
    "COLLECTIVES",
    "Table",
    "parse",
    "read",
    "for_job",
    "install",
    "entries_for",
    "decide",
    "path",
    "merged",
    "summary",
    "pick",
]

ENV = "PYCOLL_TUNING"
# The paths each collective the table decides can take.
COLLECTIVES: Dict[str, Tuple[str, ...]] = {
    "all_reduce": ("mpi", "ring", "window"),
    "reduce_scatter": ("mpi", "window", "pairwise"),
}
PATHS = COLLECTIVES["all_reduce"]
VERSION = 1
LIVE_MODES = ("live", "off")  # values of PYCOLL_TUNING that name no file (pycoll.autotune)
NEVER = 1 << 62  # a group with no entries: no size reaches it
# The live tuning (pycoll.autotune): which groups' large calls its trials
# decide, as PYCOLL_TUNING sets it ("live": every group; unset: groups of
# two ranks, "pairs"; "off" or a table: none). LIVE_FROM is the least
# all_reduce they decide: below, pycoll's exchange, doubling and MPI's call
# take the sizes by rules measured on both MPIs, and a call's Python (a few
# microseconds) would weigh on the timings.
LIVE = ("pairs", "live", "off")
LIVE_FROM = 1 << 20
LIVE_MODE = "off"  # what install_live() was given (init_process_group)
_LIVE_OVERRIDES = ("PYCOLL_SHM_BYTES", "PYCOLL_SPLIT_BYTES")
_OTHER_KEYS = ("pycoll_tuning", "measured")

Entries = Tuple[List[int], List[str]]  # the entries' first sizes (increasing), their paths
# {collective: {ranks: entries}}
Table = Dict[str, Dict[int, Entries]]

TABLE: Optional[Table] = None  # the installed table (init_process_group)


def _fix(source: str) -> str:
    return (
        f"make it again with 'mpiexec -n N python -m pycoll.bench.tune -o {source}', or unset {ENV}"
    )


def parse(text: str, source: str) -> Table:
    """The table in ``text`` (the contents of ``source``); ValueError naming
    what is wrong and how to mend it."""

    import json  # (here: every group imports this module, few jobs have a table)

    def bad(problem: str) -> ValueError:
        return ValueError(f"{ENV}={source}: {problem}; {_fix(source)}")

    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("pycoll_tuning") != VERSION:
        raise bad(f'not a pycoll tuning table (no "pycoll_tuning": {VERSION})')
    for key in doc:
        if key not in COLLECTIVES and key not in _OTHER_KEYS:
            raise bad(f"{key!r} is none of {', '.join(map(repr, [*COLLECTIVES, *_OTHER_KEYS]))}")
    table: Table = {}
    for name, paths_allowed in COLLECTIVES.items():
        rules = doc.get(name, {})
        if not isinstance(rules, dict):
            raise bad(f'"{name}" must map a number of ranks to a list of entries')
        table[name] = {}
        for ranks_text, entries in rules.items():
            where = f'"{name}"["{ranks_text}"]'
            if not (ranks_text.isdigit() and int(ranks_text) > 1):
                raise bad(f'"{name}" key {ranks_text!r} is not a number of ranks above 1')
            if not isinstance(entries, list) or not entries:
                raise bad(f"{where} must be a non-empty list of [bytes, path]")
            starts: List[int] = []
            paths: List[str] = []
            for entry in entries:
                if (
                    not isinstance(entry, list)
                    or len(entry) != 2
                    or type(entry[0]) is not int
                    or entry[0] < 0
                    or entry[1] not in paths_allowed
                ):
                    raise bad(
                        f"{where} has {entry!r}: an entry is [bytes, path] with bytes >= 0 "
                        f"and path one of {', '.join(paths_allowed)}"
                    )
                if starts and entry[0] <= starts[-1]:
                    raise bad(f"{where}: the sizes must increase")
                starts.append(entry[0])
                paths.append(entry[1])
            table[name][int(ranks_text)] = (starts, paths)
    return table


def read(environ: Any = os.environ) -> Tuple[Optional[Table], Optional[str]]:
    """The table ``PYCOLL_TUNING`` names, or an error message (what rank 0
    sends every rank at init); (None, None) where it is not set, or is one of
    the live tuning's modes ("live", "off": pycoll.autotune)."""
    source = environ.get(ENV, "").strip()
    if not source or source in LIVE_MODES:
        return None, None
    try:
        with open(source) as f:
            text = f.read()
    except (OSError, ValueError) as exc:  # (ValueError: not text, UnicodeDecodeError)
        why = exc.strerror if isinstance(exc, OSError) else "not text"
        return None, f"{ENV}={source}: cannot be read ({why}); {_fix(source)}"
    try:
        return parse(text, source), None
    except ValueError as exc:
        return None, str(exc)


def for_job(table: Optional[Table], one_node: bool, warn: bool) -> Optional[Table]:
    """The table a job uses: ``table`` where its ranks share one node, where
    it was measured; else none, with a warning (where ``warn``: rank 0)."""
    if table is None or one_node:
        return table
    if warn:
        import warnings

        warnings.warn(
            f"{ENV}: the table is ignored: this job's ranks are on several nodes, and "
            f"it was measured on one (pycoll.tuning)",
            stacklevel=3,
        )
    return None


def install(table: Optional[Table]) -> None:
    """Make ``table`` the one groups made from now on use (None: none)."""
    global TABLE
    TABLE = table


_NONE: Entries = ([NEVER], ["mpi"])  # the entries of a group the table does not decide


def read_live(environ: Any = os.environ) -> str:
    """The live tuning ``PYCOLL_TUNING`` asks for (what rank 0 sends every rank
    at init): ``"live"``, ``"off"``, or ``"pairs"`` where it is unset;
    ``"off"`` where it names a table (the table decides), or where it is unset
    and a path's size is set by ``PYCOLL_SHM_BYTES`` or ``PYCOLL_SPLIT_BYTES``."""
    value = environ.get(ENV, "").strip()
    if value == "live":
        return "live"
    if value or any(environ.get(name, "").strip() for name in _LIVE_OVERRIDES):
        return "off"
    return "pairs"


def install_live(mode: str) -> None:
    """Make ``mode`` (one of :data:`LIVE`) the one groups made from now on use."""
    global LIVE_MODE
    if mode not in LIVE:
        raise ValueError(f"live tuning mode {mode!r} is none of {', '.join(LIVE)}")
    LIVE_MODE = mode


def live_from(ranks: int) -> int:
    """For a new group of ``ranks``: the least all_reduce the live trials
    decide (:data:`NEVER` where they do not apply: one comparison on the hot
    path)."""
    if ranks < 2 or LIVE_MODE == "off" or (LIVE_MODE == "pairs" and ranks != 2):
        return NEVER
    return LIVE_FROM


def entries_for(collective: str, ranks: int) -> Tuple[int, Entries]:
    """For a new group of ``ranks``: the least size of ``collective`` the
    installed table decides (NEVER where it has no entries for it), and the
    entries."""
    entries = _NONE if TABLE is None else TABLE[collective].get(ranks, _NONE)
    return entries[0][0], entries


def decide(pg: Any, collective: str, entries: Optional[Entries]) -> None:
    """Give the group ``pg`` these entries for ``collective`` in place of the
    installed table's (None: the table's again): pycoll.bench.tune forces
    each path so (ProcessGroup.tune keeps them)."""
    if entries is None:
        least, entries = entries_for(collective, pg.size())
    else:
        least = entries[0][0]
    pg.tune(collective, least, entries)


def path(entries: Entries, nbytes: int) -> str:
    """The path of the last entry at or below ``nbytes`` (at least the first's)."""
    starts, paths = entries
    return paths[bisect_right(starts, nbytes) - 1]


def summary(ratios: List[float]) -> Tuple[float, float]:
    """The median and the upper quartile of a path's per-round times over
    MPI's own call's (the upper quartile is the value itself for one round)."""
    import statistics

    if len(ratios) == 1:
        return ratios[0], ratios[0]
    return statistics.median(ratios), statistics.quantiles(ratios, n=4)[2]


def pick(stats: Dict[str, Tuple[float, float]], margin: float, base: str = "mpi") -> str:
    """The path from each path's :func:`summary` of its times over the path
    ``base``'s (MPI's own call for pycoll.bench.tune's tables, the built-in
    rule's path for pycoll.autotune's trials): the fastest whose median is
    at most ``margin`` and whose upper quartile is under 1, so faster than
    ``base`` in three rounds of four; ``base`` where none is."""
    fits = [
        (median, upper, path)
        for path, (median, upper) in stats.items()
        if path != base and median <= margin and upper < 1.0
    ]
    return min(fits)[2] if fits else base  # (a tie of medians: the steadier)


def merged(
    existing: Optional[str],
    ranks: int,
    entries: Dict[str, List[List[Any]]],
    about: Dict[str, Any],
) -> str:
    """A table's text: ``existing`` (a table's text, or None) with the
    entries for ``ranks`` of each collective in ``entries`` and what was
    measured for them (``about``) replaced, everything else kept."""
    import json

    doc: Dict[str, Any] = {"pycoll_tuning": VERSION, "measured": {}}
    if existing:
        old = json.loads(existing)
        if isinstance(old, dict) and old.get("pycoll_tuning") == VERSION:
            doc.update(old)
    for name, rows in entries.items():
        doc.setdefault(name, {})[str(ranks)] = rows
    doc.setdefault("measured", {})[str(ranks)] = about
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
