"""all_reduce by pycoll's recursive doubling (pycoll.collectives.doubling).

Most tests lower the path's threshold, put the ring's and the window's out
of reach and let any group whose size is a power of two take it (by default
only two ranks on Open MPI do), then check every rank's result against
numpy's own reduction and, where the op's bits depend on its operands'
order, against the other ranks' bits."""

from __future__ import annotations

import os
from typing import List

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, debug
from pycoll.collectives import doubling
from pycoll.paths import rule
from support import (
    BF16,
    LATE_TIMEOUT,
    assert_equal,
    at_detail,
    count_starts,
    data,
    fresh_group,
    late_rank_named,
    reduce_all,
    rop,
    valid_pairs,
)

PAIRS = valid_pairs()
NEVER = 1 << 62


def count_doubling(monkeypatch) -> List[int]:
    """:func:`support.count_starts` of the doubling all_reduce (one rank sends nothing)."""
    return count_starts(monkeypatch, doubling.Doubling, lambda steps: steps._steps)


@pytest.fixture
def forced(monkeypatch):
    """Every all_reduce of 8 bytes or more on a group of a power of two
    takes the path; the ring's and the window's thresholds out of reach.
    Yields the started calls' sequence numbers."""
    monkeypatch.setattr(rule, "DOUBLING_BYTES", 8)
    monkeypatch.setattr(rule, "doubles", doubling.applies)
    for name in ("RING_BYTES", "SPLIT_BYTES", "SPLIT_BYTES_TWO_RANKS"):
        monkeypatch.setattr(rule, name, NEVER)
    for name in ("SHM_BYTES", "SHM_BYTES_MPICH", "SHM_BYTES_PAIR"):
        monkeypatch.setattr(rule, name, NEVER)
    yield count_doubling(monkeypatch)


@pytest.fixture
def group(forced, pg):
    yield from fresh_group()


def taken(op, dtype, n) -> int:
    """1 where the path takes the call: a power of two of ranks, more than
    one, and an op the kernels carry (an AVG divides real floats only)."""
    carried = not (op == "AVG" and np.dtype(dtype).kind in "cbiu")
    return int(doubling.applies(n) and carried)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_every_op_and_dtype(group, forced, op, dtype, async_op, rank, world_size):
    n = world_size
    x = data(rank, dtype, (7, 3))
    work = pycoll.all_reduce(x, op=rop(op), group=group, async_op=async_op)
    if async_op:
        assert work.wait() is True and work.result() == [x]
    want = reduce_all(op, [data(r, dtype, (7, 3)) for r in range(n)], n)
    assert_equal(x, want)
    assert len(forced) == taken(op, dtype, n)


@pytest.mark.parametrize("op", ["MIN", "MAX", "SUM", "PRODUCT"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16], ids=str)
def test_every_rank_ends_with_the_same_bits(group, forced, op, dtype, rank, world_size):
    """Signed zeros, NaN and infinities on some ranks and not others: MIN
    and MAX of 0.0 and -0.0 give either zero by their order, so each pair
    folds the lower half first, and every rank holds the same bits (SUM and
    PRODUCT are the same in either order). (Where MPI's own call runs, on 3
    ranks, the values are checked, not the bits: MPICH 5.0.2's MIN gave
    0.0 on some ranks and -0.0 on others there, as the MPI standard allows
    for an op declared commutative.)"""
    n = world_size
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(7 + rank)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0], np.float64)
    x = rng.choice(specials, 600).astype(dtype)
    x[:4] = [0.0, -0.0, -0.0, 0.0] if rank % 2 else [-0.0, 0.0, -0.0, 0.0]
    mine = x.copy()
    with np.errstate(invalid="ignore"):
        pycoll.all_reduce(x, op=rop(op), group=group)
    words = x.view(f"u{dtype.itemsize}")
    everyone: list = [None] * n
    pycoll.all_gather_object(everyone, words.tobytes(), group=group)
    nan = np.isnan(x.astype(np.float32))
    for other in everyone:
        theirs = np.frombuffer(other, words.dtype)
        assert np.array_equal(nan, np.isnan(theirs.view(dtype).astype(np.float32)))
        if doubling.applies(n):
            assert np.array_equal(words[~nan], theirs[~nan]), "ranks differ in some element's bits"
    inputs: list = [None] * n
    pycoll.all_gather_object(inputs, mine, group=group)
    with np.errstate(invalid="ignore"):
        want = reduce_all(op, inputs, n).astype(np.float32)
    got = x.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])  # (0.0 == -0.0)
    assert len(forced) == taken(op, dtype, n)


@pytest.mark.parametrize("count", [1, 2, 1000, 70001], ids=lambda c: f"{c} elements")
def test_sizes(group, forced, count, rank, world_size):
    """One element (below the threshold: MPI's call), two, many, and a
    large array whose folds run on the kernels' parallel build where the
    rank has threads; the same call again on the same array."""
    n = world_size
    x = np.arange(count, dtype=np.float32) + rank
    for k in range(2):
        pycoll.all_reduce(x, group=group)
        want = np.arange(count, dtype=np.float32) * n + n * (n - 1) / 2
        for _ in range(k):
            want = want * n
        assert_equal(x, want)
    assert len(forced) == (2 if count > 1 and doubling.applies(n) else 0)


def test_calls_in_flight_keep_their_messages_apart(group, forced, rank, world_size):
    """Three async calls on one group, waited for in opposite orders on
    different ranks: on four ranks each call's second step starts when its
    Work is driven, so without a tag per call a step of one would match a
    step of another."""
    n, count = world_size, 37
    xs = [np.arange(count, dtype=np.float64) * (k + 1) + rank for k in range(3)]
    works = [pycoll.all_reduce(x, group=group, async_op=True) for x in xs]
    for k in range(3) if rank % 2 == 0 else reversed(range(3)):
        assert works[k].wait() is True
    for k in range(3):
        assert_equal(xs[k], np.arange(count, dtype=np.float64) * (k + 1) * n + n * (n - 1) / 2)
    assert len(forced) == 3 * doubling.applies(n)


def test_sync_and_async_calls_match(group, forced, rank, world_size):
    n = world_size
    x = np.full(9, rank + 1.0)
    if rank % 2:
        assert pycoll.all_reduce(x, group=group, async_op=True).wait() is True
    else:
        assert pycoll.all_reduce(x, group=group) is None
    assert_equal(x, np.full(9, n * (n + 1) / 2))


def test_detail_checks_it(group, forced, rank, world_size):
    with at_detail():
        x = np.full(11, rank + 1.0, np.float32)
        pycoll.all_reduce(x, op=ReduceOp.AVG, group=group)
        assert_equal(x, np.full(11, (world_size + 1) / 2, np.float32))
    assert len(forced) == doubling.applies(world_size)


def test_a_late_rank_is_named_by_the_timeout(forced, rank, world_size):
    if not doubling.applies(world_size):
        pytest.skip("the path runs on groups of a power of two, more than one rank")
    g = pycoll.new_group(timeout=LATE_TIMEOUT)
    x = np.ones(16)
    last = world_size - 1
    late_rank_named(lambda: pycoll.all_reduce(x, group=g), "all_reduce", rank, last)
    # (At DETAIL the check before the call is what times out: nothing starts.)
    assert len(forced) == (rank != last and debug.LEVEL < debug.DebugLevel.DETAIL)


def test_not_for_arrays_that_alias_device_memory(group, forced, rank, world_size):
    """Under CUDA-aware MPI the host body gets arrays aliasing device memory
    (pycoll.gpu.collectives): no host kernel may touch them, so MPI's own
    call runs."""
    from pycoll.collectives._common import device_aliases

    n = world_size
    y = np.full(10, rank + 1.0, np.float32)
    with device_aliases(group):
        pycoll.all_reduce(y, group=group)
    assert_equal(y, np.full(10, n * (n + 1) / 2, np.float32))
    assert forced == []


def test_the_built_in_rule(monkeypatch, rank, world_size):
    """By default a group of two ranks on Open MPI takes the path from
    DOUBLING_BYTES (one element less stays with MPI's call) while libnbc's
    all_reduce is left to its binomial tree and the wait mode is the
    default one; other groups, MPIs and modes never by the rule; 0
    (PYCOLL_DOUBLING_BYTES=0) turns it off."""
    from pycoll import _mpi, watch

    started = count_doubling(monkeypatch)
    g = pycoll.new_group()
    assert rule.DOUBLING_BYTES == 64 << 10
    libnbc_default = os.environ.get(_mpi.ALL_REDUCE_MCA, "0").strip() in ("", "0")
    takes = world_size == 2 and _mpi.VENDOR == "Open MPI" and libnbc_default
    takes = takes and not watch.BLOCKING
    count = rule.DOUBLING_BYTES // 4
    for size in (count - 1, count):
        x = np.full(size, rank + 1.0, np.float32)
        pycoll.all_reduce(x, group=g)
        assert_equal(x, np.full(size, world_size * (world_size + 1) / 2, np.float32))
    assert len(started) == takes
    monkeypatch.setattr(rule, "DOUBLING_BYTES", 0)
    x = np.ones(count, np.float32)
    pycoll.all_reduce(x, group=g)
    assert_equal(x, np.full(count, world_size, np.float32))
    assert len(started) == takes
    pycoll.destroy_process_group(g)


@pytest.mark.parametrize("vendor", ["MPICH", "Open MPI"])
@pytest.mark.parametrize("libnbc", ["default", "chosen", "blocking"])
def test_the_rule_by_mpi_mode_and_group_size(monkeypatch, vendor, libnbc):
    """Only two ranks of Open MPI whose nonblocking all_reduce is libnbc's
    binomial tree (no algorithm chosen, the default wait mode); with
    PYCOLL_DOUBLING_BYTES set, two ranks of any MPI in either mode."""
    from pycoll import _mpi, watch

    monkeypatch.setattr(_mpi, "VENDOR", vendor)
    monkeypatch.setattr(_mpi, "ALL_REDUCE_CHOSEN", libnbc == "chosen")
    monkeypatch.setattr(watch, "BLOCKING", libnbc == "blocking")
    tree = vendor == "Open MPI" and libnbc == "default"
    for ranks in (1, 2, 3, 4, 8):
        assert rule.doubles(ranks) is (tree and ranks == 2), ranks
    monkeypatch.setattr(rule, "_DOUBLING_SET", 4096)
    for ranks in (1, 2, 3, 4, 8):
        assert rule.doubles(ranks) is (ranks == 2), ranks
