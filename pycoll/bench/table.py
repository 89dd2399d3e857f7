"""The nccl-tests-style table: every collective, a size sweep, pycoll against
raw mpi4py on the same buffers, each result checked.

Like is compared with like: pycoll's in-place call with mpi4py's MPI_IN_PLACE
call, its out-of-place call with mpi4py's out-of-place one, each row one
kind; where the MPI ships a compiler wrapper, a third column times the same
call in a C loop on the same libmpi in the same process (pycoll.bench.floor),
the floor both sit above. The variants are timed round by round: each round
times a block of calls of every variant, in an order rotated each round, so
a machine's drift touches all of them alike; a time is the slowest rank's
mean per call in its block, the table shows the median over rounds, and a
ratio is the median (and range) of the per-round ratios. Every variant's
result, mpi4py's and the C loop's included, is checked against numpy once,
before it is timed.

Sizes follow nccl-tests: ``bytes`` is the whole buffer the operation is
named for (the reduced array for all_reduce, the gathered output for
all_gather, the input for reduce_scatter and all_to_all), and

    algbw = bytes / time,    busbw = algbw x factor,

with factor 2(n-1)/n for all_reduce, 1 for broadcast and reduce, and
(n-1)/n for all_gather, reduce_scatter and all_to_all, so busbw compares
with the link's speed whatever the collective. A block holds ``iters``
calls: by default as many as fill about 10 ms of mpi4py's calls (at most
2000), agreed by every rank.

The raw mpi4py column is what a user without pycoll would write: MPI's
builtin op where MPI has one, else ``MPI.Op.Create`` over numpy (float16,
bfloat16, and AVG as a SUM plus a numpy division).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple, Union

import numpy as np

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
)
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
PREMUL_SCALE = 0.5  # exact in every floating dtype, so the check stays exact


def factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def pattern(rank: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Rank ``rank``'s input: small integers, so every reduction is exact."""
    k = np.arange(count) + rank
    if dtype == np.bool_:
        return k % 3 == 0
    values = k % 2 + 1 if op == "PRODUCT" else k % 5 + 1
    return values.astype(np.float64).astype(dtype)


def expected_reduction(inputs: List[np.ndarray], op: str) -> np.ndarray:
    """numpy's reduction of every rank's input, computed independently of pycoll."""
    dtype, n = inputs[0].dtype, len(inputs)
    if dtype == np.bool_:
        fn: Any = np.logical_and if op in ("PRODUCT", "MIN", "BAND") else np.logical_or
        if op == "BXOR":
            fn = np.logical_xor
        return fn.reduce(np.stack(inputs))
    # Small integers: exact in float64 (and complex128), whatever the order.
    wide = {"f": np.float64, "V": np.float64, "c": np.complex128}.get(dtype.kind)
    values = [x.astype(wide) if wide else x for x in inputs]
    if op == "PREMUL_SUM":
        values = [x * PREMUL_SCALE for x in values]
    ufunc = {
        "SUM": np.add,
        "AVG": np.add,
        "PREMUL_SUM": np.add,
        "PRODUCT": np.multiply,
        "MIN": np.minimum,
        "MAX": np.maximum,
        "BAND": np.bitwise_and,
        "BOR": np.bitwise_or,
        "BXOR": np.bitwise_xor,
    }[op]
    total = ufunc.reduce(np.stack(values)).astype(dtype)
    if op == "AVG":  # one division in the dtype, as torch (and pycoll) do it
        total = (total / dtype.type(n)).astype(dtype)
    return total


class RawOps:
    """The ops a raw mpi4py user would reduce with, created once, freed at the end."""

    def __init__(self, MPI: Any) -> None:
        self.MPI = MPI
        self._made: Dict[Tuple[str, np.dtype], Any] = {}

    def get(self, op: str, dtype: np.dtype) -> Any:
        from ..arrays import dtype_kind

        name = "SUM" if op in ("AVG", "PREMUL_SUM") else op
        kind = dtype_kind(dtype)
        if kind != "half":
            builtin = {"PRODUCT": "PROD"}.get(name, name)
            if kind == "bool":
                builtin = {"SUM": "LOR", "MAX": "LOR", "PROD": "LAND", "MIN": "LAND"}.get(
                    builtin, "L" + builtin[1:] if builtin.startswith("B") else builtin
                )
            return getattr(self.MPI, builtin)
        key = (name, dtype)
        if key not in self._made:
            ufunc = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum}[
                name
            ]

            def apply(a: Any, b: Any, datatype: Any) -> None:
                x = np.frombuffer(a, dtype)
                y = np.frombuffer(b, dtype)
                with np.errstate(all="ignore"):
                    ufunc(x, y, out=y)

            self._made[key] = self.MPI.Op.Create(apply, commute=True)
        return self._made[key]

    def free(self) -> None:
        for op in self._made.values():
            op.Free()
        self._made.clear()


KINDS = ("in-place", "out-of-place")
SIDES = ("pycoll", "plans", "mpi4py", "c")
BLOCK_S = 0.01  # a block of calls lasts about this long (calibrated on mpi4py's)
MAX_ITERS = 2000
SETTLE_CALLS = 100  # at most, to finish the live trials of a size before its rounds


def _fill(target: np.ndarray, values: np.ndarray, *zeroed: np.ndarray) -> Callable[[], None]:
    """A callable that zeroes ``zeroed`` and then writes ``values`` into ``target``."""

    def fill() -> None:
        for z in zeroed:
            z.fill(0)
        target[...] = values

    return fill


def _repeat(call: Callable[[], Any]) -> Callable[[int], None]:
    """``iters`` calls of ``call`` in a Python loop (pycoll's and mpi4py's
    sides pay the same loop)."""

    def run(iters: int) -> None:
        for _ in range(iters):
            call()

    return run


class Case:
    """One collective at one size: its buffers and, for each kind (in-place,
    out-of-place) it has, pycoll's call, raw mpi4py's call with the same
    semantics, and the C floor's loop where one is given and applies; each
    kind's inputs, where its result lands, and numpy's expected answer.

    ``pycoll[kind]`` and ``mpi4py[kind]`` make one call; ``c[kind]`` takes a
    number of calls to loop over in C.
    """

    def __init__(
        self,
        collective: str,
        nbytes: int,
        dtype: np.dtype,
        op: str,
        root: int,
        comm: Any,
        raw_ops: RawOps,
        pycoll_call: Optional[Callable[..., Any]] = None,
        floor: Any = None,
        plans_group: Any = None,
    ) -> None:
        import pycoll

        from ..arrays import dtype_kind, mpi_datatype

        MPI = raw_ops.MPI
        n, rank = comm.Get_size(), comm.Get_rank()
        item = dtype.itemsize
        per_rank = collective in ("all_gather", "reduce_scatter", "all_to_all")
        count = max(1, nbytes // item // n) if per_rank else max(1, nbytes // item)
        self.count = count  # elements per rank's part
        self.bytes = count * item * (n if per_rank else 1)
        T = mpi_datatype(dtype)
        rop = pycoll.make_premul_sum(PREMUL_SCALE) if op == "PREMUL_SUM" else pycoll.ReduceOp(op)
        mop = raw_ops.get(op, dtype) if collective in REDUCING else None
        avg = op == "AVG"
        # The C loop calls MPI and nothing else: for MPI's own ops and types only.
        plain_mpi = collective not in REDUCING or (
            op not in ("AVG", "PREMUL_SUM") and dtype_kind(dtype) != "half"
        )
        c = floor if plain_mpi else None
        call = pycoll_call  # a replacement for pycoll's collective (testing the check)
        f: Callable[..., Any]
        self.plans_group = plans_group
        self.pycoll: Dict[str, Callable[..., Any]] = {}  # each takes the group (default None)
        self.mpi4py: Dict[str, Callable[[], Any]] = {}
        self.c: Dict[str, Callable[[int], None]] = {}
        self.inputs: Dict[str, Callable[[], None]] = {}
        self.results: Dict[str, Callable[[], np.ndarray]] = {}
        self.buffers: List[np.ndarray] = []
        IP = "in-place"
        OOP = "out-of-place"

        def prescaled(x: np.ndarray) -> np.ndarray:
            return x * dtype.type(PREMUL_SCALE) if op == "PREMUL_SUM" else x

        def prescale_in_place(x: np.ndarray) -> None:
            if op == "PREMUL_SUM":  # scale in place, as pycoll does, then reduce
                np.multiply(x, dtype.type(PREMUL_SCALE), out=x)

        if collective == "all_reduce":
            buf = np.zeros(count, dtype)
            self.buffers = [buf]
            f = call or pycoll.all_reduce
            self.pycoll[IP] = lambda g=None: f(buf, op=rop, group=g)  # torch's: in place only

            def raw() -> None:
                prescale_in_place(buf)
                comm.Allreduce(MPI.IN_PLACE, [buf, T], mop)
                if avg:
                    np.divide(buf, n, out=buf)

            self.mpi4py[IP] = raw
            if c:
                self.c[IP] = c.loop(collective, comm, None, buf, count, T, mop, in_place=True)
            self.inputs[IP] = _fill(buf, pattern(rank, count, dtype, op))
            self.results[IP] = lambda: buf
            self.expected = expected_reduction([pattern(r, count, dtype, op) for r in range(n)], op)
        elif collective == "broadcast":
            buf = np.zeros(count, dtype)
            self.buffers = [buf]
            f = call or pycoll.broadcast
            self.pycoll[IP] = lambda g=None: f(buf, src=root, group=g)
            self.mpi4py[IP] = lambda: comm.Bcast([buf, T], root)
            if c:
                self.c[IP] = c.loop(collective, comm, None, buf, count, T, root=root)
            self.inputs[IP] = _fill(buf, pattern(rank, count, dtype, op))
            self.results[IP] = lambda: buf
            self.expected = pattern(root, count, dtype, op)
        elif collective == "reduce":
            buf = np.zeros(count, dtype)
            self.buffers = [buf]
            f = call or pycoll.reduce
            self.pycoll[IP] = lambda g=None: f(buf, dst=root, op=rop, group=g)

            def raw() -> None:
                if rank == root:
                    prescale_in_place(buf)
                    comm.Reduce(MPI.IN_PLACE, [buf, T], mop, root)
                    if avg:
                        np.divide(buf, n, out=buf)
                else:
                    comm.Reduce([prescaled(buf), T], None, mop, root)

            self.mpi4py[IP] = raw
            if c:
                self.c[IP] = c.loop(collective, comm, buf, buf, count, T, mop, root, True)
            self.inputs[IP] = _fill(buf, pattern(rank, count, dtype, op))
            self.results[IP] = lambda: buf
            mine = pattern(rank, count, dtype, op)
            total = expected_reduction([pattern(r, count, dtype, op) for r in range(n)], op)
            self.expected = total if rank == root else mine
        elif collective == "all_gather":
            send = np.zeros(count, dtype)
            out = np.zeros(count * n, dtype)
            self.buffers = [send, out]
            f = call or pycoll.all_gather_into_tensor
            own = out[rank * count : (rank + 1) * count]
            self.pycoll[OOP] = lambda g=None: f(out, send, group=g)
            self.pycoll[IP] = lambda g=None: f(out, own, group=g)
            self.mpi4py[OOP] = lambda: comm.Allgather([send, T], [out, T])
            self.mpi4py[IP] = lambda: comm.Allgather(MPI.IN_PLACE, [out, T])
            if c:
                self.c[OOP] = c.loop(collective, comm, send, out, count, T)
                self.c[IP] = c.loop(collective, comm, None, out, count, T, in_place=True)
            self.inputs[OOP] = _fill(send, pattern(rank, count, dtype, op), out)
            self.inputs[IP] = _fill(own, pattern(rank, count, dtype, op), out)
            self.results[OOP] = self.results[IP] = lambda: out
            self.expected = np.concatenate([pattern(r, count, dtype, op) for r in range(n)])
        elif collective == "reduce_scatter":
            send = np.zeros(count * n, dtype)
            out = np.zeros(count, dtype)
            self.buffers = [send, out]
            f = call or pycoll.reduce_scatter_tensor
            own = send[rank * count : (rank + 1) * count]
            self.pycoll[OOP] = lambda g=None: f(out, send, op=rop, group=g)
            self.pycoll[IP] = lambda g=None: f(own, send, op=rop, group=g)

            def raw() -> None:
                comm.Reduce_scatter_block([prescaled(send), T], [out, T], mop)
                if avg:
                    np.divide(out, n, out=out)

            def raw_in_place() -> None:
                # MPI leaves the part at the start of the buffer; torch's
                # in-place form has it in this rank's own part: one copy.
                prescale_in_place(send)
                comm.Reduce_scatter_block(MPI.IN_PLACE, [send, count, T], mop)
                if rank:
                    own[...] = send[:count]
                if avg:
                    np.divide(own, n, out=own)

            self.mpi4py[OOP] = raw
            self.mpi4py[IP] = raw_in_place
            if c:
                self.c[OOP] = c.loop(collective, comm, send, out, count, T, mop)
                self.c[IP] = c.loop(collective, comm, send, own, count, T, mop, in_place=True)
            full = lambda r: pattern(r, count * n, dtype, op)  # noqa: E731
            self.inputs[OOP] = _fill(send, full(rank), out)
            self.inputs[IP] = _fill(send, full(rank))
            self.results[OOP] = lambda: out
            self.results[IP] = lambda: own
            total = expected_reduction([full(r) for r in range(n)], op)
            self.expected = total[rank * count : (rank + 1) * count]
        elif collective == "all_to_all":
            send = np.zeros(count * n, dtype)
            out = np.zeros(count * n, dtype)
            self.buffers = [send, out]
            f = call or pycoll.all_to_all_single
            self.pycoll[OOP] = lambda g=None: f(out, send, group=g)
            self.pycoll[IP] = lambda g=None: f(send, send, group=g)
            self.mpi4py[OOP] = lambda: comm.Alltoall([send, T], [out, T])
            self.mpi4py[IP] = lambda: comm.Alltoall(MPI.IN_PLACE, [send, T])
            if c:
                self.c[OOP] = c.loop(collective, comm, send, out, count, T)
                self.c[IP] = c.loop(collective, comm, None, send, count, T, in_place=True)
            full = lambda r: pattern(r * 7919, count * n, dtype, op)  # noqa: E731
            self.inputs[OOP] = _fill(send, full(rank), out)
            self.inputs[IP] = _fill(send, full(rank))
            self.results[OOP] = lambda: out
            self.results[IP] = lambda: send
            self.expected = np.concatenate(
                [full(r)[rank * count : (rank + 1) * count] for r in range(n)]
            )
        else:
            raise ValueError(
                f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}"
            )
        self.kinds = [k for k in KINDS if k in self.pycoll]

    def runner(self, side: str, kind: str) -> Optional[Callable[[int], None]]:
        """``side``'s ``kind`` as a callable of a number of calls; None if it has none.
        The ``plans`` side is pycoll's call on ``plans_group`` (a group with
        pycoll.persistent's plans on), where one was given."""
        if side == "c":
            return self.c.get(kind)
        if side == "plans":
            if self.plans_group is None or kind not in self.pycoll:
                return None
            call, group = self.pycoll[kind], self.plans_group
            return _repeat(lambda: call(group))
        calls = self.pycoll if side == "pycoll" else self.mpi4py
        return _repeat(calls[kind]) if kind in calls else None

    def wrong(self, side: str, kind: str) -> int:
        """Run ``side``'s ``kind`` once on fresh inputs; count the elements that
        differ from numpy's independently computed answer on this rank. The
        buffers are zeroed again afterwards, so repeated timed calls never
        overflow."""
        run = self.runner(side, kind)
        if run is None:
            raise ValueError(f"{side} has no {kind} variant here")
        self.inputs[kind]()
        run(1)
        got = self.results[kind]()
        if got.shape != self.expected.shape:
            bad = int(self.expected.size)
        else:
            bad = int(np.count_nonzero(got != self.expected))
        for buf in self.buffers:
            buf.fill(0)
        return bad


def time_block(call: Callable[[], Any], iters: int, warmup: int, comm: Any) -> float:
    """This rank's mean seconds per call over ``iters`` calls, after ``warmup``."""
    for _ in range(warmup):
        call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def slowest_block(run: Callable[[int], None], iters: int, comm: Any) -> float:
    """The slowest rank's mean seconds per call over a block of ``iters``
    calls, started together after a barrier."""
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    run(iters)
    return float(comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))


def rotated(
    runs: Dict[str, Callable[[int], None]],
    iters: Union[int, Dict[str, int]],
    rounds: int,
    comm: Any,
    warmup: int = 0,
) -> Dict[str, List[float]]:
    """Each run's :func:`slowest_block` of ``iters`` calls (or ``iters[name]``)
    in each of ``rounds`` rounds, the order rotated by one every round, so
    the machine's drift falls on every run alike; ``warmup`` calls before
    each block, untimed."""
    times: Dict[str, List[float]] = {name: [] for name in runs}
    order = list(runs)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            run = runs[name]
            if warmup:
                run(warmup)
            block = iters if isinstance(iters, int) else iters[name]
            times[name].append(slowest_block(run, block, comm))
    return times


def against(times: Dict[str, List[float]], base: str, scale: float = 1.0, digits: int = 2) -> str:
    """One line of :func:`rotated`'s figures: each run's median (times
    ``scale``) and, in parentheses, the median over the rounds of its time
    over run ``base``'s in the same round."""
    ref = np.array(times[base])
    return "; ".join(
        f"{name} {np.median(v) * scale:.{digits}f} ({np.median(np.array(v) / ref):.2f})"
        for name, v in times.items()
    )


def bandwidth_header(base: str, label: str, names: List[str]) -> str:
    """The head of a paths table of :func:`bandwidth_row` rows: run ``base``'s
    GB/s (headed ``label``), then a column for each other run of ``names``."""
    return f"{'':>7s} {label + ' GB/s':>12s}" + "".join(f"{k:>10s}" for k in names if k != base)


def bandwidth_row(nbytes: int, times: Dict[str, List[float]], base: str) -> str:
    """One row of a paths table from :func:`rotated`'s figures: the size,
    run ``base``'s GB/s (``nbytes`` over its median time), then for each other
    run the median over the rounds of its time over ``base``'s in the same round."""
    if nbytes >= 1 << 20:
        size = f"{nbytes >> 20}M"
    else:
        size = f"{nbytes >> 10}K" if nbytes >= 1 << 10 else f"{nbytes}B"
    ref = times[base]
    row = f"{size:>7s} {nbytes / np.median(ref) / 1e9:12.2f}"
    for name, v in times.items():
        if name != base:
            row += f"{np.median([b / a for a, b in zip(ref, v)]):10.2f}"
    return row


def _sides(plans_group: Any) -> List[Tuple[str, Any]]:
    """pycoll's sides and their groups: its own on the default group, the
    plans side's on ``plans_group``."""
    import pycoll

    return [("pycoll", pycoll.group.WORLD), ("plans", plans_group)]


def in_trials(plans_group: Any = None) -> Dict[str, FrozenSet[Any]]:
    """For each of pycoll's sides, the classes of its group's calls in the
    live trials now (pycoll.autotune), before a size's first call."""
    from pycoll import autotune

    return {side: autotune.pending(g) for side, g in _sides(plans_group) if g is not None}


def settle(
    runs: Dict[str, Callable[[int], None]],
    plans_group: Any = None,
    before: Optional[Dict[str, FrozenSet[Any]]] = None,
) -> None:
    """Make pycoll's calls until the live trials (pycoll.autotune) of the
    classes they started (those not in ``before``, from :func:`in_trials`)
    have decided, so that the rounds time the path a job's later calls take,
    not the trials' turns; at most SETTLE_CALLS each."""
    from pycoll import autotune

    for side, group in _sides(plans_group):
        run = runs.get(side)
        old = (before or {}).get(side, frozenset())
        for _ in range(SETTLE_CALLS):
            if run is None or group is None or not autotune.pending(group) - old:
                break
            run(1)


def calibrate(run: Callable[[int], None], comm: Any) -> int:
    """Calls per block: as many as fill about ``BLOCK_S`` (at most
    ``MAX_ITERS``), from the slowest rank's time for a few calls, so every
    rank agrees."""
    probe = 1
    while True:
        t = slowest_block(run, probe, comm)
        if t * probe >= BLOCK_S / 10 or probe >= MAX_ITERS:
            return max(1, min(MAX_ITERS, int(BLOCK_S / t)))
        probe *= 10


def _ratios(num: List[float], den: List[float]) -> Dict[str, float]:
    paired = [a / b for a, b in zip(num, den)]
    return {"median": statistics.median(paired), "min": min(paired), "max": max(paired)}


def measure(
    collective: str,
    nbytes: int,
    comm: Any,
    dtype: Any = np.float32,
    op: str = "SUM",
    root: int = 0,
    rounds: int = 7,
    iters: Optional[int] = None,
    warmup: Optional[int] = None,
    check: bool = True,
    raw_ops: Optional[RawOps] = None,
    pycoll_call: Optional[Callable[..., Any]] = None,
    floor: Any = None,
    plans_group: Any = None,
) -> List[Dict[str, Any]]:
    """The table's rows for one collective at one size, one per kind
    (in-place, out-of-place) it has (collective over ``comm``: every rank
    calls it). ``floor`` is a loaded :class:`pycoll.bench.floor.Floor`, or
    None to leave the C column out."""
    from mpi4py import MPI

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    dtype = np.dtype(dtype)
    own_ops = raw_ops is None
    ops = raw_ops or RawOps(MPI)
    rows: List[Dict[str, Any]] = []
    try:
        case = Case(collective, nbytes, dtype, op, root, comm, ops, pycoll_call, floor, plans_group)
        n = comm.Get_size()
        fac = factor(collective, n)
        for kind in case.kinds:
            before = in_trials(plans_group)
            runs = {s: go for s in SIDES if (go := case.runner(s, kind)) is not None}
            wrong: Dict[str, Optional[int]] = dict.fromkeys(runs)
            if check:
                for side in runs:
                    wrong[side] = comm.allreduce(case.wrong(side, kind), op=MPI.SUM)
            calls = (20 if case.bytes <= 8 << 10 else 2) if warmup is None else warmup
            for run in runs.values():
                run(calls)
            settle(runs, plans_group, before)
            block = calibrate(runs["mpi4py"], comm) if iters is None else iters
            seconds = rotated(runs, block, rounds, comm)
            row: Dict[str, Any] = dict(
                collective=collective,
                kind=kind,
                bytes=case.bytes,
                count=case.count,
                type=str(dtype),
                redop=op if collective in REDUCING else None,
                root=root if collective in ("broadcast", "reduce") else None,
                ranks=n,
                iters=block,
                rounds=rounds,
            )
            for side in SIDES:
                if side not in runs:
                    row[side] = None
                    continue
                t = statistics.median(seconds[side])
                algbw = case.bytes / t / 1e9
                row[side] = dict(
                    time_us=t * 1e6, algbw_GBps=algbw, busbw_GBps=algbw * fac, wrong=wrong[side]
                )
            row["ratio"] = _ratios(seconds["pycoll"], seconds["mpi4py"])
            has_plans = "plans" in runs
            row["plans_ratio"] = _ratios(seconds["plans"], seconds["mpi4py"]) if has_plans else None
            has_c = "c" in runs
            row["mpi4py_over_c"] = _ratios(seconds["mpi4py"], seconds["c"]) if has_c else None
            row["pycoll_over_c"] = _ratios(seconds["pycoll"], seconds["c"]) if has_c else None
            row["correct"] = all(w == 0 for w in wrong.values()) if check else None
            rows.append(row)
        return rows
    finally:
        if own_ops:
            ops.free()


def header(check: bool, with_plans: bool = False) -> str:
    """Column names: pycoll's (and with plans, pycoll's on a group with
    pycoll.persistent's plans on), raw mpi4py's and the C floor's time per
    call (us) and pycoll's bus bandwidth (GB/s), then the ratios."""
    wrong = f" {'wrong':>7}" if check else ""
    plans = f" {'plans_us':>9}" if with_plans else ""
    plans_ratio = f" {'plans/mpi4py (range)':>22}" if with_plans else ""
    return (
        f"{'collective':<14} {'kind':<12} {'bytes':>10} {'type':>8} {'redop':>10} | "
        f"{'pycoll_us':>10}{plans} {'mpi4py_us':>10} {'C_us':>10} {'busbw':>7} | "
        f"{'pycoll/mpi4py (range)':>22}{plans_ratio} {'mpi4py/C':>8} {'pycoll/C':>8}{wrong}"
    )


def line(row: Dict[str, Any], check: bool, with_plans: bool = False) -> str:
    """One printed row."""

    def us(side: str) -> str:
        entry = row[side]
        return f"{'-':>10}" if entry is None else f"{entry['time_us']:>10.1f}"

    def over_c(key: str) -> str:
        r = row[key]
        return f"{'-':>8}" if r is None else f"{r['median']:>8.2f}"

    def spread(key: str) -> str:
        r = row[key]
        text = "-" if r is None else f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
        return f" {text:>22}"

    plans = f" {us('plans')[1:]}" if with_plans else ""
    text = (
        f"{row['collective']:<14} {row['kind']:<12} {row['bytes']:>10} {row['type']:>8} "
        f"{row['redop'] or '-':>10} | {us('pycoll')}{plans} {us('mpi4py')} {us('c')} "
        f"{row['pycoll']['busbw_GBps']:>7.2f} |{spread('ratio')}"
        f"{spread('plans_ratio') if with_plans else ''} {over_c('mpi4py_over_c')} "
        f"{over_c('pycoll_over_c')}"
    )
    if check:
        text += f" {sum(v['wrong'] for s in SIDES if (v := row[s]) is not None):>7}"
    return text
