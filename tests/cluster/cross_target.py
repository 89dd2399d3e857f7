"""One rank of a cross-node job (tests/cluster/test_cluster.py): every kind of
call once across the nodes, each result checked here against a value worked
out by hand from the ranks, then one line ``CLUSTER-OK {json}`` saying where
this rank ran, or an exception (the job fails)."""

from __future__ import annotations

import json
import os
import socket

import numpy as np

import pycoll

pycoll.init_process_group()
rank, size = pycoll.get_rank(), pycoll.get_world_size()
host = socket.gethostname()

# Where every rank runs, and so which ranks share this one's node.
hosts: list = [None] * size
pycoll.all_gather_object(hosts, host)
mine = [r for r in range(size) if hosts[r] == host]
local_rank, local_size = mine.index(rank), len(mine)
assert int(os.environ["LOCAL_RANK"]) == local_rank, (os.environ["LOCAL_RANK"], local_rank)
assert int(os.environ["LOCAL_WORLD_SIZE"]) == local_size, os.environ["LOCAL_WORLD_SIZE"]
assert pycoll.get_node_local_rank() == local_rank

# Reductions, small (one message) and large (16 MiB: the large-message paths,
# which must keep node-local shortcuts to the ranks of one node).
total = size * (size + 1) / 2
for n in (4, 1 << 22):
    x = np.full(n, rank + 1, np.float32)
    pycoll.all_reduce(x)
    assert np.all(x == total), (n, x[:4])
    y = np.full(n, rank + 1, np.float64)
    pycoll.all_reduce(y, op=pycoll.ReduceOp.MAX)
    assert np.all(y == size)
    z = np.full(n, rank + 1, np.float32)
    pycoll.reduce(z, dst=size - 1)
    if rank == size - 1:
        assert np.all(z == total)
b = np.arange(1000, dtype=np.int64) * (rank == 1)
pycoll.broadcast(b, src=1)
assert np.array_equal(b, np.arange(1000))

# Gathers and scatters, each rank's part telling whose it is.
parts = [np.zeros(3, np.int32) for _ in range(size)]
pycoll.all_gather(parts, np.full(3, rank * 10, np.int32))
assert all(np.all(parts[r] == r * 10) for r in range(size))
flat = np.zeros(3 * size, np.int32)
pycoll.all_gather_into_tensor(flat, np.full(3, rank, np.int32))
assert np.array_equal(flat, np.repeat(np.arange(size, dtype=np.int32), 3))
out = np.zeros(2, np.float32)
pycoll.reduce_scatter_tensor(out, np.arange(2 * size, dtype=np.float32) + rank)
assert np.array_equal(out, size * np.arange(2 * rank, 2 * rank + 2) + total - size)
recv = [np.zeros(1, np.int64) for _ in range(size)]
pycoll.all_to_all(recv, [np.array([rank * 100 + r]) for r in range(size)])
assert [int(v[0]) for v in recv] == [r * 100 + rank for r in range(size)]
got = np.zeros(2, np.int32)
pycoll.scatter(got, [np.full(2, r, np.int32) for r in range(size)] if rank == 0 else None, src=0)
assert np.all(got == rank)

# Point-to-point round a ring that crosses every node boundary.
right, left = (rank + 1) % size, (rank - 1) % size
inbox = np.zeros(5, np.float64)
reqs = [pycoll.isend(np.full(5, rank, np.float64), dst=right), pycoll.irecv(inbox, src=left)]
for w in reqs:
    w.wait()
assert np.all(inbox == left)

# Object collectives.
objs = [{"from": 0}] if rank == 0 else [None]
pycoll.broadcast_object_list(objs, src=0)
assert objs == [{"from": 0}]
gathered = [None] * size if rank == 0 else None
pycoll.gather_object((rank, host), gathered, dst=0)
if rank == 0:
    assert gathered == [(r, hosts[r]) for r in range(size)]

# A subgroup per node (ranks of one host), and one of the nodes' first ranks.
nodes = sorted(set(hosts), key=hosts.index)
per_node, _ = pycoll.new_subgroups_by_enumeration(
    [[r for r in range(size) if hosts[r] == h] for h in nodes]
)
v = np.ones(8, np.float32)
pycoll.all_reduce(v, group=per_node)
assert np.all(v == local_size)
leaders = pycoll.new_group([hosts.index(h) for h in nodes])
if local_rank == 0:
    w8 = np.ones(8, np.float32)
    pycoll.all_reduce(w8, group=leaders)
    assert np.all(w8 == len(nodes))
pycoll.barrier()
pycoll.destroy_process_group()
print(
    "CLUSTER-OK "
    + json.dumps({"rank": rank, "host": host, "local_rank": local_rank, "local_size": local_size}),
    flush=True,
)
