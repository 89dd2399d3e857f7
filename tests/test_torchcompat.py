"""torch tensors and torch's ReduceOps in pycoll's own API (pycoll.torchcompat).

Needs torch (CI's .venv-torch has the CPU build); skipped where it is not
installed. Expected values come from numpy on each rank's own inputs.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import pycoll
from support import assert_equal, data, reduce_all, valid_pairs

# Any size of job: tensors are adapted alike at every size.
pytestmark = pytest.mark.any_size

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch_tensors import TORCH, tensor, values  # noqa: E402

PAIRS = [(op, dt) for op, dt in valid_pairs() if dt in TORCH and op != "PREMUL_SUM"]


@pytest.mark.parametrize("op,dtype", PAIRS, ids=[f"{o}-{d}" for o, d in PAIRS])
def test_all_reduce_of_a_tensor_with_torchs_op(op, dtype, rank, world_size):
    t = tensor(data(rank, dtype))
    address = t.data_ptr()
    assert pycoll.all_reduce(t, op=getattr(dist.ReduceOp, op)) is None
    expected = reduce_all(op, [data(r, dtype) for r in range(world_size)], world_size)
    assert_equal(values(t), expected)
    assert t.data_ptr() == address  # in place: the tensor's own memory


def test_every_family_takes_tensors(rank, world_size):
    f32 = np.dtype(np.float32)
    every = [data(r, f32) for r in range(world_size)]
    out = torch.zeros(6 * world_size)
    pycoll.all_gather_into_tensor(out, tensor(data(rank, f32)))
    assert_equal(values(out), np.concatenate(every))
    outs = [torch.zeros(6) for _ in range(world_size)]
    pycoll.all_gather(outs, tensor(data(rank, f32)))
    for r in range(world_size):
        assert_equal(values(outs[r]), every[r])
    b = tensor(data(rank, f32))
    pycoll.broadcast(b, src=world_size - 1)
    assert_equal(values(b), every[-1])
    part = torch.zeros(2)
    big = [data(r, f32, (2 * world_size,)) for r in range(world_size)]
    pycoll.reduce_scatter_tensor(part, tensor(big[rank]), op=dist.ReduceOp.MAX)
    assert_equal(values(part), reduce_all("MAX", big, world_size)[2 * rank : 2 * rank + 2])
    got = torch.zeros(world_size, dtype=torch.int64)
    pycoll.all_to_all_single(got, torch.arange(world_size) + 10 * rank)
    assert_equal(values(got), np.array([10 * r + rank for r in range(world_size)]))
    coalesced = [tensor(data(rank, f32)), tensor(data(rank, f32, (3,)))]
    pycoll.all_reduce_coalesced(coalesced)
    assert_equal(
        values(coalesced[1]),
        reduce_all("SUM", [data(r, f32, (3,)) for r in range(world_size)], world_size),
    )


def test_a_tensor_that_needs_grad_is_reduced_in_place(rank, world_size):
    w = torch.full((3,), float(rank + 1), requires_grad=True)
    pycoll.all_reduce(w)  # reduced in its memory, outside autograd (as torch's own)
    assert w.detach().tolist() == [world_size * (world_size + 1) / 2] * 3
    with torch.no_grad():
        g = torch.ones(2) * (rank + 1)
        pycoll.all_reduce(g, op=dist.ReduceOp.AVG)
    assert g.tolist() == [(world_size + 1) / 2] * 2


def test_async_work_hands_back_the_tensors(rank, world_size):
    t = torch.full((4,), float(rank))
    work = pycoll.all_reduce(t, async_op=True)
    future = work.get_future()
    assert work.wait() is True and work.is_success()
    assert work.result()[0] is t  # the caller's tensor, not a view of it
    assert future.wait()[0] is t
    assert t.tolist() == [sum(range(world_size))] * 4
    src = torch.full((2,), float(rank))
    if world_size > 1 and rank < 2:
        peer = 1 - rank
        if rank == 0:
            w = pycoll.isend(src, dst=peer)
        else:
            w = pycoll.irecv(src, src=peer)
        w.wait()
        if rank == 1:
            assert w.result()[0] is src and src.tolist() == [0.0, 0.0]


def test_torchs_premul_sum_keeps_its_factor(rank, world_size):
    for factor in (0.5, torch.tensor([0.5])):
        t = torch.full((3,), float(rank + 1))
        pycoll.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        assert t.tolist() == [0.5 * world_size * (world_size + 1) / 2] * 3


def test_what_pycoll_cannot_take_is_refused_by_name(rank):
    with pytest.raises(ValueError, match=r"output is not contiguous; pass output.contiguous\(\)"):
        pycoll.reduce_scatter_tensor(
            torch.zeros(4, 2).t(), torch.zeros(8 * pycoll.get_world_size())
        )
    with pytest.raises(TypeError, match="tensor is a torch tensor numpy cannot view: .*Sparse"):
        pycoll.all_reduce(torch.ones(2).to_sparse())
    with pytest.raises(
        TypeError, match="tensor must be a numpy.ndarray, a torch tensor or a CUDA array"
    ):
        pycoll.all_reduce([torch.ones(2)])


def test_import_pycoll_does_not_import_torch():
    code = "import sys, pycoll; pycoll.all_reduce; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tensors_called_again_are_viewed_once_until_their_memory_changes(rank, world_size):
    """From its second call on, a tensor's calls get one numpy view, kept
    while the tensor holds the same memory (pycoll.torchcompat.kept_view),
    so the compiled path can keep them. A tensor whose memory moves
    (``.data``, ``set_``), shrinks (``resize_``) or whose layout changes
    (``t_``) is viewed
    afresh; the kept view holds no tensor alive."""
    from pycoll import torchcompat

    total = sum(range(world_size))
    t = torch.zeros(2, 2)
    for step in range(200):  # past the group's first call check point: compiled
        t.fill_(rank + step)
        pycoll.all_reduce(t)
        assert t.tolist() == [[total + world_size * step] * 2] * 2
    view = torchcompat.kept_view(t)
    assert view is not None and torchcompat.host_view(t, "f", "t") is view
    assert view.base is not t  # (over its memory: the table keeps no tensor alive)

    t.t_()  # the same address and shape, strides swapped: no longer contiguous
    assert torchcompat.kept_view(t) is None
    with pytest.raises(ValueError, match=r"tensor is not contiguous; pass tensor.contiguous\(\)"):
        pycoll.all_reduce(t)
    t.t_()
    # From here a doubling sum, which changes the values on one rank too: a
    # stale view would reduce memory the tensor no longer reads.
    double = pycoll.make_premul_sum(2.0)
    t.data = torch.zeros(64)  # moved (a viewed tensor's storage cannot grow: resize_ refuses)
    for step in range(3):
        t.fill_(rank + step)
        pycoll.all_reduce(t, op=double)
        assert t.tolist() == [2 * (total + world_size * step)] * 64
    t.resize_(3)  # the same address, fewer elements: the rest is another tensor's
    rest = torch.empty(0).set_(t.untyped_storage(), 3, (61,)).fill_(7.0)
    t.fill_(rank)
    pycoll.all_reduce(t, op=double)
    assert t.tolist() == [2 * total] * 3 and rest.tolist() == [7.0] * 61
    other = torch.zeros(3)
    t.set_(other)  # another tensor's memory, the same shape and strides
    t.fill_(rank + 1)
    pycoll.all_reduce(t, op=double)
    assert other.tolist() == [2 * (total + world_size)] * 3 and t.tolist() == other.tolist()
    t.fill_(rank)
    pycoll.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.tolist() == [world_size - 1] * 3
    t.data = t.data.view(torch.int32)  # the same memory, shape and strides, read as int32
    assert torchcompat.host_view(t, "f", "t").dtype == np.int32
    t.fill_(rank + 1)
    pycoll.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.tolist() == [world_size] * 3

    ref = weakref.ref(t)
    del t, other, view
    gc.collect()
    assert ref() is None


def test_every_family_again_on_the_same_tensors(rank, world_size):
    """The same tensors through every family, round after round (their
    views kept from the second round, the calls compiled from the group's
    first call check point), torch's ops included, and all_gather_into_tensor
    with its input a tensor over this rank's part of the output (torch's
    in-place idiom) or over memory the output shares with nothing."""
    n = world_size
    inout = torch.zeros(3)
    b16 = torch.zeros(4, dtype=torch.bfloat16)
    gathered = torch.zeros(2 * n)
    mine = gathered[2 * rank : 2 * rank + 2]  # kept across rounds, as the output
    apart = torch.zeros(2 * n)
    part = torch.zeros(2)
    big = torch.zeros(2 * n)
    got = torch.zeros(n, dtype=torch.int64)
    sent = torch.zeros(n, dtype=torch.int64)
    outs = [torch.zeros(2) for _ in range(n)]
    sources = [torch.zeros(2) for _ in range(n)]
    for step in range(140):
        inout.fill_(rank + step)
        pycoll.all_reduce(inout, op=dist.ReduceOp.MAX)
        assert inout.tolist() == [n - 1 + step] * 3
        b16.fill_(rank + 1)
        pycoll.all_reduce(b16)
        assert b16.float().tolist() == [n * (n + 1) / 2] * 4
        inout.fill_(rank * 10 + step)
        pycoll.broadcast(inout, src=n - 1)
        assert inout.tolist() == [(n - 1) * 10 + step] * 3
        inout.fill_(rank + 1)
        pycoll.reduce(inout, dst=0, op=dist.ReduceOp.PRODUCT)
        if rank == 0:
            assert inout.tolist() == [float(np.prod(range(1, n + 1)))] * 3
        mine.copy_(torch.tensor([rank, step], dtype=torch.float32))
        pycoll.all_gather_into_tensor(gathered, mine)
        assert gathered.tolist() == [v for r in range(n) for v in (r, step)]
        pycoll.all_gather_into_tensor(apart, mine)  # (mine is in gathered, not in apart)
        assert apart.tolist() == gathered.tolist()
        big.copy_(torch.arange(2 * n, dtype=torch.float32) + rank + step)
        pycoll.reduce_scatter_tensor(part, big)
        want = [sum(i + r + step for r in range(n)) for i in (2 * rank, 2 * rank + 1)]
        assert part.tolist() == want
        sent.copy_(torch.arange(n) + 10 * rank + step)
        pycoll.all_to_all_single(got, sent)
        assert got.tolist() == [10 * r + rank + step for r in range(n)]
        pycoll.all_gather(outs, part)
        for r in range(n):
            parts = [sum(i + q + step for q in range(n)) for i in (2 * r, 2 * r + 1)]
            assert outs[r].tolist() == parts
        for r, source in enumerate(sources):
            source.fill_(10 * r + step)
        pycoll.scatter(part, sources if rank == n - 1 else None, src=n - 1)
        assert part.tolist() == [10 * rank + step] * 2


def test_works_on_the_same_tensors_again_hand_back_the_tensors(rank, world_size):
    """async_op=True round after round on the same tensors: from the second
    round each tensor's view is kept and the front's lane runs the call on
    it (past the group's first call check point, on the compiled path);
    every Work's result() and future give the caller's tensors, not their
    views, and the values are right once it is waited for."""
    from pycoll import torchcompat

    n = world_size
    t = torch.zeros(3)
    gathered = torch.zeros(2 * n)
    mine = torch.zeros(2)
    big = torch.zeros(2 * n)
    part = torch.zeros(2)
    for step in range(140):
        t.fill_(rank + step)
        work = pycoll.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
        future = work.get_future()
        assert work.wait() is True and work.is_success()
        assert work.result()[0] is t and future.wait()[0] is t
        assert t.tolist() == [n - 1 + step] * 3
        t.fill_(rank * 10 + step)
        work = pycoll.broadcast(t, src=n - 1, async_op=True)
        assert work.result()[0] is t and t.tolist() == [(n - 1) * 10 + step] * 3
        mine.copy_(torch.tensor([rank, step], dtype=torch.float32))
        work = pycoll.all_gather_into_tensor(gathered, mine, async_op=True)
        assert work.result()[0] is gathered
        assert gathered.tolist() == [v for r in range(n) for v in (r, step)]
        big.copy_(torch.arange(2 * n, dtype=torch.float32) + rank + step)
        work = pycoll.reduce_scatter_tensor(part, big, async_op=True)
        assert work.get_future().wait()[0] is part
        want = [sum(i + r + step for r in range(n)) for i in (2 * rank, 2 * rank + 1)]
        assert part.tolist() == want
    for x in (t, gathered, mine, big, part):
        assert torchcompat.kept_view(x) is not None  # (so the lane ran the later rounds)


def test_send_and_recv_again_on_the_same_tensors(rank, world_size):
    """send and recv on the same tensors round after round (their views kept
    from the second round: the front's lane, as for the collectives), float32
    and bfloat16, around the ring: even ranks send first."""
    if world_size == 1:
        pytest.skip("point-to-point needs two ranks")
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    out = torch.zeros(3)
    got = torch.zeros(3)
    out16 = torch.zeros(4, dtype=torch.bfloat16)
    got16 = torch.zeros(4, dtype=torch.bfloat16)
    for step in range(20):
        out.fill_(10 * rank + step)
        out16.fill_(rank + 1)
        for send, recv in ((out, got), (out16, got16)):
            if rank % 2 == 0:
                pycoll.send(send, right)
                assert pycoll.recv(recv, left) == left
            else:
                assert pycoll.recv(recv, left) == left
                pycoll.send(send, right)
        assert got.tolist() == [10 * left + step] * 3
        assert got16.float().tolist() == [left + 1] * 4
