# ruff: noqa: B023  (each timed closure runs inside the loop iteration that made it)
"""pycoll.rpc against torch.distributed.rpc (TensorPipe) and mpi4py.futures.

Run under MPI with at least 2 ranks (``scripts/bench rpc``, which uses the
torch venv, or ``mpiexec -n 2 python -m pycoll.bench.rpc [--no-torch]``).
All three run in the same job, and in each round every variant runs once,
so a busy machine slows them alike; every call's result is checked. Only
the system being measured is running: each round starts and stops
pycoll.rpc's and TensorPipe's agents in turn (an idle TensorPipe agent was
seen to slow pycoll.rpc ten times at 4 ranks on 2 cores), and enters an
MPICommExecutor for mpi4py.futures.

- latency: one caller (rank 0) makes ``rpc_sync(1, echo, (i,))`` calls one
  after another, with pycoll.rpc and TensorPipe; mpi4py.futures'
  ``MPICommExecutor`` (rank 0 the master, the others its workers) runs
  ``submit(echo, i).result()``;
- calls/s, one caller: rank 0 keeps 1,000 calls outstanding (spread over
  the other ranks; mpi4py.futures spreads them itself), then waits for all;
- calls/s, every rank: every rank at once sends 1,000 to the others
  (pycoll.rpc and TensorPipe; mpi4py.futures has one master);
- bandwidth: round trips of a float64 numpy array (1 MiB, 64 MiB) through
  ``rpc_sync(1, echo, (x,))``, against pycoll's own ``send``/``recv`` of the
  same bytes there and back, and TensorPipe with the array as a tensor.

Figures are medians over rounds; ratios are medians of per-round ratios,
with their spread.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .timing import spread


def echo(x: Any) -> Any:
    return x


def _value(name: str, future: Any) -> Any:
    """A future's result: mpi4py.futures' are concurrent.futures.Futures."""
    return future.result() if name == "mpi4py.futures" else future.wait()


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"{what} gave a wrong result")


def _start(name: str) -> Callable[..., Any]:
    """Start one system's agent on every rank; its ``rpc_async``."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me, n = comm.Get_rank(), comm.Get_size()
    if name == "pycoll.rpc":
        import pycoll.rpc as prpc

        prpc.init_rpc(f"worker{me}")
        return prpc.rpc_async
    import socket

    import torch.distributed.rpc as trpc

    port = None
    if me == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port)
    options = trpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}")
    trpc.init_rpc(f"tp{me}", rank=me, world_size=n, rpc_backend_options=options)
    return trpc.rpc_async


def _stop(name: str) -> None:
    if name == "pycoll.rpc":
        import pycoll.rpc as prpc

        prpc.shutdown()
    else:
        import torch.distributed.rpc as trpc

        trpc.shutdown()


def _payload(name: str, x: np.ndarray) -> Any:
    """The array as the system carries it best (TensorPipe: a tensor)."""
    if name == "tensorpipe":
        import torch

        return torch.from_numpy(x)
    return x


_IDLE = threading.Event()


def _release() -> None:
    """Run by rank 0 on the other ranks: their main threads may go on."""
    _IDLE.set()


def _echoing(call: Callable[..., Any]) -> Callable[[int, int], Any]:
    """``(to, i) -> call(to, echo, args=(i,))``: one system's way to make a call."""
    return lambda to, i: call(to, echo, args=(i,))


def _one_caller(name: str, call: Callable[[int, int], Any], iters: int, n: int) -> Any:
    """Rank 0's latency (us) and 1,000-outstanding rate (calls/s)."""
    t0 = time.perf_counter()
    for i in range(iters):
        _check(_value(name, call(1, i)) == i, name)
    latency = (time.perf_counter() - t0) / iters * 1e6
    t0 = time.perf_counter()
    pending = [call(1 + i % (n - 1), i) for i in range(1000)]
    got = [_value(name, f) for f in pending]
    rate = 1000 / (time.perf_counter() - t0)
    _check(got == list(range(1000)), name)
    return latency, rate


def _rank0_alone(name: str, rpc_async: Callable[..., Any], work: Callable[[], Any]) -> Any:
    """``work()`` on rank 0 while the other ranks' main threads wait on an
    Event (no polling of theirs competes with the threads serving), released
    by a call of the system under test."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    _IDLE.clear()
    comm.Barrier()
    if comm.Get_rank() != 0:
        _IDLE.wait(600)
        return None
    out = work()
    for other in range(1, comm.Get_size()):
        rpc_async(other, _release).wait()
    return out


def _every_rank(name: str, rpc_async: Callable[..., Any]) -> float:
    """Calls/s of the whole job, every rank keeping 1,000 calls outstanding."""
    import pycoll
    from pycoll.bench.timing import slowest

    me, n = pycoll.get_rank(), pycoll.get_world_size()
    pycoll.barrier()
    t0 = time.perf_counter()
    pending = [rpc_async((me + 1 + i % (n - 1)) % n, echo, args=(i,)) for i in range(1000)]
    got = [f.wait() for f in pending]
    rate = n * 1000 / slowest(time.perf_counter() - t0)
    _check(got == list(range(1000)), name)
    return rate


def _iters(nbytes: int) -> int:
    return max(2, min(50, (256 << 20) // nbytes))


def _round_trips(name: str, rpc_async: Callable[..., Any], x: np.ndarray) -> float:
    """GB/s of rank 0 -> 1 -> 0 round trips of ``x`` (2 x nbytes each)."""
    payload = _payload(name, x)
    iters = _iters(x.nbytes)
    t0 = time.perf_counter()
    for _ in range(iters):
        y = rpc_async(1, echo, args=(payload,)).wait()
    seconds = time.perf_counter() - t0
    _check(np.array_equal(np.asarray(y), x), f"{name} at {x.nbytes} B")
    return 2 * x.nbytes * iters / seconds / 1e9


def _send_recv(x: np.ndarray) -> Optional[float]:
    """The same round trips with pycoll.send/recv into a reused buffer."""
    import pycoll

    me = pycoll.get_rank()
    back = np.zeros_like(x)
    iters = _iters(x.nbytes)
    pycoll.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if me == 0:
            pycoll.send(x, 1)
            pycoll.recv(back, 1)
        elif me == 1:
            pycoll.recv(back, 0)
            pycoll.send(back, 0)
    seconds = time.perf_counter() - t0
    if me != 0:
        return None
    _check(np.array_equal(back, x), f"send/recv at {x.nbytes} B")
    return 2 * x.nbytes * iters / seconds / 1e9


def _futures(iters: int, n: int) -> Any:
    """mpi4py.futures' latency and rate, rank 0 the master, the others its workers."""
    from mpi4py import MPI
    from mpi4py.futures import MPICommExecutor

    comm = MPI.COMM_WORLD.Dup()
    try:
        with MPICommExecutor(comm, root=0) as pool:
            executor: Any = pool  # a concurrent.futures.Executor on rank 0, None elsewhere
            if executor is None:
                return None
            way = lambda to, i: executor.submit(echo, i)  # noqa: E731
            return _one_caller("mpi4py.futures", way, iters, n)
    finally:
        comm.Free()


def measure(rounds: int, iters: int, sizes: List[int], names: List[str]) -> Dict[str, Any]:
    """Every metric, round by round; figures on rank 0."""
    import pycoll

    me, n = pycoll.get_rank(), pycoll.get_world_size()
    every = [*names, "mpi4py.futures"]
    out: Dict[str, Any] = {
        "latency": {k: [] for k in every},
        "rate": {k: [] for k in every},
        "job": {k: [] for k in names},
        "bandwidth": {size: {k: [] for k in [*names, "send/recv"]} for size in sizes},
    }
    arrays = {size: np.arange(size // 8, dtype=np.float64) for size in sizes}
    for _ in range(rounds):
        for name in names:
            rpc_async = _start(name)
            got = _rank0_alone(
                name, rpc_async, lambda: _one_caller(name, _echoing(rpc_async), iters, n)
            )
            job = _every_rank(name, rpc_async)
            trips = {
                size: _rank0_alone(
                    name, rpc_async, lambda: _round_trips(name, rpc_async, arrays[size])
                )
                for size in sizes
            }
            _stop(name)
            if me == 0:
                out["latency"][name].append(got[0])
                out["rate"][name].append(got[1])
                out["job"][name].append(job)
                for size, gbs in trips.items():
                    out["bandwidth"][size][name].append(gbs)
        got = _futures(iters, n)
        for size in sizes:
            gbs = _send_recv(arrays[size])
            if me == 0:
                out["bandwidth"][size]["send/recv"].append(gbs)
        if me == 0:
            out["latency"]["mpi4py.futures"].append(got[0])
            out["rate"]["mpi4py.futures"].append(got[1])
    return out


def _ratio(a: List[float], b: List[float]) -> str:
    return spread([x / y for x, y in zip(a, b)])


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=300, help="calls per round of the latency")
    parser.add_argument("--sizes", default=f"{1 << 20},{64 << 20}", help="bytes, comma-separated")
    parser.add_argument("--no-torch", action="store_true", help="leave out TensorPipe")
    args = parser.parse_args(argv)
    import pycoll

    names = ["pycoll.rpc"]
    if not args.no_torch:
        try:
            import torch.distributed.rpc  # noqa: F401

            names.append("tensorpipe")
        except ImportError:
            pass
    pycoll.init_process_group()
    n, me = pycoll.get_world_size(), pycoll.get_rank()
    if n < 2:
        raise SystemExit("pycoll.bench.rpc needs at least 2 ranks")
    sizes = [int(s) for s in args.sizes.split(",")]
    res = measure(args.rounds, args.iters, sizes, names)
    if me == 0:
        print(f"# pycoll.rpc, {n} ranks, {args.rounds} interleaved rounds")
        print("# no-op rpc_sync from rank 0 to rank 1, us per call (median, min-max)")
        lat = res["latency"]
        for name, v in lat.items():
            print(f"{name:>16} {spread(v)}")
        for other in lat:
            if other != "pycoll.rpc":
                print(f"{'pycoll.rpc/' + other:>28} {_ratio(lat['pycoll.rpc'], lat[other])}")
        print("# calls/s, 1,000 outstanding from rank 0")
        for name, v in res["rate"].items():
            print(f"{name:>16} {statistics.median(v):10.0f} ({min(v):.0f}-{max(v):.0f})")
        print("# calls/s of the job, 1,000 outstanding from every rank")
        for name, v in res["job"].items():
            print(f"{name:>16} {statistics.median(v):10.0f} ({min(v):.0f}-{max(v):.0f})")
        for nbytes, table in res["bandwidth"].items():
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"
            print(f"# {size} numpy round trip, GB/s")
            for name, v in table.items():
                print(f"{name:>16} {spread(v)}")
            print(f"{'pycoll.rpc/send-recv':>28} {_ratio(table['pycoll.rpc'], table['send/recv'])}")
    pycoll.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
