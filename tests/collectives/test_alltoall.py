"""all_to_all and all_to_all_single, even and uneven."""

import numpy as np
import pytest

import pycoll
from pycoll.collectives import alltoall
from support import ALL_DTYPES, assert_equal, data

ASYNC = pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])


def block(src, dst, dtype, rows, width=2):
    """What rank ``src`` sends to rank ``dst``: ``rows`` rows tagged with both."""
    return data(src, dtype, (rows, width), salt=10 * dst)


def rows(src, dst):
    """An uneven pattern: rank src sends (src + 2 * dst) % 3 rows to dst (zero too)."""
    return (src + 2 * dst) % 3


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_to_all_single_even(dtype, async_op, rank, world_size):
    x = np.concatenate([block(rank, d, dtype, 2) for d in range(world_size)])
    out = np.zeros_like(x)
    work = pycoll.all_to_all_single(out, x, async_op=async_op)
    if async_op:
        work.wait()
    assert_equal(out, np.concatenate([block(s, rank, dtype, 2) for s in range(world_size)]))


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_to_all_single_uneven(dtype, async_op, rank, world_size):
    send = [rows(rank, d) for d in range(world_size)]
    recv = [rows(s, rank) for s in range(world_size)]
    x = np.concatenate([block(rank, d, dtype, send[d]) for d in range(world_size)])
    out = np.zeros((sum(recv), 2), dtype)
    work = pycoll.all_to_all_single(
        out, x, output_split_sizes=recv, input_split_sizes=send, async_op=async_op
    )
    if async_op:
        work.wait()
    assert_equal(out, np.concatenate([block(s, rank, dtype, recv[s]) for s in range(world_size)]))


@ASYNC
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_to_all_single_even_large(dtype, in_place, async_op, rank, world_size):
    """From alltoall.PARTS_FROM bytes: MPI's v-form, this rank's own part
    copied by pycoll (or, in place, left where it is)."""
    rows = alltoall.PARTS_FROM // (2 * np.dtype(dtype).itemsize * world_size) + 3
    x = np.concatenate([block(rank, d, dtype, rows) for d in range(world_size)])
    out = x if in_place else np.zeros_like(x)
    work = pycoll.all_to_all_single(out, x, async_op=async_op)
    if async_op:
        work.wait()
    assert_equal(out, np.concatenate([block(s, rank, dtype, rows) for s in range(world_size)]))


@pytest.mark.parametrize("rows", [1, alltoall.PARTS_FROM // 32], ids=["small", "large"])
def test_all_to_all_single_over_device_memory(rows, rank, world_size, monkeypatch):
    """Arrays that alias device memory (CUDA-aware MPI, pycoll.gpu) are
    passed as given, with no CPU copy: in place on every rank here (MPI's
    in-place form), out of place, and an input overlapping the output
    without being it refused on every rank that passes one."""
    from pycoll.collectives._common import device_aliases

    copies = []
    monkeypatch.setattr(np, "copyto", lambda *a, **k: copies.append(a))
    dtype = np.dtype(np.float64)
    want = np.concatenate([block(s, rank, dtype, rows) for s in range(world_size)])
    with device_aliases(pycoll.group.WORLD):
        x = np.concatenate([block(rank, d, dtype, rows) for d in range(world_size)])
        pycoll.all_to_all_single(x, x)
        assert_equal(x, want)
        x = np.concatenate([block(rank, d, dtype, rows) for d in range(world_size)])
        out = np.zeros_like(x)
        pycoll.all_to_all_single(out, x)
        assert_equal(out, want)
        m = world_size * max(rows, 2)  # (rows of each: shifted by one, they overlap)
        whole = np.zeros((m + 1, 2))
        with pytest.raises(ValueError, match="overlaps output without being it, in device"):
            pycoll.all_to_all_single(whole[1:], whole[:m])
    assert copies == []


def test_all_to_all_single_one_split_given(rank, world_size):
    """Only input splits given: the output is split evenly."""
    send = [1] * world_size
    x = np.arange(world_size, dtype=np.int32) + 100 * rank
    out = np.zeros(world_size, np.int32)
    pycoll.all_to_all_single(out, x, input_split_sizes=send)
    assert_equal(out, np.array([100 * s + rank for s in range(world_size)], np.int32))


def test_all_to_all_single_in_place(rank, world_size):
    x = np.array([100 * rank + d for d in range(world_size)], np.int64)
    pycoll.all_to_all_single(x, x)
    assert_equal(x, np.array([100 * s + rank for s in range(world_size)], np.int64))


@ASYNC
@pytest.mark.parametrize("count", [1, 300, 5000], ids=lambda c: f"{16 * c}B-a-pair")
def test_all_to_all_single_in_place_on_some_ranks(count, async_op, rank, world_size):
    """Whether a call is in place is each rank's own, as in torch; MPI's
    in-place form must be passed by every rank or none (MPICH's blocking
    one runs another algorithm, and ranks that mixed the two hung). Even
    ranks in place, odd ranks not, then the other way round; MPICH's short,
    medium and long algorithms' sizes."""
    for first in (0, 1):
        x = np.concatenate([block(rank, d, np.dtype(np.float64), count) for d in range(world_size)])
        out = x if rank % 2 == first else np.zeros_like(x)
        work = pycoll.all_to_all_single(out, x, async_op=async_op)
        if async_op:
            work.wait()
        want = np.concatenate(
            [block(s, rank, np.dtype(np.float64), count) for s in range(world_size)]
        )
        assert_equal(out, want)


def test_split_sizes_that_disagree_raise_on_every_rank(rank, world_size):
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    # Rank 0 claims to receive 2 rows from the last rank, which sends 1.
    recv = [1] * world_size
    if rank == 0:
        recv[-1] = 2
    x = np.zeros((world_size, 1))
    out = np.zeros((sum(recv), 1))
    before = pycoll.group.WORLD.sequence_number()
    with pytest.raises(ValueError, match="split sizes disagree") as info:
        pycoll.all_to_all_single(
            out, x, output_split_sizes=recv, input_split_sizes=[1] * world_size
        )
    if rank == 0:
        assert f"expects 2 elements from rank {world_size - 1}, which sends 1" in str(info.value)
    elif rank == world_size - 1:
        assert "sends 1 elements to rank 0, which expects 2" in str(info.value)
    else:
        assert f"ranks [0, {world_size - 1}]" in str(info.value)
    assert pycoll.group.WORLD.sequence_number() == before


@ASYNC
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_to_all_lists(dtype, async_op, rank, world_size):
    ins = [block(rank, d, dtype, rows(rank, d)) for d in range(world_size)]
    outs = [np.zeros((rows(s, rank), 2), dtype) for s in range(world_size)]
    work = pycoll.all_to_all(outs, ins, async_op=async_op)
    if async_op:
        work.wait()
    for s in range(world_size):
        assert_equal(outs[s], block(s, rank, dtype, rows(s, rank)))


def test_zero_size(rank, world_size):
    out = np.zeros((0, 4))
    pycoll.all_to_all_single(out, np.zeros((0, 4)))
    pycoll.all_to_all_single(out, np.zeros((0, 4)), [0] * world_size, [0] * world_size)
    assert out.shape == (0, 4)
