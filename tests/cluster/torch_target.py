"""One rank of a cross-node torch job (tests/cluster/test_cluster.py): the
pycoll backend from ``mpi://`` or ``env://``, a gloo subgroup (its store bound
at rank 0's host name, reached from the other node), and one DDP step whose
gradient must equal a single-process reference over the whole batch, then
FSDP2 (fully_shard over all ranks) trained two steps against the same
steps on one process."""

from __future__ import annotations

import copy
import socket
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import pycoll.torch  # noqa: F401  (registers the "pycoll" backend)

dist.init_process_group("pycoll", init_method=sys.argv[1])
rank, size = dist.get_rank(), dist.get_world_size()

t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
assert torch.all(t == size * (size + 1) / 2), t
hosts = [None] * size
dist.all_gather_object(hosts, socket.gethostname())
assert len(set(hosts)) > 1, hosts  # the job spans nodes

gloo = dist.new_group(list(range(size)), backend="gloo")
g = torch.full((3,), float(rank))
dist.all_reduce(g, group=gloo)
assert torch.all(g == size * (size - 1) / 2), g

torch.manual_seed(0)
model = torch.nn.Linear(5, 1)
reference = torch.nn.Linear(5, 1)
reference.load_state_dict(model.state_dict())
data = torch.arange(size * 2 * 5, dtype=torch.float32).reshape(size * 2, 5) / 10
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(data[2 * rank : 2 * rank + 2]).pow(2).mean().backward()
reference(data).pow(2).mean().backward()
assert torch.allclose(model.weight.grad, reference.weight.grad, atol=1e-5)

# FSDP2: each Linear sharded over the 4 ranks of both nodes; two optimizer
# steps on this rank's slice of the batch match the same steps on one process.
torch.manual_seed(1)
layers = [torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)]
sharded, whole = torch.nn.Sequential(*layers), torch.nn.Sequential(*map(copy.deepcopy, layers))
mesh = init_device_mesh("cpu", (size,))
for layer in (sharded[0], sharded[2], sharded):
    fully_shard(layer, mesh=mesh)
opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (sharded, whole)]
for _ in range(2):
    sharded(data[2 * rank : 2 * rank + 2]).pow(2).mean().backward()
    whole(data).pow(2).mean().backward()
    for opt in opts:
        opt.step()
        opt.zero_grad()
gathered = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
for key, value in whole.state_dict().items():
    assert torch.allclose(gathered[key], value, atol=1e-5), key
dist.destroy_process_group()
print(f'CLUSTER-OK {{"rank": {rank}, "host": "{socket.gethostname()}"}}', flush=True)
