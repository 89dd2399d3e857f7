"""The backend-config path to NCCL: which groups carry it, what stays on MPI,
and (on a GPU with cupy's NCCL) the collectives NCCL runs."""

import numpy as np
import pytest
from fakes import FakeCAI

import pycoll
from pycoll import ReduceOp
from support import assert_equal, data, reduce_all

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
