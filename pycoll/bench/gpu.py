# ruff: noqa: B023  (each timed closure runs inside the loop iteration that made it)
"""GPU benchmarks: staged all_reduce of cupy arrays, and the device kernels.

Run under MPI on a GPU machine (``mpiexec -n 2 python -m pycoll.bench.gpu``).
For each size it times, in the same run and on the same data:

- ``pycoll cupy``: ``pycoll.all_reduce`` on a cupy array (staged through
  pinned memory when MPI is not CUDA-aware, chunked above PYCOLL_STAGE_CHUNK);
- ``naive cupy``: what a user writes without pycoll: ``cupy.asnumpy``,
  mpi4py's ``Allreduce`` on the host copy, ``cupy.asarray`` back;
- ``host numpy``: ``pycoll.all_reduce`` on a numpy array of the same size,
  the ceiling for any staging.

Then, on rank 0 alone, the device kernels' bandwidth (bytes read and written
per second) against a device-to-device copy and cupy's own ``a += b``.
Figures are medians over the iterations; every result is checked.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, List

import numpy as np

from .extras import _best  # median seconds per call, the slowest rank's


def _sizes(lo: int, hi: int, factor: int) -> List[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def _fmt(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def allreduce_table(args: argparse.Namespace) -> None:
    import cupy
    from mpi4py import MPI

    import pycoll
    import pycoll.gpu

    if not pycoll.is_initialized():
        pycoll.init_process_group()
    comm = MPI.COMM_WORLD
    rank, n = comm.rank, comm.size
    sync = cupy.cuda.get_current_stream().synchronize
    if rank == 0:
        print(f"# all_reduce SUM, {n} ranks, GB/s (algbw, median): {pycoll.gpu.cuda_aware()}")
        print(f"{'dtype':>8} {'size':>8} {'pycoll cupy':>12} {'naive cupy':>11} {'host numpy':>11}")
    for dtype in args.dtypes:
        dt = np.dtype(dtype)
        for nbytes in _sizes(args.min_bytes, args.max_bytes, args.factor):
            count = nbytes // dt.itemsize
            iters = 50 if nbytes <= (1 << 20) else 10 if nbytes <= (32 << 20) else 4
            base = np.arange(count) % 7
            x = cupy.asarray((base * (rank + 1)).astype(dt))
            h = (base * (rank + 1)).astype(dt)
            want = (base * (n * (n + 1) // 2)).astype(dt)

            def ours() -> None:
                pycoll.all_reduce(x)

            def naive() -> None:
                host = cupy.asnumpy(x)
                if dt == np.float16:  # MPI has no float16 SUM: the user's own op
                    comm.Allreduce(MPI.IN_PLACE, [host.view(np.uint16), MPI.UINT16_T], _f16_sum())
                else:
                    comm.Allreduce(MPI.IN_PLACE, host)
                x[...] = cupy.asarray(host)

            def host() -> None:
                pycoll.all_reduce(h)

            row = []
            for fn in (ours, naive, host):
                x[...] = cupy.asarray((base * (rank + 1)).astype(dt))
                h[...] = (base * (rank + 1)).astype(dt)
                fn()
                sync()
                got = cupy.asnumpy(x) if fn is not host else h
                if not np.array_equal(got, want):
                    raise SystemExit(f"wrong result: {fn.__name__} {dt} {nbytes}")
                x[...] = 0
                h[...] = 0  # zeros stay zeros under SUM: timing runs need no reset
                row.append(nbytes / _best(lambda: (fn(), sync()), iters, comm) / 1e9)
            if rank == 0:
                print(
                    f"{dt.name:>8} {_fmt(nbytes):>8} {row[0]:12.2f} {row[1]:11.2f} {row[2]:11.2f}"
                )
                sys.stdout.flush()


_F16_OP: Any = None


def _f16_sum() -> Any:
    """An mpi4py Python op summing float16 with numpy: what users write."""
    global _F16_OP
    if _F16_OP is None:
        from mpi4py import MPI

        def add(a: Any, b: Any, datatype: Any) -> None:
            x = np.frombuffer(a, np.float16)
            y = np.frombuffer(b, np.float16)
            y += x

        _F16_OP = MPI.Op.Create(add, commute=True)
    return _F16_OP


def kernel_table(args: argparse.Namespace) -> None:
    import cupy
    import ml_dtypes

    from pycoll.gpu import kernels
    from pycoll.gpu.device import adapt

    nbytes = args.kernel_bytes
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    def timed(fn: Callable[[], Any], reps: int = 20) -> float:
        fn()
        cupy.cuda.get_current_stream().synchronize()
        times = []
        for _ in range(reps):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        return float(np.median(times))

    src = cupy.random.random(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    copy_rate = 2 * nbytes / timed(lambda: dst.__setitem__(Ellipsis, src)) / 1e9
    print(f"# device kernels, {_fmt(nbytes)} per array, GB/s of bytes read + written (median)")
    print(f"device-to-device copy: {copy_rate:.0f} GB/s")
    print(f"{'dtype':>9} {'op':>5} {'pycoll kernel':>14} {'cupy a += b':>12} {'of copy rate':>13}")
    stream = cupy.cuda.get_current_stream().ptr or 1
    for dtype in ("float32", "float16", "bfloat16"):
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        count = nbytes // dt.itemsize
        words = np.random.default_rng(0).random(count, np.float32).astype(dt)
        a = cupy.asarray(words.view(np.uint16) if dtype == "bfloat16" else words)
        b = a.copy()
        da, db = adapt(a, "k", "a"), adapt(b, "k", "b")
        da.dtype = db.dtype = dt
        for op in ("SUM", "MAX"):
            ours = 3 * nbytes / timed(lambda: kernels.combine(da, db, op, stream)) / 1e9
            theirs = "-"
            if dtype != "bfloat16":
                fn = (lambda: a.__iadd__(b)) if op == "SUM" else (lambda: cupy.maximum(a, b, out=a))
                theirs = f"{3 * nbytes / timed(fn) / 1e9:.0f}"
            print(f"{dtype:>9} {op:>5} {ours:14.0f} {theirs:>12} {ours / copy_rate:13.2f}")
        ours = 2 * nbytes / timed(lambda: kernels.divide(da, 2, stream)) / 1e9
        print(f"{dtype:>9} {'AVG/':>5} {ours:14.0f} {'-':>12} {ours / copy_rate:13.2f}")


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pycoll.bench.gpu", description=__doc__)
    parser.add_argument("-b", "--min-bytes", type=int, default=1 << 10)
    parser.add_argument("-e", "--max-bytes", type=int, default=256 << 20)
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("-d", "--dtypes", nargs="+", default=["float32", "float16"])
    parser.add_argument("--kernel-bytes", type=int, default=256 << 20)
    parser.add_argument(
        "--chunks",
        type=int,
        nargs="+",
        metavar="BYTES",
        help="repeat the all_reduce table for each PYCOLL_STAGE_CHUNK value (0: unchunked)",
    )
    parser.add_argument("--no-kernels", action="store_true", help="skip the kernel table")
    parser.add_argument("--kernels-only", action="store_true", help="only the kernel table")
    args = parser.parse_args(argv)
    from mpi4py import MPI

    try:
        for chunk in [] if args.kernels_only else args.chunks or [None]:
            if chunk is not None:
                os.environ["PYCOLL_STAGE_CHUNK"] = str(chunk)
                if MPI.COMM_WORLD.rank == 0:
                    print(f"== PYCOLL_STAGE_CHUNK={chunk}")
            allreduce_table(args)
        if MPI.COMM_WORLD.rank == 0 and not args.no_kernels:
            kernel_table(args)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)  # the other ranks would wait for this one forever


if __name__ == "__main__":
    main()
