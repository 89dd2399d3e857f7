"""torch.distributed's API over the backend "pycoll" (pycoll.torch).

Every collective, torch's way, with expected values computed with numpy from
each rank's own inputs (tests/support.py), never by the backend.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest

import pycoll
from support import BF16, assert_equal, data, invalid_pairs, reduce_all, valid_pairs

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch_tensors import TORCH, tensor, values  # noqa: E402

COMPLEX_DENIED = ("PRODUCT", "MIN", "MAX")  # torch refuses these on complex tensors itself
PAIRS = [
    (op, dt)
    for op, dt in valid_pairs()
    if dt in TORCH and not (dt.kind == "c" and op in COMPLEX_DENIED)
]
F32 = np.dtype(np.float32)


def torch_op(op: str):
    if op == "PREMUL_SUM":
        from support import PREMUL_SCALE

        return dist._make_nccl_premul_sum(PREMUL_SCALE)
    return getattr(dist.ReduceOp, op)


def test_the_backend_is_registered_and_named(tdist, world_size):
    assert dist.is_backend_available("pycoll")
    assert dist.get_backend() == "pycoll"
    assert dist.get_world_size() == world_size
    assert dist.get_rank() == pycoll.get_rank()
    assert dist.group.WORLD.name() == "pycoll"
    assert dist.group.WORLD.group_name  # torch's name methods reach the group


@pytest.mark.parametrize("op,dtype", PAIRS, ids=[f"{o}-{d}" for o, d in PAIRS])
def test_all_reduce_every_dtype_and_op(tdist, op, dtype, rank, world_size):
    t = tensor(data(rank, dtype))
    dist.all_reduce(t, op=torch_op(op))
    expected = reduce_all(op, [data(r, dtype) for r in range(world_size)], world_size)
    assert_equal(values(t), expected)


def test_ops_met_again_keep_their_meaning(tdist, rank, world_size):
    """The backend knows an op kind it has met again by the options' ReduceOp
    (pycoll.torch.backend._op): each op, premul sums of two factors among
    them, means itself on its second and third meeting too."""
    x = data(rank, F32)
    inputs = [data(r, F32) for r in range(world_size)]
    total = reduce_all("SUM", inputs, world_size)
    for _ in range(3):
        for name in ("SUM", "MAX", "MIN", "PRODUCT", "AVG"):
            t = tensor(x)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            assert_equal(values(t), reduce_all(name, inputs, world_size))
        for factor in (0.25, 2.0):
            t = tensor(x)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
            assert_equal(values(t), (total * np.float32(factor)).astype(F32))


BAD = [(op, dt) for op, dt in invalid_pairs() if dt in TORCH and dt.kind != "c"]


@pytest.mark.parametrize("op,dtype", BAD, ids=[f"{o}-{d}" for o, d in BAD])
def test_an_op_the_dtype_lacks_is_refused_before_sending(tdist, op, dtype, rank):
    t = tensor(data(rank, dtype))
    with pytest.raises((TypeError, ValueError), match=op):
        dist.all_reduce(t, op=torch_op(op))
    # Nothing was sent: the group is in step for the next call.
    x = torch.ones(1)
    dist.all_reduce(x)
    assert x.item() == dist.get_world_size()


def test_async_all_reduce_future_holds_the_tensor_and_chains(tdist, rank, world_size):
    t = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert isinstance(fut, torch.futures.Future)
    chained = fut.then(lambda f: f.value()[0] * 2)
    got = chained.wait()
    total = world_size * (world_size + 1) / 2
    assert got.tolist() == [2 * total] * 1000
    assert fut.value()[0] is t
    assert work.is_completed() and work.is_success()
    assert work.wait()


def test_a_future_completes_without_anyone_waiting(tdist, world_size):
    t = torch.ones(4)
    fut = dist.all_reduce(t, async_op=True).get_future()
    seen = threading.Event()
    fut.add_done_callback(lambda f: seen.set())
    assert seen.wait(60), "the completer did not complete the future"
    assert t.tolist() == [float(world_size)] * 4


def test_coalesced_forms(tdist, rank, world_size):
    n = world_size
    ts = [torch.full((3,), float(rank)), torch.full((2,), float(rank + 1))]
    dist.all_reduce_coalesced(ts)
    assert ts[0].tolist() == [n * (n - 1) / 2] * 3
    assert ts[1].tolist() == [n * (n + 1) / 2] * 2
    outs = [torch.zeros(2 * n), torch.zeros(3 * n)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_single(outs[0], torch.full((2,), float(rank)))
        dist.all_gather_single(outs[1], torch.full((3,), float(rank) * 10))
    cm.wait()
    assert outs[0].tolist() == [float(r) for r in range(n) for _ in range(2)]
    assert outs[1].tolist() == [r * 10.0 for r in range(n) for _ in range(3)]
    parts = [torch.zeros(2), torch.zeros(1)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_single(parts[0], torch.arange(2.0 * n))
        dist.reduce_scatter_single(parts[1], torch.arange(1.0 * n))
    cm.wait()
    assert parts[0].tolist() == [n * (2.0 * rank), n * (2.0 * rank + 1)]
    assert parts[1].tolist() == [n * float(rank)]


@pytest.mark.parametrize("op,dtype", PAIRS, ids=[f"{o}-{d}" for o, d in PAIRS])
def test_a_coalesced_block_of_cpu_tensors_is_one_operation(tdist, op, dtype, rank, world_size):
    """What _coalescing_manager issues for CPU tensors is one pycoll call (one
    sequence number) per block: all-gathers of mixed dtypes, reduce-scatters
    of every op and dtype."""
    n = world_size
    pg = dist.group.WORLD.pycoll_group
    mixed = [dtype, F32, np.dtype(np.int64)]
    ins = [tensor(data(rank, dt, (3 + i,), salt=i)) for i, dt in enumerate(mixed)]
    outs = [tensor(np.zeros(n * (3 + i), dt)) for i, dt in enumerate(mixed)]
    before = pg.sequence_number()
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, x in zip(outs, ins):
            dist.all_gather_into_tensor(out, x)
    cm.wait()
    assert pg.sequence_number() == before + 1
    for i, (dt, out) in enumerate(zip(mixed, outs)):
        want = np.concatenate([data(r, dt, (3 + i,), salt=i) for r in range(n)])
        assert_equal(values(out), want)
    shapes = [(n * 2,), (n * 3, 2), (n,)]
    xs = [tensor(data(rank, dtype, s, salt=i)) for i, s in enumerate(shapes)]
    parts = [tensor(np.zeros((s[0] // n,) + s[1:], dtype)) for s in shapes]
    before = pg.sequence_number()
    with dist._coalescing_manager(async_ops=True) as cm:
        for part, x in zip(parts, xs):
            dist.reduce_scatter_tensor(part, x, op=torch_op(op))
    cm.wait()
    assert pg.sequence_number() == before + 1
    for i, (s, part) in enumerate(zip(shapes, parts)):
        total = reduce_all(op, [data(r, dtype, s, salt=i) for r in range(n)], n)
        k = s[0] // n
        assert_equal(values(part), total[rank * k : (rank + 1) * k])


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16, np.dtype(np.int64)], ids=str)
def test_every_collective(tdist, dtype, rank, world_size):
    n = world_size
    every = [data(r, dtype) for r in range(n)]
    last = n - 1

    t = tensor(every[rank])
    dist.reduce(t, dst=last, op=dist.ReduceOp.MAX)
    if rank == last:
        assert_equal(values(t), reduce_all("MAX", every, n))

    t = tensor(every[rank])
    dist.broadcast(t, src=last)
    assert_equal(values(t), every[last])

    outs = [tensor(np.zeros(6, dtype)) for _ in range(n)]
    dist.all_gather(outs, tensor(every[rank]))
    for r in range(n):
        assert_equal(values(outs[r]), every[r])

    out = tensor(np.zeros(6 * n, dtype))
    dist.all_gather_into_tensor(out, tensor(every[rank]))
    assert_equal(values(out), np.concatenate(every))

    gathered = [tensor(np.zeros(6, dtype)) for _ in range(n)] if rank == 0 else None
    dist.gather(tensor(every[rank]), gathered, dst=0)
    if rank == 0:
        for r in range(n):
            assert_equal(values(gathered[r]), every[r])

    mine = tensor(np.zeros(6, dtype))
    dist.scatter(mine, [tensor(a) for a in every] if rank == last else None, src=last)
    assert_equal(values(mine), every[rank])

    big = [data(r, dtype, (6 * n,)) for r in range(n)]
    part = tensor(np.zeros(6, dtype))
    dist.reduce_scatter_tensor(part, tensor(big[rank]), op=dist.ReduceOp.SUM)
    assert_equal(values(part), reduce_all("SUM", big, n)[6 * rank : 6 * rank + 6])

    part = tensor(np.zeros(6, dtype))
    dist.reduce_scatter(part, [tensor(b[6 * r : 6 * r + 6]) for r, b in enumerate([big[rank]] * n)])
    assert_equal(values(part), reduce_all("SUM", big, n)[6 * rank : 6 * rank + 6])

    ins = [tensor(data(rank, dtype, (2,), salt=r)) for r in range(n)]
    outs = [tensor(np.zeros(2, dtype)) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for r in range(n):
        assert_equal(values(outs[r]), data(r, dtype, (2,), salt=rank))


def test_the_groups_methods_with_their_options_left_out(tdist, rank, world_size):
    """Each of the group's methods called as torch's C++ API allows, without
    options: the options' defaults apply (asyncOp True: a Work to wait for;
    root 0), with the same results as through dist's API."""
    pg = dist.group.WORLD
    n = world_size
    total = n * (n + 1) / 2
    t = torch.full((2,), float(rank + 1))
    assert pg.allreduce([t]).wait() and t.tolist() == [total] * 2
    ts = [torch.full((2,), float(rank + 1)), torch.full((3,), float(rank))]
    assert pg.allreduce_coalesced(ts).wait()
    assert ts[0].tolist() == [total] * 2 and ts[1].tolist() == [total - n] * 3
    t.fill_(rank + 1)
    pg.reduce([t]).wait()
    if rank == 0:
        assert t.tolist() == [total] * 2
    t.fill_(rank + 5)
    pg.broadcast([t]).wait()
    assert t.tolist() == [5.0] * 2
    mine = torch.full((2,), float(rank))
    outs = [torch.zeros(2) for _ in range(n)]
    pg.allgather([outs], [mine]).wait()
    assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(n)]
    out = torch.zeros(2 * n)
    pg.all_gather_single(out, mine).wait()
    assert out.tolist() == [float(r) for r in range(n) for _ in range(2)]
    big = torch.arange(2.0 * n) + rank
    part = torch.zeros(2)
    pg.reduce_scatter_single(part, big).wait()
    assert part.tolist() == [n * (2 * rank + i) + total - n for i in range(2)]
    gathered = [torch.zeros(2) for _ in range(n)]
    pg.gather([gathered] if rank == 0 else [], [mine]).wait()
    if rank == 0:
        assert [g.tolist() for g in gathered] == [[float(r)] * 2 for r in range(n)]
    got = torch.zeros(2)
    parts = [torch.full((2,), 10.0 * r) for r in range(n)]
    pg.scatter([got], [parts] if rank == 0 else []).wait()
    assert got.tolist() == [10.0 * rank] * 2
    ins = [torch.full((1,), 10.0 * rank + r) for r in range(n)]
    outs = [torch.zeros(1) for _ in range(n)]
    pg.alltoall(outs, ins).wait()
    assert [o.item() for o in outs] == [10.0 * r + rank for r in range(n)]
    out = torch.zeros(n)
    pg.alltoall_base(out, torch.arange(float(n)) + 10 * rank, [], []).wait()
    assert out.tolist() == [10.0 * r + rank for r in range(n)]
    assert pg.barrier().wait()


def test_all_to_all_single_uneven(tdist, rank, world_size):
    n = world_size
    # rank r sends (s + 1) rows to rank s; each row holds 100 * r + s
    in_splits = [s + 1 for s in range(n)]
    x = torch.cat([torch.full((s + 1, 2), 100.0 * rank + s) for s in range(n)])
    out_splits = [rank + 1] * n
    out = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(out, x, out_splits, in_splits)
    expected = torch.cat([torch.full((rank + 1, 2), 100.0 * r + rank) for r in range(n)])
    assert torch.equal(out, expected)
    even = torch.arange(float(n)) + 10 * rank
    got = torch.zeros(n)
    dist.all_to_all_single(got, even)
    assert got.tolist() == [10.0 * r + rank for r in range(n)]


def test_complex_tensors(tdist, rank, world_size):
    t = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(t)
    n = world_size
    assert t.tolist() == [complex(n * (n - 1) / 2, n)] * 3


def test_barrier_and_sequence_numbers(tdist, world_size):
    group = dist.group.WORLD
    before = group._get_sequence_number_for_group()
    dist.barrier()
    dist.all_reduce(torch.ones(1))
    assert group._get_sequence_number_for_group() == before + 2
    everyone = [None] * world_size
    dist.all_gather_object(everyone, group._get_sequence_number_for_group())
    assert len(set(everyone)) == 1
    work = dist.barrier(async_op=True)
    assert work.wait()
    group.monitored_barrier(timedelta(seconds=60), wait_all_ranks=True)


def test_point_to_point_and_any_source(tdist, rank, world_size):
    if world_size == 1:
        pytest.skip("needs a peer")
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    out = torch.full((4,), float(rank))
    got = torch.zeros(4)
    ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert got.tolist() == [float(prv)] * 4
    if rank == 0:
        srcs = set()
        for _ in range(world_size - 1):
            buf = torch.zeros(1)
            src = dist.recv(buf)
            assert buf.item() == 7.0 + src
            srcs.add(src)
        assert srcs == set(range(1, world_size))
    else:
        dist.send(torch.full((1,), 7.0 + rank), 0)
    if rank == 0:
        w = dist.isend(torch.arange(3.0), 1)
        w.wait()
    elif rank == 1:
        y = torch.zeros(3)
        dist.irecv(y, 0).wait()
        assert y.tolist() == [0.0, 1.0, 2.0]


def test_object_collectives(tdist, rank, world_size):
    everyone = [None] * world_size
    dist.all_gather_object(everyone, {"rank": rank, "s": "x" * rank})
    assert everyone == [{"rank": r, "s": "x" * r} for r in range(world_size)]
    objs = [("a", 1), None] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [("a", 1), None]
    got = [None] * world_size if rank == 0 else None
    dist.gather_object(rank * 3, got, dst=0)
    if rank == 0:
        assert got == [r * 3 for r in range(world_size)]
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(world_size)] if rank == 0 else None)
    assert out == [f"to {rank}"]


def test_new_group_and_subgroups(tdist, rank, world_size):
    evens = list(range(0, world_size, 2))
    g = dist.new_group(evens, backend="pycoll")
    if rank in evens:
        assert dist.get_backend(g) == "pycoll"
        x = torch.full((2,), float(rank))
        dist.all_reduce(x, group=g)
        assert x.tolist() == [float(sum(evens))] * 2
        assert dist.get_rank(g) == evens.index(rank)
        dist.broadcast(x := torch.full((1,), float(rank)), src=evens[-1], group=g)
        assert x.item() == float(evens[-1])
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
    mine, _ = dist.new_subgroups(group_size=1)
    y = torch.full((1,), float(rank))
    dist.all_reduce(y, group=mine)
    assert y.item() == float(rank)
    dist.destroy_process_group(mine)


def test_gloo_groups_beside_it_use_the_store(tdist, rank, world_size):
    g = dist.new_group(backend="gloo")
    x = torch.full((2,), float(rank))
    dist.all_reduce(x, group=g)
    assert x.tolist() == [world_size * (world_size - 1) / 2] * 2


def test_bad_input_is_refused_by_name(tdist):
    t = torch.zeros(4, 2).t()
    with pytest.raises(ValueError, match="not contiguous|contiguous"):
        dist.all_reduce(t.contiguous().t())
    with pytest.raises(ValueError, match="must have .*|same|size|elements"):
        dist.all_gather_into_tensor(torch.zeros(1), torch.zeros(5))
    x = torch.ones(1)
    dist.all_reduce(x)  # nothing was sent by either
    assert x.item() == dist.get_world_size()


def test_pycoll_api_on_the_same_ranks(tdist, world_size):
    g = dist.group.WORLD
    x = np.ones(3, np.float32)
    pycoll.all_reduce(x, group=g.pycoll_group)
    assert x.tolist() == [float(world_size)] * 3


def test_a_backend_config_naming_pycoll_for_cpu(pg, world_size):
    """torch hands the whole group to a Python backend: "cpu:pycoll,cuda:nccl"
    makes one pycoll group, for new groups too (CUDA tensors would take pycoll's
    device door)."""
    import pycoll.torch  # noqa: F401

    dist.init_process_group("cpu:pycoll,cuda:nccl", init_method="mpi://")
    try:
        assert dist.get_backend() == "cpu:pycoll,cuda:nccl"
        assert type(dist.group.WORLD).__name__ == "ProcessGroupPycoll"
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [float(world_size)] * 2
        g = dist.new_group(backend="cpu:pycoll,cuda:nccl")
        x = torch.full((1,), 2.0)
        dist.all_reduce(x, group=g)
        assert x.item() == 2.0 * world_size
    finally:
        dist.destroy_process_group()


def test_torch_collectives_are_on_pycolls_timeline(tdist, rank, world_size, tmp_path):
    """Traced under the backend: torch's calls appear as pycoll's operations
    on the backend's group (each rank writes its own file here)."""
    t = torch.ones(16, dtype=torch.float32)
    with pycoll.trace(str(tmp_path)):
        tdist.all_reduce(t)
        tdist.all_reduce(t, async_op=True).wait()
        tdist.barrier()
    assert (t == world_size**2).all()
    import json

    with open(tmp_path / f"trace-rank{rank}.json") as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    reduces = [e for e in events if e["name"] == "all_reduce"]
    assert len(reduces) == 2 and all(e["args"]["bytes"] == 64 for e in reduces), events
    assert reduces[0]["args"]["call"] == "all_reduce(SUM, float32, 16 elements)"
    assert reduces[1]["args"]["seq"] == reduces[0]["args"]["seq"] + 1
    assert any(e["name"] == "barrier" for e in events), events


def sparse_input(rank: int, dtype=torch.float32):
    """Rank r's sparse (6, 3) tensor: rows r and r+1 (some shared with the
    next rank, so the sum has duplicate indices to merge), uncoalesced (row r
    twice), with values that say whose they are."""
    rows = torch.tensor([[rank % 6, (rank + 1) % 6, rank % 6]])
    vals = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [100.0, 0.0, 0.0]]) * (rank + 1)
    return torch.sparse_coo_tensor(rows, vals.to(dtype), (6, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sparse_all_reduce_sums_as_dense(tdist, rank, world_size, dtype):
    t = sparse_input(rank, dtype)
    dist.all_reduce(t)
    expected = sum(sparse_input(r, torch.float64).to_dense() for r in range(world_size))
    assert t.layout == torch.sparse_coo and t.dtype == dtype
    torch.testing.assert_close(t.to_dense().double(), expected, rtol=1e-2, atol=0)
    assert t.is_coalesced()  # no duplicate index left


def test_sparse_all_reduce_of_an_empty_rank_and_async(tdist, rank, world_size):
    empty = torch.sparse_coo_tensor(
        torch.empty((1, 0), dtype=torch.long), torch.empty(0, 3), (6, 3)
    )
    t = sparse_input(rank) if rank else empty
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.get_future().value()[0] is t
    expected = sum((sparse_input(r).to_dense() for r in range(1, world_size)), torch.zeros(6, 3))
    torch.testing.assert_close(t.to_dense(), expected)


def test_sparse_all_reduce_refuses_other_reductions_and_unlike_tensors(tdist, rank):
    with pytest.raises(ValueError, match="ReduceOp.SUM only"):
        dist.all_reduce(sparse_input(rank), op=dist.ReduceOp.MAX)
    unlike = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 3 + rank), (6, 3 + rank))
    if pycoll.get_world_size() > 1:  # every rank sees every header, so every rank raises
        with pytest.raises(ValueError, match="differ in shape, sparse dimensions or dtype"):
            dist.all_reduce(unlike)
