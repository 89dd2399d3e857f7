# ruff: noqa: B023  (each timed closure runs inside the loop iteration that made it)
"""The torch backend "pycoll" against gloo, through torch's own API.

Run under MPI with torch installed (``scripts/bench torch``, or
``mpiexec -n 2 python -m pycoll.bench.torch_backend``). In one run, round by
round (the backends alternate, so a busy machine slows both alike):

- ``dist.all_reduce`` of float32 CPU tensors on the default group (backend
  "pycoll") and on a gloo group of the same ranks, 8 B to 64 MiB; float16
  and bfloat16 at 1 MiB;
- ``pycoll.all_reduce`` of the numpy view of the same tensor: the backend's
  cost is the difference;
- one DDP training step (forward, backward with the gradients' all_reduce,
  SGD step) of an MLP of about 10M parameters, over each backend.

Figures are medians over rounds of the slowest rank's mean per call; every
all_reduce's result is checked after each round.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable, Dict, List

from .timing import timed

SIZES = [8, 1 << 10, 1 << 20, 16 << 20, 64 << 20]


def _fmt(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _iters(nbytes: int) -> int:
    return max(3, min(2000, (64 << 20) // max(nbytes, 1) // 8))


def all_reduce_table(rounds: int) -> List[Dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import pycoll

    n = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    rows = []
    cases = [(s, torch.float32) for s in SIZES] + [
        (1 << 20, torch.float16),
        (1 << 20, torch.bfloat16),
    ]
    for nbytes, dtype in cases:
        t = torch.ones(max(1, nbytes // torch.tensor([], dtype=dtype).element_size()), dtype=dtype)
        view = t.view(torch.int16).numpy() if dtype == torch.bfloat16 else t.numpy()
        iters = _iters(nbytes)
        ways: Dict[str, Callable[[], Any]] = {
            "pycoll": lambda: dist.all_reduce(t),
            "gloo": lambda: dist.all_reduce(t, group=gloo),
        }
        if dtype != torch.bfloat16:
            ways["numpy"] = lambda: pycoll.all_reduce(view)
        times: Dict[str, List[float]] = {k: [] for k in ways}
        for _ in range(rounds):
            for name, call in ways.items():
                t.fill_(1)
                times[name].append(timed(call, iters))
                t.fill_(1)
                call()  # the check: one more call on known data
                if not bool((t == n).all()):
                    raise AssertionError(f"{name} all_reduce of {nbytes} B {dtype} is wrong")
        rows.append(
            dict(
                size=nbytes,
                dtype=str(dtype).replace("torch.", ""),
                iters=iters,
                **{k: statistics.median(v) for k, v in times.items()},
            )
        )
    return rows


def ddp_steps(rounds: int, steps: int) -> Dict[str, float]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")

    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(2048, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 512),
        )

    models = {"pycoll": DDP(net()), "gloo": DDP(net(), process_group=gloo)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    x, y = torch.randn(32, 2048), torch.randn(32, 512)
    times: Dict[str, List[float]] = {k: [] for k in models}

    for _ in range(rounds):
        for name, model in models.items():
            opt = opts[name]

            def step() -> None:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()

            step()  # warm
            times[name].append(timed(step, steps))
    a, b = (torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models.values())
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
        raise AssertionError("DDP over pycoll and over gloo trained to different weights")
    params = sum(p.numel() for p in models["pycoll"].parameters())
    return dict(params=params, **{k: statistics.median(v) for k, v in times.items()})


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ddp-steps", type=int, default=10)
    args = parser.parse_args(argv)
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401

    dist.init_process_group("pycoll", init_method="mpi://")
    rows = all_reduce_table(args.rounds)
    ddp = ddp_steps(args.rounds, args.ddp_steps)
    if dist.get_rank() == 0:
        n = dist.get_world_size()
        print(f"# torch all_reduce SUM, {n} ranks, us per call (median of {args.rounds} rounds)")
        print(
            f"{'size':>8} {'dtype':>9} {'pycoll':>9} {'gloo':>9} {'gloo/pycoll':>11} "
            f"{'numpy':>9} {'backend cost':>12}"
        )
        for r in rows:
            numpy = r.get("numpy")
            cost = f"{(r['pycoll'] - numpy) * 1e6:12.1f}" if numpy is not None else f"{'-':>12}"
            num = f"{numpy * 1e6:9.1f}" if numpy is not None else f"{'-':>9}"
            print(
                f"{_fmt(r['size']):>8} {r['dtype']:>9} {r['pycoll'] * 1e6:9.1f} "
                f"{r['gloo'] * 1e6:9.1f} {r['gloo'] / r['pycoll']:11.1f} {num} {cost}"
            )
        print(
            f"# DDP step, MLP of {ddp['params'] / 1e6:.1f}M parameters, batch 32 per rank: "
            f"pycoll {ddp['pycoll'] * 1e3:.1f} ms, gloo {ddp['gloo'] * 1e3:.1f} ms, "
            f"gloo/pycoll {ddp['gloo'] / ddp['pycoll']:.2f}"
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
