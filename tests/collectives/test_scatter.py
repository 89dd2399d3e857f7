"""broadcast and scatter."""

import re

import numpy as np
import pytest

import pycoll
from support import ALL_DTYPES, assert_equal, bad_root_lists, data

ASYNC = pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_broadcast_from_every_root(dtype, async_op, rank, world_size):
    for src in range(world_size):
        x = data(rank, dtype, (2, 3))
        work = pycoll.broadcast(x, src=src, async_op=async_op)
        if async_op:
            work.wait()
        assert_equal(x, data(src, dtype, (2, 3)))


def test_bool_broadcast(rank):
    """as torch's _test_bool_tensors"""
    tensor = np.array([1, 0, 0, 1], dtype=bool)
    out = np.zeros(4, bool) if rank > 0 else tensor.copy()
    pycoll.broadcast(out, src=0)
    assert_equal(out, tensor)


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_scatter_from_every_root(dtype, async_op, rank, world_size):
    for src in range(world_size):
        inputs = [data(src, dtype, (3,), salt=i) for i in range(world_size)]
        out = np.zeros(3, dtype)
        work = pycoll.scatter(out, inputs if rank == src else None, src=src, async_op=async_op)
        if async_op:
            work.wait()
        assert_equal(out, data(src, dtype, (3,), salt=rank))


def test_broadcast_read_only_input_on_src(rank):
    """The source's array is only read, so a read-only array is fine there."""
    x = np.arange(4.0) if rank == 0 else np.zeros(4)
    if rank == 0:
        x.flags.writeable = False
    pycoll.broadcast(x, src=0)
    np.testing.assert_array_equal(x, np.arange(4.0))


def test_zero_size(rank, world_size):
    x = np.zeros((3, 0))
    pycoll.broadcast(x, src=0)
    out = np.zeros(0)
    pycoll.scatter(out, [np.zeros(0)] * world_size if rank == 0 else None, src=0)
    assert x.shape == (3, 0) and out.shape == (0,)


def test_broadcast_64_mib(rank, world_size):
    n = 16 * 1024 * 1024
    x = np.arange(n, dtype=np.float32) if rank == 0 else np.zeros(n, np.float32)
    pycoll.broadcast(x, src=0)
    assert x[1] == 1 and x[n // 2] == n // 2 and x[-1] == np.float32(n - 1)


BAD_LISTS = bad_root_lists("scatter_list", "src")


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_LISTS))
def test_a_scatter_list_only_src_can_refuse_makes_every_rank_raise(
    pg, rank, world_size, async_op, case
):
    """Only src can see its scatter_list is wrong: it still takes part, so the
    group stays in step, and every rank raises instead of keeping what it got."""
    make, problem = BAD_LISTS[case]
    out = np.full(3, -7.0)
    bad = make(world_size) if rank == 0 else None
    with pytest.raises((ValueError, TypeError)) as caught:
        work = pycoll.scatter(out, bad, src=0, async_op=async_op)
        if async_op:
            work.wait()
    if rank == 0:
        assert re.search(problem, str(caught.value)), caught.value
    else:
        assert str(caught.value) == (
            "scatter: src (rank 0) refused its scatter_list (see the error raised there), "
            "so nothing was scattered; tensor is left as it was"
        )
    assert (out == -7.0).all()
    x = np.ones(2) * (rank + 1)  # the next collective pairs with the next one
    pycoll.all_reduce(x)
    assert (x == world_size * (world_size + 1) / 2).all()
