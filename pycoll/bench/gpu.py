# ruff: noqa: B023  (each timed closure in kernel_table runs inside the loop iteration that made it)
"""GPU benchmarks: staged all_reduce of device arrays, and the device kernels.

Run under MPI on a GPU machine (``mpiexec -n 2 python -m pycoll.bench.gpu``).
For each dtype and size it times, in one run, on the same machine state, an
in-place all_reduce SUM of the same number of bytes by:

- ``staged``: ``pycoll.all_reduce`` on a cupy array (or a torch CUDA tensor,
  ``--arrays torch``), staged through pinned memory when MPI is not
  CUDA-aware, in chunks of PYCOLL_STAGE_CHUNK bytes (the default), and once
  more for each ``--chunks`` value (0: the whole array at once, so the host
  call takes pycoll's own large-array paths, pycoll.collectives.reduce);
- ``host pycoll``: ``pycoll.all_reduce`` on a numpy array;
- ``host mpi4py``: mpi4py's ``Allreduce`` on a numpy array: MPI's own host
  all_reduce, the reference every ratio is taken against (float16 and
  bfloat16, which MPI cannot add, through an ``MPI.Op.Create`` over numpy,
  as a raw mpi4py user would);
- ``gloo``: torch.distributed's gloo backend on a torch CUDA tensor.

The cases are timed round by round, in an order rotated each round: a round
times a block of calls of every case (the slowest rank's mean per call, each
call followed by a device synchronization). The table gives each case's
median algbw and the median (and range) over rounds of MPI's time over its
time: above 1 is faster than MPI's host all_reduce. Every case's result,
mpi4py's and gloo's included, is checked against numpy on every rank before
it is timed.

Then, on rank 0 alone, the device kernels' bandwidth (bytes read and written
per second) against a device-to-device copy and cupy's own ``a += b``.

``--arrays cpu`` runs every case on host arrays (torch CPU tensors for gloo):
a check of the benchmark itself on a machine without a GPU, whose figures
mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import sizes
from .table import RawOps, _repeat, expected_reduction, pattern, rotated, slowest_block

BLOCK_S = 0.1  # a block of one case's calls lasts about this long


def _fmt(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


class Arrays:
    """The bench's device arrays: cupy's, torch's CUDA tensors, or (``cpu``)
    host arrays standing in for them (torch CPU tensors, numpy arrays without
    torch), to check the bench without a GPU. torch, where installed, also
    makes gloo's tensors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.cupy: Any = None
        self.torch: Any = None
        if kind == "cupy":
            import cupy

            self.cupy = cupy
        try:
            import torch

            self.torch = torch
        except ImportError:
            if kind == "torch":
                raise

    def make(self, host: np.ndarray) -> Any:
        """A device array holding ``host``'s values."""
        if self.kind == "cupy":
            return self.cupy.asarray(host)
        if self.torch is None:
            return host.copy()
        return self.tensor(host, "cpu" if self.kind == "cpu" else "cuda")

    def tensor(self, host: np.ndarray, device: str) -> Any:
        """A torch tensor on ``device`` holding ``host``'s values."""
        torch = self.torch
        if host.dtype.name == "bfloat16":  # numpy cannot hand torch a bfloat16
            return torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16).to(device)
        return torch.from_numpy(host.copy()).to(device)

    def read(self, x: Any, dtype: np.dtype) -> np.ndarray:
        """``x``'s values in host memory, as ``dtype``."""
        if isinstance(x, np.ndarray):
            return x
        if self.cupy is not None and isinstance(x, self.cupy.ndarray):
            return self.cupy.asnumpy(x)
        x = x.cpu()
        if dtype.name == "bfloat16":
            return x.view(self.torch.int16).numpy().view(dtype)
        return x.numpy()

    def sync(self) -> None:
        """Wait for everything queued on the device, on every stream."""
        if self.kind == "cupy":
            self.cupy.cuda.Device().synchronize()
        elif self.kind == "torch":
            self.torch.cuda.synchronize()


def _gloo(comm: Any, device: str) -> Any:
    """torch.distributed with a gloo group of every rank, where gloo can
    all-reduce tensors on ``device``; None otherwise (without torch, say)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_initialized():
        import socket

        port = 0
        if comm.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = comm.bcast(port)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
        )
    error = ""
    try:  # gloo's CUDA support is a build option: try it once
        probe = torch.ones(4, device=device)
        dist.all_reduce(probe)
        if probe.cpu().tolist() != [comm.size] * 4:
            error = f"gloo's all_reduce gave {probe.cpu().tolist()}"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    errors = comm.allgather(error)
    if any(errors):
        if comm.rank == 0:
            print(f"# gloo left out: {next(e for e in errors if e)}")
        return None
    return dist


def _with_chunk(chunk: Optional[int], call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with PYCOLL_STAGE_CHUNK set to ``chunk`` (None: as it was)."""
    if chunk is None:
        return call

    def go() -> Any:
        before = os.environ.get("PYCOLL_STAGE_CHUNK")
        os.environ["PYCOLL_STAGE_CHUNK"] = str(chunk)
        try:
            return call()
        finally:
            if before is None:
                del os.environ["PYCOLL_STAGE_CHUNK"]
            else:
                os.environ["PYCOLL_STAGE_CHUNK"] = before

    return go


Case = Tuple[str, Callable[[], Any], Callable[[], np.ndarray], Callable[[np.ndarray], None]]


def _cases(
    args: argparse.Namespace,
    dev: Arrays,
    dist: Any,
    raw_ops: RawOps,
    dtype: np.dtype,
    mine: np.ndarray,
) -> List[Case]:
    """(name, timed call, result reader, input setter) for every case at one
    size (``raw_ops``: the ops a raw mpi4py user reduces with)."""
    import pycoll
    from pycoll import _mpi
    from pycoll.gpu import staging

    MPI = _mpi.MPI
    comm = MPI.COMM_WORLD
    cases: List[Case] = []
    x = dev.make(mine)

    def put_x(v: np.ndarray) -> None:
        x[...] = dev.make(v)

    def staged() -> None:
        pycoll.all_reduce(x)
        dev.sync()

    default = staging.chunk_bytes()
    cases.append(
        (
            f"staged {_fmt(default) if default else 'whole'}",
            staged,
            lambda: dev.read(x, dtype),
            put_x,
        )
    )
    for chunk in args.chunks:
        if chunk != default:
            label = f"staged {_fmt(chunk) if chunk else 'whole'}"
            cases.append((label, _with_chunk(chunk, staged), lambda: dev.read(x, dtype), put_x))
    h = mine.copy()
    cases.append(
        ("host pycoll", lambda: pycoll.all_reduce(h), lambda: h, lambda v: np.copyto(h, v))
    )
    m = mine.copy()
    op = raw_ops.get("SUM", dtype)
    if dtype.itemsize == 2 and dtype.kind != "i":  # float16, bfloat16: MPI has no such type
        buf = [m.view(np.uint16), MPI.UINT16_T]
    else:
        buf = m

    def raw() -> None:
        comm.Allreduce(MPI.IN_PLACE, buf, op)

    cases.append(("host mpi4py", raw, lambda: m, lambda v: np.copyto(m, v)))
    if dist is not None:
        device = "cpu" if dev.kind == "cpu" else "cuda"
        t = dev.tensor(mine, device)

        def gloo() -> None:
            dist.all_reduce(t)
            dev.sync()

        def put_t(v: np.ndarray) -> None:
            t.copy_(dev.tensor(v, device))

        cases.append(("gloo", gloo, lambda: dev.read(t, dtype), put_t))
    return cases


def allreduce_table(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import pycoll
    import pycoll.gpu
    from pycoll.arrays import BFLOAT16

    if not pycoll.is_initialized():
        pycoll.init_process_group()
    comm = MPI.COMM_WORLD
    rank, n = comm.rank, comm.size
    dev = Arrays(args.arrays)
    dist = None if args.no_gloo else _gloo(comm, "cpu" if args.arrays == "cpu" else "cuda")
    raw_ops = RawOps(MPI)
    if rank == 0:
        print(f"# all_reduce SUM in place, {n} ranks, {args.rounds} interleaved rounds")
        print(f"# {_machine(dev)}")
        print(f"# MPI: {MPI.Get_library_version().splitlines()[0]}; {pycoll.gpu.cuda_aware()}")
        print(
            "# algbw GB/s (median over rounds); in brackets MPI's host time over the "
            "case's, median (min-max) of per-round ratios: above 1 is faster than MPI"
        )
    for name in args.dtypes:
        dtype = BFLOAT16 if name == "bfloat16" else np.dtype(name)
        for nbytes in sizes(args.min_bytes, args.max_bytes, args.factor):
            count = nbytes // dtype.itemsize
            inputs = [pattern(r, count, dtype, "SUM") for r in range(n)]
            want = expected_reduction(inputs, "SUM")
            cases = _cases(args, dev, dist, raw_ops, dtype, inputs[rank])
            iters: Dict[str, int] = {}
            for label, call, result, put in cases:
                put(np.zeros_like(inputs[rank]))
                for _ in range(args.warmup):  # untimed: first calls make windows, caches, kernels
                    call()
                put(inputs[rank])
                call()
                got = result()
                bad = comm.allgather(not np.array_equal(got.view(np.uint8), want.view(np.uint8)))
                if any(bad):
                    ranks = [r for r, b in enumerate(bad) if b]
                    raise SystemExit(
                        f"{label}: wrong result on ranks {ranks}, {name} {_fmt(nbytes)}"
                    )
                put(np.zeros_like(inputs[rank]))  # zeros stay zeros: timed calls need no reset
                t = slowest_block(_repeat(call), 2, comm)  # warm: the first call made the caches
                iters[label] = max(1, min(args.max_iters, int(BLOCK_S / max(t, 1e-9))))
            runs = {label: _repeat(call) for label, call, _, _ in cases}
            times = rotated(runs, iters, args.rounds, comm)
            if rank == 0:
                ref = times["host mpi4py"]
                print(f"{name:>8} {_fmt(nbytes):>8}", end="")
                for label, *_ in cases:
                    gbps = nbytes / statistics.median(times[label]) / 1e9
                    over = [a / b for a, b in zip(ref, times[label])]
                    spread = f"{statistics.median(over):.2f} ({min(over):.2f}-{max(over):.2f})"
                    print(f" | {label}: {gbps:.2f} [{spread}]", end="")
                print(flush=True)
    raw_ops.free()


def _machine(dev: Arrays) -> str:
    """One line: cores, the GPU, the array library, torch."""
    parts = [f"{os.cpu_count()} cores", platform.python_version()]
    if dev.kind == "cupy":
        props = dev.cupy.cuda.runtime.getDeviceProperties(0)
        parts.append(props["name"].decode() if isinstance(props["name"], bytes) else props["name"])
        parts.append(f"cupy {dev.cupy.__version__}")
    if dev.torch is not None:
        parts.append(f"torch {dev.torch.__version__}")
        if dev.kind == "torch":
            parts.append(dev.torch.cuda.get_device_name(0))
    parts.append(f"numpy {np.__version__}")
    return ", ".join(parts)


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


def _parser() -> argparse.ArgumentParser:
    from . import parse_size

    parser = argparse.ArgumentParser(prog="python -m pycoll.bench.gpu", description=__doc__)
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=1 << 20, help="default 1M")
    parser.add_argument(
        "-e", "--max-bytes", type=parse_size, default=256 << 20, help="default 256M"
    )
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("-d", "--dtypes", nargs="+", default=["float32", "float16"])
    parser.add_argument("-R", "--rounds", type=int, default=5, help="interleaved rounds (5)")
    parser.add_argument(
        "--max-iters",
        type=int,
        default=50,
        help="most calls in one block (50; a block lasts about 0.1 s)",
    )
    parser.add_argument(
        "--arrays",
        choices=("cupy", "torch", "cpu"),
        default="cupy",
        help="the staged cases' arrays: cupy (default), torch CUDA tensors, or host arrays "
        "(cpu: checks the bench itself without a GPU)",
    )
    parser.add_argument(
        "--chunks",
        type=parse_size,
        nargs="*",
        default=[4 << 20, 0],
        metavar="BYTES",
        help="a staged case for each PYCOLL_STAGE_CHUNK value besides the default "
        "(default: 4M 0; 0 stages the whole array at once)",
    )
    parser.add_argument(
        "-w", "--warmup", type=int, default=5, help="untimed calls of each case first (5)"
    )
    parser.add_argument("--no-gloo", action="store_true", help="leave out gloo's case")
    parser.add_argument("--kernel-bytes", type=parse_size, default=256 << 20)
    parser.add_argument("--no-kernels", action="store_true", help="skip the kernel table")
    parser.add_argument("--kernels-only", action="store_true", help="only the kernel table")
    return parser


def main(argv: Any = None) -> None:
    args = _parser().parse_args(argv)
    from mpi4py import MPI

    try:
        if not args.kernels_only:
            allreduce_table(args)
        if MPI.COMM_WORLD.rank == 0 and not args.no_kernels and args.arrays != "cpu":
            kernel_table(args)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)  # the other ranks would wait for this one forever


if __name__ == "__main__":
    main()
