"""One rank of a cross-node RPC job (tests/cluster/test_cluster.py).

``calls``: pycoll.rpc and distributed autograd across the nodes. Each rank
calls the rank after it, so that calls between nodes go both ways: an
array, an RRef held there, and a backward pass through the remote part,
each result and gradient checked against values worked out by hand. Then
``CLUSTER-OK {json}``.

``ring``: every rank calls the rank after it, again and again, with a call
timeout of PYCOLL_TIMEOUT seconds (15 unset), saying RUNNING once; the test
cuts a node off mid-call.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np
import torch

import pycoll.rpc as rpc
import pycoll.rpc.autograd as dist_autograd
from pycoll.rpc import RpcBackendOptions

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
host = socket.gethostname()
timeout = float(os.environ.get("PYCOLL_TIMEOUT", "15"))
rpc.init_rpc(f"worker{rank}", rpc_backend_options=RpcBackendOptions(rpc_timeout=timeout))
after = f"worker{(rank + 1) % size}"

if sys.argv[1] == "ring":
    for i in range(10**8):
        x = np.full(1000, float(i), np.float64)
        assert np.all(rpc.rpc_sync(after, np.add, args=(x, 1.0)) == i + 1)
        if i == 50:
            print("RUNNING", host, flush=True)

# Which host the next rank runs on, asked of it.
there = rpc.rpc_sync(after, socket.gethostname)
big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB, out of band
assert np.array_equal(rpc.rpc_sync(after, np.multiply, args=(big, 2.0)), big * 2)
held = rpc.remote(after, torch.full, args=((3,), float(rank)))
assert torch.equal(held.to_here(), torch.full((3,), float(rank)))
assert rpc.rpc_async(after, torch.add, args=(torch.ones(2), rank)).wait().tolist() == [rank + 1] * 2

# d/dw sum((w * x) ** 2) over the remote product is 2 * w * x**2.
w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
x = torch.tensor([0.5, 1.0, float(rank + 1)])
with dist_autograd.context() as ctx:
    y = rpc.rpc_sync(after, torch.mul, args=(w, x))
    dist_autograd.backward(ctx, [(y**2).sum()])
    grad = dist_autograd.get_gradients(ctx)[w]
assert torch.allclose(grad, 2 * w.detach() * x**2), grad

rpc.shutdown()
print("CLUSTER-OK " + json.dumps({"rank": rank, "host": host, "next_host": there}), flush=True)
