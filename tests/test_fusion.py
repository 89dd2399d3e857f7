"""FusedAllReduce: the same answers as one all_reduce per array, on every rank."""

import numpy as np
import pytest

import pycoll
from pycoll import FusedAllReduce, ReduceOp
from support import (
    BF16,
    assert_equal,
    data,
    fresh_group,
    reduce_all,
    rop,
    small_window,
    valid_pairs,
    window_chunk,
)

SHAPES = [(3,), (2, 5), (1,), (4, 4, 2), (7,)]
OPS = [
    ("SUM", np.dtype(np.float32)),
    ("AVG", np.dtype(np.float16)),
    ("MAX", BF16),
    ("PREMUL_SUM", np.dtype(np.float64)),
    ("BXOR", np.dtype(np.int16)),
    ("PRODUCT", np.dtype(np.complex64)),
]


def arrays(rank, dtype, salt=0):
    return [data(rank, dtype, shape, salt=salt + i) for i, shape in enumerate(SHAPES)]


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", OPS, ids=str)
def test_fused_equals_unfused(op, dtype, async_op, rank, world_size):
    fused_arrays = arrays(rank, dtype)
    separate = arrays(rank, dtype)
    fused = FusedAllReduce(fused_arrays, op=rop(op))
    assert len(fused) == len(SHAPES)
    assert fused.nbytes == sum(a.nbytes for a in fused_arrays)
    for step in range(3):  # the buffer is reused step after step
        for i, (f, s) in enumerate(zip(fused_arrays, separate)):
            f[...] = s[...] = data(rank, dtype, f.shape, salt=10 * step + i)
        work = fused.all_reduce(async_op=async_op)
        if async_op:
            assert work.wait() is True
        else:
            assert work is None
        for s in separate:
            pycoll.all_reduce(s, op=rop(op))
        for i, (f, s) in enumerate(zip(fused_arrays, separate)):
            assert_equal(f, s)
            everyone = [data(r, dtype, f.shape, salt=10 * step + i) for r in range(world_size)]
            assert_equal(f, reduce_all(op, everyone, world_size))


def test_a_second_call_before_the_first_is_waited_on_is_refused(rank, world_size):
    fused = FusedAllReduce([np.full(4, rank + 1.0, np.float32)])
    work = fused.all_reduce(async_op=True)
    with pytest.raises(RuntimeError, match="still in flight"):
        fused.all_reduce()  # refused on every rank, before anything is sent
    assert work.wait() is True
    total = world_size * (world_size + 1) / 2
    assert (fused.arrays[0] == total).all()
    fused.all_reduce()  # fine once the first is done
    assert (fused.arrays[0] == total * world_size).all()


def test_a_thousand_small_arrays(rank, world_size):
    grads = [np.full(256, rank + i, np.float32) for i in range(1000)]
    FusedAllReduce(grads).all_reduce()
    base = world_size * (world_size - 1) // 2
    for i, g in enumerate(grads):
        assert (g == base + world_size * i).all(), i


@pytest.mark.parametrize(
    "tensors,op,message",
    [
        ([], ReduceOp.SUM, "tensors is empty"),
        ([np.ones(2), np.ones(2, np.float32)], ReduceOp.SUM, "different dtypes"),
        ([np.ones(4)[::2]], ReduceOp.SUM, "not C-contiguous"),
        ([np.ones(2)], ReduceOp.BAND, "bitwise ops apply to integers"),
        ([np.ones(2, np.int32)], ReduceOp.AVG, "cast to a floating dtype"),
        ("not a list", ReduceOp.SUM, "must be a list"),
    ],
)
def test_bad_arrays_are_refused_when_built(pg, tensors, op, message):
    seq = pg.sequence_number()
    with pytest.raises((ValueError, TypeError), match=message):
        FusedAllReduce(tensors, op=op)
    assert pg.sequence_number() == seq  # nothing was sent


def test_a_rank_outside_the_group_does_nothing(rank, world_size):
    if world_size < 2:
        pytest.skip("needs a rank outside the group")
    group = pycoll.new_group([0])
    x = np.full(3, float(rank))
    if rank == 0:
        FusedAllReduce([x], group=group).all_reduce()
        assert (x == 0).all()
    else:
        with pytest.warns(UserWarning, match="does not belong to"):
            fused = FusedAllReduce([x], group=group)
        assert fused.all_reduce() is None
        assert (x == rank).all()
    if rank == 0:
        pycoll.destroy_process_group(group)


@pytest.mark.parametrize("op,dtype", [("SUM", np.dtype(np.float32)), ("AVG", BF16)], ids=str)
def test_views_into_the_buffer(op, dtype, rank, world_size):
    """FusedAllReduce.empty: the arrays are the buffer, and answers are the same."""
    fused = FusedAllReduce.empty(SHAPES, dtype, op=rop(op))
    arrays = fused.arrays
    assert [a.shape for a in arrays] == SHAPES
    assert all(np.shares_memory(a, fused.buffer) for a in arrays)
    for step in range(2):
        for i, a in enumerate(arrays):
            a[...] = data(rank, dtype, a.shape, salt=10 * step + i)
        fused.all_reduce()
        for i, a in enumerate(arrays):
            everyone = [data(r, dtype, a.shape, salt=10 * step + i) for r in range(world_size)]
            assert_equal(a, reduce_all(op, everyone, world_size))


def test_views_of_one_buffer_out_of_order_are_packed(rank, world_size):
    """Slices of one array, but not in buffer order: reduced correctly, through
    a fusion buffer of its own."""
    flat = np.arange(12, dtype=np.float64) + rank
    parts = [flat[8:], flat[:4], flat[4:8]]
    fused = FusedAllReduce(parts)
    assert not np.shares_memory(fused.buffer, flat)
    fused.all_reduce()
    base = np.arange(12, dtype=np.float64) * world_size + world_size * (world_size - 1) / 2
    np.testing.assert_array_equal(flat, base)


# -- through the node's shared window (pycoll.collectives.shm.Scattered) ------------

# Arrays of 0-40 elements: with 32-byte chunks, most span chunks and ranks' slices.
WINDOW_SHAPES = [(5, 7), (0,), (1,), (13,), (2, 0, 3), (40,), (3, 3)]


@pytest.fixture
def shared(monkeypatch, world_size):
    """A group whose FusedAllReduce calls of 16 bytes or more go through the
    shared window, in chunks of 32 bytes."""
    from pycoll import fusion

    small_window(monkeypatch, world_size, 32, (fusion, "SHM_BYTES"))
    yield from fresh_group()


def through_window(g) -> bool:
    return window_chunk(g) == 32


def window_arrays(rank, dtype, salt=0):
    return [data(rank, dtype, shape, salt=salt + i) for i, shape in enumerate(WINDOW_SHAPES)]


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", valid_pairs(), ids=str)
def test_through_the_window_every_op_and_dtype(shared, op, dtype, async_op, rank, world_size):
    mine = window_arrays(rank, dtype)
    fused = FusedAllReduce(mine, op=rop(op), group=shared)
    for step in range(2):  # the second call reuses the copy tables
        for i, a in enumerate(mine):
            a[...] = data(rank, dtype, a.shape, salt=10 * step + i)
        work = fused.all_reduce(async_op=async_op)
        if async_op:
            assert work.wait() is True
        for i, a in enumerate(mine):
            everyone = [data(r, dtype, a.shape, salt=10 * step + i) for r in range(world_size)]
            assert_equal(a, reduce_all(op, everyone, world_size))
    # AVG of complex divides each part apart: the packed buffer through MPI
    assert through_window(shared) == (not (op == "AVG" and dtype.kind == "c"))


def test_through_the_window_takes_turns_with_other_calls(shared, monkeypatch, rank, world_size):
    """An async fused call, then a plain all_reduce through the same window:
    the second finishes the first before using it; both are right."""
    from pycoll.paths import rule

    monkeypatch.setattr(rule, "SHM_BYTES", 16)
    mine = [np.full(n, rank + 1.0) for n in (3, 9, 1)]
    fused = FusedAllReduce(mine, group=shared)
    work = fused.all_reduce(async_op=True)
    x = np.full(20, 10.0 * (rank + 1))
    pycoll.all_reduce(x, group=shared)
    assert work.wait() is True
    total = world_size * (world_size + 1) / 2
    for a in mine:
        assert_equal(a, np.full(a.shape, total))
    assert_equal(x, np.full(20, 10.0 * total))
    assert through_window(shared)


def test_coalesced_lists_seen_before_go_through_the_window(shared, rank, world_size):
    tensors = [np.full(n, rank + 1, np.int64) for n in (4, 1, 7, 2, 5, 3, 6, 8)]
    total = world_size * (world_size + 1) // 2
    for step in range(3):  # a FusedAllReduce is kept from the second call
        pycoll.all_reduce_coalesced(tensors, group=shared)
        for t in tensors:
            assert_equal(t, np.full(t.shape, total * world_size**step, np.int64))
    assert through_window(shared)


def test_detail_checks_calls_through_the_window(shared, rank, world_size):
    before = pycoll.get_debug_level()
    pycoll.set_debug_level(pycoll.DebugLevel.DETAIL)
    try:
        mine = [np.full(n, rank + 1.0, np.float32) for n in (5, 11)]
        FusedAllReduce(mine, op=ReduceOp.AVG, group=shared).all_reduce()
    finally:
        pycoll.set_debug_level(before)
    for a in mine:
        assert_equal(a, np.full(a.shape, (world_size + 1) / 2, np.float32))
    assert through_window(shared)


def test_views_into_the_buffer_keep_mpis_call(shared, rank, world_size):
    """Nothing to pack: one all_reduce of the buffer, not the window."""
    fused = FusedAllReduce.empty([(8,), (9,)], np.float64, group=shared)
    for a in fused.arrays:
        a[...] = rank
    fused.all_reduce()
    for a in fused.arrays:
        assert_equal(a, np.full(a.shape, float(sum(range(world_size)))))
    assert shared.attached("shm.window") is None


def test_crowded_ranks_take_the_window_from_a_larger_size(shared, monkeypatch, rank, world_size):
    """Whether ranks outnumber the cores they may run on together is agreed
    when the window is made (each rank's affinity may differ), so every rank
    takes the same path."""
    from pycoll import fusion
    from pycoll.kernels import threads

    monkeypatch.setattr(fusion, "SHM_BYTES_CROWDED", 1 << 40)
    mine = [np.full(10, rank + 1.0) for _ in range(3)]  # 240 bytes
    fused = FusedAllReduce(mine, group=shared)
    fused.all_reduce()
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, threads.cpus())
    crowded = world_size > len(frozenset().union(*everyone))
    assert shared.attached("shm.window").crowded == crowded
    assert (fused._scattered is not None) == (not crowded)
    for a in mine:
        assert_equal(a, np.full(10, world_size * (world_size + 1) / 2))
