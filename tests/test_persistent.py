"""pycoll.persistent: repeated small calls run as MPI-4 persistent collectives.

Every test makes its own group with plans on (PYCOLL_PERSISTENT=1's effect),
checks every result against numpy on every rank, and checks that the plans
it expects were (or were not) made."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import pycoll
from pycoll import persistent, watch
from pycoll.arrays import BFLOAT16
from pycoll.errors import DistTimeoutError

CALLS = 2 * persistent.PROMOTE + 1  # before the plan, the call that makes it, and after


@pytest.fixture
def group(pg):
    """A group of every rank with plans on (the suite runs with them off)."""
    with persistent.forced():
        g = pycoll.new_group()
    assert g._plans is not None
    yield g
    if g._broken is None:
        pycoll.destroy_process_group(g)
        assert g._plans is None  # freed with the group


def made(g) -> int:
    return len(g._plans.made)


DTYPES = [np.float32, np.int64, np.float16, BFLOAT16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_all_reduce(group, rank, world_size, dtype):
    for i in range(CALLS):
        x = np.full(5, rank + i, dtype)  # a new array each call: plans copy in and out
        pycoll.all_reduce(x, group=group)
        want = sum(r + i for r in range(world_size))
        assert_array_equal(x, np.full(5, want, dtype))
    assert made(group) == 1


def test_the_same_array_and_a_two_dimensional_one(group, rank, world_size):
    x = np.zeros((2, 3), np.float64)
    for i in range(CALLS):
        x[...] = np.arange(6).reshape(2, 3) * (rank + 1) + i
        pycoll.all_reduce(x, group=group)
        total = sum(r + 1 for r in range(world_size))
        assert_array_equal(x, np.arange(6).reshape(2, 3) * total + i * world_size)
    assert made(group) == 1


def test_broadcast_from_every_root(group, rank, world_size):
    for root in range(world_size):
        for i in range(CALLS):
            x = np.full(3, -1 if rank != root else 100 * root + i, np.int32)
            pycoll.broadcast(x, src=root, group=group)
            assert_array_equal(x, np.full(3, 100 * root + i, np.int32))
    assert made(group) == world_size  # one per root


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_to_every_root(group, rank, world_size, op):
    """Only the root's array takes the result; every other rank's stays as it
    was. A plan per root and op (the call's key holds both)."""
    for root in range(world_size):
        for i in range(CALLS):
            mine = np.arange(4, dtype=np.int64) * (rank + 1) + i
            x = mine.copy()  # a new array each call: plans copy in and out
            pycoll.reduce(x, dst=root, op=getattr(pycoll.ReduceOp, op), group=group)
            every = [np.arange(4) * (r + 1) + i for r in range(world_size)]
            want = sum(every) if op == "SUM" else np.max(every, axis=0)
            assert_array_equal(x, want if rank == root else mine)
    assert made(group) == world_size


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_all_gather_into_tensor(group, rank, world_size, in_place):
    for i in range(CALLS):
        out = np.full(3 * world_size, -1, np.float32)
        mine = np.arange(3, dtype=np.float32) + 10 * rank + i
        if in_place:
            out[3 * rank : 3 * rank + 3] = mine
            inp = out[3 * rank : 3 * rank + 3]
        else:
            inp = mine
        pycoll.all_gather_into_tensor(out, inp, group=group)
        want = np.concatenate([np.arange(3) + 10 * r + i for r in range(world_size)])
        assert_array_equal(out, want.astype(np.float32))
    assert made(group) == 1


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_reduce_scatter_tensor(group, rank, world_size, in_place):
    n = world_size
    for i in range(CALLS):
        inp = (np.arange(2 * n) + rank + i).astype(np.int64)
        out = inp[2 * rank : 2 * rank + 2] if in_place else np.zeros(2, np.int64)
        pycoll.reduce_scatter_tensor(out, inp, group=group)
        total = sum(np.arange(2 * n) + r + i for r in range(n))
        assert_array_equal(out, total[2 * rank : 2 * rank + 2])
    assert made(group) == 1


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_all_to_all_single(group, rank, world_size, in_place):
    n = world_size
    for i in range(CALLS):
        inp = (np.arange(2 * n) + 100 * rank + i).astype(np.float64)
        out = inp if in_place else np.zeros(2 * n)
        pycoll.all_to_all_single(out, inp, group=group)
        want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r + i for r in range(n)])
        assert_array_equal(out, want)
    assert made(group) == 1


def test_async_on_some_ranks_and_not_others(group, rank, world_size):
    """Whether a call is async is each rank's own choice: every rank still
    counts it and uses the plan. Two uses of one plan in flight on a rank
    are run one after the other, each result intact. (Under
    PYCOLL_WAIT=blocking, the ranks must all choose alike: before the plan
    exists MPI would not match a blocking call with a nonblocking one.)"""
    mixed = not watch.BLOCKING
    for i in range(CALLS):
        x = np.full(4, rank + i, np.float32)
        work = pycoll.all_reduce(x, group=group, async_op=mixed and rank % 2 == 0)
        if work is not None:
            assert work.wait()
        assert_array_equal(x, np.full(4, sum(r + i for r in range(world_size)), np.float32))
    a = np.full(4, rank, np.float32)
    b = np.full(4, 2 * rank, np.float32)
    wa = pycoll.all_reduce(a, group=group, async_op=True)
    wb = pycoll.all_reduce(b, group=group, async_op=True)  # the plan is in use: a finishes first
    assert wb.wait() and wa.wait() and wa.is_completed()
    total = sum(range(world_size))
    assert_array_equal(a, np.full(4, total, np.float32))
    assert_array_equal(b, np.full(4, 2 * total, np.float32))
    assert made(group) == 1


def test_detail_checks_planned_calls_too(group, rank, world_size):
    before = pycoll.get_debug_level()
    pycoll.set_debug_level(pycoll.DebugLevel.DETAIL)
    try:
        for i in range(CALLS):
            x = np.full(2, rank + i, np.int32)
            pycoll.all_reduce(x, group=group)
            assert_array_equal(x, np.full(2, sum(r + i for r in range(world_size)), np.int32))
    finally:
        pycoll.set_debug_level(before)
    assert made(group) == 1


def test_what_gets_no_plan(group, rank, world_size):
    """AVG and PREMUL_SUM (a division or scaling around MPI's op), and buffers
    over the limit, run as before: no plan, the same results."""
    for _ in range(CALLS):
        x = np.full(3, 2.0 * (rank + 1), np.float64)
        pycoll.all_reduce(x, op=pycoll.ReduceOp.AVG, group=group)
        assert_array_equal(x, np.full(3, world_size + 1.0))
        y = np.full(3, 1.0, np.float32)
        pycoll.all_reduce(y, op=pycoll.make_premul_sum(2.0), group=group)
        assert_array_equal(y, np.full(3, 2.0 * world_size, np.float32))
        big = np.ones(persistent.LIMIT // 4 + 1, np.float32)
        pycoll.all_reduce(big, group=group)
        assert (big == world_size).all()
    assert made(group) == 0


def test_plans_are_bounded(group, rank, world_size):
    sizes = range(1, persistent.MAX_PLANS + 6)
    for _ in range(persistent.PROMOTE):
        for size in sizes:
            x = np.full(size, rank + 1, np.int32)
            pycoll.all_reduce(x, group=group)
            assert (x == world_size * (world_size + 1) // 2).all()
    assert made(group) == persistent.MAX_PLANS


def test_a_late_rank_is_named_by_the_timeout(pg, rank, world_size):
    """A planned call that one rank never makes: the others wait out the
    group's timeout, and its diagnosis names the rank that did not come."""
    if world_size == 1:
        pytest.skip("needs a rank to be late")
    with persistent.forced():
        g = pycoll.new_group(timeout=timedelta(seconds=3))
    x = np.ones(2)
    for _ in range(persistent.PROMOTE):
        pycoll.all_reduce(x, group=g)
    last = world_size - 1
    if rank != last:
        with pytest.raises(DistTimeoutError) as exc:
            # async: under PYCOLL_WAIT=blocking a synchronous call's timeout
            # aborts the job instead (it cannot be interrupted)
            pycoll.all_reduce(x, group=g, async_op=True).wait()
        assert f"rank {last}: has not reached it" in str(exc.value), str(exc.value)
    pycoll.barrier()  # (the default group: the late rank joins here)


def test_a_persistent_request_is_waited_for_without_a_spurious_error(pg, rank, world_size):
    """MPICH 5.0's MPI_Testall fails a completed persistent collective with
    MPI_ERR_IN_STATUS; pycoll's waits test a single request with MPI_Test."""
    from mpi4py import MPI

    comm = pg.comm.Dup()
    try:
        buf = np.full(2, rank + 1, np.float64)
        request = comm.Allreduce_init(MPI.IN_PLACE, [buf, MPI.DOUBLE], MPI.SUM)
        for _ in range(3):
            buf[:] = rank + 1
            request.Start()
            watch.wait(pg, "test", None, [request])
            assert_array_equal(buf, np.full(2, world_size * (world_size + 1) / 2))
        request.Free()
    finally:
        comm.Free()


def test_the_setting_is_checked(monkeypatch, pg):
    monkeypatch.setenv(persistent.ENV_VAR, "yes")
    with pytest.raises(ValueError, match="PYCOLL_PERSISTENT must be '1'"):
        persistent.configure()
    before = persistent.ENABLED
    try:
        monkeypatch.setenv(persistent.ENV_VAR, "1")
        persistent.configure()
        assert persistent.ENABLED is True
        monkeypatch.setenv(persistent.ENV_VAR, "0")
        persistent.configure()
        assert persistent.ENABLED is False
    finally:
        persistent.ENABLED = before
