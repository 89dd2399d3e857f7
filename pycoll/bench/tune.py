"""Measure which path a large all_reduce and reduce_scatter_tensor should
take on this machine, and write it down as a tuning table (pycoll.tuning).

    mpiexec -n 2 python -m pycoll.bench.tune -o tuning.json     # then -n 4 ... on the node
    PYCOLL_TUNING=tuning.json mpiexec -n 2 python train.py

For each size (256 KiB to 128 MiB by default) it times float32 SUM each way
the collective has, forced through the table itself: for all_reduce (in
place) MPI's own call, pycoll's ring and the node's shared window; for
reduce_scatter_tensor (out of place, the size its input) MPI's own call,
the window and pycoll's pairwise exchange. Every way's result is checked on
every rank first. Then rounds of a block of calls each, the order rotated
every round (pycoll.bench.table.rotated); a round's figure is the way's
time over MPI's in that round. A way is chosen over MPI's own call only
where the median of those is at most ``--margin`` (0.95) and the upper quartile under
1, the fastest such: never slower than MPI's own call as far as the rounds
can tell. The choices for this number of ranks go into the file (its other
rank counts are kept), with the figures they came from.

Run it on an idle node, with the ranks placed as the jobs will place them:
the table is as good as the measurement. The exit status is 1 if a checked
result was wrong (nothing is written then), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
from typing import Any, Dict, List, Optional

import numpy as np

import pycoll

from .. import _mpi, tuning
from . import parse_size, sizes
from .table import calibrate, rotated

__all__ = ["main", "choose", "entries"]


def choose(ratios: Dict[str, List[float]], margin: float) -> str:
    """The way for one size from each way's per-round time over MPI's
    (pycoll.tuning.pick: the fastest whose median is at most ``margin`` and
    whose upper quartile is under 1; MPI's own call where none is)."""
    return tuning.pick({w: tuning.summary(v) for w, v in ratios.items() if v}, margin)


def entries(measured: List[int], chosen: List[str]) -> List[List[Any]]:
    """Table entries from each measured size's choice: one where it changes."""
    out: List[List[Any]] = []
    for nbytes, way in zip(measured, chosen):
        if not out or out[-1][1] != way:
            out.append([nbytes, way])
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pycoll.bench.tune",
        description="Measure which path a large all_reduce and reduce-scatter take best on "
        "this node and write a tuning table for PYCOLL_TUNING (run it under mpiexec, one node).",
    )
    p.add_argument("-o", "--output", default="pycoll-tuning.json", help="the table's file")
    p.add_argument("-b", "--begin", type=parse_size, default=256 << 10, help="smallest size")
    p.add_argument("-e", "--end", type=parse_size, default=128 << 20, help="largest size")
    p.add_argument("-f", "--factor", type=int, default=2, help="from one size to the next")
    p.add_argument("-R", "--rounds", type=int, default=7, help="rounds per size")
    p.add_argument("--margin", type=float, default=0.95, help="most a way's time over MPI's")
    p.add_argument(
        "--collectives",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=list(tuning.COLLECTIVES),
        help=f"which to measure (default: {','.join(tuning.COLLECTIVES)})",
    )
    return p


class _Case:
    """One collective's calls, float32 SUM, on ``nbytes`` of input a rank:
    ``check(way)`` the wrong elements of one call by that way, on this rank
    (exact in float32); ``run(way)`` a block of ``k`` calls by it."""

    def __init__(self, collective: str, nbytes: int, pg: Any) -> None:
        self.collective, self.pg = collective, pg
        n = pg.size()
        self.count = nbytes // 4 // n * n  # (a reduce-scatter's parts even)
        self.x = np.zeros(self.count, np.float32)
        self.out = np.zeros(self.count // n, np.float32)

    def call(self, x: np.ndarray) -> np.ndarray:
        if self.collective == "all_reduce":
            pycoll.all_reduce(x, group=self.pg)
            return x
        pycoll.reduce_scatter_tensor(self.out, x, group=self.pg)
        return self.out

    def check(self, way: str) -> int:
        n, me = self.pg.size(), self.pg.rank()
        base = (np.arange(self.count) % 7).astype(np.float32)
        tuning.decide(self.pg, self.collective, ([0], [way]))
        got = self.call(base + np.float32(me + 1))
        want = base * n + np.float32(n * (n + 1) // 2)
        if self.collective == "reduce_scatter":
            want = want[me * got.size : (me + 1) * got.size]
        return int(np.count_nonzero(got != want))

    def run(self, way: str) -> Any:
        forced = ([0], [way])

        def calls(k: int) -> None:
            tuning.decide(self.pg, self.collective, forced)
            for _ in range(k):
                self.call(self.x)

        return calls


def _measure(collective: str, measured: List[int], pg: Any, args: Any, comm: Any) -> Any:
    """For each size: MPI's GB/s, each other way's ratios over it, the way
    chosen; and the wrong elements seen on this rank."""
    ways = tuning.COLLECTIVES[collective]
    ratios: Dict[str, List[Dict[str, Any]]] = {way: [] for way in ways if way != "mpi"}
    gbps: List[float] = []
    chosen: List[str] = []
    wrong = 0
    for nbytes in measured:
        case = _Case(collective, nbytes, pg)
        wrong += sum(case.check(way) for way in ways)
        runs = {way: case.run(way) for way in ways}
        times = rotated(runs, calibrate(runs["mpi"], comm), args.rounds, comm, warmup=1)
        per_round = {
            way: [t / m for t, m in zip(times[way], times["mpi"])] for way in ways if way != "mpi"
        }
        chosen.append(choose(per_round, args.margin))
        gbps.append(nbytes / statistics.median(times["mpi"]) / 1e9)
        for way, values in per_round.items():
            upper = statistics.quantiles(values, n=4)[2]
            ratios[way].append({"median": round(statistics.median(values), 3),
                                "upper": round(upper, 3)})  # fmt: skip
    tuning.decide(pg, collective, None)
    return gbps, ratios, chosen, wrong


def _existing(path: str) -> Any:
    """(the table already at ``path``, or None; why it must not be written
    over, or None)."""
    if not os.path.exists(path):
        return None, None
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, ValueError) as exc:  # (ValueError: not text, UnicodeDecodeError)
        return None, f"{path} cannot be read ({exc}; left as it is: name another file with -o)"
    try:
        tuning.parse(text, path)
    except ValueError as exc:
        return None, f"{exc} (left as it is: name another file with -o)"
    return text, None


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    unknown = [name for name in args.collectives if name not in tuning.COLLECTIVES]
    if args.factor < 2 or args.rounds < 2 or not 0 < args.begin <= args.end or unknown:
        print(f"pycoll.bench.tune: need -f 2 or more, -R 2 or more, 0 < -b <= -e and "
              f"--collectives among {','.join(tuning.COLLECTIVES)}", file=sys.stderr)  # fmt: skip
        return 2
    pycoll.init_process_group()
    MPI = _mpi.MPI
    comm = MPI.COMM_WORLD
    n, me = comm.Get_size(), comm.Get_rank()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == n
    node.Free()
    existing, problem = _existing(args.output) if me == 0 else (None, None)
    if n < 2 or not one_node:
        problem = "run it on 2 or more ranks of one node (the table is for jobs on one node)"
    problem = comm.bcast(problem)
    if problem is not None:
        if me == 0:
            print(f"pycoll.bench.tune: {problem}", file=sys.stderr)
        pycoll.destroy_process_group()
        return 2
    pg = pycoll.new_group()  # a group of its own, whose table it sets for each way
    assert isinstance(pg, pycoll.ProcessGroup)  # (every rank is a member)
    measured = sizes(args.begin - args.begin % 16, args.end, args.factor)
    results = {name: _measure(name, measured, pg, args, comm) for name in args.collectives}
    wrong = comm.allreduce(sum(result[3] for result in results.values()))
    if me == 0:
        for name, (gbps, ratios, chosen, _) in results.items():
            _report(name, n, measured, gbps, ratios, chosen, wrong)
    if wrong == 0 and me == 0:
        about = {
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "host": socket.gethostname(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "rounds": args.rounds,
            "margin": args.margin,
            "sizes": measured,
            "mpi_gbps": {name: [round(g, 3) for g in r[0]] for name, r in results.items()},
            "over_mpi": {name: r[1] for name, r in results.items()},
        }
        rows = {name: entries(measured, r[2]) for name, r in results.items()}
        with open(args.output, "w") as f:
            f.write(tuning.merged(existing, n, rows, about))
        print(f"# wrote the entries for {n} ranks to {args.output}; "
              f"use it with {tuning.ENV}={os.path.abspath(args.output)}")  # fmt: skip
    pycoll.destroy_process_group()
    return 1 if wrong else 0


def _report(
    collective: str,
    n: int,
    measured: List[int],
    gbps: List[float],
    ratios: Dict[str, List[Dict[str, Any]]],
    chosen: List[str],
    wrong: int,
) -> None:
    kind = "in place" if collective == "all_reduce" else "out of place, bytes of input"
    print(f"# pycoll.bench.tune: {collective} float32 SUM {kind}, {n} ranks; a way's time "
          f"over MPI's own call, median of the rounds (upper quartile); wrong results: "
          f"{wrong}")  # fmt: skip
    ways = list(ratios)
    print(f"{'bytes':>10} {'MPI GB/s':>9} " + " ".join(f"{w:>15}" for w in ways) + "  chosen")
    for i, nbytes in enumerate(measured):
        cells = " ".join(
            f"{ratios[w][i]['median']:6.2f} ({ratios[w][i]['upper']:5.2f})" for w in ways
        )
        print(f"{nbytes:>10} {gbps[i]:>9.2f} {cells}  {chosen[i]}")


if __name__ == "__main__":
    sys.exit(main())
