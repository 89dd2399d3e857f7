"""pycoll.functional on CUDA arrays: allocation, copies and joins through the
array's own namespace, the communication through the device door (staged and
CUDA-aware, under the simulator), each rank checking numpy's answer."""

import numpy as np
import pytest
from fakes import FakeArrayAPI

from pycoll import functional as F
from support import assert_equal, data, reduce_all

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


def device(host):
    return FakeArrayAPI(host)


@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
def test_all_reduce(dtype, path, rank, world_size):
    host = data(rank, dtype, (2, 3))
    y = F.all_reduce(device(host), "sum", None)
    out = F.wait_tensor(y)
    assert isinstance(out, FakeArrayAPI)
    expected = reduce_all("SUM", [data(r, dtype, (2, 3)) for r in range(world_size)], 1)
    assert_equal(out.host, expected)
    assert_equal(host, data(rank, dtype, (2, 3)))  # the input is untouched


def test_all_gather_and_reduce_scatter_along_dim_1(path, rank, world_size):
    n = world_size
    host = data(rank, F32, (2, 2 * n))
    gathered = F.wait_tensor(F.all_gather_tensor(device(host), 1, None))
    expected = np.concatenate([data(r, F32, (2, 2 * n)) for r in range(n)], axis=1)
    assert_equal(gathered.host, expected)
    scattered = F.wait_tensor(F.reduce_scatter_tensor(device(host), "avg", 1, None))
    total = reduce_all("AVG", [data(r, F32, (2, 2 * n)) for r in range(n)], n)
    assert_equal(scattered.host, np.split(total, n, axis=1)[rank])


def test_all_to_all_and_coalesced(path, rank, world_size):
    n = world_size
    host = np.arange(2 * n, dtype=np.int64) + 100 * rank
    moved = F.wait_tensor(F.all_to_all_single(device(host), None, None, None))
    assert_equal(moved.host, np.array([100 * s + 2 * rank + k for s in range(n) for k in (0, 1)]))
    a, b = data(rank, F32, (3,)), data(rank, F32, (2, 2), salt=1)
    ys = F.all_reduce_coalesced([device(a), device(b)], "max", None)
    for y, s, salt in zip(ys, [(3,), (2, 2)], [0, 1]):
        expected = reduce_all("MAX", [data(r, F32, s, salt=salt) for r in range(n)], 1)
        assert_equal(F.wait_tensor(y).host, expected)
