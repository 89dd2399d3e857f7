"""DistributedDataParallel over MPI with the pycoll backend.

    pycoll-run -n 2 python examples/torch_ddp.py      # or: mpiexec -n 2 python ...

The only lines that differ from a gloo or NCCL script are the backend name
(``"pycoll"``) and, for a script that may run where pycoll's import-torch
hook is off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), ``import pycoll.torch``.
No MASTER_ADDR/PORT, RANK or WORLD_SIZE is needed under mpiexec or srun.
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll.torch  # noqa: F401  (registers "pycoll"; the import-torch hook does too)


def make_data(rank: int, world: int, n: int = 256):
    """This rank's shard of a fixed regression problem: y = x @ w_true + 0.5."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n * world, 8, generator=g)
    w_true = torch.randn(8, 1, generator=g)
    y = x @ w_true + 0.5
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def train(steps: int = 200, lr: float = 0.05) -> Dict[str, List[float]]:
    """Train a small MLP with DDP on the default group; the losses and the
    final weights (flattened) of this rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)  # DDP broadcasts rank 0's weights anyway
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = make_data(rank, world)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients averaged over the ranks, bucket by bucket, over MPI
        opt.step()
        losses.append(loss.item())
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    return {"loss": losses, "weights": weights}


def main() -> None:
    dist.init_process_group("pycoll")
    result = train()
    if dist.get_rank() == 0:
        print(
            f"loss {result['loss'][0]:.4f} -> {result['loss'][-1]:.6f} "
            f"on {dist.get_world_size()} ranks"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
