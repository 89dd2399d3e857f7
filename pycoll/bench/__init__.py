"""pycoll-bench: pycoll's collectives against raw mpi4py and a C loop, like for like, in one run.

Run under MPI: ``pycoll-run -n 4 pycoll-bench ...``, ``mpiexec -n 4 pycoll-bench``
or ``scripts/bench``. The default is an nccl-tests-style table (see
:mod:`pycoll.bench.table`); ``--kernels``, ``--fusion``, ``--overlap`` and
``--groups`` measure one thing each, and ``--targets`` times float32,
float16 and bfloat16 all_reduce SUM and AVG side by side in one run for the
ratios between them (see :mod:`pycoll.bench.extras`).
``--json`` prints one JSON document instead of text. The exit status is 1 when
any checked result was wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from . import extras, table
from .table import COLLECTIVES, measure

__all__ = ["main", "measure", "COLLECTIVES"]

_OPS = ("sum", "prod", "min", "max", "avg", "premulsum", "band", "bor", "bxor")
_OP_NAMES = {"prod": "PRODUCT", "premulsum": "PREMUL_SUM"}


def parse_size(text: str) -> int:
    """'64M' -> 67108864; K, M and G are powers of 1024, a trailing B or iB
    is allowed (64MiB, 64MB)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    clean = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if clean and clean[-1] in units:
            return int(float(clean[:-1]) * units[clean[-1]])
        return int(clean)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write bytes, or a number with K, M or G (16M, 16MiB)"
        ) from None


def sizes(lo: int, hi: int, factor: int) -> List[int]:
    """lo, lo*factor, ... up to hi, as nccl-tests' -b/-e/-f."""
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pycoll-bench",
        description="pycoll's collectives against raw mpi4py in one run, nccl-tests style "
        "(run it under pycoll-run or mpiexec).",
    )
    p.add_argument(
        "--collectives",
        "--ops",
        default=",".join(COLLECTIVES),
        help=f"comma-separated, from {', '.join(COLLECTIVES)} (default: all)",
    )
    p.add_argument(
        "-b", "--minbytes", type=parse_size, default=None, help="default 8 (--targets: 1M)"
    )
    p.add_argument(
        "-e", "--maxbytes", type=parse_size, default=parse_size("64M"), help="default 64M"
    )
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier (default 2)")
    p.add_argument(
        "-d",
        "--datatype",
        default="float32",
        help="float32 (default), float16, bfloat16, float64, int32, ... any dtype pycoll supports",
    )
    p.add_argument(
        "-o",
        "--op",
        default="sum",
        choices=_OPS,
        help="reduction (default sum); premulsum scales by 0.5",
    )
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast and reduce")
    p.add_argument(
        "-n",
        "--iters",
        type=int,
        default=None,
        help="calls per timed block (default: as many as fill about 10 ms of mpi4py's, "
        "at most 2000; --targets: per case and round, default 10)",
    )
    p.add_argument(
        "-w",
        "--warmup_iters",
        type=int,
        default=None,
        help="untimed calls of each variant first (default 20 up to 8 KiB, 2 above; --targets: 2)",
    )
    p.add_argument(
        "-R",
        "--rounds",
        type=int,
        default=7,
        help="interleaved rounds: each times a block of every variant, in a rotated order "
        "(default 7)",
    )
    p.add_argument(
        "--plans",
        action="store_true",
        help="add a column: pycoll's call on a group with persistent plans on "
        "(PYCOLL_PERSISTENT=1's effect, pycoll.persistent)",
    )
    p.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the C floor column (a compiled loop on the same libmpi)",
    )
    p.add_argument(
        "-c",
        "--check",
        type=int,
        default=1,
        choices=(0, 1),
        help="check every result against numpy (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--kernels",
        action="store_true",
        help="the reduction kernels alone, GB/s against numpy and memory copy",
    )
    what.add_argument(
        "--fusion",
        type=int,
        nargs="?",
        const=1000,
        metavar="ARRAYS",
        help="ARRAYS (1000) x 1 KiB all-reduced separately, coalesced and fused",
    )
    what.add_argument(
        "--overlap",
        action="store_true",
        help="an async 16 MiB all_reduce overlapped with numpy work",
    )
    what.add_argument(
        "--groups",
        type=int,
        metavar="N",
        help="time making N groups of two ranks, with and without "
        "use_local_synchronization (even number of ranks)",
    )
    what.add_argument(
        "--crosscheck",
        type=int,
        nargs="?",
        const=15,
        metavar="ROUNDS",
        help="the default mode's call check on against off and raw mpi4py, at 8 B, "
        "64 KiB and in a training-like step, timed in ROUNDS (15) interleaved rounds",
    )
    what.add_argument(
        "--targets",
        type=int,
        nargs="?",
        const=7,
        metavar="ROUNDS",
        help="float16 and bfloat16 all_reduce SUM against float32, and AVG against SUM, "
        "timed in ROUNDS (7) interleaved rounds over -b..-e",
    )
    return p


def _text(report: Dict[str, Any]) -> str:
    return "\n".join(f"{k:<32} {_value(v)}" for k, v in report.items())


def _value(v: Any) -> str:
    """A float to 3 places; a ratio [median, lowest, highest] as "m (lo-hi)"."""
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list) and len(v) == 3 and all(isinstance(x, float) for x in v):
        return f"{v[0]:.2f} ({v[1]:.2f}-{v[2]:.2f})"
    return str(v)


def _floor(comm: Any) -> Any:
    """The C floor where every rank could load it, else None (on every rank)."""
    from mpi4py import MPI

    from . import floor

    loaded = floor.load()
    return loaded if comm.allreduce(loaded is not None, op=MPI.LAND) else None


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.stepfactor < 2:
        parser.error("-f/--stepfactor must be at least 2")
    if args.minbytes is None:
        args.minbytes = parse_size("1M" if args.targets else "8")
    if args.rounds < 1:
        parser.error("-R/--rounds must be at least 1")
    if args.targets is not None and args.targets < 1:
        parser.error("--targets: ROUNDS must be at least 1")
    chosen = [c.strip() for c in args.collectives.split(",") if c.strip()]
    for c in chosen:
        if c not in COLLECTIVES:
            parser.error(f"unknown collective {c!r}; choose from {', '.join(COLLECTIVES)}")
    op = _OP_NAMES.get(args.op, args.op.upper())

    import numpy as np

    import pycoll
    from pycoll.arrays import SUPPORTED_DTYPES

    names = {str(d): d for d in SUPPORTED_DTYPES}
    dtype = names.get(args.datatype)
    if dtype is None:
        parser.error(f"unknown datatype {args.datatype!r}; choose from {', '.join(names)}")
    pycoll.init_process_group()
    world = pycoll.group.WORLD
    if world is None:
        raise RuntimeError("pycoll-bench: the default process group did not initialize")
    if not 0 <= args.root < world.size():
        parser.error(f"--root {args.root} is not a rank (0..{world.size() - 1})")
    # The compiled fast path as a training loop has it after its first calls
    # (loaded now, not inside a timed block; PYCOLL_NATIVE=0 still turns it off).
    from pycoll import native

    native.attach(world)
    from mpi4py import MPI

    comm = world.comm.Dup()  # the raw side gets a communicator of its own
    rank = comm.Get_rank()
    mpi_name = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
    try:
        if args.targets:
            report = extras.targets(
                comm,
                sizes(args.minbytes, args.maxbytes, args.stepfactor),
                args.targets,
                10 if args.iters is None else args.iters,
                2 if args.warmup_iters is None else args.warmup_iters,
            )
            if rank == 0:
                report["mpi"] = mpi_name
                print(json.dumps(report, indent=1) if args.json else extras.targets_table(report))
            return 1 if report["wrong"] else 0
        if args.crosscheck:
            report = extras.crosscheck_cost(
                comm, args.crosscheck, 2000 if args.iters is None else args.iters
            )
            if rank == 0:
                report["mpi"] = mpi_name
                text = extras.crosscheck_table(report)
                print(json.dumps(report, indent=1) if args.json else text)
            return 1 if report["wrong"] else 0
        if args.kernels or args.fusion or args.overlap or args.groups:
            if args.kernels:
                report = extras.kernels(comm)
            elif args.fusion:
                report = extras.fusion(comm, arrays=args.fusion)
            elif args.overlap:
                report = extras.overlap(comm)
            else:
                report = extras.group_creation(args.groups, comm)
            if rank == 0:
                report["mpi"] = mpi_name
                rows = report.pop("rows", None)
                if args.json:
                    print(json.dumps(dict(report, rows=rows) if rows else report, indent=1))
                else:
                    print(_text(report))
                    if rows:
                        print(
                            f"{'dtype':>9} {'op':>11} {'bytes':>10} {'pycoll_GBps':>11} "
                            f"{'numpy_GBps':>10}"
                        )
                    for row in rows or []:
                        print(
                            f"{row['dtype']:>9} {row['op']:>11} {row['bytes']:>10} "
                            f"{row['pycoll_GBps']:>11.2f} {row['numpy_GBps']:>10.2f}"
                        )
            return 1 if report.get("wrong") else 0
        check = bool(args.check)
        raw_ops = table.RawOps(MPI)
        results: List[Dict[str, Any]] = []
        floor_ = None if args.no_floor else _floor(comm)
        planned = None
        if args.plans:
            from pycoll import persistent

            with persistent.forced():
                planned = pycoll.new_group()
            if isinstance(planned, pycoll.ProcessGroup):
                native.attach(planned)  # (its plans' calls compiled, as the world's)
        if rank == 0 and not args.json:
            print(f"# pycoll-bench: {comm.Get_size()} ranks, {mpi_name}")
            print(
                f"# {args.datatype}, op {op}; {args.rounds} interleaved rounds; a time is the "
                f"median over rounds of the slowest rank's mean per call (us), busbw is "
                f"pycoll's (GB/s); a ratio is the median of the per-round ratios; C: "
                + ("a compiled loop on the same libmpi" if floor_ else "not available here")
            )
            print(table.header(check, planned is not None))
        if any(c in table.REDUCING for c in chosen):
            from pycoll.ops import plan

            premul = op == "PREMUL_SUM"
            rop = pycoll.make_premul_sum(table.PREMUL_SCALE) if premul else pycoll.ReduceOp(op)
            try:
                plan(rop, np.dtype(dtype), "pycoll-bench")
            except ValueError as exc:
                parser.error(str(exc))
        for collective in chosen:
            for size in sizes(args.minbytes, args.maxbytes, args.stepfactor):
                rows = measure(
                    collective,
                    size,
                    comm,
                    dtype,
                    op,
                    args.root,
                    args.rounds,
                    args.iters,
                    args.warmup_iters,
                    check,
                    raw_ops,
                    floor=floor_,
                    plans_group=planned,
                )
                results += rows
                if rank == 0 and not args.json:
                    for row in rows:
                        print(table.line(row, check, planned is not None), flush=True)
        raw_ops.free()
        if rank == 0 and args.json:
            json.dump(
                dict(
                    ranks=comm.Get_size(),
                    mpi=mpi_name,
                    datatype=args.datatype,
                    op=op,
                    rounds=args.rounds,
                    c_floor=floor_ is not None,
                    plans=planned is not None,
                    check=check,
                    results=results,
                ),
                sys.stdout,
                indent=1,
            )
            print()
        return 0 if all(r["correct"] is not False for r in results) else 1
    finally:
        comm.Free()
        pycoll.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
