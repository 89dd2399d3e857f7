# ruff: noqa: B023  (each timed closure runs inside the loop iteration that made it)
"""Distributed autograd: pycoll.rpc.autograd against torch's over TensorPipe,
and against the same model on one rank.

Run under MPI with 2 ranks (``scripts/bench autograd``, which uses the torch
venv, or ``mpiexec -n 2 python -m pycoll.bench.autograd``). The model has two
stages, ``tanh(linear(x))`` each: stage 1 lives on rank 1, stage 2 on rank 0,
which runs the training step: forward through rank 1
(``rpc_sync(1, forward, (width, x))``), a sum as the loss, and
``backward(context_id, [loss])``. The same two stages on rank 0 alone, with
torch's own autograd, are the local reference.

In each round every variant runs: pycoll.rpc, then TensorPipe (only the
system measured is running: each round starts and stops its agent), then
the local model; in every step the gradients of both stages (rank 1's read
there) are checked against the local model's. Figures are medians over
rounds of each round's median step; ratios are medians of per-round ratios,
with their spread.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Any, Dict, List, Tuple

from .rpc import _rank0_alone, _start, _stop
from .timing import spread

SEED = 1234


def _stage(width: int, seed: int) -> Any:
    import torch

    stage = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
    g = torch.Generator().manual_seed(seed)  # its own: the global seed is shared by threads
    with torch.no_grad():
        for p in stage.parameters():
            p.copy_((torch.rand(p.shape, generator=g) - 0.5) / width**0.5)
    return stage


_STAGES: Dict[int, Any] = {}  # rank 1's stage 1, by width


def _stage1(width: int) -> Any:
    if width not in _STAGES:
        _STAGES[width] = _stage(width, SEED)
    return _STAGES[width]


def forward(width: int, x: Any) -> Any:
    """Stage 1, run on rank 1 (a plain function rather than an RRef's
    method: torch's RRefs do not survive its agent's restart between rounds)."""
    return _stage1(width)(x)


def stage1_grads(name: str, width: int, context_id: int) -> List[Any]:
    """Stage 1's gradients in the context, read on rank 1."""
    found = _autograd(name).get_gradients(context_id)
    return [found[p] for p in _stage1(width).parameters()]


def _autograd(name: str) -> Any:
    """The system's distributed autograd module."""
    module = "pycoll.rpc.autograd" if name == "pycoll.rpc" else "torch.distributed.autograd"
    return importlib.import_module(module)


def _system(name: str) -> Any:
    """The system's RPC module."""
    return importlib.import_module(name if name == "pycoll.rpc" else "torch.distributed.rpc")


def _reference(width: int, x: Any) -> Tuple[List[Any], List[Any]]:
    """The gradients of both stages, by torch's autograd on one rank."""
    import torch

    stage1, stage2 = _stage(width, SEED), _stage(width, SEED + 1)
    loss = stage2(stage1(x)).sum()
    p1, p2 = list(stage1.parameters()), list(stage2.parameters())
    grads = torch.autograd.grad(loss, p1 + p2)
    return list(grads[: len(p1)]), list(grads[len(p1) :])


def _close(got: List[Any], want: List[Any], what: str) -> None:
    import torch

    for g, w in zip(got, want):
        if not torch.allclose(g, w, rtol=1e-4, atol=1e-6):
            raise AssertionError(f"{what}: a gradient differs from local autograd's")


def _distributed(name: str, width: int, x: Any, iters: int, want: Any) -> Tuple[float, float]:
    """Rank 0's median step time and backward time (ms) through rank 1."""
    rpc, dist_autograd = _system(name), _autograd(name)
    owner = "worker1" if name == "pycoll.rpc" else "tp1"
    stage2 = _stage(width, SEED + 1)
    steps, backwards = [], []
    for i in range(iters + 2):  # two warm-up steps
        with dist_autograd.context() as context_id:
            t0 = time.perf_counter()
            hidden = rpc.rpc_sync(owner, forward, args=(width, x))
            loss = stage2(hidden).sum()
            t1 = time.perf_counter()
            dist_autograd.backward(context_id, [loss])
            t2 = time.perf_counter()
            if i >= 2:
                steps.append(t2 - t0)
                backwards.append(t2 - t1)
            grads2 = dist_autograd.get_gradients(context_id)
            _close([grads2[p] for p in stage2.parameters()], want[1], f"{name}, stage 2")
            grads1 = rpc.rpc_sync(owner, stage1_grads, args=(name, width, context_id))
            _close(grads1, want[0], f"{name}, stage 1")
    return statistics.median(steps) * 1e3, statistics.median(backwards) * 1e3


def _local(width: int, x: Any, iters: int, want: Any) -> Tuple[float, float]:
    import torch

    stage1, stage2 = _stage(width, SEED), _stage(width, SEED + 1)
    params = list(stage1.parameters()) + list(stage2.parameters())
    steps, backwards = [], []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        loss = stage2(stage1(x)).sum()
        t1 = time.perf_counter()
        grads = torch.autograd.grad(loss, params)
        t2 = time.perf_counter()
        if i >= 2:
            steps.append(t2 - t0)
            backwards.append(t2 - t1)
        _close(list(grads), want[0] + want[1], "local")
    return statistics.median(steps) * 1e3, statistics.median(backwards) * 1e3


def measure(rounds: int, iters: int, shapes: List[Tuple[int, int]], names: List[str]) -> Any:
    """Per shape and variant, each round's (step ms, backward ms); on rank 0."""
    import torch

    import pycoll

    me = pycoll.get_rank()
    out: Dict[Any, Dict[str, List[Tuple[float, float]]]] = {
        shape: {k: [] for k in [*names, "local"]} for shape in shapes
    }
    inputs = {}
    for batch, width in shapes:
        torch.manual_seed(7)
        x = torch.randn(batch, width)
        inputs[(batch, width)] = (x, _reference(width, x))
    for _ in range(rounds):
        for name in names:
            rpc_async = _start(name)
            for shape in shapes:
                x, want = inputs[shape]
                got = _rank0_alone(
                    name, rpc_async, lambda: _distributed(name, shape[1], x, iters, want)
                )
                if me == 0:
                    out[shape][name].append(got)
            _stop(name)
        for shape in shapes:
            if me == 0:
                x, want = inputs[shape]
                out[shape]["local"].append(_local(shape[1], x, iters, want))
        pycoll.barrier()
    return out


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=30, help="training steps per round")
    parser.add_argument(
        "--shapes", default="32x256,256x1024", help="batch x width of each stage, comma-separated"
    )
    parser.add_argument("--no-torch", action="store_true", help="leave out TensorPipe")
    args = parser.parse_args(argv)
    import torch

    import pycoll

    torch.set_num_threads(1)  # two ranks on a shared machine: one core each
    names = ["pycoll.rpc"] if args.no_torch else ["pycoll.rpc", "tensorpipe"]
    pycoll.init_process_group()
    n, me = pycoll.get_world_size(), pycoll.get_rank()
    if n != 2:
        raise SystemExit("pycoll.bench.autograd runs on 2 ranks (a model of two stages)")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    res = measure(args.rounds, args.iters, shapes, names)  # type: ignore[arg-type]
    if me == 0:
        print(f"# distributed autograd, 2 stages on 2 ranks, {args.rounds} interleaved rounds")
        print("# ms per training step (forward + backward) and per backward, median (min-max)")
        for (batch, width), table in res.items():
            kib = batch * width * 4 >> 10
            print(f"# batch {batch} x width {width} (activations {kib} KiB)")
            for name, v in table.items():
                steps, backwards = spread([s for s, _ in v]), spread([b for _, b in v])
                print(f"{name:>12} step {steps}  backward {backwards}")
            for other in [*names[1:], "local"]:
                ratios = [a[1] / b[1] for a, b in zip(table["pycoll.rpc"], table[other])]
                step = [a[0] / b[0] for a, b in zip(table["pycoll.rpc"], table[other])]
                print(f"{'pycoll/' + other:>20} step {spread(step)}  backward {spread(ratios)}")
    pycoll.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
