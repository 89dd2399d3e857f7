"""all_gather_into_tensor_coalesced and reduce_scatter_tensor_coalesced: a
list of arrays in one MPI operation (pycoll.collectives.coalesced)."""

from datetime import timedelta

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp
from pycoll.errors import CollectiveMismatchError, DistTimeoutError
from support import (
    ALL_DTYPES,
    assert_equal,
    at_detail,
    data,
    fresh_group,
    reduce_all,
    rop,
    settle,
    small_window,
    valid_pairs,
    window_chunk,
)

ASYNC = pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
PAIRS = valid_pairs()
# Uneven sizes, empty and 0-d arrays among them, so pieces start anywhere.
SHAPES = [(3,), (2, 2), (), (0,), (5,), (1, 3)]


def gathered(dtype, shape, n, salt):
    """What an output of the all-gather holds: every rank's input, rank by rank."""
    return np.concatenate([data(r, dtype, shape, salt).reshape(-1) for r in range(n)])


@ASYNC
def test_all_gather_every_dtype_in_one_call(async_op, rank, world_size):
    n = world_size
    cases = [(dt, SHAPES[i % len(SHAPES)]) for i, dt in enumerate(ALL_DTYPES)]
    ins = [data(rank, dt, s, salt=i) for i, (dt, s) in enumerate(cases)]
    before = [x.copy() for x in ins]
    outs = [np.zeros(n * x.size, x.dtype) for x in ins]
    seq = pycoll.group.WORLD.sequence_number()
    settle(pycoll.all_gather_into_tensor_coalesced(outs, ins, async_op=async_op), async_op)
    assert pycoll.group.WORLD.sequence_number() == seq + 1  # one operation for the list
    for i, ((dt, s), out) in enumerate(zip(cases, outs)):
        assert_equal(out, gathered(dt, s, n, i))
    for x, b in zip(ins, before):
        assert_equal(x, b)


@ASYNC
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_every_op_and_dtype(op, dtype, async_op, rank, world_size):
    n = world_size
    shapes = [(n * 2, 2), (n * 3,), (n,), (0,), (n * 5, 1)]
    ins = [data(rank, dtype, s, salt=i) for i, s in enumerate(shapes)]
    before = [x.copy() for x in ins]
    outs = [np.zeros((s[0] // n,) + s[1:], dtype) for s in shapes]
    seq = pycoll.group.WORLD.sequence_number()
    work = pycoll.reduce_scatter_tensor_coalesced(outs, ins, op=rop(op), async_op=async_op)
    settle(work, async_op)
    assert pycoll.group.WORLD.sequence_number() == seq + 1
    for i, (s, out) in enumerate(zip(shapes, outs)):
        total = reduce_all(op, [data(r, dtype, s, salt=i) for r in range(n)], n)
        part = s[0] // n
        assert_equal(out, total[rank * part : (rank + 1) * part])
    for x, b in zip(ins, before):  # the inputs are read only, PREMUL_SUM's too
        assert_equal(x, b)


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_in_place_forms(op, rank, world_size):
    """torch's in-place idioms: the input is this rank's part of the output
    (all-gather), the output this rank's part of the input (reduce-scatter)."""
    n = world_size
    outs = [np.zeros(n * k, np.float64) for k in (2, 3)]
    for k, out in zip((2, 3), outs):
        out[rank * k : (rank + 1) * k] = data(rank, np.dtype(np.float64), (k,))
    ins = [out[rank * k : (rank + 1) * k] for k, out in zip((2, 3), outs)]
    pycoll.all_gather_into_tensor_coalesced(outs, ins)
    for k, out in zip((2, 3), outs):
        assert_equal(out, gathered(np.dtype(np.float64), (k,), n, 0))
    xs = [data(rank, np.dtype(np.float32), (n * k,), salt=k) for k in (4, 1)]
    originals = [x.copy() for x in xs]
    mine = [x[rank * k : (rank + 1) * k] for k, x in zip((4, 1), xs)]
    pycoll.reduce_scatter_tensor_coalesced(mine, xs, op=getattr(ReduceOp, op))
    for k, x, original in zip((4, 1), xs, originals):
        total = reduce_all(op, [data(r, np.dtype(np.float32), (n * k,), k) for r in range(n)], n)
        part = slice(rank * k, (rank + 1) * k)
        assert_equal(x[part], total[part])
        original[part] = total[part]
        assert_equal(x, original)  # the other ranks' parts are left as they were


def test_many_arrays_and_kept_buffers(rank, world_size):
    """1,000 arrays, 1 MiB in all (the parallel copies, the group's kept
    buffers), then a shorter list and the first again: every call right,
    whatever buffer it was given."""
    n = world_size
    big = [np.full(n * (256 // n), rank * 1000 + i, np.float32) for i in range(1000)]
    small = [np.full(7 * n, rank * 10 - i, np.int64) for i in range(30)]

    def of(x, r):
        """Rank r's version of this rank's array x."""
        return x + (r - rank) * (1000 if x.dtype == np.float32 else 10)

    for xs in (big, small, big):
        outs = [np.empty(n * x.size, x.dtype) for x in xs]
        pycoll.all_gather_into_tensor_coalesced(outs, xs)
        for x, out in zip(xs, outs):
            assert_equal(out, np.concatenate([of(x, r) for r in range(n)]))
        parts = [np.empty(x.size // n, x.dtype) for x in xs]
        pycoll.reduce_scatter_tensor_coalesced(parts, xs)
        for x, part in zip(xs, parts):
            k = part.size
            total = sum(of(x, r) for r in range(n))
            assert_equal(part, total[rank * k : (rank + 1) * k])


def test_bad_lists_are_refused_before_anything_is_sent(unsent, world_size, rank):
    n = world_size
    ag, rs = pycoll.all_gather_into_tensor_coalesced, pycoll.reduce_scatter_tensor_coalesced
    with pytest.raises(ValueError, match=r"output_tensors has 1 arrays for 2 in input_tensors"):
        ag([np.zeros(n)], [np.zeros(1), np.zeros(1)])
    with pytest.raises(ValueError, match="input_tensors is empty"):
        rs([], [])
    with pytest.raises(TypeError, match="input_tensors must be a list"):
        ag([np.zeros(n)], np.zeros(1))
    with pytest.raises(
        ValueError,
        match=r"output_tensors\[1\] holds 3 elements but must hold "
        rf"{2 * n} \(input_tensors\[1\].size x group size\)",
    ):
        ag([np.zeros(n), np.zeros(3)], [np.zeros(1), np.zeros(2)])
    with pytest.raises(
        ValueError,
        match=r"output_tensors\[0\] has dtype int32 but input_tensors\[0\] has float64",
    ):
        ag([np.zeros(n, np.int32)], [np.zeros(1)])
    with pytest.raises(ValueError, match=r"output_tensors\[1\] is not C-contiguous"):
        ag([np.zeros(n), np.zeros(4 * n)[::2]], [np.zeros(1), np.zeros(2)])
    with pytest.raises(ValueError, match=r"output_tensors\[0\] is read-only"):
        frozen = np.zeros(n)
        frozen.flags.writeable = False
        ag([frozen], [np.zeros(1)])
    with pytest.raises(ValueError, match=r"different dtypes \(found float32, float64\)"):
        rs([np.zeros(1), np.zeros(1, np.float32)], [np.zeros(n), np.zeros(n, np.float32)])
    with pytest.raises(
        ValueError, match=rf"input_tensors\[0\] holds {n + 1} elements but must hold {n}"
    ):
        rs([np.zeros(1)], [np.zeros(n + 1)])
    with pytest.raises(TypeError, match=r"input_tensors\[1\]"):
        rs([np.zeros(1), np.zeros(1)], [np.zeros(n), "no array"])
    with pytest.raises(ValueError, match="ReduceOp.BAND is not defined for dtype float64"):
        rs([np.zeros(1)], [np.zeros(n)], op=ReduceOp.BAND)


def test_detail_names_the_lists_that_differ(pg, rank, world_size):
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    with at_detail():
        k = 3 if rank == world_size - 1 else 2
        ins = [np.zeros(k, np.float32), np.zeros(1, np.int8)]
        outs = [np.zeros(world_size * x.size, x.dtype) for x in ins]
        with pytest.raises(CollectiveMismatchError) as info:
            pycoll.all_gather_into_tensor_coalesced(outs, ins)
    msg = str(info.value)
    assert "all_gather_into_tensor_coalesced(inputs=[((3,), 'float32'), ((1,), 'int8')])" in msg
    assert "all_gather_into_tensor_coalesced(inputs=[((2,), 'float32'), ((1,), 'int8')])" in msg
    x = np.ones(1)
    pycoll.all_reduce(x)
    assert x[0] == world_size


def kept_plans(pg):
    kept = pg.attached("collectives.coalesced.kept")
    return [] if kept is None else kept.plans


@ASYNC
def test_a_list_given_again_is_kept_and_stays_right(pg, async_op, rank, world_size):
    """From its second call a list runs on the plan the group kept: the
    arrays' new contents every time, and a list that differs in one array
    is not taken for it (its checks run again, and refuse it)."""
    n = world_size
    ins = [np.zeros(k, np.float32) for k in (3, 1, 4)] + [np.zeros(2, np.int16)]
    outs = [np.zeros(n * x.size, x.dtype) for x in ins]
    parts = [np.zeros(x.size, x.dtype) for x in ins]
    wide = [np.zeros(n * x.size, x.dtype) for x in ins]
    lists = [[np.zeros(x.shape, x.dtype) for x in ins] for _ in range(n)]
    for step in range(4):
        for i, x in enumerate(ins):
            x[...] = rank + 10 * step + i
            wide[i][...] = np.arange(wide[i].size) + step
        ag = pycoll.all_gather_into_tensor_coalesced(outs, ins, async_op=async_op)
        co = pycoll.all_gather_coalesced(lists, ins, async_op=async_op)
        rs = pycoll.reduce_scatter_tensor_coalesced(
            parts[:3], wide[:3], op=ReduceOp.MAX, async_op=async_op
        )
        for work in (ag, co, rs):
            settle(work, async_op)
        for i, (x, out) in enumerate(zip(ins, outs)):
            want = np.concatenate([np.full(x.size, r + 10 * step + i, x.dtype) for r in range(n)])
            assert_equal(out, want)
            for r in range(n):
                assert_equal(lists[r][i], np.full(x.shape, r + 10 * step + i, x.dtype))
        for i in range(3):
            k = parts[i].size
            assert_equal(parts[i], (np.arange(rank * k, (rank + 1) * k) + step).astype(np.float32))
    funcs = {entry[0] for entry in kept_plans(pg)}
    assert funcs >= {
        "all_gather_into_tensor_coalesced",
        "all_gather_coalesced",
        "reduce_scatter_tensor_coalesced",
    }
    changed = outs[:1] + [np.zeros(n * 2, np.float32)] + outs[2:]  # one output replaced
    with pytest.raises(ValueError, match=r"output_tensors\[1\] holds"):
        pycoll.all_gather_into_tensor_coalesced(changed, ins)
    with pytest.raises(TypeError, match="async_op must be True or False"):
        pycoll.all_gather_into_tensor_coalesced(outs, ins, async_op=1)
    x = np.ones(1)
    pycoll.all_reduce(x)  # nothing was sent by the refused calls
    assert x[0] == n


def test_more_lists_than_the_group_keeps(pg, rank, world_size):
    """Lists taken in turn, more of them than KEPT: each right every time."""
    from pycoll.collectives import coalesced

    n = world_size
    lists = [
        [np.full(k + j, rank * 100 + j, np.int32) for k in range(1, 4)]
        for j in range(coalesced.KEPT + 2)
    ]
    outs = [[np.zeros(n * x.size, np.int32) for x in xs] for xs in lists]
    for _ in range(3):
        for j, (xs, os_) in enumerate(zip(lists, outs)):
            os_[0][...] = -1
            pycoll.all_gather_into_tensor_coalesced(os_, xs)
            for x, out in zip(xs, os_):
                assert_equal(out, np.repeat(np.arange(n, dtype=np.int32) * 100 + j, x.size))
    assert len(kept_plans(pg)) <= coalesced.KEPT


def test_detail_checks_a_kept_list(pg, rank, world_size):
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    mine = [np.zeros(2, np.float32), np.zeros(3, np.float64)]
    other = [np.zeros(3, np.float32), np.zeros(3, np.float64)]
    ins = other if rank == world_size - 1 else mine
    outs = [np.zeros(world_size * x.size, x.dtype) for x in ins]
    with at_detail():
        for _ in range(2):  # agreeing on the count of bytes would not do: shapes differ
            with pytest.raises(CollectiveMismatchError, match=r"\(3,\), 'float32'"):
                pycoll.all_gather_into_tensor_coalesced(outs, ins)
        assert any(entry[0] == "all_gather_into_tensor_coalesced" for entry in kept_plans(pg))
    x = np.ones(1)
    pycoll.all_reduce(x)
    assert x[0] == world_size


# -- through the node's shared window (pycoll.collectives.shm.Gathered) ---------------


@pytest.fixture
def shared(monkeypatch, world_size):
    """A group whose all-gathers of 16 bytes a rank or more take the window, in
    chunks of 32 bytes (so arrays span chunks and chunks hold many arrays)."""
    from pycoll.collectives import coalesced

    small_window(monkeypatch, world_size, 32, (coalesced, "SHM_FROM"))
    yield from fresh_group()


def through_window(g) -> bool:
    return window_chunk(g) == 32


@ASYNC
def test_every_dtype_through_the_window(shared, async_op, rank, world_size):
    n = world_size
    shapes = [(3,), (2, 5), (), (0,), (17,), (1, 3)]
    cases = [(dt, shapes[i % len(shapes)]) for i, dt in enumerate(ALL_DTYPES)]
    ins = [data(rank, dt, s, salt=i) for i, (dt, s) in enumerate(cases)]
    outs = [np.zeros(n * x.size, x.dtype) for x in ins]
    lists = [[np.zeros(x.shape, x.dtype) for x in ins] for _ in range(n)]
    for step in range(3):  # new, seen once, kept: each time the arrays' new contents
        for i, ((dt, s), x, out) in enumerate(zip(cases, ins, outs)):
            x[...] = data(rank, dt, s, salt=i + step)
            out[...] = 0
        w1 = pycoll.all_gather_into_tensor_coalesced(outs, ins, group=shared, async_op=async_op)
        w2 = pycoll.all_gather_coalesced(lists, ins, group=shared, async_op=async_op)
        settle(w1, async_op)
        settle(w2, async_op)
        for i, ((dt, s), out) in enumerate(zip(cases, outs)):
            assert_equal(out, gathered(dt, s, n, i + step))
            for r in range(n):
                assert_equal(lists[r][i], data(r, dt, s, salt=i + step))
    assert through_window(shared)


def test_window_calls_take_turns_with_the_window_all_reduce(shared, monkeypatch, rank, world_size):
    """Async all-gathers and an all_reduce through the same window, in flight
    together: each waits for the one before, on every rank alike."""
    from pycoll.paths import rule

    monkeypatch.setattr(rule, "SHM_BYTES", 16)
    n = world_size
    ins = [np.full(k, rank * 10 + k, np.int64) for k in (5, 1, 9)]
    outs = [np.zeros(n * x.size, np.int64) for x in ins]
    y = np.full(20, rank + 1.0)
    w1 = pycoll.all_gather_into_tensor_coalesced(outs, ins, group=shared, async_op=True)
    w2 = pycoll.all_reduce(y, group=shared, async_op=True)
    more = [np.zeros(n * x.size, np.int64) for x in ins]
    w3 = pycoll.all_gather_into_tensor_coalesced(more, ins, group=shared, async_op=True)
    assert w3.wait() and w2.wait() and w1.wait()
    for x, out, again in zip(ins, outs, more):
        want = np.repeat(np.arange(n, dtype=np.int64) * 10 + x.size, x.size)
        assert_equal(out, want)
        assert_equal(again, want)
    assert_equal(y, np.full(20, n * (n + 1) / 2))
    assert through_window(shared)


def test_detail_checks_calls_through_the_window(shared, rank, world_size):
    with at_detail():
        ins = [np.full(7, rank, np.float32), np.full(3, -rank, np.int8)]
        outs = [np.zeros(world_size * x.size, x.dtype) for x in ins]
        pycoll.all_gather_into_tensor_coalesced(outs, ins, group=shared)
        last = world_size - 1
        odd = [np.zeros(8 if rank == last else 7, np.float32), ins[1]]
        odd_outs = [np.zeros(world_size * x.size, x.dtype) for x in odd]
        with pytest.raises(CollectiveMismatchError, match=r"\(8,\), 'float32'"):
            pycoll.all_gather_into_tensor_coalesced(odd_outs, odd, group=shared)
    assert_equal(outs[0], np.repeat(np.arange(world_size, dtype=np.float32), 7))
    assert through_window(shared)


# -- reduce-scatter through the node's shared window (pycoll.collectives.shm.Blocks) --


@pytest.fixture
def scattering(monkeypatch, world_size):
    """A group whose coalesced reduce-scatters of 16 bytes a rank or more take
    the window, in chunks of 48 bytes of every rank's block (so parts span
    chunks and chunks hold many parts)."""
    from pycoll.collectives import coalesced

    small_window(monkeypatch, world_size, 48 * world_size, (coalesced, "SHM_SCATTER_FROM"))
    yield from fresh_group()


def scattered_through_window(g) -> bool:
    return window_chunk(g) == 48 * g.size()


@ASYNC
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_every_op_and_dtype_through_the_window(
    scattering, op, dtype, async_op, rank, world_size
):
    n = world_size
    shapes = [(n * 2, 2), (n * 13,), (n,), (0,), (n * 5, 1), (n * 7, 3)]
    ins = [data(rank, dtype, s, salt=i) for i, s in enumerate(shapes)]
    outs = [np.zeros((s[0] // n,) + s[1:], dtype) for s in shapes]
    got, kept = [], []  # every rank makes every call, then checks: none is left waiting
    for step in range(3):  # new, seen once, kept: each time the arrays' new contents
        for i, (s, x, out) in enumerate(zip(shapes, ins, outs)):
            x[...] = data(rank, dtype, s, salt=i + step)
            out[...] = 0
        before = [x.copy() for x in ins]
        work = pycoll.reduce_scatter_tensor_coalesced(
            outs, ins, op=rop(op), group=scattering, async_op=async_op
        )
        settle(work, async_op)
        got.append([out.copy() for out in outs])
        kept.append([(x.copy(), b) for x, b in zip(ins, before)])
    for step in range(3):
        for i, (s, out) in enumerate(zip(shapes, got[step])):
            total = reduce_all(op, [data(r, dtype, s, salt=i + step) for r in range(n)], n)
            part = s[0] // n
            assert_equal(out, total[rank * part : (rank + 1) * part])
        for after, b in kept[step]:  # the inputs are read only, PREMUL_SUM's too
            assert_equal(after, b)
    # AVG of complex divides each part apart: MPI's SUM, then a division
    assert scattered_through_window(scattering) == (not (op == "AVG" and dtype.kind == "c"))


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_in_place_reduce_scatter_through_the_window(scattering, op, rank, world_size):
    """Each output this rank's part of its input: chunk by chunk, what is
    copied out lands where no later chunk reads."""
    n = world_size
    f32 = np.dtype(np.float32)
    xs = [data(rank, f32, (n * k,), salt=k) for k in (20, 3, 9)]
    originals = [x.copy() for x in xs]
    mine = [x[rank * k : (rank + 1) * k] for k, x in zip((20, 3, 9), xs)]
    pycoll.reduce_scatter_tensor_coalesced(mine, xs, op=getattr(ReduceOp, op), group=scattering)
    for k, x, original in zip((20, 3, 9), xs, originals):
        total = reduce_all(op, [data(r, f32, (n * k,), k) for r in range(n)], n)
        part = slice(rank * k, (rank + 1) * k)
        assert_equal(x[part], total[part])
        original[part] = total[part]
        assert_equal(x, original)  # the other ranks' parts are left as they were
    assert scattered_through_window(scattering)


def test_functional_reduce_scatter_through_the_window(scattering, rank, world_size):
    """The functional form's results, views of one new buffer per call."""
    from pycoll import functional as F

    n = world_size
    i64 = np.dtype(np.int64)
    shapes = [(n * 11,), (n * 2, 3)]
    ins = [data(rank, i64, s, salt=i) for i, s in enumerate(shapes)]
    first = F.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], group=scattering)
    second = F.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], group=scattering)
    for results in (first, second):
        for i, (s, y) in enumerate(zip(shapes, results)):
            total = reduce_all("SUM", [data(r, i64, s, salt=i) for r in range(n)], n)
            part = s[0] // n
            assert_equal(np.asarray(F.wait_tensor(y)), total[rank * part : (rank + 1) * part])
    assert scattered_through_window(scattering)


def test_window_reduce_scatters_take_turns_with_the_other_window_calls(
    scattering, monkeypatch, rank, world_size
):
    """Async reduce-scatters, an all-gather and an all_reduce through the
    same window, in flight together: each waits for the one before, on every
    rank alike, and each is right."""
    from pycoll.collectives import coalesced
    from pycoll.paths import rule

    monkeypatch.setattr(coalesced, "SHM_FROM", 16)
    monkeypatch.setattr(rule, "SHM_BYTES", 16)
    n = world_size
    xs = [np.full(n * k, rank + k, np.int64) for k in (17, 1, 6)]
    parts = [np.zeros(k, np.int64) for k in (17, 1, 6)]
    gathered = [np.zeros(n * x.size, np.int64) for x in xs]
    y = np.full(40, rank + 1.0)
    again = [np.zeros(k, np.int64) for k in (17, 1, 6)]
    w1 = pycoll.reduce_scatter_tensor_coalesced(parts, xs, group=scattering, async_op=True)
    w2 = pycoll.all_gather_into_tensor_coalesced(gathered, xs, group=scattering, async_op=True)
    w3 = pycoll.all_reduce(y, group=scattering, async_op=True)
    w4 = pycoll.reduce_scatter_tensor_coalesced(again, xs, group=scattering, async_op=True)
    assert w4.wait() and w3.wait() and w2.wait() and w1.wait()
    ranks = n * (n - 1) // 2
    for k, x, part, other, out in zip((17, 1, 6), xs, parts, again, gathered):
        assert_equal(part, np.full(k, ranks + n * k, np.int64))
        assert_equal(other, np.full(k, ranks + n * k, np.int64))
        assert_equal(out, np.repeat(np.arange(n, dtype=np.int64) + k, x.size))
    assert_equal(y, np.full(40, n * (n + 1) / 2))
    assert scattered_through_window(scattering)


def test_detail_checks_reduce_scatters_through_the_window(scattering, rank, world_size):
    with at_detail():
        xs = [np.full(world_size * 7, rank, np.float32)]
        outs = [np.zeros(7, np.float32)]
        pycoll.reduce_scatter_tensor_coalesced(outs, xs, group=scattering)
        k = 8 if rank == world_size - 1 else 7
        odd = [np.zeros(world_size * k, np.float32)]
        with pytest.raises(CollectiveMismatchError, match=rf"\({world_size * 8},\), 'float32'"):
            pycoll.reduce_scatter_tensor_coalesced([np.zeros(k, np.float32)], odd, group=scattering)
    assert_equal(outs[0], np.full(7, world_size * (world_size - 1) / 2, np.float32))
    assert scattered_through_window(scattering)


def test_a_late_rank_is_named_in_a_window_reduce_scatter(monkeypatch, rank, world_size):
    if world_size == 1:
        pytest.skip("needs a rank to be late")
    from pycoll.collectives import coalesced

    monkeypatch.setattr(coalesced, "SHM_SCATTER_FROM", 16)
    g = pycoll.new_group(timeout=timedelta(seconds=3))
    xs = [np.ones(world_size * 10, np.float64)]
    outs = [np.zeros(10, np.float64)]
    pycoll.reduce_scatter_tensor_coalesced(outs, xs, group=g)  # every rank: the window is made
    assert g.attached("shm.window")
    last = world_size - 1
    if rank != last:
        with pytest.raises(DistTimeoutError) as exc:
            pycoll.reduce_scatter_tensor_coalesced(outs, xs, group=g)
        assert f"rank {last}: has not reached it" in str(exc.value), str(exc.value)
    pycoll.barrier()
    pycoll.destroy_process_group(g)


def test_outputs_overlapping_the_inputs_otherwise_through_the_window(scattering, rank, world_size):
    """Each output is a part of the next input, which later chunks still
    read: the window path receives aside and copies out at the end, so the
    result is as if the inputs were read first."""
    n, k = world_size, 20
    f64 = np.dtype(np.float64)
    xs = [data(rank, f64, (n * k,), salt=i) for i in range(3)]
    originals = [x.copy() for x in xs]
    there = (rank + 1) % n
    outs = [xs[(i + 1) % 3][there * k : (there + 1) * k] for i in range(3)]
    pycoll.reduce_scatter_tensor_coalesced(outs, xs, group=scattering)
    for i in range(3):
        total = reduce_all("SUM", [data(r, f64, (n * k,), i) for r in range(n)], n)
        originals[(i + 1) % 3][there * k : (there + 1) * k] = total[rank * k : (rank + 1) * k]
    for x, original in zip(xs, originals):
        assert_equal(x, original)
    assert scattered_through_window(scattering)


def test_no_window_at_all_with_pycoll_shm_bytes_0(monkeypatch, rank, world_size):
    """PYCOLL_SHM_BYTES=0 (read at import: set here as it leaves it) makes no
    shared window, so the coalesced calls that would take one from their
    thresholds take their packed paths, and are right."""
    if world_size == 1:
        pytest.skip("one rank makes no window anyway")
    from pycoll.collectives import coalesced, shm

    monkeypatch.setattr(shm, "SHM_SET", 0)
    monkeypatch.setattr(coalesced, "SHM_FROM", 16)
    monkeypatch.setattr(coalesced, "SHM_SCATTER_FROM", 16)
    g = pycoll.new_group()
    n = world_size
    xs = [np.full(n * k, rank + k, np.int64) for k in (17, 3)]
    gathered = [np.zeros(n * x.size, np.int64) for x in xs]
    parts = [np.zeros(k, np.int64) for k in (17, 3)]
    pycoll.all_gather_into_tensor_coalesced(gathered, xs, group=g)
    pycoll.reduce_scatter_tensor_coalesced(parts, xs, group=g)
    for k, x, out, part in zip((17, 3), xs, gathered, parts):
        assert_equal(out, np.repeat(np.arange(n, dtype=np.int64) + k, x.size))
        assert_equal(part, np.full(k, n * (n - 1) // 2 + n * k, np.int64))
    assert g.attached("shm.window") is None
    pycoll.destroy_process_group(g)
