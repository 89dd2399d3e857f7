"""reduce on two ranks by pycoll's own path (pycoll.collectives.to_root).

Most tests lower the path's threshold and its piece size (so small arrays
take it in several pieces, the last one short) and check the root's result
against numpy's own reduction and the other rank's array left as it was.
They run on a group of ranks 0 and 1 (the world on two ranks); a rank
outside it checks that the call is none of its business."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, debug
from pycoll.collectives import to_root
from pycoll.paths import rule
from support import (
    LATE_TIMEOUT,
    assert_equal,
    at_detail,
    count_starts,
    data,
    late_rank_named,
    reduce_around,
    rop,
    two_rank_reduce_checked,
    valid_pairs,
)

# Any size of job: the two-rank reduce runs on a group of ranks 0 and 1.
pytestmark = pytest.mark.any_size

PAIRS = valid_pairs()
K = 13  # elements: pieces of 4 (float64: 32 bytes) or 8, the last one short


def count_to_root(monkeypatch) -> List[int]:
    """:func:`support.count_starts` of the reduce to a root, where it has something to send."""
    return count_starts(monkeypatch, to_root.ToRoot, lambda steps: steps._pieces)


@pytest.fixture
def forced(monkeypatch, world_size):
    """Every reduce of 8 bytes or more on two ranks takes the path, in pieces
    of 32 bytes. Yields the started calls' sequence numbers."""
    if world_size == 1:
        pytest.skip("the path runs on two ranks")
    for name in ("TO_ROOT_BYTES", "TO_ROOT_BYTES_OPEN_MPI", "_TO_ROOT_SET"):
        monkeypatch.setattr(rule, name, 8)
    monkeypatch.setattr(to_root, "CHUNK", 32)
    yield count_to_root(monkeypatch)


@pytest.fixture
def pair(forced, rank):
    """A group of ranks 0 and 1 (on the others, what new_group gives a rank
    outside: a call with it is none of theirs), destroyed after the test
    unless a fault broke it."""
    g = pycoll.new_group([0, 1])
    member = rank < 2
    yield g
    if member and g._broken is None:
        pycoll.destroy_process_group(g)


def carried(op, dtype) -> bool:
    """The kernels' AVG divides real floats only: a complex AVG stays with MPI."""
    return not (op == "AVG" and np.dtype(dtype).kind == "c")


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("dst", [0, 1])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_every_op_and_dtype(pair, forced, op, dtype, dst, async_op, rank):
    x = data(rank, dtype, (K, 2))
    before = x.copy()  # (the other rank's array is read only, a PREMUL_SUM's too)
    work = pycoll.reduce(x, dst=dst, op=rop(op), group=pair, async_op=async_op)
    if not two_rank_reduce_checked(work, x, before, op, dtype, (K, 2), rank, dst, async_op):
        assert forced == []  # (outside the group)
        return
    assert len(forced) == carried(op, dtype)


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 1000], ids=lambda c: f"{c} elements")
def test_sizes_around_a_piece(pair, forced, count, rank):
    """No element (below the threshold), less than a piece, exactly one, one
    and a bit, many; the same call again on the same arrays."""
    x = np.arange(count, dtype=np.float64) + rank
    for k in range(2):
        pycoll.reduce(x, dst=1, group=pair)
        if rank == 1:
            want = np.arange(count, dtype=np.float64) * (k + 2) + 1
            assert_equal(x, want)  # (rank 0's array is added again each call)
        else:
            assert_equal(x, np.arange(count, dtype=np.float64) + rank)
    assert len(forced) == (2 if count and rank < 2 else 0)


def test_calls_in_flight_keep_their_messages_apart(pair, forced, rank):
    """Three async calls to different roots, waited for in opposite orders on
    the two ranks: their later pieces start when their Works are driven, so
    without a tag per call a piece of one would match a piece of another."""
    if rank >= 2:  # outside the group
        assert pycoll.reduce(np.ones(3), dst=0, group=pair, async_op=True) is None
        return
    count = 37
    xs = [np.arange(count, dtype=np.float64) * (k + 1) + rank for k in range(3)]
    works = [pycoll.reduce(x, dst=k % 2, group=pair, async_op=True) for k, x in enumerate(xs)]
    for k in range(3) if rank == 0 else reversed(range(3)):
        assert works[k].wait() is True
    for k in range(3):
        mine = np.arange(count, dtype=np.float64) * (k + 1) + rank
        if rank == k % 2:
            assert_equal(xs[k], np.arange(count, dtype=np.float64) * (k + 1) * 2 + 1)
        else:
            assert_equal(xs[k], mine)
    assert len(forced) == 3


def test_sync_and_async_calls_match(pair, forced, rank):
    x = np.full(K, rank + 1.0)
    if rank >= 2:  # outside the group
        assert pycoll.reduce(x, dst=0, group=pair) is None
        return
    if rank:
        assert pycoll.reduce(x, dst=0, group=pair, async_op=True).wait() is True
        assert_equal(x, np.full(K, 2.0))
    else:
        assert pycoll.reduce(x, dst=0, group=pair) is None
        assert_equal(x, np.full(K, 3.0))


def test_detail_checks_it(pair, forced, rank):
    with at_detail():
        x = np.full(K, rank + 1.0, np.float32)
        pycoll.reduce(x, dst=0, op=ReduceOp.AVG, group=pair)
        assert_equal(x, np.full(K, 1.5 if rank == 0 else rank + 1.0, np.float32))
    assert len(forced) == (rank < 2)


def test_a_late_rank_is_named_by_the_timeout(forced, rank):
    g = pycoll.new_group([0, 1], timeout=LATE_TIMEOUT)
    x = np.ones(K)
    if rank < 2:
        late_rank_named(lambda: pycoll.reduce(x, dst=0, group=g), "reduce", rank, 1)
    else:
        pycoll.barrier()  # (outside the group: only the barrier the others meet at)
    # (At DETAIL the check before the call is what times out: nothing starts.)
    assert len(forced) == (rank == 0 and debug.LEVEL < debug.DebugLevel.DETAIL)


def test_not_for_arrays_that_alias_device_memory(pair, forced, rank):
    """Under CUDA-aware MPI the host body gets arrays aliasing device memory
    (pycoll.gpu.collectives): no host kernel may touch them, so MPI's own
    call runs."""
    from pycoll.collectives._common import device_aliases

    x = np.full(K, rank + 1.0, np.float32)
    if rank >= 2:  # outside the group
        assert pycoll.reduce(x, dst=1, group=pair) is None
    else:
        with device_aliases(pair):
            pycoll.reduce(x, dst=1, group=pair)
    want = 3.0 if rank == 1 else rank + 1.0
    assert_equal(x, np.full(K, want, np.float32))
    assert forced == []


def test_the_built_in_rule(monkeypatch, rank, world_size):
    """By default a group of two ranks takes the path from 64 KiB on MPICH
    and 8 MiB on Open MPI (one element less stays with MPI's call); larger
    groups never; 0 (PYCOLL_TO_ROOT_BYTES=0) turns it off."""
    from pycoll import _mpi

    started = count_to_root(monkeypatch)
    vendor = _mpi.VENDOR
    least = rule.to_root_from()
    assert least == {"MPICH": 64 << 10, "Open MPI": 8 << 20}[vendor]
    g = pycoll.new_group()
    reduce_around(least, rank, world_size, g)
    assert len(started) == (world_size == 2)
    monkeypatch.setattr(rule, "TO_ROOT_BYTES", 0)
    monkeypatch.setattr(rule, "TO_ROOT_BYTES_OPEN_MPI", 0)
    assert rule.to_root_from() == 0
    pycoll.destroy_process_group(g)


def test_an_mpi_it_was_not_measured_against_keeps_its_own_call(monkeypatch):
    from pycoll import _mpi

    monkeypatch.setattr(_mpi, "VENDOR", "Intel(R) MPI")
    assert rule.to_root_from() == 0
    monkeypatch.setattr(rule, "_TO_ROOT_SET", 4096)
    monkeypatch.setattr(rule, "TO_ROOT_BYTES", 4096)
    assert rule.to_root_from() == 4096
