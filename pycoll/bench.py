"""pycoll-bench: pycoll's collectives against raw mpi4py, like for like, in one run.

Run under MPI, e.g. ``mpiexec -n 4 pycoll-bench`` or ``scripts/bench``. For
each operation and size it checks one result, then times alternating blocks
of pycoll calls and of the equivalent raw mpi4py calls on the same buffers,
in A-B, B-A order (so drift in the machine's speed hits both alike). A block's time is the
slowest rank's; the figure reported is the median block, per call.

Bandwidths follow nccl-tests: algbw = bytes / time, busbw = algbw x factor,
where the factor is 2(n-1)/n for all_reduce, 1 for broadcast and (n-1)/n for
all_gather, whose bytes are the whole gathered output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

__all__ = ["main", "measure"]

OPS = ("all_reduce", "broadcast", "all_gather")


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _sizes(lo: int, hi: int, factor: int) -> List[int]:
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def _iterations(nbytes: int) -> int:
    """More calls for small messages, fewer for large (OSU-like counts)."""
    if nbytes <= 8 << 10:
        return 1000
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 16 << 20:
        return 20
    return 5


def _setup(op: str, count: int, comm: Any, MPI: Any) -> Dict[str, Any]:
    """The buffers and the two callables (pycoll, mpi4py) for one op and size."""
    import pycoll

    n, rank = comm.Get_size(), comm.Get_rank()
    if op == "all_reduce":
        buf = np.zeros(count, np.float32)
        return dict(
            pycoll=lambda: pycoll.all_reduce(buf),
            mpi=lambda: comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], MPI.SUM),
            check=lambda: _check_all_reduce(buf, rank, n, pycoll),
            nbytes=buf.nbytes,
            factor=2 * (n - 1) / n,
        )
    if op == "broadcast":
        buf = np.zeros(count, np.float32)
        return dict(
            pycoll=lambda: pycoll.broadcast(buf, src=0),
            mpi=lambda: comm.Bcast([buf, MPI.FLOAT], 0),
            check=lambda: _check_broadcast(buf, rank, pycoll),
            nbytes=buf.nbytes,
            factor=1.0,
        )
    if op == "all_gather":
        mine = np.full(count, rank, np.float32)
        out = np.zeros(count * n, np.float32)
        return dict(
            pycoll=lambda: pycoll.all_gather_into_tensor(out, mine),
            mpi=lambda: comm.Allgather([mine, MPI.FLOAT], [out, MPI.FLOAT]),
            check=lambda: _check_all_gather(out, mine, count, n, pycoll),
            nbytes=out.nbytes,
            factor=(n - 1) / n,
        )
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def _check_all_reduce(buf: np.ndarray, rank: int, n: int, pycoll: Any) -> bool:
    buf[:] = rank + 1
    pycoll.all_reduce(buf)
    ok = bool(np.all(buf == n * (n + 1) / 2))
    buf[:] = 0
    return ok


def _check_broadcast(buf: np.ndarray, rank: int, pycoll: Any) -> bool:
    buf[:] = 7 if rank == 0 else -1
    pycoll.broadcast(buf, src=0)
    return bool(np.all(buf == 7))


def _check_all_gather(out: np.ndarray, mine: np.ndarray, count: int, n: int, pycoll: Any) -> bool:
    out[:] = -1
    pycoll.all_gather_into_tensor(out, mine)
    return bool(np.array_equal(out, np.repeat(np.arange(n, dtype=np.float32), count)))


def _block(call: Callable[[], Any], iters: int, comm: Any, MPI: Any) -> float:
    """Seconds per call over one block, as seen by the slowest rank."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    elapsed = (time.perf_counter() - t0) / iters
    return comm.allreduce(elapsed, op=MPI.MAX)


def measure(
    op: str, nbytes: int, comm: Any, iters: Optional[int] = None, blocks: int = 7, warmup: int = 10
) -> Dict[str, Any]:
    """Time one op at one size (bytes of float32 per rank); collective over ``comm``."""
    from mpi4py import MPI

    count = max(1, nbytes // 4)
    bufs = _setup(op, count, comm, MPI)
    ok = comm.allreduce(bufs["check"](), op=MPI.LAND)
    iters = iters or _iterations(nbytes)
    for _ in range(warmup):
        bufs["pycoll"]()
        bufs["mpi"]()
    ours, theirs = [], []
    for i in range(blocks):
        # A-B then B-A: whichever side runs first in a pair gets no lasting edge.
        if i % 2 == 0:
            ours.append(_block(bufs["pycoll"], iters, comm, MPI))
            theirs.append(_block(bufs["mpi"], iters, comm, MPI))
        else:
            theirs.append(_block(bufs["mpi"], iters, comm, MPI))
            ours.append(_block(bufs["pycoll"], iters, comm, MPI))
    t_ours, t_mpi = statistics.median(ours), statistics.median(theirs)
    algbw = bufs["nbytes"] / t_ours / 1e9
    return dict(
        op=op,
        bytes=count * 4,
        ranks=comm.Get_size(),
        iters=iters,
        blocks=blocks,
        pycoll_us=t_ours * 1e6,
        mpi4py_us=t_mpi * 1e6,
        algbw_GBps=algbw,
        busbw_GBps=algbw * bufs["factor"],
        mpi4py_busbw_GBps=bufs["nbytes"] / t_mpi / 1e9 * bufs["factor"],
        time_ratio=t_ours / t_mpi,
        bw_ratio=t_mpi / t_ours,
        correct=bool(ok),
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


def _row(r: Dict[str, Any]) -> str:
    return (
        f"{r['op']:<11} {r['bytes']:>10} {r['pycoll_us']:>11.2f} {r['mpi4py_us']:>11.2f} "
        f"{r['algbw_GBps']:>8.3f} {r['busbw_GBps']:>8.3f} {r['mpi4py_busbw_GBps']:>8.3f} "
        f"{r['time_ratio']:>6.3f} {'ok' if r['correct'] else 'WRONG':>5}"
    )


HEADER = (
    f"{'op':<11} {'bytes':>10} {'pycoll_us':>11} {'mpi4py_us':>11} {'algbw':>8} "
    f"{'busbw':>8} {'mpi_bus':>8} {'ratio':>6} {'check':>5}"
)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pycoll-bench",
        description="pycoll collectives against raw mpi4py on float32, in one run "
        "(run under mpiexec).",
    )
    parser.add_argument(
        "--ops",
        default=",".join(OPS),
        help=f"comma-separated, from {', '.join(OPS)} (default: all)",
    )
    parser.add_argument("-b", "--min-bytes", default="8", help="smallest size (default 8)")
    parser.add_argument("-e", "--max-bytes", default="64M", help="largest size (default 64M)")
    parser.add_argument("-f", "--factor", type=int, default=2, help="size step (default 2)")
    parser.add_argument(
        "--iters",
        type=int,
        default=None,
        help="calls per timed block (default: 1000 up to 8 KiB, 100 up to 1 MiB, 20 up to "
        "16 MiB, 5 above)",
    )
    parser.add_argument(
        "--blocks", type=int, default=12, help="timed blocks per size, for each side"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--groups",
        type=int,
        metavar="N",
        help="instead of the collectives, time making N groups of two ranks with and "
        "without use_local_synchronization (even number of ranks)",
    )
    args = parser.parse_args(argv)
    if args.factor < 2:
        parser.error("--factor must be at least 2")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            parser.error(f"unknown op {o!r}; choose from {', '.join(OPS)}")

    import pycoll

    pycoll.init_process_group()
    world = pycoll.group.WORLD
    if world is None:  # init_process_group returned without a default group
        raise RuntimeError("pycoll-bench: the default process group did not initialize")
    comm = world.comm.Dup()  # the raw side gets a communicator of its own
    rank = comm.Get_rank()
    from mpi4py import MPI

    if args.groups:
        report = group_creation(args.groups, comm)
        if rank == 0:
            if args.json:
                print(json.dumps(report, indent=1))
            else:
                print(
                    f"# group creation: {report['ranks']} ranks, {report['groups']} groups "
                    f"of 2 ranks\n"
                    f"local  (use_local_synchronization=True): "
                    f"{report['local_us_per_new_group']:9.1f} us per new_group, "
                    f"{report['local_calls_per_rank']} calls per rank; pairs ran one after "
                    f"another, so no call waited for a rank outside its pair; world sequence "
                    f"number unchanged: {report['world_sequence_unchanged_by_local']}\n"
                    f"global (every rank calls):               "
                    f"{report['global_us_per_new_group']:9.1f} us per new_group, "
                    f"{report['global_calls_per_rank']} calls per rank"
                )
        comm.Free()
        pycoll.destroy_process_group()
        return 0

    results = []
    if rank == 0 and not args.json:
        print(
            f"# pycoll-bench: {comm.Get_size()} ranks, float32, "
            f"{MPI.Get_library_version().splitlines()[0].strip()}"
        )
        print(
            "# times are per call (median of blocks, slowest rank); bandwidths in GB/s; "
            "ratio = pycoll time / mpi4py time"
        )
        print(HEADER)
    for op in ops:
        for size in _sizes(_parse_size(args.min_bytes), _parse_size(args.max_bytes), args.factor):
            r = measure(op, size, comm, args.iters, args.blocks)
            results.append(r)
            if rank == 0 and not args.json:
                print(_row(r), flush=True)
    if rank == 0 and args.json:
        json.dump(
            {
                "ranks": comm.Get_size(),
                "mpi": MPI.Get_library_version().splitlines()[0],
                "results": results,
            },
            sys.stdout,
            indent=1,
        )
        print()
    comm.Free()
    pycoll.destroy_process_group()
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
