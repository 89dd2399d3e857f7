"""reduce_scatter_tensor and reduce_scatter by pycoll's pairwise exchange
(pycoll.collectives.pairwise).

Most tests lower the path's threshold and its piece size (so small arrays
take it, each step in several pieces, the last one short) and check every
rank's result against numpy's own reduction, with the input left as it was
outside the output."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, debug, paths, tuning
from pycoll.collectives import pairwise
from pycoll.collectives import reduce as reduce_mod
from pycoll.ops import plan
from pycoll.paths import rule
from support import (
    LATE_TIMEOUT,
    assert_equal,
    at_detail,
    check_reduce_scatter_list_form,
    count_starts,
    data,
    fresh_group,
    late_rank_named,
    reduce_all,
    rop,
    rule_only,
    valid_pairs,
)

PAIRS = valid_pairs()
K = 13  # elements of each rank's part: in pieces of 4 (the last of 1)


def count_pairwise(monkeypatch) -> List[int]:
    """:func:`support.count_starts` of the pairwise reduce-scatter (every start)."""
    return count_starts(monkeypatch, pairwise.Pairwise, lambda steps: True)


@pytest.fixture
def forced(monkeypatch, world_size):
    """Every reduce-scatter of 16 bytes of input or more takes the path
    (through a table on groups of more than two ranks), in pieces of 4
    elements; the window's thresholds out of reach. Yields the started
    calls' sequence numbers."""
    if world_size == 1:
        pytest.skip("one rank exchanges nothing")
    monkeypatch.setattr(rule, "PAIRWISE_BYTES", 16)
    monkeypatch.setattr(rule, "PAIRWISE_BYTES_OPEN_MPI", 16)
    monkeypatch.setattr(rule, "SCATTER_SHM_BYTES", 1 << 62)
    monkeypatch.setattr(rule, "SCATTER_SHM_BYTES_OPEN_MPI", 1 << 62)
    monkeypatch.setattr(pairwise, "CHUNK", 32)  # 4 elements of 8 bytes, 8 of 4...
    yield count_pairwise(monkeypatch)


@pytest.fixture
def group(forced, world_size):
    for g in fresh_group():
        if world_size > 2:
            tuning.decide(g, "reduce_scatter", ([16], ["pairwise"]))
        yield g


def carried(op, dtype) -> bool:
    """The kernels' AVG divides real floats only: a complex AVG stays with MPI."""
    return not (op == "AVG" and np.dtype(dtype).kind == "c")


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_every_op_and_dtype_out_of_place(group, forced, op, dtype, async_op, rank, world_size):
    n = world_size
    shape = (n * K, 2)  # 2-d: the output is K x 2, and parts are K rows
    x = data(rank, dtype, shape)
    before = x.copy()
    out = np.zeros((K, 2), dtype)
    work = pycoll.reduce_scatter_tensor(out, x, op=rop(op), group=group, async_op=async_op)
    if async_op:
        assert work.wait() and work.result() == [out]
    want = reduce_all(op, [data(r, dtype, shape) for r in range(n)], n)
    assert_equal(out, want[rank * K : (rank + 1) * K])
    assert_equal(x, before)  # the input is read only, PREMUL_SUM's too
    assert len(forced) == carried(op, dtype)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_every_op_and_dtype_in_place(group, forced, op, dtype, async_op, rank, world_size):
    """torch's in-place form: the output is this rank's part of the input,
    reduced where it is; the other parts are left as they were."""
    n = world_size
    x = data(rank, dtype, (n * K,))
    before = x.copy()
    mine = slice(rank * K, (rank + 1) * K)
    work = pycoll.reduce_scatter_tensor(x[mine], x, op=rop(op), group=group, async_op=async_op)
    if async_op:
        assert work.wait()
    want = reduce_all(op, [data(r, dtype, (n * K,)) for r in range(n)], n)
    before[mine] = want[mine]
    assert_equal(x, before)
    assert len(forced) == carried(op, dtype)


def test_an_output_over_other_parts_receives_aside(group, forced, rank, world_size):
    """An output overlapping parts other than this rank's own (still to be
    sent) is received aside and copied in at the end: as if the input were
    read first."""
    n = world_size
    f32 = np.dtype(np.float32)
    x = data(rank, f32, (n * K,))
    original = x.copy()
    at = slice(K // 2, K // 2 + K)
    pycoll.reduce_scatter_tensor(x[at], x, group=group)
    total = reduce_all("SUM", [data(r, f32, (n * K,)) for r in range(n)], n)
    original[at] = total[rank * K : (rank + 1) * K]
    assert_equal(x, original)
    assert len(forced) == 1


@pytest.mark.parametrize("op,dtype", [p for p in PAIRS if p[1] in (np.float32, np.int64)], ids=str)
@pytest.mark.parametrize("where", ["apart", "mine", "another's"])
def test_the_list_form(group, forced, op, dtype, where, rank, world_size):
    """reduce_scatter(output, input_list): the output apart, the list's own
    entry for this rank (reduced in place), or another rank's (aside)."""
    check_reduce_scatter_list_form(group, op, dtype, where, K, rank, world_size)
    assert len(forced) == carried(op, dtype)


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 1000], ids=lambda c: f"{c}a rank")
def test_part_sizes_around_a_piece(group, forced, count, rank, world_size):
    """Parts of no element, of less than a piece, of exactly one, of one and a
    bit, of many pieces; the same call again on the same arrays."""
    n = world_size
    x = np.arange(n * count, dtype=np.float64) + rank
    out = np.full(count, -1.0)
    for _ in range(2):
        pycoll.reduce_scatter_tensor(out, x, group=group)
        want = (np.arange(n * count, dtype=np.float64) * n + n * (n - 1) / 2)[
            rank * count : (rank + 1) * count
        ]
        assert_equal(out, want)
    assert len(forced) == (2 if count * n * 8 >= 16 else 0)


def test_calls_in_flight_keep_their_messages_apart(group, forced, rank, world_size):
    """Three async calls on one group, waited for in opposite orders on
    different ranks: each call's later steps start when its Work is driven,
    so without a tag per call a step of one would match a step of another."""
    n, count = world_size, 37
    inputs = [np.arange(n * count, dtype=np.float64) * (k + 1) + rank for k in range(3)]
    outs = [np.zeros(count) for _ in range(3)]
    works = [
        pycoll.reduce_scatter_tensor(o, x, group=group, async_op=True) for o, x in zip(outs, inputs)
    ]
    for k in range(3) if rank % 2 == 0 else reversed(range(3)):
        assert works[k].wait() is True
    for k in range(3):
        full = np.arange(n * count, dtype=np.float64) * (k + 1) * n + n * (n - 1) / 2
        assert_equal(outs[k], full[rank * count : (rank + 1) * count])
    assert len(forced) == 3


def test_sync_and_async_calls_match(group, forced, rank, world_size):
    n = world_size
    x = np.arange(n * K, dtype=np.float32) + rank
    out = np.zeros(K, np.float32)
    if rank % 2:
        assert pycoll.reduce_scatter_tensor(out, x, group=group, async_op=True).wait() is True
    else:
        assert pycoll.reduce_scatter_tensor(out, x, group=group) is None
    want = (np.arange(n * K, dtype=np.float32) * n + n * (n - 1) / 2)[rank * K : (rank + 1) * K]
    assert_equal(out, want)


def test_detail_checks_it(group, forced, rank, world_size):
    with at_detail():
        x = np.full(world_size * K, rank + 1.0, np.float32)
        out = np.zeros(K, np.float32)
        pycoll.reduce_scatter_tensor(out, x, op=ReduceOp.AVG, group=group)
        assert_equal(out, np.full(K, (world_size + 1) / 2, np.float32))
    assert len(forced) == 1


def test_a_late_rank_is_named_by_the_timeout(forced, rank, world_size):
    g = pycoll.new_group(timeout=LATE_TIMEOUT)
    if world_size > 2:
        tuning.decide(g, "reduce_scatter", ([16], ["pairwise"]))
    x = np.ones(world_size * K, np.float64)
    out = np.zeros(K)
    last = world_size - 1
    late_rank_named(lambda: pycoll.reduce_scatter_tensor(out, x, group=g), "reduce_scatter_tensor",
                    rank, last)  # fmt: skip
    # (At DETAIL the check before the call is what times out: nothing starts.)
    assert len(forced) == (rank != last and debug.LEVEL < debug.DebugLevel.DETAIL)


def test_not_for_arrays_that_alias_device_memory(group, forced, monkeypatch, rank, world_size):
    """Under CUDA-aware MPI the host body gets arrays aliasing device memory
    (pycoll.gpu.collectives): no host kernel may touch them, so MPI's own
    call runs, for the reduce-scatter as for the all_reduce's ring."""
    from pycoll.collectives._common import device_aliases
    from support import count_rings

    rings = count_rings(monkeypatch)
    monkeypatch.setattr(rule, "RING_BYTES", 1)  # (MPICH's ring for MPI's own ops)
    n = world_size
    x = np.arange(n * K, dtype=np.float32) + rank
    out = np.zeros(K, np.float32)
    y = np.full(K, rank + 1.0, np.float32)
    with device_aliases(group):
        pycoll.reduce_scatter_tensor(out, x, group=group)
        pycoll.all_reduce(y, group=group)
    want = (np.arange(n * K, dtype=np.float32) * n + n * (n - 1) / 2)[rank * K : (rank + 1) * K]
    assert_equal(out, want)
    assert_equal(y, np.full(K, n * (n + 1) / 2, np.float32))
    assert forced == [] and rings == []
    pycoll.all_reduce(y, group=group)  # outside: the ring again
    assert len(rings) == (rule.ring_from() > 0)


def test_the_built_in_rule(monkeypatch, rank, world_size):
    """By default a group of two ranks takes the path from PAIRWISE_BYTES of
    input (PAIRWISE_BYTES_OPEN_MPI on Open MPI; one element less stays with
    MPI or the window), a larger group never by the rule; 0
    (PYCOLL_PAIRWISE_BYTES=0) turns it off."""
    started = count_pairwise(monkeypatch)
    g = pycoll.new_group()
    rule_only(monkeypatch, g)
    f32 = np.dtype(np.float32)
    least = rule.pairwise_from()
    vendor = reduce_mod._mpi.VENDOR
    assert least == (256 << 10 if vendor == "Open MPI" else 1 << 20)
    count = least // 4 // world_size
    for size in (count - 1, count):
        x = np.full(size * world_size, rank + 1.0, np.float32)
        out = np.zeros(size, np.float32)
        pycoll.reduce_scatter_tensor(out, x, group=g)
        assert_equal(out, np.full(size, world_size * (world_size + 1) / 2, np.float32))
    assert len(started) == (world_size == 2)
    func = "reduce_scatter_tensor"
    call = paths.Call(func, "SUM", f32, 1 << 40, world_size, plan(ReduceOp.SUM, f32, func))
    way = paths.choose(g, call).name
    assert way == ("pairwise" if world_size == 2 else "window" if world_size > 1 else "mpi")
    monkeypatch.setattr(rule, "PAIRWISE_BYTES", 0)
    monkeypatch.setattr(rule, "PAIRWISE_BYTES_OPEN_MPI", 0)
    assert paths.choose(g, call).name != "pairwise"
    pycoll.destroy_process_group(g)
