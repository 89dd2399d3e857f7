"""all_reduce on a group whose tuning table (pycoll.tuning) decides its path:
each path taken where the table says and right, every rank the same; below
the table's first size the built-in rule; the table's ring and window for
every op they can carry, its MPI call for MPI's own ops only. Each test
gives a fresh group its entries (tuning.decide), so every rank's group has
the same table, as init_process_group makes it."""

from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, tuning
from pycoll.arrays import BFLOAT16
from pycoll.paths import rule
from support import (
    assert_equal,
    count_rings,
    data,
    fresh_group,
    reduce_all,
    rop,
    window_chunk,
)

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
    tuning.decide(group, "all_reduce", ([0], [way]))
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
    tuning.decide(group, "all_reduce", ([1000, 4000], ["ring", "window"]))
    # (float32 elements, rings so far, window made): 996 bytes are MPI's, 1000
    # and 3996 the ring's, 4000 the window's.
    for count, ring_calls, window in ((249, 0, False), (250, 1, False), (999, 2, False),
                                      (1000, 2, True)):  # fmt: skip
        x = np.full(count, rank + 1.0, np.float32)
        pycoll.all_reduce(x, group=group)
        assert_equal(x, np.full(count, world_size * (world_size + 1) / 2, np.float32))
        assert (len(rings), window_chunk(group) is not None) == (ring_calls, window), count


OTHER_OPS = [("SUM", np.float16), ("SUM", BFLOAT16), ("MAX", np.float32), ("AVG", np.float32),
             ("AVG", BFLOAT16), ("PREMUL_SUM", np.float64)]  # fmt: skip


@pytest.mark.parametrize("op,dtype", OTHER_OPS, ids=str)
@pytest.mark.parametrize("way", ["ring", "window"])
def test_the_tables_ring_and_window_serve_other_ops_too(group, way, op, dtype, monkeypatch, rank,
                                                        world_size):  # fmt: skip
    """pycoll's user ops (float16, bfloat16, NaN-propagating float MAX), AVG
    and PREMUL_SUM: where the table's path beat MPI's float32 SUM it beats
    MPI's way with these the more, so they take it too."""
    rings = count_rings(monkeypatch)
    tuning.decide(group, "all_reduce", ([0], [way]))
    x = data(rank, np.dtype(dtype), SHAPE)
    pycoll.all_reduce(x, op=rop(op), group=group)
    everyone = [data(r, np.dtype(dtype), SHAPE) for r in range(world_size)]
    assert_equal(x, reduce_all(op, everyone, world_size))
    assert (len(rings), window_chunk(group) is not None) == (way == "ring", way == "window")


@pytest.mark.parametrize("op,dtype", OTHER_OPS, ids=str)
def test_where_the_table_keeps_mpis_call_other_ops_keep_the_built_in_rule(
    group, op, dtype, monkeypatch, rank, world_size
):
    """Below the rule's sizes: MPI's call (for AVG on two ranks, the mean of two)."""
    rings = count_rings(monkeypatch)
    tuning.decide(group, "all_reduce", ([0], ["mpi"]))
    x = data(rank, np.dtype(dtype), SHAPE)
    pycoll.all_reduce(x, op=rop(op), group=group)
    everyone = [data(r, np.dtype(dtype), SHAPE) for r in range(world_size)]
    assert_equal(x, reduce_all(op, everyone, world_size))
    assert rings == [] and window_chunk(group) is None


@pytest.mark.parametrize("way", ["ring", "window"])
def test_a_complex_avg_stays_with_mpi_whatever_the_table(group, way, monkeypatch, rank,
                                                         world_size):  # fmt: skip
    """The kernels do not divide complex numbers in their last sum."""
    rings = count_rings(monkeypatch)
    tuning.decide(group, "all_reduce", ([0], [way]))
    x = data(rank, np.dtype(np.complex64), SHAPE)
    pycoll.all_reduce(x, op=ReduceOp.AVG, group=group)
    everyone = [data(r, np.dtype(np.complex64), SHAPE) for r in range(world_size)]
    assert_equal(x, reduce_all("AVG", everyone, world_size))
    assert rings == [] and window_chunk(group) is None


def test_the_tables_mpi_call_overrides_the_built_in_rule(group, monkeypatch, rank, world_size):
    """With the rule's ring and window thresholds at 1 byte, MPI's own op
    still takes MPI's call where the table says so."""
    monkeypatch.setattr(rule, "RING_BYTES", 1)
    monkeypatch.setattr(rule, "SHM_BYTES", 1)
    rings = count_rings(monkeypatch)
    tuning.decide(group, "all_reduce", ([0], ["mpi"]))
    x = np.full(100, rank + 1.0, np.float32)
    pycoll.all_reduce(x, group=group)
    assert_equal(x, np.full(100, world_size * (world_size + 1) / 2, np.float32))
    assert rings == [] and window_chunk(group) is None


# -- reduce_scatter_tensor and reduce_scatter: MPI's call or the window -------------


def _scatter(group, rank, world_size, dtype, op, form, async_op=False):
    """One reduce-scatter of 5 elements a part by ``form`` ("tensor", "in
    place", "list"), checked against numpy's on every rank."""
    n = world_size
    parts = [data(rank, np.dtype(dtype), (5,), salt=d) for d in range(n)]
    x = np.concatenate(parts)
    out = np.empty(5, dtype)
    if form == "list":
        work = pycoll.reduce_scatter(out, parts, op=rop(op), group=group, async_op=async_op)
    elif form == "in place":
        out = x[rank * 5 : (rank + 1) * 5]  # torch's in-place form: this rank's part
        work = pycoll.reduce_scatter_tensor(out, x, op=rop(op), group=group, async_op=async_op)
    else:
        work = pycoll.reduce_scatter_tensor(out, x, op=rop(op), group=group, async_op=async_op)
    if async_op:
        assert work.wait() is True
    mine = [data(r, np.dtype(dtype), (5,), salt=rank) for r in range(n)]
    assert_equal(out, reduce_all(op, mine, n))


SCATTER_OPS = [("SUM", np.float32), ("MAX", np.int32), ("SUM", np.float16), ("AVG", BFLOAT16),
               ("PREMUL_SUM", np.float64)]  # fmt: skip


@pytest.mark.parametrize("form", ["tensor", "in place", "list"])
@pytest.mark.parametrize("op,dtype", SCATTER_OPS, ids=str)
@pytest.mark.parametrize("way", tuning.COLLECTIVES["reduce_scatter"])
def test_reduce_scatter_where_the_table_says(group, way, op, dtype, form, rank, world_size):
    tuning.decide(group, "reduce_scatter", ([0], [way]))
    _scatter(group, rank, world_size, dtype, op, form, async_op=form == "tensor")
    assert (window_chunk(group) is not None) == (way == "window")


def test_reduce_scatter_the_tables_mpi_call_overrides_the_built_in_rule(
    group, monkeypatch, rank, world_size
):
    monkeypatch.setattr(rule, "SCATTER_SHM_BYTES", 16)
    monkeypatch.setattr(rule, "SCATTER_SHM_BYTES_OPEN_MPI", 16)
    tuning.decide(group, "reduce_scatter", ([0], ["mpi"]))
    _scatter(group, rank, world_size, np.float32, "SUM", "tensor")
    assert window_chunk(group) is None


def test_reduce_scatter_below_the_first_size_the_built_in_rule(group, rank, world_size):
    """Input of 20 bytes a part: under the table's first size (here 40 bytes a
    part) MPI's call (the built-in rule's, at these sizes), then the window."""
    tuning.decide(group, "reduce_scatter", ([40 * world_size], ["window"]))
    _scatter(group, rank, world_size, np.float32, "SUM", "tensor")
    assert window_chunk(group) is None
    parts = [np.full(10, rank + 1.0, np.float32) for _ in range(world_size)]
    out = np.empty(10, np.float32)
    pycoll.reduce_scatter_tensor(out, np.concatenate(parts), group=group)
    assert_equal(out, np.full(10, world_size * (world_size + 1) / 2, np.float32))
    assert window_chunk(group) is not None
