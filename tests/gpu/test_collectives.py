"""Every collective on CUDA arrays, through real MPI, staged and CUDA-aware.

The arrays are fakes over host memory (tests/gpu/fakes.py) and the runtime
is pycoll.gpu's simulator, so the staging copies, the pinned pool, the
stream synchronization and the aware path's hand-over to MPI all run for
real; each rank checks its device array against numpy's answer."""

import ml_dtypes
import numpy as np
import pytest
from fakes import FakeCAI, FakeDLPack, cuda_like

import pycoll
from pycoll import ReduceOp, make_premul_sum
from pycoll.gpu import aware
from support import PREMUL_SCALE, assert_equal, count_rings, data, reduce_all, valid_pairs

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


def rop(name):
    return make_premul_sum(PREMUL_SCALE) if name == "PREMUL_SUM" else getattr(ReduceOp, name)


def expected(op, dtype, world_size, shape=(6,)):
    return reduce_all(op, [data(r, dtype, shape) for r in range(world_size)], world_size)


@pytest.mark.parametrize("kind", ["cai", "dlpack"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", valid_pairs(), ids=str)
def test_all_reduce(op, dtype, async_op, kind, path, rank, world_size):
    if kind == "cai" and dtype == BF16:
        kind = "dlpack"  # bfloat16 has no __cuda_array_interface__ typestr
    host = data(rank, dtype)
    x = cuda_like(host, kind)
    work = pycoll.all_reduce(x, op=rop(op), async_op=async_op)
    if async_op:
        assert work.wait() is True and work.is_completed() and work.is_success()
        assert work.result() == [x]  # the caller's device array, not a stand-in
    else:
        assert work is None
    assert_equal(host, expected(op, dtype, world_size))


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX", "PREMUL_SUM"])
@pytest.mark.parametrize("dtype", [F32, np.dtype(np.float16), BF16], ids=str)
def test_chunked_all_reduce(op, dtype, sim, monkeypatch, rank, world_size):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "0")
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", "64")  # 32 chunks of 2 KiB total
    from pycoll.gpu import aware

    aware.reset()
    shape = (1000 + 3,)  # chunks of unequal length
    host = data(rank, dtype, shape)
    pycoll.all_reduce(FakeDLPack(host), op=rop(op))
    assert_equal(host, expected(op, dtype, world_size, shape))
    aware.reset()


def test_the_stage_chunk_by_default_and_as_set(monkeypatch):
    from pycoll.gpu import staging

    monkeypatch.delenv("PYCOLL_STAGE_CHUNK", raising=False)
    assert staging.chunk_bytes() == 4 << 20
    assert not staging.chunked(4 << 20) and staging.chunked((4 << 20) + 1)
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", "0")
    assert not staging.chunked(1 << 30)  # 0: never in chunks
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", "4M")
    with pytest.raises(
        ValueError,
        match=r"PYCOLL_STAGE_CHUNK='4M': set it to a number of bytes \(0: the whole array",
    ):
        staging.chunk_bytes()


def test_chunked_staging_pins_a_few_chunks_not_the_message(sim, monkeypatch, rank, world_size):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "0")
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", str(64 << 10))
    from pycoll.gpu import aware

    aware.reset()
    shape = (1 << 20,)  # 4 MiB of float32: 64 chunks
    host = data(rank, F32, shape)
    pycoll.all_reduce(FakeCAI(host), op=ReduceOp.MAX)
    assert_equal(host, expected("MAX", F32, world_size, shape))
    assert sim.pinned_bytes <= 256 << 10  # three 64 KiB slots (the pool rounds to 256 KiB)
    aware.reset()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_chunked_broadcast(sim, monkeypatch, rank, world_size, async_op):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "0")
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", "40")
    src = world_size - 1
    host = data(rank, F32, (101,))
    work = pycoll.broadcast(FakeCAI(host), src=src, async_op=async_op)
    if async_op:
        work.wait()
    assert_equal(host, data(src, F32, (101,)))
    seq = pycoll.group.WORLD._seq
    pycoll.broadcast(FakeCAI(host), src=src)
    assert pycoll.group.WORLD._seq == seq + 1  # many chunks, one collective


def test_broadcast_reduce_and_gathers(path, rank, world_size):
    n = world_size
    for src in range(n):
        host = data(rank, F32)
        pycoll.broadcast(FakeCAI(host), src=src)
        assert_equal(host, data(src, F32))
    for dst in range(n):
        host = data(rank, F32)
        pycoll.reduce(FakeCAI(host), dst=dst, op=ReduceOp.SUM)
        assert_equal(host, expected("SUM", F32, n) if rank == dst else data(rank, F32))
    out = np.zeros(6 * n, F32)
    pycoll.all_gather_into_tensor(FakeCAI(out), FakeCAI(data(rank, F32)))
    assert_equal(out, np.concatenate([data(r, F32) for r in range(n)]))
    outs = [np.zeros(6, F32) for _ in range(n)]
    pycoll.all_gather([FakeCAI(o) for o in outs], FakeCAI(data(rank, F32)))
    for r in range(n):
        assert_equal(outs[r], data(r, F32))
    gathered = [np.zeros(6, F32) for _ in range(n)] if rank == 0 else None
    targets = [FakeCAI(g) for g in gathered] if gathered else None
    pycoll.gather(FakeCAI(data(rank, F32)), gather_list=targets, dst=0)
    if rank == 0:
        for r in range(n):
            assert_equal(gathered[r], data(r, F32))


def test_scatter_reduce_scatter_and_all_to_all(path, rank, world_size):
    n = world_size
    got = np.zeros(6, F32)
    parts = [FakeCAI(data(r, F32, salt=1)) for r in range(n)] if rank == 0 else None
    pycoll.scatter(FakeCAI(got), scatter_list=parts, src=0)
    assert_equal(got, data(rank, F32, salt=1))
    mine = np.zeros(6, F32)
    full = np.concatenate([data(rank, F32, salt=r) for r in range(n)])
    pycoll.reduce_scatter_tensor(FakeCAI(mine), FakeCAI(full), op=ReduceOp.SUM)
    assert_equal(mine, reduce_all("SUM", [data(r, F32, salt=rank) for r in range(n)], n))
    mine2 = np.zeros(6, F32)
    inputs = [FakeCAI(data(rank, F32, salt=r)) for r in range(n)]
    pycoll.reduce_scatter(FakeCAI(mine2), inputs, op=ReduceOp.MAX)
    assert_equal(mine2, reduce_all("MAX", [data(r, F32, salt=rank) for r in range(n)], n))
    out = np.zeros(2 * n, F32)
    send = np.arange(2 * n, dtype=F32) + 100 * rank
    pycoll.all_to_all_single(FakeCAI(out), FakeCAI(send))
    want = np.concatenate(
        [np.arange(2 * rank, 2 * rank + 2, dtype=F32) + 100 * r for r in range(n)]
    )
    assert_equal(out, want)
    outs = [np.zeros(3, F32) for _ in range(n)]
    ins = [FakeCAI(np.full(3, 10 * rank + r, F32)) for r in range(n)]
    pycoll.all_to_all([FakeCAI(o) for o in outs], ins)
    for r in range(n):
        assert_equal(outs[r], np.full(3, 10 * r + rank, F32))


def test_coalesced(path, rank, world_size):
    a, b = data(rank, F32, (3,)), data(rank, np.dtype(np.float32), (5,), salt=2)
    pycoll.all_reduce_coalesced([FakeCAI(a), FakeCAI(b)], op=ReduceOp.SUM)
    assert_equal(a, expected("SUM", F32, world_size, (3,)))
    want_b = reduce_all("SUM", [data(r, F32, (5,), salt=2) for r in range(world_size)], world_size)
    assert_equal(b, want_b)
    outs = [[np.zeros(2, F32)] for _ in range(world_size)]
    pycoll.all_gather_coalesced([[FakeCAI(o[0])] for o in outs], [FakeCAI(np.full(2, rank, F32))])
    for r in range(world_size):
        assert_equal(outs[r][0], np.full(2, r, F32))


def test_point_to_point(path, rank, world_size):
    if world_size < 2:
        pytest.skip("needs 2 ranks")
    peer = 1 - rank if rank < 2 else None
    if peer is None:
        return
    mine = np.full(4, rank + 1, F32)
    got = np.zeros(4, F32)
    if rank == 0:
        pycoll.send(FakeCAI(mine), dst=1)
        assert pycoll.recv(FakeCAI(got), src=1) == 1
    else:
        assert pycoll.recv(FakeCAI(got), src=0) == 0
        pycoll.send(FakeCAI(mine), dst=0)
    assert_equal(got, np.full(4, peer + 1, F32))
    got2 = np.zeros(4, F32)
    recv = pycoll.irecv(FakeCAI(got2), src=peer)
    pycoll.isend(FakeCAI(mine), dst=peer).wait()
    recv.wait()
    assert recv.source_rank() == peer
    assert_equal(got2, np.full(4, peer + 1, F32))


def test_producer_stream_is_synchronized_before_mpi(path, sim, rank, world_size):
    host = data(rank, F32)
    x = FakeCAI(host, stream=0x1234)
    pycoll.all_reduce(x)
    assert sim.synchronized and sim.synchronized[0] == 0x1234
    assert_equal(host, expected("SUM", F32, world_size))


def test_stream_argument_is_the_one_used(path, sim, rank, world_size):
    host = data(rank, F32)
    fake = FakeDLPack(host)
    pycoll.all_reduce(fake, stream=0x99)
    assert fake.asked == [0x99]  # the producer orders its work before our stream
    assert 0x99 in sim.synchronized
    with pytest.raises(TypeError, match="stream must be a CUDA stream"):
        pycoll.all_reduce(FakeCAI(data(rank, F32)), stream="fast")


def test_pinned_buffers_are_reused(sim, monkeypatch, rank):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "0")
    from pycoll.gpu import aware

    aware.reset()
    for _ in range(5):
        pycoll.all_reduce(FakeCAI(data(rank, F32)))
    assert sim.pinned_allocations == 1
    aware.reset()


def test_mixed_device_kinds_are_refused_before_anything_is_sent(sim, rank, world_size):
    seq = pycoll.group.WORLD._seq
    with pytest.raises(
        ValueError,
        match="all arrays of one call must be on one device kind.*"
        r"output_tensor is a CUDA array and input_tensor is a numpy.ndarray",
    ):
        pycoll.all_gather_into_tensor(FakeCAI(np.zeros(6 * world_size, F32)), data(rank, F32))
    with pytest.raises(ValueError, match=r"tensor_list\[0\] is a CUDA array"):
        pycoll.all_gather([FakeCAI(np.zeros(6, F32))] * world_size, data(rank, F32))
    assert pycoll.group.WORLD._seq == seq


def test_bad_device_arrays_are_refused_with_the_host_messages(path, rank):
    with pytest.raises(ValueError, match="all_reduce: tensor is not C-contiguous"):
        pycoll.all_reduce(FakeCAI(np.zeros((4, 4), F32)[:, ::2]))
    with pytest.raises(ValueError, match="ReduceOp.BAND is not defined for dtype float32"):
        pycoll.all_reduce(FakeCAI(data(rank, F32)), op=ReduceOp.BAND)


@pytest.mark.parametrize("chunk", ["0", "64"], ids=["whole", "chunked"])
def test_read_only_device_arrays_are_refused_where_written(path, monkeypatch, chunk, rank):
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", chunk)
    host = data(rank, F32, (100,))
    before = host.copy()
    seq = pycoll.group.WORLD._seq
    with pytest.raises(ValueError, match="all_reduce: tensor is read-only.*writeable"):
        pycoll.all_reduce(FakeCAI(host, readonly=True))
    out = FakeCAI(np.zeros(100 * pycoll.get_world_size(), F32), readonly=True)
    with pytest.raises(ValueError, match="output_tensor is read-only"):
        pycoll.all_gather_into_tensor(out, FakeCAI(host))
    assert_equal(host, before)
    assert pycoll.group.WORLD._seq == seq
    # read-only where it is only read: the source of a broadcast
    pycoll.broadcast(FakeCAI(host, readonly=rank == 0), src=0)
    assert_equal(host, data(0, F32, (100,)))


@pytest.mark.parametrize("size", [1, 7, 301])
@pytest.mark.parametrize("op", ["SUM", "MAX", "AVG", "PREMUL_SUM"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16, F32], ids=str)
def test_aware_user_ops_go_through_the_device_ring(
    dtype, op, size, sim, monkeypatch, rank, world_size
):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "1")
    from pycoll.gpu import aware

    aware.reset()
    if dtype == F32 and op in ("SUM", "AVG", "PREMUL_SUM"):
        op = "MIN"  # float32 SUM is MPI's own op: the ring is for pycoll's user ops
    host = data(rank, dtype, (size,))
    seq = pycoll.group.WORLD._seq
    rings = count_rings(monkeypatch)
    pycoll.all_reduce(FakeDLPack(host), op=rop(op))
    assert_equal(host, expected(op, dtype, world_size, (size,)))
    assert pycoll.group.WORLD._seq == seq + 1
    assert sim.pinned_allocations == 0  # nothing was staged
    assert len(rings) == (world_size > 1)
    aware.reset()


def test_aware_user_ops_take_another_way_without_isendrecv(sim, monkeypatch, rank, world_size):
    """The device ring sends with MPI_Isendrecv (MPI-4.0): on an MPI without
    it a float16 MAX of device memory still reduces, by another way."""
    from pycoll import _mpi

    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "1")
    monkeypatch.setitem(_mpi._HAS, "MPI_Isendrecv", False)
    from pycoll.gpu import aware

    aware.reset()
    dtype = np.dtype(np.float16)
    host = data(rank, dtype, (7,))
    rings = count_rings(monkeypatch)
    pycoll.all_reduce(FakeDLPack(host), op=rop("MAX"))
    assert_equal(host, expected("MAX", dtype, world_size, (7,)))
    assert rings == []
    aware.reset()


def test_staged_copies_and_the_collective_are_on_the_timeline(
    sim, monkeypatch, rank, world_size, tmp_path
):
    """Traced, a staged all_reduce of a CUDA array shows its copy to the host,
    the collective and the copy back, in that order (each rank its own file)."""
    import json

    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "0")
    aware.reset()
    host = data(rank, F32)
    x = cuda_like(host, "cai")
    with pycoll.trace(str(tmp_path)):
        pycoll.all_reduce(x)
    aware.reset()
    assert_equal(host, expected("SUM", F32, world_size))
    with open(tmp_path / f"trace-rank{rank}.json") as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    names = [e["name"] for e in sorted(events, key=lambda e: e["ts"])]
    assert names == ["copy to host", "all_reduce", "copy to device"], events
    assert events[0]["args"]["bytes"] == host.nbytes and events[0]["cat"] == "gpu"
