"""Data-parallel training with pycoll: each rank trains on its own shard.

Run with ``scripts/demo`` or ``mpiexec -n 4 python examples/data_parallel.py``.
A linear model learns y = X @ w_true + noise. Weights start on rank 0 and are
broadcast; each step every rank computes the gradient on its own shard and the
ranks average the gradients with ``all_reduce(op=AVG)``, so the weights stay
identical everywhere without ever being sent again.
"""

from __future__ import annotations

import numpy as np

import pycoll

FEATURES = 16
SAMPLES_PER_RANK = 512


def shard(rank: int) -> tuple:
    """This rank's training data (the true weights are the same on every rank)."""
    w_true = np.random.default_rng(0).normal(size=FEATURES).astype(np.float32)
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(SAMPLES_PER_RANK, FEATURES)).astype(np.float32)
    y = x @ w_true + np.float32(0.01) * rng.normal(size=SAMPLES_PER_RANK).astype(np.float32)
    return x, y


def train(steps: int = 100, lr: float = 0.1, log_every: int = 0) -> dict:
    """Train and return the loss history and this rank's final weights."""
    rank = pycoll.get_rank()
    x, y = shard(rank)
    w = (
        np.random.default_rng(7).normal(size=FEATURES).astype(np.float32)
        if rank == 0
        else np.zeros(FEATURES, np.float32)
    )
    pycoll.broadcast(w, src=0)
    history = []
    for step in range(steps):
        err = x @ w - y
        grad = (2.0 / len(y)) * (x.T @ err)
        pycoll.all_reduce(grad, op=pycoll.ReduceOp.AVG)
        w -= np.float32(lr) * grad
        loss = np.array([np.mean(err**2)], np.float32)
        pycoll.all_reduce(loss, op=pycoll.ReduceOp.AVG)  # the global mean loss
        history.append(float(loss[0]))
        if log_every and rank == 0 and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {loss[0]:.6f}", flush=True)
    return {"loss": history, "weights": w}


def main() -> None:
    pycoll.init_process_group()
    rank, size = pycoll.get_rank(), pycoll.get_world_size()
    if rank == 0:
        print(
            f"data-parallel linear regression on {size} ranks, {SAMPLES_PER_RANK} samples per rank",
            flush=True,
        )
    result = train(steps=100, lr=0.1, log_every=10)
    everyone = np.empty((size, FEATURES), np.float32)
    pycoll.all_gather_into_tensor(everyone, result["weights"])
    identical = bool((everyone == everyone[0]).all())
    if rank == 0:
        print(f"loss fell from {result['loss'][0]:.4f} to {result['loss'][-1]:.6f}")
        print(f"weights identical on all {size} ranks: {identical}")
    pycoll.destroy_process_group()
    if not identical:
        raise SystemExit("weights diverged between ranks")


if __name__ == "__main__":
    main()
