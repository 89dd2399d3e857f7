"""The backend-config path to NCCL: which groups carry it, what stays on MPI,
and (on a GPU with cupy's NCCL) the collectives NCCL runs."""

import numpy as np
import pytest
from fakes import FakeCAI, MpiNccl

import pycoll
from pycoll import ReduceOp
from support import PREMUL_SCALE, assert_equal, data, reduce_all

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size

CONFIG = "cpu:mpi,cuda:nccl"
F32 = np.dtype(np.float32)


@pytest.fixture
def nccl_world(uninitialized):
    pycoll.init_process_group(backend=CONFIG)
    yield pycoll.group.WORLD
    pycoll.destroy_process_group()


def test_backend_config_is_taken_and_inherited(nccl_world, rank, world_size):
    assert pycoll.get_backend() == CONFIG
    sub = pycoll.new_group(list(range(world_size)))
    assert pycoll.get_backend(sub) == CONFIG
    plain = pycoll.new_group(list(range(world_size)), backend="mpi")
    assert pycoll.get_backend(plain) == "mpi"
    # host arrays still go through MPI on an NCCL group
    x = data(rank, F32)
    pycoll.all_reduce(x, group=sub)
    assert_equal(x, reduce_all("SUM", [data(r, F32) for r in range(world_size)], world_size))


@pytest.mark.parametrize(
    "backend,message",
    [
        ("nccl", "backend 'nccl' is not available alone.*'cpu:mpi,cuda:nccl'"),
        ("cpu:nccl", "backend 'nccl' cannot serve cpu"),
        ("cpu:mpi,cuda:nccl,", "empty entry"),
        ("cuda:gloo", "backend 'gloo' cannot serve cuda"),
    ],
)
def test_bad_backend_configs(uninitialized, backend, message):
    with pytest.raises(ValueError, match=message):
        pycoll.init_process_group(backend=backend)


def test_without_nccl_bindings_a_cuda_array_is_a_clear_error(nccl_world, sim, rank):
    try:
        from cupy.cuda import nccl

        if nccl.available:
            pytest.skip("cupy's NCCL is installed here: the real tests cover it")
    except ImportError:
        pass
    seq = nccl_world._seq
    with pytest.raises(RuntimeError, match="cupy's NCCL bindings are not available"):
        pycoll.all_reduce(FakeCAI(data(rank, F32)))
    assert nccl_world._seq == seq  # refused before it was counted
    # what NCCL lacks (bitwise ops, int16, lists) goes through MPI on the same group
    x = data(rank, np.dtype(np.int16))
    pycoll.all_reduce(FakeCAI(x), op=ReduceOp.BXOR)
    n = pycoll.get_world_size()
    assert_equal(x, reduce_all("BXOR", [data(r, np.dtype(np.int16)) for r in range(n)], n))


@pytest.fixture
def gpu(real_gpu):
    from cupy.cuda import nccl

    if not nccl.available:
        pytest.fail("cupy is installed without NCCL: the NCCL path cannot be tested")
    return real_gpu


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX", "PREMUL_SUM"])
def test_nccl_collectives_on_a_gpu(gpu, nccl_world, op, rank, world_size):
    rop = pycoll.make_premul_sum(0.5) if op == "PREMUL_SUM" else getattr(ReduceOp, op)
    x = gpu.asarray(data(rank, F32))
    seq = nccl_world._seq
    pycoll.all_reduce(x, op=rop)
    assert nccl_world._seq == seq + 1
    assert_equal(
        gpu.asnumpy(x), reduce_all(op, [data(r, F32) for r in range(world_size)], world_size)
    )
    y = gpu.asarray(data(rank, F32))
    work = pycoll.broadcast(y, src=0, async_op=True)
    assert work.wait() and work.result() == [y]
    assert_equal(gpu.asnumpy(y), data(0, F32))
    out = gpu.zeros(6 * world_size, gpu.float32)
    pycoll.all_gather_into_tensor(out, gpu.asarray(data(rank, F32)))
    assert_equal(gpu.asnumpy(out), np.concatenate([data(r, F32) for r in range(world_size)]))


@pytest.fixture
def mpi_nccl(nccl_world, sim, monkeypatch):
    """pycoll.gpu.nccl with cupy's NCCL played by MPI (fakes.MpiNccl)."""
    from pycoll.gpu import nccl

    comm = MpiNccl(nccl_world.comm.Dup())
    monkeypatch.setattr(nccl, "_module", lambda: None)
    monkeypatch.setattr(nccl, "communicator", lambda pg: comm)
    yield comm
    comm.comm.Free()


I32 = np.dtype(np.int32)


@pytest.mark.parametrize("dtype", [F32, I32], ids=str)
@pytest.mark.parametrize("op", ["SUM", "MAX", "AVG", "PREMUL_SUM"])
def test_each_nccl_collective_issues_nccl_with_the_host_results(
    mpi_nccl, dtype, op, rank, world_size
):
    """Every collective NCCL has goes to NCCL on such a group, with the
    counts and roots the host collective would use, and is counted once."""
    if dtype == I32 and op in ("AVG", "PREMUL_SUM"):
        op = "MIN"  # NCCL's integer reductions; AVG of integers is refused as on the host
    rop = pycoll.make_premul_sum(PREMUL_SCALE) if op == "PREMUL_SUM" else getattr(ReduceOp, op)
    every = [data(r, dtype) for r in range(world_size)]
    root = world_size - 1
    pg = pycoll.group.WORLD
    seq = pg._seq

    x = data(rank, dtype)
    pycoll.all_reduce(FakeCAI(x), op=rop)
    assert_equal(x, reduce_all(op, every, world_size))

    y = data(rank, dtype)
    pycoll.reduce(FakeCAI(y), dst=root, op=rop)
    assert_equal(y, reduce_all(op, every, world_size) if rank == root else data(rank, dtype))

    z = data(rank, dtype)
    work = pycoll.broadcast(FakeCAI(z), src=root, async_op=True)
    assert work.wait() and work.is_success()
    assert_equal(z, data(root, dtype))

    out = np.zeros(6 * world_size, dtype)
    pycoll.all_gather_into_tensor(FakeCAI(out), FakeCAI(data(rank, dtype)))
    assert_equal(out, np.concatenate(every))

    part = np.zeros(2, dtype)
    big = [data(r, dtype, (2 * world_size,)) for r in range(world_size)]
    pycoll.reduce_scatter_tensor(FakeCAI(part), FakeCAI(big[rank]), op=rop)
    full = reduce_all(op, big, world_size)
    assert_equal(part, full[2 * rank : 2 * rank + 2])

    assert pg._seq == seq + 5
    if op == "PREMUL_SUM":  # NCCL scales then sums in all_reduce only; MPI takes the others
        assert mpi_nccl.calls == ["allReduce", "bcast", "allGather"]
    else:
        assert mpi_nccl.calls == ["allReduce", "reduce", "bcast", "allGather", "reduceScatter"]


def test_nccl_refuses_a_bad_size_before_counting(mpi_nccl, rank, world_size):
    seq = pycoll.group.WORLD._seq
    with pytest.raises(ValueError, match="output_tensor"):
        pycoll.all_gather_into_tensor(
            FakeCAI(np.zeros(5 * world_size + 1, F32)), FakeCAI(data(rank, F32, (5,)))
        )
    assert pycoll.group.WORLD._seq == seq and mpi_nccl.calls == []
