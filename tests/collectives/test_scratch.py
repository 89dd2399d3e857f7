"""The buffers a group keeps to receive into (pycoll.collectives.scratch), and
the calls that use them: in-place reduce_scatter_tensor and pycoll's ring,
with buffers of the pool's sizes, called again and in flight together,
against numpy on every rank."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.collectives import scratch
from pycoll.paths import rule
from support import count_rings, rule_only

MIB = 1 << 20


@pytest.fixture
def group(pg):
    """A group of its own (a pool of its own), destroyed at the end."""
    g = pycoll.new_group(list(range(pycoll.get_world_size())))
    yield g
    pycoll.destroy_process_group(g)


def test_a_buffer_given_back_is_taken_again(group):
    a = scratch.take(group, 2 * MIB, np.dtype(np.float32))
    assert a.dtype == np.float32 and a.nbytes == 2 * MIB
    scratch.give(group, a)
    b = scratch.take(group, MIB, np.dtype(np.float16))  # smaller: the same memory
    assert b.nbytes == MIB and np.shares_memory(a, b)
    c = scratch.take(group, MIB, np.dtype(np.float16))  # that one is taken: new memory
    assert not np.shares_memory(b, c)


def test_the_smallest_buffer_that_fits_is_taken(group):
    big, small = (scratch.take(group, n, np.dtype(np.uint8)) for n in (8 * MIB, 2 * MIB))
    scratch.give(group, big)
    scratch.give(group, small)
    assert np.shares_memory(scratch.take(group, 2 * MIB, np.dtype(np.uint8)), small)
    assert np.shares_memory(scratch.take(group, 3 * MIB, np.dtype(np.uint8)), big)


def test_small_buffers_are_not_kept(group):
    a = scratch.take(group, scratch.POOL_FROM - 8, np.dtype(np.float64))
    scratch.give(group, a)
    assert not np.shares_memory(a, scratch.take(group, 8, np.dtype(np.float64)))


def test_the_pool_is_bounded(group):
    buffers = [scratch.take(group, (i + 1) * MIB, np.dtype(np.uint8)) for i in range(6)]
    for buf in buffers:
        scratch.give(group, buf)
    kept = [scratch.take(group, MIB, np.dtype(np.uint8)) for _ in range(scratch.KEEP + 1)]
    reused = [b for b in buffers if any(np.shares_memory(b, k) for k in kept)]
    assert [b.nbytes for b in reused] == [3 * MIB, 4 * MIB, 5 * MIB, 6 * MIB]  # the largest
    huge = scratch.take(group, scratch.KEEP_BYTES + MIB, np.dtype(np.uint8))
    scratch.give(group, huge)
    assert not np.shares_memory(huge, scratch.take(group, scratch.KEEP_BYTES, np.dtype(np.uint8)))


def test_an_array_it_did_not_give_is_not_kept(group):
    mine = np.zeros(4 * MIB, np.uint8)
    scratch.give(group, mine[MIB:])  # a view of memory pycoll does not own
    assert not np.shares_memory(mine, scratch.take(group, MIB, np.dtype(np.uint8)))


def test_buffers_their_calls_dropped_are_forgotten(group):
    """A buffer handed out and never given back (its call failed, and MPI may
    still write into it) is dropped with that call: the pool keeps no entry
    for it past a bound, and an array that takes its place is not kept."""
    pool = scratch._pool(group)
    held = [scratch.take(group, MIB, np.dtype(np.uint8)) for _ in range(scratch._OUT_PRUNE)]
    assert len(pool.out) == scratch._OUT_PRUNE
    del held  # (their calls failed)
    last = scratch.take(group, MIB, np.dtype(np.uint8))
    assert len(pool.out) == 1  # (the dead entries dropped)
    scratch.give(group, last)
    assert len(pool.out) == 0 and len(pool.free) == 1
    stranger = np.zeros(2 * MIB, np.uint8)  # (perhaps at a dropped buffer's id)
    scratch.give(group, stranger)
    assert not any(buf is stranger for buf in pool.free)


def _rank_values(r, n, size):
    return (np.arange(n * size) % 7 + r).astype(np.float32)


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_in_place_reduce_scatter_again_and_in_flight(op, group, rank, world_size):
    """Large enough for the pool: two calls in flight get buffers of their
    own, and later calls reuse them, every result right."""
    part = (2 * MIB) // 4  # 2 MiB of output per rank
    total = sum(_rank_values(r, world_size, part) for r in range(world_size))
    if op == "AVG":
        total = total / world_size
    mine = slice(rank * part, (rank + 1) * part)
    for _ in range(3):
        xs = [_rank_values(rank, world_size, part) for _ in range(2)]
        works = [
            pycoll.reduce_scatter_tensor(x[mine], x, op=getattr(ReduceOp, op), group=group,
                                         async_op=True)
            for x in xs
        ]  # fmt: skip
        for work, x in zip(works, xs):
            assert work.wait() is True
            np.testing.assert_array_equal(x[mine], total[mine].astype(np.float32))
            rest = _rank_values(rank, world_size, part)
            rest[mine] = x[mine]
            np.testing.assert_array_equal(x, rest)


@pytest.mark.parametrize("dtype,op", [(np.float16, "SUM"), (np.float32, "AVG")], ids=str)
def test_ring_again_and_in_flight(dtype, op, monkeypatch, group, rank, world_size):
    """pycoll's ring (taken by float16 and by AVG on MPICH), forced, on arrays
    whose received parts come from the pool: repeated and overlapping calls
    each give numpy's result."""
    monkeypatch.setattr(rule, "SPLIT_BYTES", 1)
    monkeypatch.setattr(rule, "SPLIT_BYTES_TWO_RANKS", 1)
    rule_only(monkeypatch, group)
    rings = count_rings(monkeypatch)
    size = (4 * MIB * world_size) // np.dtype(dtype).itemsize
    want = sum((np.arange(size) % 5 + r) for r in range(world_size)).astype(dtype)
    if op == "AVG":
        want = want / dtype(world_size)
    for _ in range(3):
        xs = [(np.arange(size) % 5 + rank).astype(dtype) for _ in range(2)]
        works = [
            pycoll.all_reduce(x, op=getattr(ReduceOp, op), group=group, async_op=True) for x in xs
        ]
        for work, x in zip(works, xs):
            assert work.wait() is True
            np.testing.assert_array_equal(x, want)
    ring_used = world_size > 1  # (pycoll.ops.Plan.split)
    assert len(rings) == (6 if ring_used else 0)


def test_all_gather_and_all_to_all_lists_again_and_in_flight(group, rank, world_size):
    """The list forms receive into one buffer of the pool's sizes and copy
    out: repeated and overlapping calls each give every rank's arrays."""
    count = MIB // 4  # 1 MiB per rank and array
    for _ in range(3):
        works, checks = [], []
        for salt in range(2):
            mine = np.full(count, 10 * rank + salt, np.float32)
            gathered = [np.zeros(count, np.float32) for _ in range(world_size)]
            works.append(pycoll.all_gather(gathered, mine, group=group, async_op=True))
            checks.append((gathered, [np.full(count, 10 * r + salt) for r in range(world_size)]))
            ins = [np.full(count, 100 * rank + to + salt, np.float32) for to in range(world_size)]
            outs = [np.zeros(count, np.float32) for _ in range(world_size)]
            works.append(pycoll.all_to_all(outs, ins, group=group, async_op=True))
            sent = [np.full(count, 100 * r + rank + salt) for r in range(world_size)]
            checks.append((outs, sent))
        for work in works:
            assert work.wait() is True
        for got, want in checks:
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w.astype(np.float32))


def test_gather_on_the_root_again(group, rank, world_size):
    count = MIB // 4
    for step in range(3):
        dst = step % world_size
        got = [np.zeros(count, np.float32) for _ in range(world_size)] if rank == dst else None
        pycoll.gather(np.full(count, rank + step, np.float32), got, dst=dst, group=group)
        if rank == dst:
            for r, g in enumerate(got):
                np.testing.assert_array_equal(g, np.full(count, r + step, np.float32))
