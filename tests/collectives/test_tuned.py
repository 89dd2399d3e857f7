"""all_reduce on a group whose tuning table (pycoll.tuning) decides its path:
each path taken where the table says and right, every rank the same; below
the table's first size, and for ops that are not MPI's own, the built-in
rule. Each test gives a fresh group its entries (tuning.decide), so every
rank's group has the same table, as init_process_group makes it."""

from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, tuning
from pycoll.arrays import BFLOAT16
from support import assert_equal, count_rings, data, fresh_group, reduce_all, window_chunk

SHAPE = (5, 7)  # 35 elements: the ring's parts cut unevenly
OWN_OPS = [("SUM", np.float32), ("MAX", np.int32), ("PRODUCT", np.float64), ("BXOR", np.int64)]


@pytest.fixture
def group(world_size):
    if world_size == 1:
        pytest.skip("a table decides groups of 2 or more ranks")
    yield from fresh_group()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", OWN_OPS, ids=str)
@pytest.mark.parametrize("way", tuning.PATHS)
def test_each_path_where_the_table_says(group, way, op, dtype, async_op, monkeypatch, rank,
                                        world_size):  # fmt: skip
    rings = count_rings(monkeypatch)
    tuning.decide(group, ([0], [way]))
    x = data(rank, np.dtype(dtype), SHAPE)
    work = pycoll.all_reduce(x, op=getattr(ReduceOp, op), group=group, async_op=async_op)
    if async_op:
        assert work.wait() is True
    everyone = [data(r, np.dtype(dtype), SHAPE) for r in range(world_size)]
    assert_equal(x, reduce_all(op, everyone, world_size))
    assert len(rings) == (way == "ring")
    assert (window_chunk(group) is not None) == (way == "window")


def test_below_the_first_size_the_built_in_rule(group, monkeypatch, rank, world_size):
    rings = count_rings(monkeypatch)
    tuning.decide(group, ([1000, 4000], ["ring", "window"]))
    # (float32 elements, rings so far, window made): 996 bytes are MPI's, 1000
    # and 3996 the ring's, 4000 the window's.
    for count, ring_calls, window in ((249, 0, False), (250, 1, False), (999, 2, False),
                                      (1000, 2, True)):  # fmt: skip
        x = np.full(count, rank + 1.0, np.float32)
        pycoll.all_reduce(x, group=group)
        assert_equal(x, np.full(count, world_size * (world_size + 1) / 2, np.float32))
        assert (len(rings), window_chunk(group) is not None) == (ring_calls, window), count


@pytest.mark.parametrize(
    "op,dtype", [("SUM", np.float16), ("SUM", BFLOAT16), ("AVG", np.float32)], ids=str
)
def test_ops_that_are_not_mpis_own_keep_the_built_in_rule(group, op, dtype, monkeypatch, rank,
                                                          world_size):  # fmt: skip
    """float16/bfloat16 (pycoll's user ops) and AVG: a small call stays with MPI."""
    rings = count_rings(monkeypatch)
    tuning.decide(group, ([0], ["ring"]))
    x = data(rank, np.dtype(dtype), SHAPE)
    pycoll.all_reduce(x, op=getattr(ReduceOp, op), group=group)
    everyone = [data(r, np.dtype(dtype), SHAPE) for r in range(world_size)]
    assert_equal(x, reduce_all(op, everyone, world_size))
    assert rings == [] and window_chunk(group) is None
