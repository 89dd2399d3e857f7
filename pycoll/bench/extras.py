"""pycoll-bench's other measurements: the kernels, fusion, overlap, group
creation, and the dtype/op targets of the reductions.

Each is collective over ``comm`` (every rank calls it) and returns a dict;
times are the slowest rank's unless said otherwise.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = [
    "kernels",
    "fusion",
    "overlap",
    "group_creation",
    "targets",
    "pool_targets",
    "crosscheck_cost",
]


def _best(call: Callable[[], Any], repeats: int, comm: Any) -> float:
    """Median seconds per call over ``repeats`` calls, after one warm-up call;
    the slowest rank's."""
    from mpi4py import MPI

    call()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return comm.allreduce(statistics.median(times), op=MPI.MAX)


def _numpy_mean_of_two(a: np.ndarray, b: np.ndarray) -> None:
    np.add(a, b, out=b)
    np.divide(b, 2, out=b)


def kernels(comm: Any, nbytes: int = 64 << 20, repeats: int = 10) -> Dict[str, Any]:
    """Two arrays reduced in memory (``b = a op b``), every rank at once, as
    GB/s of memory traffic (3 x bytes: two reads, one write), against numpy
    doing the same and against a plain copy (2 x bytes), the memory limit.
    AVG's division counts 2 x bytes (one read, one write); the two-rank AVG's
    combine (``b = (a + b) / 2``, one pass in pycoll, two in numpy) 3 x bytes."""
    import ml_dtypes

    from .. import kernels as k

    k.warmup(dtypes=["float16", ml_dtypes.bfloat16, "float32", "float64"], mpi=False)
    rng = np.random.default_rng(comm.Get_rank())
    src = np.empty(nbytes, np.uint8)
    dst = np.empty_like(src)
    copy_gbps = 2 * nbytes / _best(lambda: np.copyto(dst, src), repeats, comm) / 1e9
    slow = max(2, repeats // 3)  # numpy on 16-bit floats is slow: fewer repeats
    rows: List[Dict[str, Any]] = []
    for dtype in (
        np.dtype(np.float16),
        np.dtype(ml_dtypes.bfloat16),
        np.dtype(np.float32),
        np.dtype(np.float64),
    ):
        a = rng.standard_normal(nbytes // dtype.itemsize, dtype=np.float32).astype(dtype)
        b = a.copy()
        cases: List[Tuple[str, int, Callable[[], Any], Callable[[], Any]]] = [
            ("SUM", 3, partial(k.reduce, "SUM", a, b), partial(np.add, a, b, out=b)),
            ("MAX", 3, partial(k.reduce, "MAX", a, b), partial(np.maximum, a, b, out=b)),
            ("AVG divide", 2, partial(k.divide, b, 1, out=b), partial(np.divide, b, 1, out=b)),
            # divide_by=2 is the two-rank AVG's kernel, the MPI user op's combine
            (
                "AVG of two",
                3,
                partial(k.reduce, "SUM", a, b, divide_by=2),
                partial(_numpy_mean_of_two, a, b),
            ),
        ]
        for op, traffic, ours, theirs in cases:
            rows.append(
                dict(
                    dtype=str(dtype),
                    op=op,
                    bytes=a.nbytes,
                    pycoll_GBps=traffic * a.nbytes / _best(ours, repeats, comm) / 1e9,
                    numpy_GBps=traffic * a.nbytes / _best(theirs, slow, comm) / 1e9,
                )
            )
    return dict(
        ranks=comm.Get_size(),
        threads_per_rank=k.num_threads(),
        f16c=k.f16c(),
        copy_GBps=copy_gbps,
        rows=rows,
    )


def fusion(comm: Any, arrays: int = 1000, nbytes: int = 1024, rounds: int = 7) -> Dict[str, Any]:
    """``arrays`` float32 arrays of ``nbytes`` each, all-reduced (SUM): one call
    each, all_reduce_coalesced, FusedAllReduce over separate arrays (its
    default path, and packed into its buffer for MPI's all_reduce, the path
    it takes off one node) and over views into its buffer
    (FusedAllReduce.empty), against one all_reduce of the total size
    (pycoll's and raw mpi4py's).

    Every case's result is checked once against the expected sums first
    (``wrong`` counts differing elements, over all cases and ranks). Then
    ``rounds`` interleaved rounds: each times a block of every case, in an
    order rotated round by round, started together after a barrier; a
    block's time is the slowest rank's mean per call. A time is the median
    over rounds; a ratio is the median, and the range, of the per-round
    ratios, so the machine's drift between rounds cancels."""
    from mpi4py import MPI

    import pycoll
    from pycoll import fusion as fusion_mod

    from .table import _repeat, rotated

    rank, n = comm.Get_rank(), comm.Get_size()
    count = nbytes // 4
    grads = [np.zeros(count, np.float32) for _ in range(arrays)]
    one = np.zeros(count * arrays, np.float32)
    fused = pycoll.FusedAllReduce(grads)
    packed = pycoll.FusedAllReduce(grads)
    views = pycoll.FusedAllReduce.empty([(count,)] * arrays, np.float32)

    def through_mpi() -> None:
        saved, fusion_mod.SHM_BYTES = fusion_mod.SHM_BYTES, 0
        try:
            packed.all_reduce()
        finally:
            fusion_mod.SHM_BYTES = saved

    cases: Dict[str, Tuple[Callable[[], Any], List[np.ndarray]]] = {
        "separate": (lambda: [pycoll.all_reduce(g) for g in grads], grads),
        "coalesced": (lambda: pycoll.all_reduce_coalesced(grads), grads),
        "fused": (fused.all_reduce, grads),
        "fused_packed_mpi": (through_mpi, grads),
        "fused_views": (views.all_reduce, views.arrays),
        "one_call": (lambda: pycoll.all_reduce(one), [one]),
        "one_call_mpi4py": (lambda: comm.Allreduce(MPI.IN_PLACE, one, MPI.SUM), [one]),
    }
    wrong = 0
    for call, outputs in cases.values():
        for i, x in enumerate(outputs):
            x[...] = rank + 1 + i % 7
        call()
        for i, x in enumerate(outputs):
            expected = n * (n + 1) // 2 + n * (i % 7)
            wrong += int(np.count_nonzero(x != expected))
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    for _, outputs in cases.values():  # (timed on zeros: sums stay finite)
        for x in outputs:
            x[...] = 0
    # Calls per block: about 10 ms of each case, from the fastest of three
    # warm-up calls (the first calls of all_reduce_coalesced build what later
    # ones reuse), the slowest rank's, so every rank makes as many calls.
    blocks = {}
    for name, (call, _) in cases.items():
        took = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            took.append(time.perf_counter() - t0)
        slowest = comm.allreduce(min(took), op=MPI.MAX)
        blocks[name] = max(1, min(200, int(0.01 / max(slowest, 1e-6))))
    times = rotated(
        {name: _repeat(call) for name, (call, _) in cases.items()}, blocks, rounds, comm
    )

    def ratio(a: str, b: str) -> List[float]:
        per_round = sorted(x / y for x, y in zip(times[a], times[b]))
        return [statistics.median(per_round), per_round[0], per_round[-1]]

    report: Dict[str, Any] = dict(ranks=n, arrays=arrays, bytes_each=nbytes, rounds=rounds)
    for name in cases:
        report[f"{name}_us"] = statistics.median(times[name]) * 1e6
    for a in ("coalesced", "fused", "fused_packed_mpi", "fused_views"):
        report[f"{a}_over_one_call"] = ratio(a, "one_call")
    report["one_call_over_mpi4py"] = ratio("one_call", "one_call_mpi4py")
    report["separate_over_fused"] = ratio("separate", "fused")
    report["wrong"] = wrong
    return report


def overlap(comm: Any, nbytes: int = 16 << 20, repeats: int = 5) -> Dict[str, Any]:
    """An async all_reduce of ``nbytes`` while the caller runs numpy work that
    alone takes about as long: how long the pair takes, against the longer
    of the two alone (1.0 = perfect overlap, 2.0 = none)."""
    import pycoll

    x = np.zeros(nbytes // 4, np.float32)
    work = np.ones(1 << 18, np.float64)

    def compute(rounds: int) -> None:
        for _ in range(rounds):
            np.sqrt(work, out=work)

    t_comm = _best(lambda: pycoll.all_reduce(x), repeats, comm)
    t_one = _best(lambda: compute(1), 20, comm)
    rounds = max(1, int(round(t_comm / t_one)))
    t_comp = _best(lambda: compute(rounds), repeats, comm)

    def pair() -> None:
        pending = pycoll.all_reduce(x, async_op=True)
        compute(rounds)
        assert pending is not None
        pending.wait()

    t_pair = _best(pair, repeats, comm)
    return dict(
        ranks=comm.Get_size(),
        bytes=nbytes,
        all_reduce_ms=t_comm * 1e3,
        compute_ms=t_comp * 1e3,
        pair_ms=t_pair * 1e3,
        ratio=t_pair / max(t_comm, t_comp),
    )


def group_creation(count: int, comm: Any) -> Dict[str, Any]:
    """Time making ``count`` groups of two ranks (pairs 0-1, 2-3, ...) with and
    without ``use_local_synchronization``; collective over ``comm`` (a world-sized
    communicator of the caller's, used only to pass the signals below).

    With local synchronization the pairs go one after another: pair k starts
    only once pair k-1 has made all of its groups. Had a local new_group
    needed any rank outside its pair, this would never finish.
    """
    from mpi4py import MPI

    import pycoll

    world = pycoll.group.WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    if world is None or n % 2:
        raise ValueError("group creation is measured on an even number of ranks")
    pairs, mine = n // 2, rank // 2
    members = [2 * mine, 2 * mine + 1]
    per_pair = max(1, count // pairs)
    seq_before = world.sequence_number()

    comm.Barrier()
    if mine > 0:  # wait until the previous pair is done
        if rank % 2 == 0:
            comm.recv(source=rank - 2, tag=91)
            comm.send(None, dest=rank + 1, tag=92)
        else:
            comm.recv(source=rank - 1, tag=92)
    t0 = time.perf_counter()
    local = [pycoll.new_group(members, use_local_synchronization=True) for _ in range(per_pair)]
    t_local = (time.perf_counter() - t0) / per_pair
    if rank % 2 == 0 and mine < pairs - 1:
        comm.send(None, dest=rank + 2, tag=91)
    world_untouched = world.sequence_number() == seq_before
    for g in local:
        if isinstance(g, pycoll.ProcessGroup):
            pycoll.destroy_process_group(g)

    comm.Barrier()
    t0 = time.perf_counter()
    kept: List[Any] = []
    for _ in range(per_pair):
        for p in range(pairs):
            g = pycoll.new_group([2 * p, 2 * p + 1])
            if isinstance(g, pycoll.ProcessGroup):  # this rank's pair
                kept.append(g)
    t_global = (time.perf_counter() - t0) / (per_pair * pairs)
    for g in kept:
        pycoll.destroy_process_group(g)
    return dict(
        ranks=n,
        groups=per_pair * pairs,
        local_calls_per_rank=per_pair,
        global_calls_per_rank=per_pair * pairs,
        local_us_per_new_group=comm.allreduce(t_local, op=MPI.MAX) * 1e6,
        global_us_per_new_group=comm.allreduce(t_global, op=MPI.MAX) * 1e6,
        world_sequence_unchanged_by_local=bool(comm.allreduce(world_untouched, op=MPI.LAND)),
    )


# The pairs whose bandwidths the targets compare: (name, numerator, denominator,
# least ratio). The half types' SUM against float32's, each dtype's AVG
# against its own SUM.
TARGETS: Tuple[Tuple[str, Tuple[str, str], Tuple[str, str], float], ...] = (
    ("f16/f32 SUM", ("float16", "SUM"), ("float32", "SUM"), 0.8),
    ("bf16/f32 SUM", ("bfloat16", "SUM"), ("float32", "SUM"), 0.8),
    ("f32 AVG/SUM", ("float32", "AVG"), ("float32", "SUM"), 0.9),
    ("f16 AVG/SUM", ("float16", "AVG"), ("float16", "SUM"), 0.9),
    ("bf16 AVG/SUM", ("bfloat16", "AVG"), ("bfloat16", "SUM"), 0.9),
)


def _ratio(row: Dict[str, Any], name: str, rounds: List[float], least: float) -> None:
    """A ratio's entries in a row: the median of its rounds, their quartiles,
    min and max, the rounds themselves, and whether the median meets ``least``."""
    row[name] = statistics.median(rounds)
    q1, _, q3 = statistics.quantiles(rounds, n=4) if len(rounds) > 1 else rounds * 3
    row[name + " q1"], row[name + " q3"] = q1, q3
    row[name + " min"], row[name + " max"] = min(rounds), max(rounds)
    row[name + " rounds"] = rounds
    row[name + " met"] = row[name] >= least


def targets(
    comm: Any,
    sizes: List[int],
    rounds: int = 7,
    iters: int = 10,
    warmup: int = 2,
    pycoll_call: Optional[Callable[..., Any]] = None,
) -> Dict[str, Any]:
    """all_reduce of float32, float16 and bfloat16, SUM and AVG, at each size,
    timed in interleaved blocks so that the ratios the targets name are
    measured side by side in one run: on a shared machine the speed drifts
    from one run to the next by more than the differences looked for.

    Each of ``rounds`` rounds times a block of ``iters`` calls of every
    case, in an order rotated each round; a block's time is the median over
    ranks of each rank's mean per call. A ratio is the median over rounds of
    the two cases' bandwidth ratio within the round; its quartiles, min and
    max over rounds, and each round's ratio (to pool several runs) are
    reported too. Every case's result is checked against
    numpy once, before it is timed, and made until the live trials of its
    class have decided (pycoll.autotune), so the rounds time its path."""
    from mpi4py import MPI

    from ..arrays import BFLOAT16
    from .table import Case, RawOps, in_trials, settle, time_block

    cases = [(dtype, op) for op in ("SUM", "AVG") for dtype in ("float32", "float16", "bfloat16")]
    dtypes: Dict[str, np.dtype] = {
        "float32": np.dtype(np.float32),
        "float16": np.dtype(np.float16),
        "bfloat16": BFLOAT16,
    }
    raw_ops = RawOps(MPI)
    rows: List[Dict[str, Any]] = []
    wrong = 0
    try:
        for nbytes in sizes:
            made = {
                key: Case(
                    "all_reduce", nbytes, dtypes[key[0]], key[1], 0, comm, raw_ops, pycoll_call
                )
                for key in cases
            }
            for case in made.values():
                before = in_trials()
                wrong += comm.allreduce(case.wrong("pycoll", "in-place"), op=MPI.SUM)
                call = case.pycoll["in-place"]
                for _ in range(warmup):
                    call()
                run = case.runner("pycoll", "in-place")
                if run is not None:
                    settle({"pycoll": run}, before=before)
            seconds: Dict[Tuple[str, str], List[float]] = {key: [] for key in cases}
            for r in range(rounds):
                for key in cases[r % len(cases) :] + cases[: r % len(cases)]:
                    mean = time_block(made[key].pycoll["in-place"], iters, 0, comm)
                    seconds[key].append(statistics.median(comm.allgather(mean)))
            row: Dict[str, Any] = {"bytes": made[cases[0]].bytes}
            for key in cases:
                row[f"{key[0]} {key[1]} GB/s"] = (
                    row["bytes"] / statistics.median(seconds[key]) / 1e9
                )
            for name, num, den, least in TARGETS:
                # bandwidth ratio = time ratio inverted, round by round
                paired = [d / n for n, d in zip(seconds[num], seconds[den])]
                _ratio(row, name, paired, least)
            rows.append(row)
    finally:
        raw_ops.free()
    return dict(
        ranks=comm.Get_size(),
        rounds=rounds,
        iters=iters,
        wrong=wrong,
        targets={name: least for name, _, _, least in TARGETS},
        all_met=all(row[name + " met"] for row in rows for name, *_ in TARGETS),
        rows=rows,
    )


def targets_table(report: Dict[str, Any]) -> str:
    """:func:`targets`' report as text: each case's algbw, then each ratio as
    its median over rounds, (its quartiles), and whether it meets its target."""
    names = [name for name, *_ in TARGETS]
    cases = (
        [k[: -len(" GB/s")] for k in report["rows"][0] if k.endswith(" GB/s")]
        if report["rows"]
        else []
    )
    lines = [
        f"# all_reduce, {report['ranks']} ranks, {report['rounds']} interleaved rounds of "
        f"{report['iters']} calls per case; algbw in GB/s; ratios: median over rounds "
        f"(first-third quartile), '+' where the target is met, '-' where not; wrong results: "
        f"{report['wrong']}",
        "# targets: "
        + ", ".join(f"{name} >= {least}" for name, least in report["targets"].items()),
        f"{'bytes':>9} "
        + " ".join(f"{c.replace('float', 'f'):>9}" for c in cases)
        + " | "
        + " ".join(f"{name:>19}" for name in names),
    ]
    for row in report["rows"]:
        cells = [f"{row[c + ' GB/s']:>9.3f}" for c in cases]
        ratios = [
            f"{row[n]:.2f} ({row[n + ' q1']:.2f}-{row[n + ' q3']:.2f}) "
            f"{'+' if row[n + ' met'] else '-'}"
            for n in names
        ]
        lines.append(
            f"{row['bytes']:>9} " + " ".join(cells) + " | " + " ".join(f"{r:>19}" for r in ratios)
        )
    return "\n".join(lines)


def pool_targets(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Several runs of :func:`targets` (their JSON) as one report: each ratio
    the median of every run's rounds together, its spread their min and max,
    each bandwidth the median of the runs'. The runs must share rank count
    and sizes."""
    first = reports[0]
    shape = [(r["ranks"], [row["bytes"] for row in r["rows"]]) for r in reports]
    if any(s != shape[0] for s in shape):
        raise ValueError(f"runs differ in ranks or sizes: {shape}; pool like with like")
    rows = []
    for i, row in enumerate(first["rows"]):
        pooled: Dict[str, Any] = {"bytes": row["bytes"]}
        for key in row:
            if key.endswith(" GB/s"):
                pooled[key] = statistics.median(r["rows"][i][key] for r in reports)
        for name, least in first["targets"].items():
            _ratio(
                pooled, name, [x for r in reports for x in r["rows"][i][name + " rounds"]], least
            )
        rows.append(pooled)
    return dict(
        ranks=first["ranks"],
        rounds=sum(r["rounds"] for r in reports),
        iters=first["iters"],
        wrong=sum(r["wrong"] for r in reports),
        targets=first["targets"],
        all_met=all(row[name + " met"] for row in rows for name in first["targets"]),
        rows=rows,
    )


def crosscheck_cost(comm: Any, rounds: int = 15, iters: int = 2000) -> Dict[str, Any]:
    """What the default mode's call check (pycoll.crosscheck) costs, in a
    training-like loop and at 8 B and 64 KiB.

    Three variants of each workload, timed in interleaved rounds (order
    rotated each round): pycoll on a group whose call check runs, pycoll on a
    group whose check is switched off (its calls still store their keys: that
    part is timed alone below), and raw mpi4py. The workloads: an 8-byte
    all_reduce; a 64 KiB all_reduce; a training step of five collectives (async
    all_reduces of 8 B, 4 KiB and 64 KiB waited together, then an 8-byte
    broadcast and an 8-byte all_reduce). Each variant's result is checked on
    every rank before it is timed. ``bookkeeping_ns`` is the per-call key store
    and exchange-point test alone, timed on one process."""
    from mpi4py import MPI

    import pycoll

    from .. import crosscheck
    from ..collectives.reduce import _ALL_REDUCE
    from ..crosscheck import COUNT
    from .table import time_block

    n = comm.Get_size()
    on: Any = pycoll.new_group()
    off: Any = pycoll.new_group()
    crosscheck.switch_off(off)
    sizes = {"8 B": 2, "4 KiB": 1024, "64 KiB": 16384}
    SUM, FLOAT, IN_PLACE = MPI.SUM, MPI.FLOAT, MPI.IN_PLACE

    def arrays() -> Dict[str, np.ndarray]:
        return {k: np.zeros(v, np.float32) for k, v in sizes.items()}

    held: Dict[str, Dict[str, np.ndarray]] = {}

    def pycoll_calls(name: str, group: Any) -> Dict[str, Callable[[], Any]]:
        a = held[name] = arrays()

        def step() -> None:
            works: List[Any] = [pycoll.all_reduce(a[k], group=group, async_op=True) for k in sizes]
            for w in works:
                w.wait()
            pycoll.broadcast(a["8 B"], src=0, group=group)
            pycoll.all_reduce(a["8 B"], group=group)

        return {
            "all_reduce 8 B": lambda: pycoll.all_reduce(a["8 B"], group=group),
            "all_reduce 64 KiB": lambda: pycoll.all_reduce(a["64 KiB"], group=group),
            "training step": step,
        }

    raw = comm.Dup()
    r = held["mpi4py"] = arrays()

    def raw_step() -> None:
        reqs = [raw.Iallreduce(IN_PLACE, [r[k], FLOAT], SUM) for k in sizes]
        MPI.Request.Waitall(reqs)
        raw.Bcast([r["8 B"], FLOAT], 0)
        raw.Allreduce(IN_PLACE, [r["8 B"], FLOAT], SUM)

    variants = {
        "check on": pycoll_calls("check on", on),
        "check off": pycoll_calls("check off", off),
        "mpi4py": {
            "all_reduce 8 B": lambda: raw.Allreduce(IN_PLACE, [r["8 B"], FLOAT], SUM),
            "all_reduce 64 KiB": lambda: raw.Allreduce(IN_PLACE, [r["64 KiB"], FLOAT], SUM),
            "training step": raw_step,
        },
    }
    workloads = ["all_reduce 8 B", "all_reduce 64 KiB", "training step"]
    wrong = 0
    for name, calls in variants.items():  # every variant's result, checked once
        data = held[name]
        for work in workloads:
            for x in data.values():
                x[:] = comm.Get_rank() + 1
            calls[work]()
            want = n * (n + 1) / 2
            if work == "training step":  # 8 B: all-reduced, broadcast, all-reduced again
                ok = (data["8 B"] == n * want).all() and (data["64 KiB"] == want).all()
            else:
                ok = (data[work.split(" ", 1)[1]] == want).all()
            wrong += comm.allreduce(0 if ok else 1, op=MPI.SUM)
            for x in data.values():
                x[:] = 0  # sums of zeros stay finite while timed
    names = list(variants)
    seconds: Dict[Tuple[str, str], List[float]] = {(v, w): [] for v in names for w in workloads}
    for rnd in range(rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for work in workloads:
            count = iters if work != "training step" else max(1, iters // 5)
            for v in order:
                mean = time_block(variants[v][work], count, 2, comm)
                seconds[(v, work)].append(statistics.median(comm.allgather(mean)))
    rows = []
    for work in workloads:
        row: Dict[str, Any] = {"workload": work}
        for v in names:
            row[f"{v} us"] = statistics.median(seconds[(v, work)]) * 1e6
        on_s, off_s = seconds[("check on", work)], seconds[("check off", work)]
        paired = [a / b - 1 for a, b in zip(on_s, off_s)]
        _ratio(row, "check cost", paired, float("-inf"))
        rows.append(row)
    # The per-call part alone: the key, its store, the exchange-point test.
    how_key, keys, mask, seq, size = 7 << 35, on._keys, on._mask, 5, 2
    loops = 200_000
    t0 = time.perf_counter()
    for _ in range(loops):
        key = how_key | _ALL_REDUCE | size & COUNT
        slot = seq & mask
        keys[slot] = key
        if slot == mask:
            pass
    t1 = time.perf_counter()
    for _ in range(loops):
        pass
    t2 = time.perf_counter()
    bookkeeping = ((t1 - t0) - (t2 - t1)) / loops
    raw.Free()
    pycoll.destroy_process_group(on)
    pycoll.destroy_process_group(off)
    return dict(
        ranks=n,
        rounds=rounds,
        iters=iters,
        every=crosscheck.EVERY,
        wrong=wrong,
        bookkeeping_ns=bookkeeping * 1e9,
        rows=rows,
    )


def crosscheck_table(report: Dict[str, Any]) -> str:
    """:func:`crosscheck_cost`'s report as text."""
    lines = [
        f"{report['ranks']} ranks, {report['rounds']} rounds, check every {report['every']} "
        f"calls; per-call key store alone: {report['bookkeeping_ns']:.0f} ns; "
        f"wrong results: {report['wrong']}",
        f"{'workload':<20} {'check on':>10} {'check off':>10} {'mpi4py':>10} "
        f"{'check cost (q1..q3)':>24}",
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['workload']:<20} {row['check on us']:>8.2f}us {row['check off us']:>8.2f}us "
            f"{row['mpi4py us']:>8.2f}us {row['check cost'] * 100:>+8.1f}% "
            f"({row['check cost q1'] * 100:+.1f}..{row['check cost q3'] * 100:+.1f}%)"
        )
    return "\n".join(lines)
