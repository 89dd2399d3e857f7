"""reduce on three ranks or more as a reduce-scatter, then a gather to the
root (pycoll.collectives.reduce._reduce_scattered).

Most tests lower the path's threshold so small arrays take it, sizes that
do not divide by the group's size included, and check the root's result
against numpy's own reduction and every other rank's array left as it was.
On one or two ranks the path is not taken and the results are the same."""

from __future__ import annotations

import os
from typing import List

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.paths import rule
from support import (
    LATE_TIMEOUT,
    assert_equal,
    at_detail,
    data,
    fresh_group,
    late_rank_named,
    reduce_all,
    reduce_around,
    rop,
    spy_path,
    valid_pairs,
)

PAIRS = valid_pairs()


def count_scattered(monkeypatch) -> List[int]:
    """Record every reduce that takes the path, the real function still
    doing the work."""
    return spy_path(monkeypatch, "reduce", "scattered")


@pytest.fixture
def forced(monkeypatch):
    """Every reduce of 8 bytes or more on three ranks or more takes the
    path. Yields the list of calls that took it."""
    monkeypatch.setattr(rule, "SCATTERED_BYTES", 8)
    monkeypatch.setattr(rule, "_SCATTERED_SET", 8)
    yield count_scattered(monkeypatch)


@pytest.fixture
def group(forced, pg):
    yield from fresh_group()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("last", [False, True], ids=["dst 0", "dst last"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_every_op_and_dtype(group, forced, op, dtype, last, async_op, rank, world_size):
    n = world_size
    dst = n - 1 if last else 0
    x = data(rank, dtype, (7, 3))  # 21 elements: parts of 7, or 6, 5 and 5, ...
    before = x.copy()
    work = pycoll.reduce(x, dst=dst, op=rop(op), group=group, async_op=async_op)
    if async_op:
        assert work.wait() is True and work.result() == [x]
    if rank == dst:
        assert_equal(x, reduce_all(op, [data(r, dtype, (7, 3)) for r in range(n)], n))
    else:
        assert_equal(x, before)  # read only, a PREMUL_SUM's too
    assert len(forced) == (n > 2)


@pytest.mark.parametrize("count", [1, 2, 5, 1000], ids=lambda c: f"{c} elements")
def test_sizes_around_the_group(group, forced, count, rank, world_size):
    """Fewer elements than ranks (some parts empty), a few more, many; the
    same call again on the same arrays."""
    n = world_size
    x = np.arange(count, dtype=np.float64) + rank
    for k in range(2):
        pycoll.reduce(x, dst=n - 1, group=group)
        if rank == n - 1:
            # (the root's result is its input to the second call)
            total = np.arange(count, dtype=np.float64) * n + n * (n - 1) / 2
            others = (n - 1) * np.arange(count) + n * (n - 1) / 2 - (n - 1)  # ranks 0..n-2
            assert_equal(x, total if k == 0 else total + others)
        else:
            assert_equal(x, np.arange(count, dtype=np.float64) + rank)
    assert len(forced) == (2 if n > 2 and count * 8 >= 8 else 0)


def test_calls_in_flight_keep_apart(group, forced, rank, world_size):
    """Three async calls to different roots, waited for in opposite orders
    on different ranks: each call's gather starts when its Work is driven."""
    n, count = world_size, 37
    xs = [np.arange(count, dtype=np.float64) * (k + 1) + rank for k in range(3)]
    works = [pycoll.reduce(x, dst=k % n, group=group, async_op=True) for k, x in enumerate(xs)]
    for k in range(3) if rank % 2 == 0 else reversed(range(3)):
        assert works[k].wait() is True
    for k in range(3):
        if rank == k % n:
            want = np.arange(count, dtype=np.float64) * (k + 1) * n + n * (n - 1) / 2
        else:
            want = np.arange(count, dtype=np.float64) * (k + 1) + rank
        assert_equal(xs[k], want)
    assert len(forced) == 3 * (n > 2)


def test_detail_checks_it(group, forced, rank, world_size):
    n = world_size
    with at_detail():
        x = np.full(11, rank + 1.0, np.float32)
        pycoll.reduce(x, dst=0, op=ReduceOp.AVG, group=group)
        assert_equal(x, np.full(11, (n + 1) / 2 if rank == 0 else rank + 1.0, np.float32))
    assert len(forced) == (n > 2)


def test_a_late_rank_is_named_by_the_timeout(forced, rank, world_size):
    if world_size < 3:
        pytest.skip("the path runs on three ranks or more")
    g = pycoll.new_group(timeout=LATE_TIMEOUT)
    x = np.ones(16)
    last = world_size - 1
    late_rank_named(lambda: pycoll.reduce(x, dst=0, group=g), "reduce", rank, last)
    assert len(forced) == (rank != last)


def test_not_for_arrays_that_alias_device_memory(group, forced, rank, world_size):
    from pycoll.collectives._common import device_aliases

    n = world_size
    x = np.full(10, rank + 1.0, np.float32)
    with device_aliases(group):
        pycoll.reduce(x, dst=0, group=group)
    assert_equal(x, np.full(10, n * (n + 1) / 2 if rank == 0 else rank + 1.0, np.float32))
    assert forced == []


def test_the_built_in_rule(monkeypatch, rank, world_size):
    """By default from 16 MiB on MPICH where its v-form reduce-scatter runs
    pairwise (the variable pycoll sets when it starts MPI, not when the
    program imported mpi4py.MPI first, as in the one-rank run), never
    elsewhere; one element less stays with MPI's call; 0
    (PYCOLL_SCATTERED_BYTES=0) turns it off."""
    from pycoll import _mpi

    taken = count_scattered(monkeypatch)
    least = rule.scattered_from()
    pairwise = os.environ.get("MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM") == "sched_pairwise"
    assert least == (16 << 20 if _mpi.VENDOR == "MPICH" and pairwise else 0)
    if least == 0:
        return
    g = pycoll.new_group()
    reduce_around(least, rank, world_size, g)
    assert len(taken) == (world_size > 2)
    monkeypatch.setattr(rule, "SCATTERED_BYTES", 0)
    assert rule.scattered_from() == 0
    pycoll.destroy_process_group(g)


def test_without_pairwise_asked_for_mpi_keeps_its_call(monkeypatch):
    from pycoll import _mpi

    monkeypatch.setattr(_mpi, "REDUCE_SCATTER_PAIRWISE", False)
    assert rule.scattered_from() == 0
    monkeypatch.setattr(rule, "_SCATTERED_SET", 4096)
    assert rule.scattered_from() == 4096
