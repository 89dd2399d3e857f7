# ruff: noqa: B023  (each timed closure runs inside the loop iteration that made it)
"""pycoll.functional against the imperative calls, and torch's functional
collectives compiled over pycoll against the same over gloo.

Run under MPI (``scripts/bench functional``, or ``mpiexec -n 2 python -m
pycoll.bench.functional [--torch]``). In one run, round by round (the
variants alternate, so a busy machine slows them alike), every result
checked after each round:

- the fixed cost at 8 B: ``pycoll.all_reduce(x)`` (in place), the same with
  ``async_op=True`` and ``wait()``, ``F.all_reduce(x, "sum")`` read at once
  (a copy, the nonblocking call, the wait) and mpi4py's ``comm.Allreduce``;
- overlap at 16 MiB: independent numpy work (a loop of ``np.multiply`` over
  its own arrays, calibrated to take about as long as the all_reduce) after a
  synchronous ``pycoll.all_reduce``, against the same work between
  ``F.all_reduce`` and the first read of its result. ``hidden`` is the share
  of the shorter of the two that the functional form saved;
- with ``--torch``: one training step of an MLP whose forward and gradient
  averaging (torch's functional ``all_reduce`` of every gradient, then a
  division) are compiled with ``torch.compile`` (inductor), over the backend
  "pycoll" and over a gloo group of the same ranks; the two models must end
  with the same weights.

Figures are medians over rounds of the slowest rank's mean per call; ratios
are medians of the per-round ratios, with their spread.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable, Dict, List

import numpy as np

from .timing import spread, timed


def fixed_cost(rounds: int, iters: int) -> Dict[str, List[float]]:
    """us per call of each way at 8 B (float64 scalar-sized arrays)."""
    from mpi4py import MPI

    import pycoll
    from pycoll import functional as F

    n = pycoll.get_world_size()
    comm = MPI.COMM_WORLD
    x = np.ones(1)
    out = np.empty(1)
    ways: Dict[str, Callable[[], Any]] = {
        "mpi4py": lambda: comm.Allreduce(x, out),
        "imperative": lambda: pycoll.all_reduce(x),
        "async": lambda: pycoll.all_reduce(x, async_op=True).wait(),  # type: ignore[union-attr]
        "functional": lambda: F.wait_tensor(F.all_reduce(x, "sum")),
    }
    times: Dict[str, List[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, call in ways.items():
            times[name].append(timed(call, iters) * 1e6)
            x[0] = 1.0
        comm.Allreduce(x, out)
        got = F.wait_tensor(F.all_reduce(x, "sum"))
        y = x.copy()
        pycoll.all_reduce(y)
        if not (out[0] == n and got[0] == n and y[0] == n and x[0] == 1.0):
            raise AssertionError("an 8-byte all_reduce gave a wrong result")
    return times


def overlap(rounds: int, nbytes: int) -> Dict[str, Any]:
    """Seconds of: all_reduce alone, work alone, sync + work, functional + work."""
    import pycoll
    from pycoll import functional as F

    n = pycoll.get_world_size()
    x = np.ones(nbytes // 4, np.float32)
    a, b = np.ones(1 << 18, np.float32), np.empty(1 << 18, np.float32)

    def work(k: int) -> None:
        for _ in range(k):
            np.multiply(a, 1.0001, out=b)

    t_ar = timed(lambda: pycoll.all_reduce(x.copy()), 5)
    t_one = timed(lambda: work(20), 5) / 20
    k = max(1, round(t_ar / t_one))

    def sync_then_work() -> None:
        y = x.copy()
        pycoll.all_reduce(y)
        work(k)

    def functional_then_work() -> None:
        y = F.all_reduce(x, "sum")
        work(k)
        F.wait_tensor(y)

    ways: Dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: pycoll.all_reduce(x.copy()),
        "work": lambda: work(k),
        "sync+work": sync_then_work,
        "functional+work": functional_then_work,
    }
    times: Dict[str, List[float]] = {w: [] for w in ways}
    hidden: List[float] = []
    for _ in range(rounds):
        now = {name: timed(call, 3) for name, call in ways.items()}
        for name, t in now.items():
            times[name].append(t)
        saved = now["sync+work"] - now["functional+work"]
        hidden.append(saved / min(now["all_reduce"], now["work"]))
        y = F.wait_tensor(F.all_reduce(x, "sum"))
        if not (np.all(y == n) and np.all(x == 1)):
            raise AssertionError("the 16 MiB functional all_reduce gave a wrong result")
    return dict(k=k, hidden=hidden, **{w: statistics.median(v) for w, v in times.items()})


def compiled_step(rounds: int, steps: int) -> Dict[str, List[float]]:
    """ms per training step, compiled, over pycoll and over gloo."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    n = dist.get_world_size()
    groups = {"pycoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}

    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
        )

    models = {k: net() for k in groups}
    forwards = {k: torch.compile(m, backend="inductor") for k, m in models.items()}

    def averager(group: Any) -> Callable[[List[torch.Tensor]], List[torch.Tensor]]:
        def average(grads: List[torch.Tensor]) -> List[torch.Tensor]:
            return [fc.all_reduce(g, "sum", group) / n for g in grads]

        return torch.compile(average, backend="inductor", fullgraph=True)

    averages = {k: averager(g) for k, g in groups.items()}
    torch.manual_seed(1 + dist.get_rank())
    x, y = torch.randn(32, 1024), torch.randn(32, 256)
    times: Dict[str, List[float]] = {k: [] for k in groups}
    for _ in range(rounds):
        for name, model in models.items():
            forward, average = forwards[name], averages[name]

            def step() -> None:
                model.zero_grad()
                torch.nn.functional.mse_loss(forward(x), y).backward()
                params = list(model.parameters())
                with torch.no_grad():
                    for p, g in zip(params, average([p.grad for p in params])):
                        p -= 1e-3 * g

            step()  # warm (the first round compiles)
            times[name].append(timed(step, steps) * 1e3)
    a, b = (torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models.values())
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
        raise AssertionError("the compiled step over pycoll and over gloo gave different weights")
    return times


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=2000, help="calls per round at 8 B")
    parser.add_argument("--size", type=int, default=16 << 20, help="bytes of the overlap case")
    parser.add_argument("--torch", action="store_true", help="also the compiled training step")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    import pycoll

    if args.torch:
        import torch.distributed as dist

        import pycoll.torch  # noqa: F401

        dist.init_process_group("pycoll", init_method="mpi://")
    else:
        pycoll.init_process_group()
    n, me = pycoll.get_world_size(), pycoll.get_rank()
    cost = fixed_cost(args.rounds, args.iters)
    over = overlap(args.rounds, args.size)
    step = compiled_step(args.rounds, args.steps) if args.torch else None
    if me == 0:
        print(f"# pycoll.functional, {n} ranks, {args.rounds} interleaved rounds")
        print("# 8 B all_reduce, us per call (median, min-max over rounds)")
        for name, v in cost.items():
            print(f"{name:>12} {spread(v)}")
        for a, b in (("functional", "imperative"), ("functional", "async")):
            ratio = [f / i for f, i in zip(cost[a], cost[b])]
            print(f"{a + '/' + b:>22} {spread(ratio)}")
        print(f"# overlap at {args.size >> 20} MiB float32, ms (median), work = {over['k']} calls")
        for name in ("all_reduce", "work", "sync+work", "functional+work"):
            print(f"{name:>16} {over[name] * 1e3:8.2f}")
        print(f"{'hidden':>16} {spread(over['hidden'])}  (share of the shorter part saved)")
        if step is not None:
            print("# compiled training step (inductor), ms per step")
            for name, v in step.items():
                print(f"{name:>12} {spread(v)}")
            ratio = [g / p for g, p in zip(step["gloo"], step["pycoll"])]
            print(f"{'gloo/pycoll':>12} {spread(ratio)}")
    if args.torch:
        import torch.distributed as dist

        dist.destroy_process_group()
    else:
        pycoll.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
