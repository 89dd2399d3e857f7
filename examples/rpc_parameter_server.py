"""A parameter server over pycoll.rpc: every rank trains, worker0 keeps the weights.

Run with ``mpiexec -n 4 python examples/rpc_parameter_server.py``.
A linear model learns y = X @ w_true + noise, on the shards of the
data-parallel example (examples/data_parallel.py, imported from beside this
file). The weights live in one ParameterServer object on worker0, reached
through an RRef; each trainer pulls them, computes a gradient on its own
shard and pushes it back (asynchronous SGD: updates apply in whatever order
they arrive). At the end
every trainer waits on ``all_done``, an ``async_execution`` function whose
Future completes when the last trainer arrives (no thread of worker0 waits
meanwhile), and fetches the final weights.
"""

from __future__ import annotations

import threading

import numpy as np
from data_parallel import FEATURES, shard

import pycoll.rpc as rpc


class ParameterServer:
    """The weights, updated by every trainer's gradients (thread-safe: the
    server's worker threads run updates concurrently)."""

    def __init__(self, trainers: int) -> None:
        self.w = np.random.default_rng(7).normal(size=FEATURES).astype(np.float32)
        self.lock = threading.Lock()
        self.trainers = trainers
        self.arrived = 0
        self.done = rpc.Future()

    def get_weights(self) -> np.ndarray:
        with self.lock:
            return self.w.copy()

    def update(self, grad: np.ndarray, lr: float) -> None:
        with self.lock:
            self.w -= lr * grad

    def arrive(self) -> rpc.Future:
        with self.lock:
            self.arrived += 1
            if self.arrived == self.trainers:
                self.done.set_result(self.w.copy())
        return self.done


_SERVER = {}  # on worker0: the one ParameterServer's RRef
_SERVER_LOCK = threading.Lock()


def server(trainers: int) -> rpc.RRef:
    """On worker0: the parameter server's RRef, made by the first trainer to ask."""
    with _SERVER_LOCK:
        if "rref" not in _SERVER:
            _SERVER["rref"] = rpc.RRef(ParameterServer(trainers))
        return _SERVER["rref"]


@rpc.functions.async_execution
def all_done(ps: rpc.RRef) -> rpc.Future:
    """Completes (with the final weights) once every trainer has arrived."""
    return ps.local_value().arrive()


def train(steps: int = 100, lr: float = 0.05) -> dict:
    """Initialize RPC, train, shut down; this rank's losses and the final weights."""
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    rpc.init_rpc(f"worker{rank}")
    ps = rpc.rpc_sync("worker0", server, args=(size,))
    x, y = shard(rank)
    losses = []
    for _ in range(steps):
        w = ps.rpc_sync().get_weights()
        err = x @ w - y
        losses.append(float(np.mean(err**2)))
        ps.rpc_sync().update(2 * x.T @ err / len(y), lr)
    final = rpc.rpc_sync("worker0", all_done, args=(ps,))
    del ps
    rpc.shutdown()
    return {"loss": losses, "final_loss": float(np.mean((x @ final - y) ** 2)), "weights": final}


if __name__ == "__main__":
    result = train()
    print(f"loss {result['loss'][0]:.4f} -> {result['final_loss']:.6f}")
