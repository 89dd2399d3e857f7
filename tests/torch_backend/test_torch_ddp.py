"""DistributedDataParallel over the backend "pycoll" trains as one process would.

Each rank trains on its slice of a batch; the reference is the same model
trained in this one process on the whole batch (the mean loss, so DDP's
averaged gradient is the whole batch's gradient). The weights must match
the reference's after every variant DDP offers, and be identical on every
rank.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pycoll

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
nn = torch.nn
DDP = torch.nn.parallel.DistributedDataParallel
hooks = pytest.importorskip("torch.distributed.algorithms.ddp_comm_hooks.default_hooks")
powerSGD = pytest.importorskip("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook")

STEPS = 4
PER_RANK = 4


class Net(nn.Module):
    """A small MLP, with a branch that find_unused_parameters can skip."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(10, 40)
        self.b = nn.Linear(40, 20)
        self.c = nn.Linear(20, 4)
        self.spare = nn.Linear(20, 4) if unused else None

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def batches(world_size: int):
    g = torch.Generator().manual_seed(7)
    return [
        (
            torch.randn(PER_RANK * world_size, 10, generator=g),
            torch.randn(PER_RANK * world_size, 4, generator=g),
        )
        for _ in range(STEPS)
    ]


def reference(model: nn.Module, data, lr: float = 0.05) -> nn.Module:
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    return ref


def train(ddp, data, rank: int, lr: float = 0.05, micro: int = 1):
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    lo, hi = rank * PER_RANK, (rank + 1) * PER_RANK
    for x, y in data:
        opt.zero_grad()
        xs, ys = x[lo:hi].chunk(micro), y[lo:hi].chunk(micro)
        for i in range(micro - 1):  # accumulate locally, then one synchronizing pass
            with ddp.no_sync():
                (nn.functional.mse_loss(ddp(xs[i]), ys[i]) / micro).backward()
        (nn.functional.mse_loss(ddp(xs[-1]), ys[-1]) / micro).backward()
        opt.step()


def assert_same_everywhere(model: nn.Module, ref: nn.Module, world_size: int, tol=1e-5):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol, msg=name)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, flat)  # identical on every rank, bit for bit
    for other in everyone:
        np.testing.assert_array_equal(other, flat)


VARIANTS = {
    "plain": {},
    "grad_as_bucket_view": {"gradient_as_bucket_view": True},
    "small_buckets": {"bucket_cap_mb": 0.002},
    "find_unused": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ddp_matches_one_process(tdist, variant, rank, world_size):
    torch.manual_seed(0)
    model = Net(unused=variant == "find_unused")
    data = batches(world_size)
    ref = reference(model, data)
    ddp = DDP(model, **VARIANTS[variant])
    train(ddp, data, rank)
    assert_same_everywhere(model, ref, world_size)


def test_no_sync_accumulation_matches(tdist, rank, world_size):
    torch.manual_seed(1)
    model = Net()
    data = batches(world_size)
    ref = reference(model, data)
    train(DDP(model), data, rank, micro=2)
    assert_same_everywhere(model, ref, world_size)


def test_ddp_on_a_subgroup(tdist, rank, world_size):
    members = list(range(0, world_size, 2))
    group = dist.new_group(members)
    if rank not in members:
        return
    torch.manual_seed(2)
    model = Net()
    data = batches(len(members))
    ref = reference(model, data)
    train(DDP(model, process_group=group), data, members.index(rank))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "hook,tol",
    [(hooks.allreduce_hook, 1e-5), (hooks.fp16_compress_hook, 2e-3)],
    ids=["allreduce", "fp16_compress"],
)
def test_comm_hooks(tdist, hook, tol, rank, world_size):
    torch.manual_seed(3)
    model = Net()
    data = batches(world_size)
    ref = reference(model, data)
    ddp = DDP(model, bucket_cap_mb=0.002)
    ddp.register_comm_hook(None, hook)
    train(ddp, data, rank)
    assert_same_everywhere(model, ref, world_size, tol)


def test_bf16_compress_hook_is_torchs_to_refuse_on_cpu(tdist):
    """torch 2.13 allows bf16_compress_hook only with NCCL (or XCCL): it says so
    itself, before anything reaches the backend."""
    ddp = DDP(Net())
    with pytest.raises(TypeError, match="BF16 all reduce communication hook required"):
        ddp.register_comm_hook(None, hooks.bf16_compress_hook)


@pytest.mark.parametrize("buckets", [25, 0.002], ids=["one_bucket", "many_buckets"])
def test_powersgd(tdist, buckets, rank, world_size):
    """Vanilla allreduce before start_powerSGD_iter (so the first steps match
    the reference exactly), compressed after; every rank ends identical. With
    many buckets the hook's callbacks issue collectives while later buckets
    are issued: the two streams must stay in step on every rank."""
    torch.manual_seed(4)
    model = Net()
    data = batches(world_size)
    vanilla = reference(model, data[:2])
    state = powerSGD.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=2,
        start_powerSGD_iter=2,
        min_compression_rate=0.5,
    )
    ddp = DDP(model, bucket_cap_mb=buckets)
    ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    train(ddp, data[:2], rank)
    assert_same_everywhere(model, vanilla, world_size)
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    train(ddp, data[2:], rank)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.isfinite(flat).all() and not torch.equal(flat, before)
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, flat.numpy())
    for other in everyone:
        np.testing.assert_array_equal(other, flat.numpy())


def test_checkpoint_and_resume(tdist, rank, world_size, mpi_tmp_path):
    torch.manual_seed(5)
    model = Net()
    data = batches(world_size)
    ref = reference(model, data)
    ddp = DDP(model)
    train(ddp, data[:2], rank)
    path = mpi_tmp_path / "ddp.pt"
    if rank == 0:
        torch.save(ddp.state_dict(), path)
    dist.barrier()
    resumed = Net()
    fresh = DDP(resumed)
    fresh.load_state_dict(torch.load(path, map_location="cpu"))
    train(fresh, data[2:], rank)
    assert_same_everywhere(resumed, ref, world_size)


class SparseNet(nn.Module):
    """An embedding with sparse gradients (a sparse all_reduce per step) and a dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(16, 6, sparse=True)
        self.head = nn.Linear(6, 4)

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(1))


def test_ddp_with_sparse_gradients_matches_one_process(tdist, rank, world_size):
    torch.manual_seed(4)
    model = SparseNet()
    g = torch.Generator().manual_seed(11)
    data = [
        (
            torch.randint(0, 16, (PER_RANK * world_size, 3), generator=g),
            torch.randn(PER_RANK * world_size, 4, generator=g),
        )
        for _ in range(STEPS)
    ]
    ref = reference(model, data)
    ddp = DDP(model)
    train(ddp, data, rank)
    assert model.embedding.weight.grad.is_sparse  # the sparse path was taken
    assert_same_everywhere(model, ref, world_size)
