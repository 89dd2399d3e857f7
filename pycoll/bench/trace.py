"""What pycoll.trace costs: the flight recorder (always on) and the timeline.

Run under MPI (``scripts/bench trace``, or ``mpiexec -n N python -m
pycoll.bench.trace``). Four variants of each workload, timed in interleaved
rounds (order rotated each round), every variant's result checked on every
rank first: pycoll on a group whose flight recorder is off
(PYCOLL_FLIGHT_RECORDS=0 when it was made), pycoll on a group with the
recorder on (the default), the same while a timeline is being recorded
(started and stopped around the variant's turn, the file written outside
the timed part), and raw mpi4py. Workloads: the 8-byte all_reduce, synchronous
(pycoll's fast path, where the recorder is inline) and async (a Work).
Figures are per call, the median over rounds of the ranks' median; costs are
medians of per-round differences, with their quartiles. ``inline_ns`` is the
fast path's recording statements alone, timed on one process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from .table import time_block


def _group(records: int) -> Any:
    import pycoll

    from ..trace import recorder

    before = os.environ.get(recorder.RECORDS_ENV)
    os.environ[recorder.RECORDS_ENV] = str(records)
    try:
        return pycoll.new_group()
    finally:
        if before is None:
            del os.environ[recorder.RECORDS_ENV]
        else:
            os.environ[recorder.RECORDS_ENV] = before


def inline_ns(records: int, loops: int = 200_000) -> float:
    """The fast path's recording (collectives._common.plain) alone, per call."""
    from collections import deque

    class Group:
        _flight: Any = deque(maxlen=records)

    pg, key = Group(), 7 << 40
    t0 = time.perf_counter()
    for _ in range(loops):
        ring = pg._flight
        if ring is not None:
            ring.append(key)
    t1 = time.perf_counter()
    for _ in range(loops):
        pass
    t2 = time.perf_counter()
    return ((t1 - t0) - (t2 - t1)) / loops * 1e9


def measure(comm: Any, rounds: int, iters: int, records: int) -> Dict[str, Any]:
    from mpi4py import MPI

    import pycoll

    from ..trace import timeline

    n = comm.Get_size()
    groups = {"recorder off": _group(0), "recorder on": _group(records)}
    groups["tracing"] = groups["recorder on"]
    raw = comm.Dup()
    held = {v: np.zeros(2, np.float32) for v in [*groups, "mpi4py"]}
    SUM, FLOAT, IN_PLACE = MPI.SUM, MPI.FLOAT, MPI.IN_PLACE

    def calls(v: str) -> Dict[str, Callable[[], Any]]:
        x = held[v]
        if v == "mpi4py":
            return {
                "sync": lambda: raw.Allreduce(IN_PLACE, [x, FLOAT], SUM),
                "async": lambda: raw.Iallreduce(IN_PLACE, [x, FLOAT], SUM).Wait(),
            }
        g = groups[v]
        return {
            "sync": lambda: pycoll.all_reduce(x, group=g),
            "async": lambda: pycoll.all_reduce(x, group=g, async_op=True).wait(),  # type: ignore[union-attr]
        }

    variants = {v: calls(v) for v in held}
    workloads = ["sync", "async"]
    wrong = 0
    for v, fns in variants.items():
        for w in workloads:
            held[v][:] = comm.Get_rank() + 1
            fns[w]()
            wrong += comm.allreduce(0 if (held[v] == n * (n + 1) / 2).all() else 1, op=SUM)
            held[v][:] = 0
    folder = comm.bcast(
        tempfile.mkdtemp(prefix="pycoll-bench-trace-") if comm.Get_rank() == 0 else None
    )
    names = list(variants)
    seconds: Dict[Tuple[str, str], List[float]] = {(v, w): [] for v in names for w in workloads}
    for rnd in range(rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for w in workloads:
            for v in order:
                if v == "tracing":
                    timeline.start(folder)
                mean = time_block(variants[v][w], iters, 2, comm)
                if v == "tracing":
                    timeline.stop()
                seconds[(v, w)].append(statistics.median(comm.allgather(mean)))
    rows = []
    for w in workloads:
        row: Dict[str, Any] = {"workload": w}
        for v in names:
            row[v] = statistics.median(seconds[(v, w)]) * 1e6
        for cost, (a, b) in {"recorder": ("recorder on", "recorder off"),
                             "timeline": ("tracing", "recorder on")}.items():  # fmt: skip
            diffs = [(x - y) * 1e6 for x, y in zip(seconds[(a, w)], seconds[(b, w)])]
            q1, _, q3 = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else diffs * 3
            row[cost] = (statistics.median(diffs), q1, q3)
        rows.append(row)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
    raw.Free()
    pycoll.destroy_process_group(groups["recorder off"])
    pycoll.destroy_process_group(groups["recorder on"])
    return dict(
        ranks=n, rounds=rounds, iters=iters, records=records, wrong=wrong, rows=rows,
        inline_ns=inline_ns(records),
    )  # fmt: skip


def table(report: Dict[str, Any]) -> str:
    lines = [
        f"# pycoll.trace's cost: {report['ranks']} ranks, {report['rounds']} interleaved rounds of "
        f"{report['iters']} calls, {report['records']} records per group; wrong results: "
        f"{report['wrong']}",
        f"# the fast path's recording alone: {report['inline_ns']:.0f} ns per call",
        "# 8-byte all_reduce, us per call (median); costs: medians of per-round differences "
        "(q1..q3)",
        f"{'workload':<8} {'rec. off':>9} {'rec. on':>9} {'tracing':>9} {'mpi4py':>9} "
        f"{'recorder cost':>24} {'timeline cost':>24}",
    ]
    for row in report["rows"]:
        costs = [f"{m:+.3f} ({a:+.3f}..{b:+.3f})" for m, a, b in (row["recorder"], row["timeline"])]
        lines.append(
            f"{row['workload']:<8} {row['recorder off']:>9.2f} {row['recorder on']:>9.2f} "
            f"{row['tracing']:>9.2f} {row['mpi4py']:>9.2f} {costs[0]:>24} {costs[1]:>24}"
        )
    return "\n".join(lines)


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=2000, help="calls per variant per round")
    parser.add_argument(
        "--records", type=int, help="entries per group (default: PYCOLL_FLIGHT_RECORDS's default)"
    )
    args = parser.parse_args(argv)
    from mpi4py import MPI

    import pycoll

    pycoll.init_process_group()
    from ..trace import recorder

    records = recorder.DEFAULT_RECORDS if args.records is None else args.records
    report = measure(MPI.COMM_WORLD, args.rounds, args.iters, records)
    if pycoll.get_rank() == 0:
        print(table(report))
    pycoll.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
