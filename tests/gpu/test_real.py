"""On a real GPU: cupy arrays through every path pycoll has on this MPI.

Skipped without cupy or a GPU; PYCOLL_TEST_GPU=1 turns the skip into a
failure. Run on a GPU machine as
``PYCOLL_TEST_GPU=1 mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_real.py``."""

import ml_dtypes
import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.gpu import aware
from support import assert_equal, data, reduce_all

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def cp(real_gpu):
    return real_gpu


@pytest.mark.parametrize("chunk", ["0", "4096"], ids=["whole", "chunked"])
@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64], ids=str)
def test_all_reduce_cupy_staged(cp, monkeypatch, op, dtype, chunk, rank, world_size):
    monkeypatch.setenv("PYCOLL_STAGE_CHUNK", chunk)
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "0")
    aware.reset()
    dtype = np.dtype(dtype)
    shape = (3001,)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.asarray(data(rank, dtype, shape))
        x *= 1  # pending work on the stream pycoll must wait for
        pycoll.all_reduce(x, op=getattr(ReduceOp, op))
        got = cp.asnumpy(x)  # same stream: sees the result
    assert_equal(
        got, reduce_all(op, [data(r, dtype, shape) for r in range(world_size)], world_size)
    )


def test_broadcast_and_all_gather_cupy(cp, rank, world_size):
    x = cp.asarray(data(rank, np.dtype(np.float32), (1 << 20,)))
    pycoll.broadcast(x, src=0)
    assert_equal(cp.asnumpy(x), data(0, np.dtype(np.float32), (1 << 20,)))
    out = cp.zeros(6 * world_size, cp.float32)
    pycoll.all_gather_into_tensor(out, cp.asarray(data(rank, np.dtype(np.float32))))
    want = np.concatenate([data(r, np.dtype(np.float32)) for r in range(world_size)])
    assert_equal(cp.asnumpy(out), want)


def test_async_all_reduce_cupy(cp, rank, world_size):
    x = cp.asarray(data(rank, np.dtype(np.float32), (1 << 16,)))
    work = pycoll.all_reduce(x, async_op=True)
    assert work.wait() and work.result() == [x]
    want = reduce_all(
        "SUM", [data(r, np.dtype(np.float32), (1 << 16,)) for r in range(world_size)], 1
    )
    assert_equal(cp.asnumpy(x), want)


def test_torch_bfloat16_through_dlpack(cp, rank, world_size):
    torch = pytest.importorskip("torch")
    host = data(rank, BF16, (1000,))
    t = torch.from_numpy(host.view(np.uint16).astype(np.int16)).view(torch.bfloat16).cuda()
    pycoll.all_reduce(t)
    got = t.view(torch.int16).cpu().numpy().view(np.uint16).view(BF16)
    assert_equal(got, reduce_all("SUM", [data(r, BF16, (1000,)) for r in range(world_size)], 1))


def test_pycoll_reports_this_mpi(cp):
    answer = aware.cuda_aware()
    assert isinstance(answer.aware, bool) and answer.reason
