# ruff: noqa: B023  (each timed closure runs inside the loop iteration that made it)
"""pycoll.rpc against torch.distributed.rpc (TensorPipe) and mpi4py.futures.

Run under MPI with at least 2 ranks (``scripts/bench rpc``, which uses the
torch venv, or ``mpiexec -n 2 python -m pycoll.bench.rpc [--no-torch]``).
All three run in the same processes, and in each round every variant runs
once, so a busy machine slows them alike; every call's result is checked.

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
import os
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np


def echo(x: Any) -> Any:
    return x


def _spread(values: List[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _value(name: str, future: Any) -> Any:
    """A future's result: mpi4py.futures' are concurrent.futures.Futures."""
    return future.result() if name == "mpi4py.futures" else future.wait()


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"{what} gave a wrong result")


class _Systems:
    """The RPC systems under test, as (to, func, args) -> Future-like."""

    def __init__(self, use_torch: bool) -> None:
        import pycoll.rpc as prpc

        self.calls: Dict[str, Callable[..., Any]] = {"pycoll.rpc": prpc.rpc_async}
        self.torch: Any = None
        if use_torch:
            import torch
            import torch.distributed.rpc as trpc

            self.torch = torch
            self.calls["tensorpipe"] = trpc.rpc_async

    def convert(self, name: str, x: Any) -> Any:
        """The payload as the system carries it best (TensorPipe: a tensor)."""
        if name == "tensorpipe" and isinstance(x, np.ndarray):
            return self.torch.from_numpy(x)
        return x


def _start(use_torch: bool) -> None:
    from mpi4py import MPI

    import pycoll.rpc as prpc

    comm = MPI.COMM_WORLD
    me, n = comm.Get_rank(), comm.Get_size()
    prpc.init_rpc(f"worker{me}")
    if use_torch:
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


_IDLE = threading.Event()


def _echoing(call: Callable[..., Any]) -> Callable[[int, int], Any]:
    """``(to, i) -> call(to, echo, args=(i,))``: one system's way to make a call."""
    return lambda to, i: call(to, echo, args=(i,))


def _release() -> None:
    """Run by rank 0 on the other ranks: their main threads may go on."""
    _IDLE.set()


def _one_caller(ways: Dict[str, Callable[[int, int], Any]], iters: int, n: int) -> Dict[str, Any]:
    """Rank 0's latency (us) and 1,000-outstanding rate (calls/s) for each way."""
    out: Dict[str, Any] = {}
    for name, call in ways.items():
        t0 = time.perf_counter()
        for i in range(iters):
            _check(_value(name, call(1, i)) == i, name)
        latency = (time.perf_counter() - t0) / iters * 1e6
        t0 = time.perf_counter()
        pending = [call(1 + i % (n - 1), i) for i in range(1000)]
        got = [_value(name, f) for f in pending]
        out[name] = (latency, 1000 / (time.perf_counter() - t0))
        _check(got == list(range(1000)), name)
    return out


def latency_and_rate(rounds: int, iters: int, use_torch: bool) -> Dict[str, Dict[str, List[float]]]:
    """us per call (one caller) and calls/s (1,000 outstanding, one caller).

    While rank 0 calls, the other ranks' main threads wait on an Event (no
    polling of theirs competes with the agents serving): pycoll.rpc and
    TensorPipe are served by their own threads. mpi4py.futures is served by
    its workers' main threads, in an MPICommExecutor entered for its turn in
    each round.
    """
    from mpi4py import MPI
    from mpi4py.futures import MPICommExecutor

    import pycoll.rpc as prpc

    systems = _Systems(use_torch)
    comm = MPI.COMM_WORLD
    me, n = comm.Get_rank(), comm.Get_size()
    lat: Dict[str, List[float]] = {k: [] for k in [*systems.calls, "mpi4py.futures"]}
    rate: Dict[str, List[float]] = {k: [] for k in lat}
    futures_comm = comm.Dup()
    ways = {name: _echoing(call) for name, call in systems.calls.items()}
    for _ in range(rounds):
        _IDLE.clear()
        comm.Barrier()
        if me == 0:
            got = _one_caller(ways, iters, n)
            for other in range(1, n):
                prpc.rpc_sync(other, _release)
        else:
            _IDLE.wait(600)
        with MPICommExecutor(futures_comm, root=0) as pool:
            executor: Any = pool  # a concurrent.futures.Executor on rank 0, None elsewhere
            if executor is not None:
                futures_way = {"mpi4py.futures": lambda to, i: executor.submit(echo, i)}
                got.update(_one_caller(futures_way, iters, n))
        if me == 0:
            for name, (latency, calls) in got.items():
                lat[name].append(latency)
                rate[name].append(calls)
    futures_comm.Free()
    return {"latency": lat, "rate": rate}


def every_rank(rounds: int, use_torch: bool) -> Dict[str, List[float]]:
    """Calls/s of the whole job, every rank keeping 1,000 calls outstanding."""
    import pycoll
    from pycoll.bench.timing import slowest

    systems = _Systems(use_torch)
    me, n = pycoll.get_rank(), pycoll.get_world_size()
    rate: Dict[str, List[float]] = {k: [] for k in systems.calls}
    for _ in range(rounds):
        for name, call in systems.calls.items():
            pycoll.barrier()
            t0 = time.perf_counter()
            pending = [call((me + 1 + i % (n - 1)) % n, echo, args=(i,)) for i in range(1000)]
            got = [f.wait() for f in pending]
            rate[name].append(n * 1000 / slowest(time.perf_counter() - t0))
            _check(got == list(range(1000)), name)
    return rate


def bandwidth(rounds: int, sizes: List[int], use_torch: bool) -> Dict[int, Dict[str, List[float]]]:
    """GB/s of round trips rank 0 -> 1 -> 0 (2 x nbytes per trip)."""
    import pycoll
    import pycoll.rpc as prpc

    systems = _Systems(use_torch)
    me = pycoll.get_rank()
    out: Dict[int, Dict[str, List[float]]] = {}
    for nbytes in sizes:
        iters = max(2, min(50, (256 << 20) // nbytes))
        x = np.arange(nbytes // 8, dtype=np.float64)
        back = np.empty_like(x)
        out[nbytes] = {k: [] for k in [*systems.calls, "send/recv"]}
        for _ in range(rounds):
            for name in out[nbytes]:
                pycoll.barrier()
                t0 = time.perf_counter()
                if name == "send/recv":
                    for _ in range(iters):
                        if me == 0:
                            pycoll.send(x, 1)
                            pycoll.recv(back, 1)
                        elif me == 1:
                            pycoll.recv(back, 0)
                            pycoll.send(back, 0)
                    y: Optional[Any] = back
                else:
                    _IDLE.clear()
                    pycoll.barrier()  # every rank has cleared its _IDLE
                    t0 = time.perf_counter()
                    if me == 0:
                        payload = systems.convert(name, x)
                        for _ in range(iters):
                            y = systems.calls[name](1, echo, args=(payload,)).wait()
                    else:  # wait without polling: the serving threads get the core
                        _IDLE.wait(600)
                seconds = time.perf_counter() - t0
                if me == 0 and name != "send/recv":
                    for other in range(1, pycoll.get_world_size()):
                        prpc.rpc_sync(other, _release)
                if me == 0:
                    out[nbytes][name].append(2 * nbytes * iters / seconds / 1e9)
                    _check(np.array_equal(np.asarray(y), x), f"{name} at {nbytes} B")
                    back[:] = 0
    return out


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=300, help="calls per round of the latency")
    parser.add_argument("--sizes", default=f"{1 << 20},{64 << 20}", help="bytes, comma-separated")
    parser.add_argument("--no-torch", action="store_true", help="leave out TensorPipe")
    args = parser.parse_args(argv)
    import pycoll
    import pycoll.rpc as prpc

    use_torch = not args.no_torch
    if use_torch:
        try:
            import torch.distributed.rpc  # noqa: F401
        except ImportError:
            use_torch = False
    pycoll.init_process_group()
    n, me = pycoll.get_world_size(), pycoll.get_rank()
    if n < 2:
        raise SystemExit("pycoll.bench.rpc needs at least 2 ranks")
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    _start(use_torch)
    sizes = [int(s) for s in args.sizes.split(",")]
    one = latency_and_rate(args.rounds, args.iters, use_torch)
    pycoll.barrier()
    everyone = every_rank(args.rounds, use_torch)
    bw = bandwidth(args.rounds, sizes, use_torch)
    if use_torch:
        import torch.distributed.rpc as trpc

        trpc.shutdown()
    prpc.shutdown()
    if me == 0:
        print(f"# pycoll.rpc, {n} ranks, {args.rounds} interleaved rounds")
        print("# no-op rpc_sync from rank 0 to rank 1, us per call (median, min-max)")
        for name, v in one["latency"].items():
            print(f"{name:>16} {_spread(v)}")
        for other in one["latency"]:
            if other != "pycoll.rpc":
                r = [p / o for p, o in zip(one["latency"]["pycoll.rpc"], one["latency"][other])]
                print(f"{'pycoll.rpc/' + other:>28} {_spread(r)}")
        print("# calls/s, 1,000 outstanding from rank 0")
        for name, v in one["rate"].items():
            print(f"{name:>16} {statistics.median(v):10.0f} ({min(v):.0f}-{max(v):.0f})")
        print("# calls/s of the job, 1,000 outstanding from every rank")
        for name, v in everyone.items():
            print(f"{name:>16} {statistics.median(v):10.0f} ({min(v):.0f}-{max(v):.0f})")
        for nbytes, table in bw.items():
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"
            print(f"# {size} numpy round trip, GB/s")
            for name, v in table.items():
                print(f"{name:>16} {_spread(v)}")
            r = [p / s for p, s in zip(table["pycoll.rpc"], table["send/recv"])]
            print(f"{'pycoll.rpc/send-recv':>28} {_spread(r)}")
    pycoll.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
