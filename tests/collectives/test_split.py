"""Large all_reduce through pycoll's ring (a reduce-scatter, an AVG's
division of this rank's part, an all-gather), on MPICH and Open MPI
(ops.RING_MPIS): with one of pycoll's user ops or a float AVG from
SPLIT_BYTES, with MPI's own ops from RING_BYTES. Same answers as numpy's, on
every rank, for sizes that do not divide by the number of ranks (on 1 rank
the same tests check the usual path)."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.paths import rule
from support import (
    BF16,
    assert_equal,
    count_rings,
    data,
    reduce_all,
    rop,
    rule_only,
    valid_pairs,
)

CASES = [
    ("SUM", np.dtype(np.float16)),
    ("AVG", BF16),
    ("PREMUL_SUM", np.dtype(np.float16)),
    ("MAX", np.dtype(np.float32)),
    ("PRODUCT", BF16),
]


@pytest.fixture(params=["large", "forced"])
def threshold(request, monkeypatch, world_size):
    """'large': past the real threshold; 'forced': a tiny threshold, so small
    arrays (and counts smaller than the number of ranks) take the path too."""
    if request.param == "forced":
        monkeypatch.setattr(rule, "SPLIT_BYTES", 1)
        monkeypatch.setattr(rule, "SPLIT_BYTES_TWO_RANKS", 1)
        return 1
    return rule.split_from(world_size)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", CASES, ids=str)
def test_split_all_reduce_matches_numpy(op, dtype, async_op, threshold, rank, world_size):
    count = (threshold // dtype.itemsize + 7) if threshold > 1 else 3
    x = data(rank, dtype, (count,))
    work = pycoll.all_reduce(x, op=rop(op), async_op=async_op)
    if async_op:
        assert work.wait() is True
    else:
        assert work is None
    expected = reduce_all(op, [data(r, dtype, (count,)) for r in range(world_size)], world_size)
    assert_equal(x, expected)


def test_the_path_is_taken_where_it_should_be(pg):
    from pycoll.ops import plan

    half = plan(ReduceOp.AVG, np.dtype(np.float16), "t")
    nan_max = plan(ReduceOp.MAX, np.dtype(np.float32), "t")
    assert half.split is True and nan_max.split is True
    # MPI's builtin ops are not split ops (they take the ring from RING_BYTES,
    # below); a float AVG is (its division then covers 1/n of the data), a
    # complex one is not.
    assert plan(ReduceOp.SUM, np.dtype(np.float32), "t").split is False
    assert plan(ReduceOp.AVG, np.dtype(np.float32), "t").split is True
    assert plan(ReduceOp.AVG, np.dtype(np.complex64), "t").split is False


def forced(monkeypatch):
    monkeypatch.setattr(rule, "SPLIT_BYTES", 1)
    monkeypatch.setattr(rule, "SPLIT_BYTES_TWO_RANKS", 1)


def test_the_ring_carries_the_call(pg, monkeypatch, rank, world_size):
    forced(monkeypatch)
    rings = count_rings(monkeypatch)
    x = data(rank, np.dtype(np.float32), (10,))
    pycoll.all_reduce(x, op=ReduceOp.AVG)
    expected = reduce_all(
        "AVG", [data(r, np.dtype(np.float32), (10,)) for r in range(world_size)], world_size
    )
    assert_equal(x, expected)
    assert len(rings) == (world_size > 1)


def test_rings_in_flight_together_keep_their_messages_apart(monkeypatch, rank, world_size):
    # Three async rings on one group, waited for in opposite orders on
    # different ranks: each ring's later steps start when its Work is driven,
    # so without a tag per ring a step of one would match a step of another.
    forced(monkeypatch)
    dtype = np.dtype(np.float16)  # sums of these inputs are exact in any order
    count = 1000 * world_size + 3
    inputs = [data(rank + 10 * k, dtype, (count,)) for k in range(3)]
    works = [pycoll.all_reduce(x, op=ReduceOp.SUM, async_op=True) for x in inputs]
    for k in range(3) if rank % 2 == 0 else reversed(range(3)):
        assert works[k].wait() is True
    for k in range(3):
        expected = reduce_all(
            "SUM", [data(r + 10 * k, dtype, (count,)) for r in range(world_size)], world_size
        )
        assert_equal(inputs[k], expected)


def test_sync_and_async_calls_match(monkeypatch, rank, world_size):
    forced(monkeypatch)
    x = data(rank, np.dtype(np.float16), (257,))
    if rank % 2:
        assert pycoll.all_reduce(x, op=ReduceOp.MAX, async_op=True).wait() is True
    else:
        assert pycoll.all_reduce(x, op=ReduceOp.MAX) is None
    expected = reduce_all(
        "MAX", [data(r, np.dtype(np.float16), (257,)) for r in range(world_size)], world_size
    )
    assert_equal(x, expected)


# MPI's own ops, every dtype: (op, dtype) pairs pycoll accepts, AVG aside (a
# float AVG is a split op above; a complex one stays with MPI, below).
OWN_OPS = [(op, dtype) for op, dtype in valid_pairs() if op != "AVG"]


def ring_expected(world_size):
    return world_size > 1


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", OWN_OPS, ids=str)
def test_mpis_own_ops_take_the_ring_from_ring_bytes(
    op, dtype, async_op, monkeypatch, rank, world_size
):
    monkeypatch.setattr(rule, "RING_BYTES", 1)
    rings = count_rings(monkeypatch)
    shape = (5, 7)  # 35 elements: parts cut unevenly
    x = data(rank, dtype, shape)
    work = pycoll.all_reduce(x, op=rop(op), async_op=async_op)
    if async_op:
        assert work.wait() is True
    assert_equal(x, reduce_all(op, [data(r, dtype, shape) for r in range(world_size)], world_size))
    assert len(rings) == ring_expected(world_size)


def test_a_float32_sum_of_ring_bytes_takes_the_ring(monkeypatch, rank, world_size):
    """At the default threshold: one element under it stays with MPI (or the
    shared-memory path), the threshold itself takes the ring."""
    rule_only(monkeypatch, pycoll.group.WORLD)
    rings = count_rings(monkeypatch)
    count = rule.RING_BYTES // 4
    for size in (count - 1, count):
        x = np.full(size, rank + 1.0, np.float32)
        pycoll.all_reduce(x)
        assert_equal(x, np.full(size, world_size * (world_size + 1) / 2, np.float32))
    assert len(rings) == ring_expected(world_size)


def test_a_complex_avg_stays_with_mpi(monkeypatch, rank, world_size):
    """The kernels do not divide complex numbers in their last sum."""
    monkeypatch.setattr(rule, "RING_BYTES", 1)
    forced(monkeypatch)
    rings = count_rings(monkeypatch)
    dtype = np.dtype(np.complex64)
    x = data(rank, dtype, (9,))
    pycoll.all_reduce(x, op=ReduceOp.AVG)
    everyone = [data(r, dtype, (9,)) for r in range(world_size)]
    assert_equal(x, reduce_all("AVG", everyone, world_size))
    assert rings == []
