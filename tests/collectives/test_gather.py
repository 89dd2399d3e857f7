"""all_gather, all_gather_into_tensor, all_gather_coalesced, gather."""

import numpy as np
import pytest

import pycoll
from support import ALL_DTYPES, assert_equal, bad_root_lists, data

ASYNC = pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])


def settle(work, async_op):
    if async_op:
        work.wait()
    else:
        assert work is None


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_gather(dtype, async_op, rank, world_size):
    out = [np.zeros((2, 3), dtype) for _ in range(world_size)]
    settle(pycoll.all_gather(out, data(rank, dtype, (2, 3)), async_op=async_op), async_op)
    for r in range(world_size):
        assert_equal(out[r], data(r, dtype, (2, 3)))


@pytest.mark.parametrize("elements", [5, 40000], ids=["small", "pooled"])
def test_all_gather_list_forms(elements, rank, world_size):
    """The synchronous list form's ways in: a list of separate arrays, a
    tuple, views of one buffer, the input itself one of the outputs; small,
    and large enough to be received into the group's kept buffer."""
    want = [np.arange(elements, dtype=np.float64) + 1000 * r for r in range(world_size)]
    mine = want[rank].copy()
    outs = [np.zeros(elements) for _ in range(world_size)]
    pycoll.all_gather(outs, mine)
    whole = np.zeros(world_size * elements)
    views = tuple(whole[r * elements : (r + 1) * elements] for r in range(world_size))
    pycoll.all_gather(views, mine)
    shared = [np.zeros(elements) for _ in range(world_size)]
    shared[rank] = mine  # (its own part received into the array it sends)
    pycoll.all_gather(shared, mine)
    for got in (outs, views, shared):
        for r in range(world_size):
            np.testing.assert_array_equal(got[r], want[r])
    np.testing.assert_array_equal(mine, want[rank])


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_gather_into_tensor(dtype, async_op, rank, world_size):
    stacked = np.zeros((world_size, 4), dtype)
    concat = np.zeros((world_size * 4,), dtype)
    x = data(rank, dtype, (4,))
    settle(pycoll.all_gather_into_tensor(stacked, x, async_op=async_op), async_op)
    settle(pycoll.all_gather_into_tensor(concat, x, async_op=async_op), async_op)
    for r in range(world_size):
        assert_equal(stacked[r], data(r, dtype, (4,)))
        assert_equal(concat[4 * r : 4 * r + 4], data(r, dtype, (4,)))


def test_all_gather_into_tensor_in_place(rank, world_size):
    """torch's in-place idiom: the input is this rank's slot of the output."""
    out = np.zeros(world_size * 3, np.int64)
    out[3 * rank : 3 * rank + 3] = data(rank, np.dtype(np.int64), (3,))
    pycoll.all_gather_into_tensor(out, out[3 * rank : 3 * rank + 3])
    expected = np.concatenate([data(r, np.dtype(np.int64), (3,)) for r in range(world_size)])
    assert_equal(out, expected)


@pytest.mark.parametrize("count", [3, 40000], ids=["small", "large"])
def test_all_gather_into_tensor_in_place_on_some_ranks(count, rank, world_size):
    """In place on even ranks only: each rank's own choice, as in torch.
    (MPI asks every rank or none to pass MPI_IN_PLACE; MPICH's and Open MPI's
    all-gathers only skip the local copy for it, and this test is the check
    that they still do.)"""
    for first in (0, 1):
        out = np.zeros(world_size * count, np.int64)
        mine = data(rank, np.dtype(np.int64), (count,))
        if rank % 2 == first:
            out[count * rank : count * rank + count] = mine
            mine = out[count * rank : count * rank + count]
        pycoll.all_gather_into_tensor(out, mine)
        expected = [data(r, np.dtype(np.int64), (count,)) for r in range(world_size)]
        assert_equal(out, np.concatenate(expected))


def test_all_gather_into_tensor_overlapping_input(rank, world_size):
    """An input that overlaps the output elsewhere than its own slot is copied first."""
    out = np.zeros(world_size * 3 + 1, np.int64)
    out[1:4] = [rank, rank + 1, rank + 2]
    pycoll.all_gather_into_tensor(out[: world_size * 3], out[1:4])
    expected = np.concatenate([[r, r + 1, r + 2] for r in range(world_size)])
    assert_equal(out[: world_size * 3], expected.astype(np.int64))


@ASYNC
def test_all_gather_coalesced_mixed_dtypes(async_op, rank, world_size):
    dtypes = [np.dtype(np.float32), np.dtype(np.int8), ALL_DTYPES[-1], np.dtype(np.bool_)]
    shapes = [(2, 2), (3,), (), (5,)]
    inputs = [data(rank, dt, s) for dt, s in zip(dtypes, shapes)]
    outputs = [[np.zeros(s, dt) for dt, s in zip(dtypes, shapes)] for _ in range(world_size)]
    settle(pycoll.all_gather_coalesced(outputs, inputs, async_op=async_op), async_op)
    for r in range(world_size):
        for out, dt, s in zip(outputs[r], dtypes, shapes):
            assert_equal(out, data(r, dt, s))


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_gather_to_every_root(dtype, async_op, rank, world_size):
    for dst in range(world_size):
        out = [np.zeros(3, dtype) for _ in range(world_size)] if rank == dst else None
        settle(pycoll.gather(data(rank, dtype, (3,)), out, dst=dst, async_op=async_op), async_op)
        if rank == dst:
            for r in range(world_size):
                assert_equal(out[r], data(r, dtype, (3,)))


def test_zero_size(rank, world_size):
    out = [np.zeros(0, np.float32) for _ in range(world_size)]
    pycoll.all_gather(out, np.zeros(0, np.float32))
    big = np.zeros(0, np.float32)
    pycoll.all_gather_into_tensor(big, np.zeros(0, np.float32))
    pycoll.gather(np.zeros(0, np.float32), out if rank == 0 else None, dst=0)
    assert all(o.size == 0 for o in out)


def test_all_gather_into_tensor_64_mib(rank, world_size):
    n = 16 * 1024 * 1024
    x = np.full(n, rank, np.float32)
    x[0] = -rank
    out = np.empty((world_size, n), np.float32)
    pycoll.all_gather_into_tensor(out, x)
    for r in range(world_size):
        assert out[r, 0] == -r and out[r, 1] == r and out[r, -1] == r


BAD_LISTS = bad_root_lists("gather_list", "dst")


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_LISTS))
def test_a_gather_list_only_dst_can_refuse_keeps_the_group_in_step(
    pg, rank, world_size, async_op, case
):
    """Only dst can see its gather_list is wrong: it raises, but still takes
    part, so the others' sends pair with this gather and not with dst's next
    collective. (The others only send; their call completes.)"""
    make, problem = BAD_LISTS[case]
    bad = make(world_size) if rank == 0 else None
    x = np.full(3, rank, np.float64)
    if rank == 0:
        with pytest.raises((ValueError, TypeError), match=problem):
            work = pycoll.gather(x, bad, dst=0, async_op=async_op)
            if async_op:
                work.wait()
        if bad is not None:
            assert all((b == 1).all() for b in bad)  # nothing written into it
    else:
        work = pycoll.gather(x, None, dst=0, async_op=async_op)
        if async_op:
            work.wait()
    y = np.ones(2) * (rank + 1)  # the next collective pairs with the next one
    pycoll.all_reduce(y)
    assert (y == world_size * (world_size + 1) / 2).all()
