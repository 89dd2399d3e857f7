"""The nccl-tests-style table: every collective, a size sweep, pycoll against
raw mpi4py on the same buffers, each result checked.

Sizes follow nccl-tests: ``bytes`` is the whole buffer the operation is
named for (the reduced array for all_reduce, the gathered output for
all_gather, the input for reduce_scatter and all_to_all), and

    algbw = bytes / time,    busbw = algbw x factor,

with factor 2(n-1)/n for all_reduce, 1 for broadcast and reduce, and
(n-1)/n for all_gather, reduce_scatter and all_to_all, so busbw compares
with the link's speed whatever the collective. Times are each rank's mean
per call over a block of ``iters`` calls after ``warmup`` calls (OSU's
defaults: 1000/100 up to 8 KiB, 100/10 above); the table shows their median
over ranks, and min/max, and bandwidths from the median.

The raw mpi4py column is what a user without pycoll would write: MPI's
builtin op where MPI has one, else ``MPI.Op.Create`` over numpy (float16,
bfloat16, and AVG as a SUM plus a numpy division).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

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


def osu_iterations(nbytes: int) -> Tuple[int, int]:
    """(iterations, warm-up) as the OSU micro-benchmarks choose them."""
    return (1000, 100) if nbytes <= 8 << 10 else (100, 10)


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


def _fill(target: np.ndarray, values: np.ndarray, *zeroed: np.ndarray) -> Callable[[], None]:
    """A callable that zeroes ``zeroed`` and then writes ``values`` into ``target``."""

    def fill() -> None:
        for z in zeroed:
            z.fill(0)
        target[...] = values

    return fill


class Case:
    """One collective at one size: its buffers, its three variants, its check."""

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
    ) -> None:
        import pycoll

        from ..arrays import mpi_datatype

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
        call = pycoll_call  # a replacement for pycoll's collective (testing the check)
        f: Callable[..., Any]
        self.variants: Dict[str, Optional[Callable[[], Any]]] = {}
        self.inputs: Dict[str, Callable[[], None]] = {}
        self.results: Dict[str, Callable[[], np.ndarray]] = {}
        self.buffers: List[np.ndarray] = []

        def prescaled(x: np.ndarray) -> np.ndarray:
            return x * dtype.type(PREMUL_SCALE) if op == "PREMUL_SUM" else x

        def prescale_in_place(x: np.ndarray) -> None:
            if op == "PREMUL_SUM":  # scale in place, as pycoll does, then reduce
                np.multiply(x, dtype.type(PREMUL_SCALE), out=x)

        if collective == "all_reduce":
            buf = np.zeros(count, dtype)
            self.buffers = [buf]
            f = call or pycoll.all_reduce
            self.variants["in-place"] = lambda: f(buf, op=rop)
            self.variants["out-of-place"] = None  # torch's all_reduce is in place only

            def raw() -> None:
                prescale_in_place(buf)
                comm.Allreduce(MPI.IN_PLACE, [buf, T], mop)
                if avg:
                    np.divide(buf, n, out=buf)

            self.variants["mpi4py"] = raw
            self.inputs["in-place"] = _fill(buf, pattern(rank, count, dtype, op))
            self.results["in-place"] = lambda: buf
            self.expected = expected_reduction([pattern(r, count, dtype, op) for r in range(n)], op)
        elif collective == "broadcast":
            buf = np.zeros(count, dtype)
            self.buffers = [buf]
            f = call or pycoll.broadcast
            self.variants["in-place"] = lambda: f(buf, src=root)
            self.variants["out-of-place"] = None
            self.variants["mpi4py"] = lambda: comm.Bcast([buf, T], root)
            self.inputs["in-place"] = _fill(buf, pattern(rank, count, dtype, op))
            self.results["in-place"] = lambda: buf
            self.expected = pattern(root, count, dtype, op)
        elif collective == "reduce":
            buf = np.zeros(count, dtype)
            self.buffers = [buf]
            f = call or pycoll.reduce
            self.variants["in-place"] = lambda: f(buf, dst=root, op=rop)
            self.variants["out-of-place"] = None

            def raw() -> None:
                if rank == root:
                    prescale_in_place(buf)
                    comm.Reduce(MPI.IN_PLACE, [buf, T], mop, root)
                    if avg:
                        np.divide(buf, n, out=buf)
                else:
                    comm.Reduce([prescaled(buf), T], None, mop, root)

            self.variants["mpi4py"] = raw
            self.inputs["in-place"] = _fill(buf, pattern(rank, count, dtype, op))
            self.results["in-place"] = lambda: buf
            mine = pattern(rank, count, dtype, op)
            total = expected_reduction([pattern(r, count, dtype, op) for r in range(n)], op)
            self.expected = total if rank == root else mine
        elif collective == "all_gather":
            send = np.zeros(count, dtype)
            out = np.zeros(count * n, dtype)
            self.buffers = [send, out]
            f = call or pycoll.all_gather_into_tensor
            mine = out[rank * count : (rank + 1) * count]
            self.variants["out-of-place"] = lambda: f(out, send)
            self.variants["in-place"] = lambda: f(out, mine)
            self.variants["mpi4py"] = lambda: comm.Allgather([send, T], [out, T])
            self.inputs["out-of-place"] = _fill(send, pattern(rank, count, dtype, op), out)
            self.inputs["in-place"] = _fill(mine, pattern(rank, count, dtype, op), out)
            self.results["out-of-place"] = self.results["in-place"] = lambda: out
            self.expected = np.concatenate([pattern(r, count, dtype, op) for r in range(n)])
        elif collective == "reduce_scatter":
            send = np.zeros(count * n, dtype)
            out = np.zeros(count, dtype)
            self.buffers = [send, out]
            f = call or pycoll.reduce_scatter_tensor
            mine = send[rank * count : (rank + 1) * count]
            self.variants["out-of-place"] = lambda: f(out, send, op=rop)
            self.variants["in-place"] = lambda: f(mine, send, op=rop)

            def raw() -> None:
                comm.Reduce_scatter_block([prescaled(send), T], [out, T], mop)
                if avg:
                    np.divide(out, n, out=out)

            self.variants["mpi4py"] = raw
            full = lambda r: pattern(r, count * n, dtype, op)  # noqa: E731
            self.inputs["out-of-place"] = _fill(send, full(rank), out)
            self.inputs["in-place"] = _fill(send, full(rank))
            self.results["out-of-place"] = lambda: out
            self.results["in-place"] = lambda: mine
            total = expected_reduction([full(r) for r in range(n)], op)
            self.expected = total[rank * count : (rank + 1) * count]
        elif collective == "all_to_all":
            send = np.zeros(count * n, dtype)
            out = np.zeros(count * n, dtype)
            self.buffers = [send, out]
            f = call or pycoll.all_to_all_single
            self.variants["out-of-place"] = lambda: f(out, send)
            self.variants["in-place"] = lambda: f(send, send)
            self.variants["mpi4py"] = lambda: comm.Alltoall([send, T], [out, T])
            full = lambda r: pattern(r * 7919, count * n, dtype, op)  # noqa: E731
            self.inputs["out-of-place"] = _fill(send, full(rank), out)
            self.inputs["in-place"] = _fill(send, full(rank))
            self.results["out-of-place"] = lambda: out
            self.results["in-place"] = lambda: send
            self.expected = np.concatenate(
                [full(r)[rank * count : (rank + 1) * count] for r in range(n)]
            )
        else:
            raise ValueError(
                f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}"
            )

    def wrong(self, variant: str) -> int:
        """Run ``variant`` once on fresh inputs; count the elements that differ
        from numpy's independently computed answer on this rank. The buffers
        are zeroed again afterwards, so repeated timed calls never overflow."""
        self.inputs[variant]()
        self.variants[variant]()  # type: ignore[misc]
        got = self.results[variant]()
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


def spread(comm: Any, seconds: float) -> Dict[str, float]:
    """Median, min and max over ranks, in microseconds."""
    times = comm.allgather(seconds)
    return {
        "median": statistics.median(times) * 1e6,
        "min": min(times) * 1e6,
        "max": max(times) * 1e6,
    }


def measure(
    collective: str,
    nbytes: int,
    comm: Any,
    dtype: Any = np.float32,
    op: str = "SUM",
    root: int = 0,
    iters: Optional[int] = None,
    warmup: Optional[int] = None,
    check: bool = True,
    raw_ops: Optional[RawOps] = None,
    pycoll_call: Optional[Callable[..., Any]] = None,
) -> Dict[str, Any]:
    """One row of the table (collective over ``comm``: every rank calls it)."""
    from mpi4py import MPI

    dtype = np.dtype(dtype)
    own_ops = raw_ops is None
    ops = raw_ops or RawOps(MPI)
    try:
        case = Case(collective, nbytes, dtype, op, root, comm, ops, pycoll_call)
        default_iters, default_warmup = osu_iterations(case.bytes)
        iters = default_iters if iters is None else iters
        warmup = default_warmup if warmup is None else warmup
        n = comm.Get_size()
        row: Dict[str, Any] = dict(
            collective=collective,
            bytes=case.bytes,
            count=case.count,
            type=str(dtype),
            redop=op if collective in REDUCING else None,
            root=root if collective in ("broadcast", "reduce") else None,
            ranks=n,
            iters=iters,
            warmup=warmup,
        )
        fac = factor(collective, n)
        correct = True
        for variant in ("out-of-place", "in-place", "mpi4py"):
            call = case.variants[variant]
            key = variant.replace("-", "_")
            if call is None:
                row[key] = None
                continue
            t = spread(comm, time_block(call, iters, warmup, comm))
            algbw = case.bytes / (t["median"] / 1e6) / 1e9
            entry: Dict[str, Any] = dict(time_us=t, algbw_GBps=algbw, busbw_GBps=algbw * fac)
            if check and variant != "mpi4py":
                wrong = comm.allreduce(case.wrong(variant), op=MPI.SUM)
                entry["wrong"] = wrong
                correct = correct and wrong == 0
            row[key] = entry
        best = min(
            row[k]["time_us"]["median"] for k in ("out_of_place", "in_place") if row[k] is not None
        )
        row["ratio"] = best / row["mpi4py"]["time_us"]["median"]
        row["correct"] = correct if check else None
        return row
    finally:
        if own_ops:
            ops.free()


def _cell(entry: Optional[Dict[str, Any]], check: bool) -> str:
    if entry is None:
        return f"{'-':>9} {'-':>9} {'-':>9}" + (f" {'-':>9}" if check else "")
    t = entry["time_us"]["median"]
    text = f"{t:>9.1f} {entry['algbw_GBps']:>9.3f} {entry['busbw_GBps']:>9.3f}"
    if check:
        text += f" {entry['wrong']:>9}"
    return text


def header(check: bool) -> str:
    """Column names: oop_ are pycoll out of place, ip_ in place, mpi_ raw mpi4py."""

    def side(prefix: str) -> str:
        wrong = f" {prefix + 'wrong':>9}" if check else ""
        return f"{prefix + 'us':>9} {prefix + 'algbw':>9} {prefix + 'busbw':>9}{wrong}"

    return (
        f"{'collective':<14} {'bytes':>10} {'count':>9} {'type':>8} {'redop':>10} {'root':>4} | "
        f"{side('oop_')} | {side('ip_')} | {'mpi_us':>9} {'mpi_busbw':>9} | "
        f"{'ratio':>5} {'min_us':>9} {'max_us':>9}"
    )


def line(row: Dict[str, Any], check: bool) -> str:
    """One printed row: pycoll's two variants, raw mpi4py, and the spread over
    ranks of pycoll's faster variant."""
    best = min(
        (row[k] for k in ("out_of_place", "in_place") if row[k] is not None),
        key=lambda e: e["time_us"]["median"],
    )
    raw = row["mpi4py"]
    return (
        f"{row['collective']:<14} {row['bytes']:>10} {row['count']:>9} {row['type']:>8} "
        f"{row['redop'] or '-':>10} {row['root'] if row['root'] is not None else '-':>4} | "
        f"{_cell(row['out_of_place'], check)} | {_cell(row['in_place'], check)} | "
        f"{raw['time_us']['median']:>9.1f} {raw['busbw_GBps']:>9.3f} | "
        f"{row['ratio']:>5.2f} {best['time_us']['min']:>9.1f} {best['time_us']['max']:>9.1f}"
    )
