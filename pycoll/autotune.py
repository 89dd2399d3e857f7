"""Live tuning: the path a large all_reduce or reduce-scatter takes, chosen
by timing each candidate during the job's own first calls of each size.

Which of pycoll's paths beats MPI's own large all_reduce moves with the
machine and with its state: on 2 ranks of the 2-core CI VM the node's shared
window took 0.67-0.78x MPICH's time at 1-8 MiB in one run and 1.5-1.9x in
another, and 1.26-1.41x on a 16-core Xeon (docs/benchmarks.md, "Which path
wins where"). The built-in rule (pycoll.paths.rule) keeps MPI's call
wherever a path lost somewhere, and a table measured beforehand (pycoll.tuning)
is as good as the run that made it. The job's own calls are the measurement
that counts.

So for each class of a group's all_reduce from :data:`LIVE_FROM` bytes (its
op and dtype, and its size rounded down to a power of two) the first calls go
in turn by each path that can carry it: the built-in rule's path first, MPI's
own call, pycoll's ring (pycoll.collectives.ring) and the node's shared
window (pycoll.collectives.shm); for a reduce-scatter the rule's, MPI's call,
pycoll's pairwise exchange (pycoll.collectives.pairwise) and the window. One
untimed round first (the window is made, pages are touched), then
:data:`ROUNDS` rounds in rotated orders, every call timed on every rank from a
barrier of every rank (so that it is not charged for the ranks it waits for);
an ``async_op`` call is waited for at once, so its Work comes back complete.
The class's next call exchanges each rank's median and upper quartile over
the rounds of each path's time over the rule's path's in the same round (the
largest over the ranks is kept) in one nonblocking all-reduce on a
communicator of the trials' own, waited for within the group's timeout, and
every rank takes the same path from then on: the fastest whose median is at
most :data:`MARGIN` and whose upper quartile is under 1 (faster than the
rule's path in three rounds of four), else the rule's path: the rule of
``python -m pycoll.bench.tune``'s tables (pycoll.tuning.pick), with the rule's
path where the tables have MPI's call. So the trials replace the rule only
where they measured it beaten, MPI's own call included where the rule's path
lost to it. Later calls of the class find it with one dictionary lookup;
every :data:`RECHECK` calls the class makes :data:`RECHECK_ROUNDS` more rounds
of trials and decides again, as the machine's state moves.

Every rank makes the same calls in the same order with the same size, op and
dtype (the call check verifies it: pycoll.crosscheck), and what decides which
paths can carry a call is the same on every rank, so every rank takes the
same path on every call, trials included.

Where it applies (``PYCOLL_TUNING``, read by rank 0 at init and sent to
every rank: pycoll.tuning.read_live and live_from, which the groups ask
without importing this module):

- unset: groups of two ranks. There every path adds each pair of elements
  once, so a result's bits do not depend on the path chosen
  (tests/test_autotune.py checks that for every op it covers);
- ``live``: groups of any size. A float sum's last bits then depend on the
  path (each adds in its own order), and so may differ from one job to the
  next as the timings choose;
- ``off``: none: the built-in rule;
- a file's name: the table decides (pycoll.tuning), with no trials.

It covers the ops MPI carries whole (``Plan.plain``: MPI's own ops and
pycoll's kernels as MPI user ops, as float16 and bfloat16 sums) but MIN and
MAX of floats, which of two zeros of opposite signs they keep depending on
the order of folding; those, AVG and PREMUL_SUM keep the rule. Where ``PYCOLL_SHM_BYTES`` or
``PYCOLL_SPLIT_BYTES`` is set and ``PYCOLL_TUNING`` is not, those choose.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from . import _mpi, debug, tuning, watch

__all__ = [
    "LIVE_FROM",
    "ROUNDS",
    "RECHECK",
    "RECHECK_ROUNDS",
    "MARGIN",
    "Trials",
    "trials",
    "chosen",
    "pending",
    "timed",
]

ROUNDS = 7  # timed rounds of each candidate, after one untimed round
# A machine's state moves (the window's 0.7x and 2.3x of MPI's time at 16 MiB
# came minutes apart on the CI VM): every RECHECK calls of a class after its
# decision, RECHECK_ROUNDS more rounds of trials, then the class decides
# again from each path's latest ROUNDS timings (the new ones the majority).
# On a class whose slowest path takes 2.5x the rule's time, that costs about 1%.
RECHECK = 1000
RECHECK_ROUNDS = 4
# A path replaces the rule's only where its median time over the rule's path's
# is at most this, and its upper quartile under 1: within 5% the noise of a
# shared machine could choose.
MARGIN = 0.95
_KEY = "autotune"
# Which groups' calls the trials decide, and from what size, is set at init
# (pycoll.tuning.read_live, install_live, live_from).
LIVE_FROM = tuning.LIVE_FROM


def _rounds(paths: Sequence[str], rounds: int, untimed: int) -> List[Tuple[str, bool]]:
    """A schedule of trials: ``rounds`` rounds of every path, each round's
    order rotated by one (so no path always follows the same other), the
    first ``untimed`` rounds not timed."""
    n = len(paths)
    return [(paths[(i + r) % n], r >= untimed) for r in range(rounds) for i in range(n)]


class _Class:
    """One class of calls: its candidate paths, each path's latest timings
    (seconds), the trials still to make, and, once decided, its path and
    how many calls have taken it since."""

    __slots__ = ("paths", "base", "times", "plan", "step", "path", "since", "ratios")

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self.base = self.paths[0]  # the built-in rule's path, which the others must beat
        self.times: Dict[str, Deque[float]] = {p: deque(maxlen=ROUNDS) for p in self.paths}
        self.plan = _rounds(self.paths, 1 + ROUNDS, 1)
        self.step = 0
        self.path: Optional[str] = None if len(self.paths) > 1 else self.paths[0]
        self.since = 0
        self.ratios: Dict[str, float] = {}  # each path's time over the base's, once decided


class Trials:
    """A group's classes of calls, and the communicator their decisions are
    exchanged on (kept with the group: pycoll.groups.attach)."""

    def __init__(self) -> None:
        self.classes: Dict[Tuple[str, int, int], _Class] = {}
        self.lock = threading.Lock()
        self.comm: Any = None

    def free(self) -> None:
        if self.comm is not None:
            self.comm.Free()

    def choose(
        self,
        pg: Any,
        func: str,
        key: Tuple[str, int, int],
        candidates: Callable[[], Sequence[str]],
    ) -> Tuple[str, Optional[Tuple[_Class, bool]]]:
        """The path of this call of class ``key``; with it, where the call is
        one of the trials, the class and whether the call is timed (the
        caller hands both to :func:`timed`), else None. (A trial of MPI's own
        call takes its general path, and the compiled path, pycoll.native,
        keeps no call of these sizes, so that every rank counts every call.)

        The class's first call asks ``candidates()`` which paths can carry it
        (the rule's first). The call after the last trial decides
        (:func:`_decide`); every :data:`RECHECK` calls after that,
        :data:`RECHECK_ROUNDS` rounds of trials are made again and the class
        decides again, from each path's latest :data:`ROUNDS` timings. On a
        group an earlier operation broke, raises as any call on it does,
        before the trials' own waits."""
        if pg.is_broken():
            raise watch.broken(pg, func)
        with self.lock:
            entry = self.classes.get(key)
            if entry is None:
                entry = self.classes[key] = _Class(candidates())
            if entry.path is not None:
                if entry.since < RECHECK or len(entry.paths) == 1:
                    entry.since += 1
                    return entry.path, None
                entry.path, entry.plan, entry.step = (
                    None,
                    _rounds(entry.paths, RECHECK_ROUNDS, 0),
                    0,
                )
            if entry.step == len(entry.plan):
                _decide(pg, func, key, entry)
                entry.since = 1
                return entry.path, None  # type: ignore[return-value]
            path, timed = entry.plan[entry.step]
            entry.step += 1
            return path, (entry, timed)

    @staticmethod
    def took(entry: _Class, path: str, seconds: float) -> None:
        """A timed trial of ``path`` took ``seconds`` on this rank."""
        entry.times[path].append(seconds)


def trials(pg: Any) -> Trials:
    """The group's :class:`Trials`, made on its first use."""
    made = pg.attached(_KEY)
    if made is None:
        made = pg.attach(_KEY, Trials(), Trials.free)
    return made


def chosen(pg: Any) -> Dict[Tuple[str, int, int], Tuple[str, str, Dict[str, float]]]:
    """What the group's trials decided so far: for each class (collective,
    op and dtype key, size's power of two), its path, the built-in rule's
    path, and each path's median time over the rule's path's."""
    made = pg.attached(_KEY)
    if made is None:
        return {}
    return {
        k: (c.path, c.base, dict(c.ratios)) for k, c in made.classes.items() if c.path is not None
    }


def pending(pg: Any) -> FrozenSet[Tuple[str, int, int]]:
    """The classes of the group's calls still in their trials (the same on
    every rank: pycoll.bench makes calls until those its own calls started
    have decided, so that it times the path a job's later calls take)."""
    made = pg.attached(_KEY)
    if made is None:
        return frozenset()
    return frozenset(k for k, c in made.classes.items() if c.path is None)


def _decide(pg: Any, func: str, key: Tuple[str, int, int], entry: _Class) -> None:
    """Every rank's median ratio of each path's time to the rule's path's, the
    largest over the ranks (one nonblocking all-reduce on the trials'
    communicator, waited for within the group's timeout), and from it the
    class's path, the same on every rank."""

    MPI = _mpi.MPI
    seq = pg.sequence_number() + 1  # (the call this decision precedes, for a diagnosis)
    # Each round's time of a path over the rule's path's in the same round (a
    # round's calls come one after the other, so a drift of the machine's
    # state between rounds cancels), the median over the rounds.
    last = min(len(entry.times[p]) for p in entry.paths)  # (a trial that raised has none)
    times = {p: np.array(list(entry.times[p])[len(entry.times[p]) - last :]) for p in entry.paths}
    base = times[entry.base]
    mine = np.array(
        [
            tuning.summary((times[p] / base).tolist()) if last else (np.inf, np.inf)
            for p in entry.paths
        ],
        np.float64,
    )  # (every rank joins the exchange, one with no timings too: its infinities keep the rule)
    every = np.empty_like(mine)
    watch.wait(pg, func, seq, [_comm(pg, func, seq).Iallreduce(mine, every, MPI.MAX)])
    stats = {p: (float(m), float(u)) for p, (m, u) in zip(entry.paths, every)}
    entry.ratios = {p: m for p, (m, _) in stats.items()}
    entry.path = tuning.pick(stats, MARGIN, entry.base)
    if debug.LEVEL:
        debug.logger.info(
            "%s group=%s bytes>=%d: %s (time over the built-in rule's %s: %s)",
            func,
            pg.group_desc,
            1 << (key[2] - 1),
            entry.path,
            entry.base,
            ", ".join(f"{p} {r:.2f}" for p, r in entry.ratios.items()),
        )


def timed(
    pg: Any, func: str, trial: Optional[Tuple[_Class, bool]], path: str, call: Callable[[], Any]
) -> Any:
    """``call()`` (the call's path), timed where ``trial`` (from
    :meth:`Trials.choose`) says the call is a timed trial.

    A timed trial starts once every rank has come (a nonblocking barrier,
    waited for within the group's timeout): timed from its own start alone, a
    call would be charged for the ranks it waits for, so the path before it
    in the rotation, whose ranks leave at different times, would pass on some
    of its cost. A Work the call returns is waited for within the timing, so
    it comes back complete."""
    if trial is None or not trial[1]:
        return call()
    entry = trial[0]

    seq = pg.sequence_number() + 1  # (the call, for a diagnosis)
    watch.wait(pg, func, seq, [_comm(pg, func, seq).Ibarrier()])
    t0 = time.perf_counter()
    result = call()
    if result is not None:
        result.wait()
    Trials.took(entry, path, time.perf_counter() - t0)
    return result


def _comm(pg: Any, func: str, seq: int) -> Any:
    """The trials' own communicator, duplicated from the group's at its first
    timed trial (within the group's timeout): an exchange or barrier a late
    rank never joins stays pending after the timeout, and on a communicator
    other collectives use (the call check's, on the side communicator) it
    would be matched with the next."""

    made = trials(pg)
    if made.comm is None:
        comm, request = pg.comm.Idup()
        watch.wait(pg, func, seq, [request])
        made.comm = comm
    return made.comm
