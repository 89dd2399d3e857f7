"""pycoll.native: synchronous fast calls made from compiled code.

Each test makes its own group with the compiled path attached from its first
call (PYCOLL_NATIVE=1's effect) and makes its calls several times on the same
arrays: the first call on an array takes the plain path, the second keeps the
call and makes it compiled, and the rest are made compiled. Every result is
checked against numpy on every rank, and a count of the plain path's calls
says which path ran. The fault tests (a mismatch, a late rank, a second
thread) show the compiled path keeps what the plain path promises."""

from __future__ import annotations

import gc
import threading
import warnings
import weakref
from datetime import timedelta
from typing import Dict, List

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import pycoll
from pycoll import CollectiveMismatchError, _mpi, crosscheck, native, persistent, watch
from pycoll.arrays import mpi_datatype
from pycoll.collectives import _common, alltoall, barrier, gather, pair, reduce, scatter
from pycoll.errors import DistTimeoutError
from pycoll.kernels import words
from pycoll.progress import BUSY
from pycoll.trace import recorder
from support import BF16, record_arg

CALLS = 4  # plain, kept (compiled), compiled, compiled


@pytest.fixture(autouse=True)
def no_plans(pg):
    """Groups made here have no persistent plans (the suite may run with
    PYCOLL_PERSISTENT=1, read at init: hence ``pg`` first), but where a test
    asks for them (``planned``)."""
    with persistent.forced(False):
        yield


@pytest.fixture(autouse=True)
def no_exchange(monkeypatch):
    """Small all_reduce and reduce on two ranks are MPI's calls here, whose
    compiled form these tests count and bound, not the exchange that
    pycoll.collectives.pair makes where its rule says (by default on Open
    MPI): tests/collectives/test_pair.py keeps the exchange's calls."""
    monkeypatch.setattr(pair, "applies", lambda func, ranks, nbytes: False)


@pytest.fixture
def group(pg, debug_off):
    """A new group of every rank on the compiled path (DETAIL off: DETAIL's
    calls take the checked path)."""
    g = pycoll.new_group()
    native.attach(g)
    assert g._native is not None, "the compiled path did not load"
    pycoll.barrier(group=g)  # the group's first call makes this thread its owner
    yield g
    try:
        pycoll.destroy_process_group(g)
    except CollectiveMismatchError:
        pass  # (test_a_mismatch_on_the_compiled_path_is_found has checked it)
    assert g._native is None  # dropped with the group's progress record


@pytest.fixture
def plain_calls(monkeypatch) -> Dict[str, int]:
    """How many calls each collective made through the plain (Python) path."""
    counts: Dict[str, int] = {}
    real = _common.plain

    def counting(pg, op, *args):
        counts[op] = counts.get(op, 0) + 1
        return real(pg, op, *args)

    for module in (reduce, scatter, gather, alltoall, barrier):
        monkeypatch.setattr(module, "plain", counting)
    return counts


@pytest.fixture
def lean_calls(monkeypatch) -> Dict[str, int]:
    """How many calls each collective made through the Python path's
    _common.lean (its calls with ``async_op=True``)."""
    counts: Dict[str, int] = {}
    real = _common.lean

    def counting(pg, op, *args):
        counts[op] = counts.get(op, 0) + 1
        return real(pg, op, *args)

    for module in (_common, reduce):
        monkeypatch.setattr(module, "lean", counting)
    return counts


@pytest.fixture
def kept(monkeypatch) -> List[str]:
    """The collective of each call the group kept (pycoll.native._keep)."""
    return record_arg(monkeypatch, native, "_keep", 2)


@pytest.fixture
def keeps(monkeypatch) -> List[str]:
    """The collective of each call that reached native.call (to be kept): a
    call found again never does, nor one whose array native.again saw for
    the first time (but for the in-place reduce-scatter's input, which
    native.call itself finds first seen)."""
    return record_arg(monkeypatch, native, "call", 1)


DTYPES = [np.float32, np.float64, np.int64, np.uint8, np.complex128, np.float16, BF16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_all_reduce(group, plain_calls, rank, world_size, dtype):
    x = np.zeros((2, 3), dtype)
    for i in range(CALLS):
        x[...] = np.arange(6).reshape(2, 3) + rank + i
        pycoll.all_reduce(x, group=group)
        want = sum(np.arange(6).reshape(2, 3) + r + i for r in range(world_size))
        assert_array_equal(x, want.astype(dtype))
    assert plain_calls == {"all_reduce": 1}


@pytest.mark.parametrize("op", ["MAX", "MIN", "PRODUCT"])
def test_all_reduce_with_other_ops_on_the_same_array(group, plain_calls, rank, world_size, op):
    """A kept call is the call with its op: SUM then another op on one array
    are two calls, each made compiled (the one kept in turn)."""
    x = np.zeros(4, np.int32)
    for i in range(CALLS):
        for name in ("SUM", op):
            x[...] = rank + 1 + i
            pycoll.all_reduce(x, op=getattr(pycoll.ReduceOp, name), group=group)
            values = [r + 1 + i for r in range(world_size)]
            want = {"SUM": sum, "MAX": max, "MIN": min, "PRODUCT": np.prod}[name](values)
            assert_array_equal(x, np.full(4, want, np.int32))
    assert plain_calls == {"all_reduce": 1}


def test_broadcast_from_every_root(group, plain_calls, rank, world_size):
    x = np.zeros(3, np.int32)
    for i in range(CALLS):
        for root in range(world_size):
            x[...] = 100 * root + i if rank == root else -1
            pycoll.broadcast(x, src=root, group=group)
            assert_array_equal(x, np.full(3, 100 * root + i, np.int32))
    assert plain_calls == {"broadcast": 1}


def test_reduce_to_every_root(group, plain_calls, rank, world_size):
    x = np.zeros(5, np.float64)
    for i in range(CALLS):
        for root in range(world_size):
            x[...] = rank + i
            pycoll.reduce(x, dst=root, group=group)
            want = sum(r + i for r in range(world_size)) if rank == root else rank + i
            assert_array_equal(x, np.full(5, want, np.float64))
    assert plain_calls == {"reduce": 1}


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_all_gather_into_tensor(group, plain_calls, rank, world_size, in_place):
    out = np.zeros(3 * world_size, np.float32)
    mine = np.zeros(3, np.float32)
    for i in range(CALLS):
        out[...] = -1
        values = np.arange(3, dtype=np.float32) + 10 * rank + i
        if in_place:
            out[3 * rank : 3 * rank + 3] = values
            inp = out[3 * rank : 3 * rank + 3]  # a new view each call, as torch users make it
        else:
            mine[...] = values
            inp = mine
        pycoll.all_gather_into_tensor(out, inp, group=group)
        want = np.concatenate([np.arange(3) + 10 * r + i for r in range(world_size)])
        assert_array_equal(out, want.astype(np.float32))
    assert plain_calls == {"all_gather_into_tensor": 1}


def test_an_in_place_gather_is_known_by_its_place(group, plain_calls, keeps, rank,
                                                  world_size):  # fmt: skip
    """The in-place all-gather's input is a new view each call, found by its
    address and size: a view of this rank's part is the kept call; a view of
    another part, or a part too short, is not (the first is gathered as an
    input apart, the second refused on every rank)."""
    k = 3
    out = np.zeros(k * world_size, np.float32)
    for i in range(CALLS):
        out[k * rank : k * rank + k] = rank + i
        pycoll.all_gather_into_tensor(out, out[k * rank : k * rank + k], group=group)
        assert_array_equal(out, np.repeat(np.arange(world_size, dtype=np.float32) + i, k))
    assert plain_calls == {"all_gather_into_tensor": 1}
    # Kept on its second call (a first sighting is not offered to native.call),
    # then found by the view's place.
    assert len(keeps) == 1
    other = (rank + 1) % world_size  # (rank 0's own part where there is one rank)
    out[...] = -1
    out[k * other : k * other + k] = 100 + rank
    pycoll.all_gather_into_tensor(out, out[k * other : k * other + k], group=group)
    assert_array_equal(out, np.repeat(np.arange(world_size, dtype=np.float32) + 100, k))
    with pytest.raises(ValueError, match="output_tensor"):
        pycoll.all_gather_into_tensor(out, out[k * rank : k * rank + k - 1], group=group)


def test_a_view_given_again_is_known_by_its_object(group, plain_calls, keeps, rank, world_size):
    """A program that keeps its in-place view and passes the same object each
    call has the call found without reading the view's address again (the
    view is held, so its address cannot change); another view object, of
    another part, is still the call of its own place, and the first one
    given again is the kept call again."""
    mpi_datatype(np.dtype(np.float32))  # (the table a first call fills, before counting)
    k = 3
    out = np.zeros(k * world_size, np.float32)
    mine = out[k * rank : k * rank + k]
    other = (rank + 1) % world_size
    theirs = out[k * other : k * other + k]
    for i in range(CALLS):
        mine[...] = rank + i
        pycoll.all_gather_into_tensor(out, mine, group=group)
        assert_array_equal(out, np.repeat(np.arange(world_size, dtype=np.float32) + i, k))
    assert plain_calls == {"all_gather_into_tensor": 1}
    out[...] = -1
    theirs[...] = 100 + rank
    pycoll.all_gather_into_tensor(out, theirs, group=group)
    assert_array_equal(out, np.repeat(np.arange(world_size, dtype=np.float32) + 100, k))
    mine[...] = rank + 7
    pycoll.all_gather_into_tensor(out, mine, group=group)
    assert_array_equal(out, np.repeat(np.arange(world_size, dtype=np.float32) + 7, k))
    inp = np.zeros(k * world_size, np.int64)
    part = inp[k * rank : k * rank + k]
    for i in range(CALLS):
        inp[...] = np.arange(k * world_size) + rank + i
        pycoll.reduce_scatter_tensor(part, inp, group=group)
        total = sum(np.arange(k * world_size) + r + i for r in range(world_size))
        assert_array_equal(part, total[k * rank : k * rank + k])
    gathers = 1 if world_size == 1 else 2  # (another part: its own call, plain)
    assert plain_calls == {"all_gather_into_tensor": gathers, "reduce_scatter_tensor": 1}


def test_one_output_from_two_inputs(group, plain_calls, rank, world_size):
    """A kept call is the call with its buffers: one output array gathered
    from two input arrays in turn is two calls."""
    out = np.zeros(2 * world_size, np.int32)
    inputs = [np.full(2, rank, np.int32), np.full(2, 10 + rank, np.int32)]
    for _ in range(CALLS):
        for k, inp in enumerate(inputs):
            pycoll.all_gather_into_tensor(out, inp, group=group)
            assert_array_equal(out, np.repeat(np.arange(world_size) + 10 * k, 2))
    assert plain_calls == {"all_gather_into_tensor": 1}  # (then each kept in turn)


def test_reduce_scatter_tensor(group, plain_calls, rank, world_size):
    out = np.zeros(2, np.int64)
    inp = np.zeros(2 * world_size, np.int64)
    for i in range(CALLS):
        inp[...] = np.arange(2 * world_size) * (rank + 1) + i
        pycoll.reduce_scatter_tensor(out, inp, group=group)
        total = sum(np.arange(2 * world_size) * (r + 1) + i for r in range(world_size))
        assert_array_equal(out, total[2 * rank : 2 * rank + 2])
    assert plain_calls == {"reduce_scatter_tensor": 1}


def test_reduce_scatter_tensor_in_place(group, plain_calls, keeps, rank, world_size):
    """torch's in-place form, the output a new view of this rank's part of the
    input each call: kept on the input, receiving beside it and copied into
    place; a view of another part is another call, a part too short is
    refused on every rank, as is a view made read-only."""
    k = 2
    inp = np.zeros(k * world_size, np.int64)

    def values(r: int, i: int) -> np.ndarray:
        return np.arange(k * world_size) * (r + 1) + i

    for i in range(CALLS):
        inp[...] = values(rank, i)
        pycoll.reduce_scatter_tensor(inp[k * rank : k * rank + k], inp, group=group)
        total = sum(values(r, i) for r in range(world_size))
        want = values(rank, i)
        want[k * rank : k * rank + k] = total[k * rank : k * rank + k]  # the rest as it was
        assert_array_equal(inp, want)
    assert plain_calls == {"reduce_scatter_tensor": 1}
    assert len(keeps) == 2  # seen, kept: then found by the output's place
    other = (rank + 1) % world_size
    inp[...] = values(rank, 9)
    pycoll.reduce_scatter_tensor(inp[k * other : k * other + k], inp, group=group)
    want = values(rank, 9)
    want[k * other : k * other + k] = sum(values(r, 9) for r in range(world_size))[
        k * rank : k * rank + k
    ]
    assert_array_equal(inp, want)
    with pytest.raises(ValueError, match="input holds"):
        pycoll.reduce_scatter_tensor(inp[k * rank : k * rank + k - 1], inp, group=group)
    mine = inp[k * rank : k * rank + k]
    mine.flags.writeable = False
    with pytest.raises(ValueError, match="output is read-only"):
        pycoll.reduce_scatter_tensor(mine, inp, group=group)


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_reduce_scatter_tensor_of_large_parts(group, plain_calls, rank, world_size, in_place):
    """Parts of 32 KiB and more go through MPI's v-form with equal counts on
    MPICH (pycoll._mpi.reduce_scatter_v): kept as that call, counts held."""
    k = _mpi.PAIRWISE_PART_BYTES // 8
    inp = np.zeros(k * world_size, np.float64)
    out = None if in_place else np.zeros(k, np.float64)

    def values(r: int, i: int) -> np.ndarray:
        return np.arange(k * world_size, dtype=np.float64) * (r + 1) + i

    for i in range(CALLS):
        inp[...] = values(rank, i)
        mine = inp[k * rank : k * rank + k] if in_place else out
        pycoll.reduce_scatter_tensor(mine, inp, group=group)
        total = sum(values(r, i) for r in range(world_size))[k * rank : k * rank + k]
        assert_array_equal(mine, total)
        if in_place:  # (the rest of the input as it was)
            rest = np.delete(inp, np.s_[k * rank : k * rank + k])
            assert_array_equal(rest, np.delete(values(rank, i), np.s_[k * rank : k * rank + k]))
    assert plain_calls == {"reduce_scatter_tensor": 1}
    known = group._native.calls[id(inp if in_place else out)]
    v = _mpi.reduce_scatter_v(k * 8)
    assert known[native._WORDS][0][words.WHAT] == (
        native.REDUCE_SCATTER_V if v else native.REDUCE_SCATTER
    )


def test_reduce_scatter_between_views_of_one_buffer(group, plain_calls, keeps, rank,
                                                    world_size):  # fmt: skip
    """Input and output views of one flat buffer that do not overlap (as a
    sharded model's flat parameters make them) are two arrays: kept once."""
    k = 3
    flat = np.zeros(k * world_size + k, np.float32)
    inp, out = flat[: k * world_size], flat[k * world_size :]
    for i in range(CALLS):
        inp[...] = np.arange(k * world_size) + rank + i
        pycoll.reduce_scatter_tensor(out, inp, group=group)
        total = sum(np.arange(k * world_size) + r + i for r in range(world_size))
        assert_array_equal(out, total[k * rank : k * rank + k])
    assert plain_calls == {"reduce_scatter_tensor": 1}
    assert len(keeps) == 1  # kept on its second call: then found by the output view


def test_calls_waited_for_in_python_are_finished(group, plain_calls, rank, world_size):
    """With no tests in the compiled code every call's wait goes on in Python:
    the results are the same, the in-place reduce-scatter's copy made."""
    group._native.st[native._starts.SPINS] = 0
    k = 3
    x = np.zeros(4, np.float64)
    inp = np.zeros(k * world_size, np.float32)
    for i in range(CALLS):
        x[...] = rank + i
        pycoll.all_reduce(x, group=group)
        assert_array_equal(x, np.full(4, sum(r + i for r in range(world_size)), np.float64))
        inp[...] = rank + i
        pycoll.reduce_scatter_tensor(inp[k * rank : k * rank + k], inp, group=group)
        want = np.full(k * world_size, rank + i, np.float32)
        want[k * rank : k * rank + k] = sum(r + i for r in range(world_size))
        assert_array_equal(inp, want)
    assert plain_calls == {"all_reduce": 1, "reduce_scatter_tensor": 1}


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_all_to_all_single(group, plain_calls, rank, world_size, in_place):
    out = np.zeros(2 * world_size, np.float64)
    inp = out if in_place else np.zeros(2 * world_size, np.float64)
    for i in range(CALLS):
        inp[...] = np.arange(2 * world_size) + 100 * rank + i
        pycoll.all_to_all_single(out, inp, group=group)
        want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r + i
                               for r in range(world_size)])  # fmt: skip
        assert_array_equal(out, want)
    assert plain_calls == {"all_to_all_single": 1}


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_all_to_all_single_of_large_parts(group, plain_calls, rank, world_size, in_place):
    """From alltoall.PARTS_FROM bytes MPI's v-form, this rank's own part
    left out (copied by the compiled call, or, in place, sent from a copy
    of the other parts alone)."""
    n = world_size
    count = alltoall.PARTS_FROM // 8 // n + 5  # float64 elements a part
    out = np.zeros(count * n, np.float64)
    inp = out if in_place else np.zeros(count * n, np.float64)
    for i in range(CALLS):
        inp[...] = np.arange(count * n) + 1e6 * rank + i
        pycoll.all_to_all_single(out, inp, group=group)
        want = np.concatenate([np.arange(count * rank, count * (rank + 1)) + 1e6 * r + i
                               for r in range(n)])  # fmt: skip
        assert_array_equal(out, want)
    assert plain_calls == {"all_to_all_single": 1}
    known = group._native.calls[id(out)]
    kept = known[native._WORDS][0]
    assert kept[words.WHAT] == native.ALL_TO_ALL_V
    if in_place:  # (the copy skips this rank's own part, which MPI never reads)
        assert list(kept[words.IN_SKIP : words.IN_TABLE]) == [count * 8 * rank, count * 8]


def test_several_calls_on_one_array_are_each_kept(group, plain_calls, keeps, rank,
                                                  world_size):  # fmt: skip
    """One array all-reduced with two ops, broadcast and reduced in turn: each
    call is kept once and found again, none displacing another (the calls
    kept on one array are chained, up to KEPT_PER_ARRAY)."""
    x = np.zeros(3, np.int64)
    total = sum(range(1, world_size + 1))
    for i in range(CALLS):
        x[...] = rank + 1 + i
        pycoll.all_reduce(x, group=group)
        assert_array_equal(x, np.full(3, total + world_size * i))
        x[...] = rank + 1 + i
        pycoll.all_reduce(x, op=pycoll.ReduceOp.MAX, group=group)
        assert_array_equal(x, np.full(3, world_size + i))
        x[...] = 7 + i if rank == 0 else -1
        pycoll.broadcast(x, src=0, group=group)
        assert_array_equal(x, np.full(3, 7 + i))
        x[...] = rank + 1 + i
        pycoll.reduce(x, dst=0, group=group)
        assert_array_equal(x, np.full(3, total + world_size * i if rank == 0 else rank + 1 + i))
    assert plain_calls == {"all_reduce": 1}  # (the array's first sight)
    # Each call kept once, the SUM on its second round (the array's first
    # sight is not offered to native.call).
    assert keeps == ["all_reduce", "broadcast", "reduce", "all_reduce"]
    chain, kept = group._native.calls[id(x)], 0
    while chain is not None:
        kept, chain = kept + 1, chain[native._NEXT]
    assert kept == 4


def test_the_calls_kept_on_one_array_are_bounded(group, rank, world_size):
    """Past KEPT_PER_ARRAY calls on one array, the oldest is dropped."""
    ops = {"SUM": sum, "MAX": max, "MIN": min, "PRODUCT": np.prod, "BOR": np.bitwise_or.reduce}
    assert len(ops) > native.KEPT_PER_ARRAY
    x = np.zeros(2, np.int64)
    for _ in range(2):
        for name, want in ops.items():
            x[...] = rank + 1
            pycoll.all_reduce(x, op=getattr(pycoll.ReduceOp, name), group=group)
            assert_array_equal(x, np.full(2, want(list(range(1, world_size + 1)))))
    kept, chain = [], group._native.calls[id(x)]
    while chain is not None:
        kept, chain = kept + [chain[native._EXTRA].name], chain[native._NEXT]
    assert kept == list(reversed(ops))[: native.KEPT_PER_ARRAY]  # the latest first


def test_a_kept_call_is_known_by_its_collective(pg, rank, world_size, debug_off):
    """On one rank all_gather_into_tensor and all_to_all_single move the same
    data between the same two arrays; they stay two calls, each made as
    itself (the flight recorder and the call check see which ran)."""
    mine, _ = pycoll.new_subgroups(group_size=1)
    try:
        native.attach(mine)
        assert mine._native is not None
        out, inp = np.zeros(4, np.int32), np.zeros(4, np.int32)
        for i in range(CALLS):
            for call in (pycoll.all_gather_into_tensor, pycoll.all_to_all_single):
                inp[...] = np.arange(4) + 10 * rank + i
                call(out, inp, group=mine)
                assert_array_equal(out, inp)
        ring = list(mine._flight)[-2 * CALLS :]
        gather = crosscheck.key("all_gather_into_tensor", np.dtype(np.int32), 4)
        to_all = crosscheck.key("all_to_all_single", np.dtype(np.int32), 4)
        assert gather != to_all
        assert ring == [gather, to_all] * CALLS
    finally:
        pycoll.destroy_process_group(mine)


def test_barrier(group, plain_calls, rank, world_size):
    if watch.BLOCKING:
        pytest.skip("under PYCOLL_WAIT=blocking a barrier takes the checked path (it raises)")
    for _ in range(CALLS):
        pycoll.barrier(group=group)
    assert plain_calls == {}  # (the fixture's barrier was the first)


def test_kept_calls_are_still_checked(group, pg, rank, world_size):
    """A kept call is found only after the arguments that decide it are
    checked: a bad root or an array made read-only still raises on every rank."""
    native.attach(pg)  # (the default group's lanes come before the root's checks)
    assert pg._native is not None
    root = 1 if world_size > 1 else 0  # (True == 1: a bool must not pass for root 1)
    x, y = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for _ in range(CALLS):
        pycoll.broadcast(x, src=root)  # (the default group: the lanes before the root's checks)
        pycoll.reduce(y, dst=root)
    assert_array_equal(x, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="src must be an int"):
        pycoll.broadcast(x, src=bool(root))
    with pytest.raises(TypeError, match="dst must be an int"):
        pycoll.reduce(y, dst=bool(root))
    with pytest.raises(ValueError, match=f"src={world_size} is not a rank of the group"):
        pycoll.broadcast(x, src=world_size)
    with pytest.raises(ValueError, match=f"dst={world_size} is not a rank of the group"):
        pycoll.reduce(y, dst=world_size)
    x.flags.writeable = False
    y.flags.writeable = False
    if rank != root:  # (the source only reads it: it would go ahead, alone)
        with pytest.raises(ValueError, match="tensor is read-only"):
            pycoll.broadcast(x, src=root)
    else:  # (the others only read it)
        with pytest.raises(ValueError, match="tensor is read-only"):
            pycoll.reduce(y, dst=root)


def test_rooted_calls_on_a_subgroup(pg, plain_calls, keeps, rank, world_size, debug_off):
    """broadcast and reduce find a kept call by the global root they are given,
    before translating it: on a group of the ranks but rank 0 (group ranks one
    less than global ones) each global root still reaches the right rank,
    each call is kept once, and a rank outside the group, or a bool, is still
    refused on every rank of the group."""
    if world_size == 1:
        pytest.skip("needs a group whose ranks are not the global ones")
    members = list(range(1, world_size))
    g = pycoll.new_group(ranks=members)
    try:
        if rank == 0:  # (not a member: every call returns at once)
            assert pycoll.broadcast(np.zeros(3), src=1, group=g) is None
            return
        native.attach(g)
        assert g._native is not None
        x, y = np.zeros(3, np.int32), np.zeros(3, np.int32)
        for i in range(CALLS):
            for src in members:
                x[...] = 100 * src + i if rank == src else -1
                pycoll.broadcast(x, src=src, group=g)
                assert_array_equal(x, np.full(3, 100 * src + i, np.int32))
                y[...] = rank + i
                pycoll.reduce(y, dst=src, group=g)
                want = sum(r + i for r in members) if rank == src else rank + i
                assert_array_equal(y, np.full(3, want, np.int32))
        assert plain_calls == {"broadcast": 1, "reduce": 1}
        # Each root's call kept once (on the next round for the first root, whose
        # call saw each array first: not offered to native.call).
        n = len(members)
        assert sorted(keeps) == ["broadcast"] * n + ["reduce"] * n
        with pytest.raises(ValueError, match="src=0 is not a rank of the group"):
            pycoll.broadcast(x, src=0, group=g)
        with pytest.raises(TypeError, match="dst must be an int"):
            pycoll.reduce(y, dst=True, group=g)
    finally:
        pycoll.destroy_process_group(g)


@pytest.mark.parametrize(
    "name", ["all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]
)
def test_two_array_calls_are_still_checked(group, rank, world_size, name):
    """The two-array collectives look for a kept call before their own checks
    of sizes and dtypes: an input whose dtype was reassigned in place, or an
    output made read-only, still raises on every rank."""
    sizes = {"all_gather_into_tensor": (2 * world_size, 2),
             "reduce_scatter_tensor": (2, 2 * world_size),
             "all_to_all_single": (2 * world_size, 2 * world_size)}  # fmt: skip
    out, inp = (np.zeros(k, np.float32) for k in sizes[name])
    call = getattr(pycoll, name)
    for _ in range(CALLS):
        call(out, inp, group=group)
    assert group._native.calls[id(out)][native._OTHER] is inp  # (kept)
    inp.dtype = np.int32
    with pytest.raises(ValueError, match="dtype"):
        call(out, inp, group=group)
    inp.dtype = np.float32
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        call(out, inp, group=group)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.complex128, BF16],
                         ids=lambda d: np.dtype(d).name)  # fmt: skip
def test_all_gather_list_form(group, plain_calls, rank, world_size, dtype):
    """torch's list form, kept: received into a buffer the call keeps and
    copied out to the list's arrays by the compiled code."""
    mpi_datatype(np.dtype(dtype))  # (the table a first call fills, before counting)
    x = np.zeros(5, dtype)
    outs = [np.zeros(5, dtype) for _ in range(world_size)]
    for i in range(CALLS):
        x[...] = np.arange(5) + 10 * rank + i
        pycoll.all_gather(outs, x, group=group)
        for r in range(world_size):
            assert_array_equal(outs[r], (np.arange(5) + 10 * r + i).astype(dtype))
    assert plain_calls == {"all_gather": 1}


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_scatter_list_form(group, plain_calls, rank, world_size, op):
    """torch's list form, kept: the inputs copied side by side into a buffer
    the call keeps by the compiled code, then MPI's reduce-scatter."""
    mpi_datatype(np.dtype(np.int64))
    ins = [np.zeros(4, np.int64) for _ in range(world_size)]
    out = np.zeros(4, np.int64)
    for i in range(CALLS):
        for d in range(world_size):
            ins[d][...] = np.arange(4) + 100 * d + rank * (d + 1) + i
        pycoll.reduce_scatter(out, ins, op=getattr(pycoll.ReduceOp, op), group=group)
        every = [np.arange(4) + 100 * rank + r * (rank + 1) + i for r in range(world_size)]
        want = sum(every) if op == "SUM" else np.maximum.reduce(every)
        assert_array_equal(out, want)
    assert plain_calls == {"reduce_scatter": 1}


def test_gather_to_every_root(group, plain_calls, rank, world_size):
    """gather, kept on every rank: the root's received into a buffer the
    call keeps and copied out to its list, the others' send-only calls (each
    root its own call)."""
    mpi_datatype(np.dtype(np.float32))
    x = np.zeros(3, np.float32)
    outs = [np.zeros(3, np.float32) for _ in range(world_size)]
    for dst in range(world_size):
        for i in range(CALLS):
            x[...] = np.arange(3) + 10 * rank + i + dst
            pycoll.gather(x, outs if rank == dst else None, dst=dst, group=group)
            if rank == dst:
                for r in range(world_size):
                    assert_array_equal(outs[r], np.arange(3, dtype=np.float32) + 10 * r + i + dst)
    # The first call plain, and a root's first call as root (its list seen once)
    assert plain_calls == {"gather": 1 if rank == 0 else 2}


@pytest.mark.parametrize("spins", ["tested", "waited"])
def test_scatter_from_every_root(group, plain_calls, rank, world_size, spins):
    """scatter, kept on every rank: the root's parts copied behind their
    status words into a buffer the call keeps, every rank's part received
    with its word into another and copied out (each root its own call);
    with no tests in the compiled code (``waited``) every call's wait goes
    on in Python and the copy is made there."""
    if spins == "waited":
        group._native.st[native._starts.SPINS] = 0
    out = np.zeros(3, np.float32)
    parts = [np.zeros(3, np.float32) for _ in range(world_size)]
    for src in range(world_size):
        for i in range(CALLS):
            for r, part in enumerate(parts):
                part[...] = np.arange(3) + 10 * r + i + src
            out[...] = -1
            pycoll.scatter(out, parts if rank == src else None, src=src, group=group)
            assert_array_equal(out, np.arange(3, dtype=np.float32) + 10 * rank + i + src)
    # The first call plain, and a root's first call as root (its list seen once)
    assert plain_calls == {"scatter": 1 if rank == 0 else 2}
    assert len(group._native.calls[id(out)]) > 0


@pytest.mark.parametrize("spins", ["tested", "waited"])
def test_a_list_src_refuses_reaches_compiled_receivers(group, plain_calls, rank, world_size,
                                                       spins):  # fmt: skip
    """Once every rank keeps the scatter, a list src refuses (it takes the
    plain path, its status words saying so) still pairs with the others'
    compiled calls: each raises the plain path's error, its tensor left as
    it was, and the next call on the kept arrays is right again."""
    if world_size == 1:
        pytest.skip("needs a rank other than src")
    if spins == "waited":
        group._native.st[native._starts.SPINS] = 0
    out = np.zeros(2, np.float64)
    parts = [np.full(2, float(r)) for r in range(world_size)]
    for _ in range(CALLS):
        pycoll.scatter(out, parts if rank == 0 else None, src=0, group=group)
        assert_array_equal(out, np.full(2, float(rank)))
    out[...] = -7.0
    bad = parts[:-1] if rank == 0 else None  # one part short
    with pytest.raises(ValueError) as caught:
        pycoll.scatter(out, bad, src=0, group=group)
    if rank == 0:
        assert "must hold one entry per rank of the group" in str(caught.value)
    else:
        assert str(caught.value) == (
            "scatter: src (rank 0) refused its scatter_list (see the error raised there), "
            "so nothing was scattered; tensor is left as it was"
        )
    assert_array_equal(out, np.full(2, -7.0))
    assert plain_calls == {"scatter": 2 if rank == 0 else 1}  # (the others' call compiled)
    pycoll.scatter(out, parts if rank == 0 else None, src=0, group=group)
    assert_array_equal(out, np.full(2, float(rank)))
    assert plain_calls == {"scatter": 2 if rank == 0 else 1}


def test_a_list_form_is_kept_with_the_arrays_of_its_list(group, plain_calls, keeps, rank,
                                                         world_size):  # fmt: skip
    """A kept list form is the call of the very arrays it was kept with,
    whatever list holds them: an array replaced in the list is written, a
    new list of the same arrays is the kept call, and lists of arrays made
    afresh for each call are never kept. A list that no longer passes the
    checks (an output made read-only) is refused on every rank, as on the
    plain path."""
    mpi_datatype(np.dtype(np.float32))
    x = np.zeros(2, np.float32)
    outs = [np.zeros(2, np.float32) for _ in range(world_size)]

    def gathered(i: int, into: List[np.ndarray]) -> None:
        x[...] = rank + i
        pycoll.all_gather(into, x, group=group)
        for r in range(world_size):
            assert_array_equal(into[r], np.full(2, r + i, np.float32))

    for i in range(CALLS):
        gathered(i, outs)
    assert plain_calls == {"all_gather": 1}
    for at in {0, world_size - 1}:
        outs[at] = np.zeros(2, np.float32)  # replaced: no longer the kept call
        gathered(10 + at, outs)
    replaced = plain_calls["all_gather"]
    assert replaced == 1 + len({0, world_size - 1})
    for i in range(CALLS):
        gathered(20 + i, list(outs))  # a new list each call, of the same arrays
    assert plain_calls == {"all_gather": replaced}  # (kept at once: every array seen)
    before = len(keeps)
    for i in range(CALLS):
        gathered(30 + i, [np.zeros(2, np.float32) for _ in range(world_size)])
    assert plain_calls == {"all_gather": replaced + CALLS}
    assert group._native.calls[id(x)][native._ITEMS] == tuple(outs)  # (none kept since)
    assert len(keeps) == before + CALLS
    outs[0].flags.writeable = False
    with pytest.raises(ValueError, match=r"tensor_list\[0\] is read-only"):
        pycoll.all_gather(outs, x, group=group)


def test_arrays_made_afresh_take_the_plain_path(group, plain_calls, rank, world_size):
    """Keeping a call that is never made again would cost more than it saves."""
    for i in range(CALLS):
        x = np.full(3, rank + i, np.float32)
        pycoll.all_reduce(x, group=group)
        assert_array_equal(x, np.full(3, sum(r + i for r in range(world_size)), np.float32))
    assert plain_calls == {"all_reduce": CALLS}
    assert group._native.calls == {}


def test_an_array_seen_once_is_held_until_the_next(group, plain_calls, keeps, rank,
                                                   world_size):  # fmt: skip
    """native.again notes an array it sees for the first time and the
    collective skips native.call for it. The group holds the array it saw
    last until it sees another, then lets it go where nothing else holds it
    (arrays made afresh for each call: never noted, never kept), and
    remembers it weakly where the program holds it (kept at its next call).
    Arrays over HELD_BYTES are remembered weakly at once."""

    def fresh(i: int, n: int = 3) -> weakref.ref:
        x = np.full(n, rank + i, np.float32)
        pycoll.all_reduce(x, group=group)
        assert_array_equal(x, np.full(n, sum(r + i for r in range(world_size)), np.float32))
        return weakref.ref(x)

    state = group._native
    gone = [fresh(i) for i in range(CALLS)]
    gc.collect()
    assert [r() is None for r in gone] == [True] * (CALLS - 1) + [False]  # (the last: held)
    assert set(state.seen) <= {id(native.NOTHING)}  # (the fixture's barrier's)
    assert keeps == []
    held = np.zeros(3, np.int64)  # (the program's, seen once; then another array)
    pycoll.all_reduce(held, group=group)
    assert state.last is held
    last = fresh(CALLS)
    assert gone[-1]() is None and last() is state.last
    assert state.seen[id(held)][0]() is held  # (remembered weakly: the program holds it)
    for i in range(2):
        held[...] = rank + i
        pycoll.all_reduce(held, group=group)
        assert_array_equal(held, np.full(3, sum(r + i for r in range(world_size))))
    assert keeps == ["all_reduce"] and id(held) in state.calls
    assert plain_calls == {"all_reduce": CALLS + 2}
    large = fresh(0, native.HELD_BYTES // 4 + 1)  # (not held: noted weakly)
    assert large() is None and state.last is None


def test_calls_dropped_from_an_array_give_back_their_bytes(group, kept, rank, world_size):
    """Six collectives on one array (the first a first sighting) keep the
    latest KEPT_PER_ARRAY; the one dropped, and one kept again for a dtype
    reassigned, no longer count toward KEPT_TOTAL."""
    x = np.zeros(1024, np.int32)
    ops = [pycoll.ReduceOp.SUM, pycoll.ReduceOp.MAX, pycoll.ReduceOp.MIN, pycoll.ReduceOp.PRODUCT]
    for op in ops:
        x[...] = 1
        pycoll.all_reduce(x, op=op, group=group)
        assert_array_equal(x, np.full(1024, world_size if op == pycoll.ReduceOp.SUM else 1))
    x[...] = 5 if rank == 0 else 0
    pycoll.broadcast(x, src=0, group=group)
    assert_array_equal(x, np.full(1024, 5))
    x[...] = 1
    pycoll.reduce(x, dst=0, group=group)
    assert_array_equal(x, np.full(1024, world_size if rank == 0 else 1))
    assert len(kept) == 5  # (MAX dropped for the reduce)
    assert group._native.held == native.KEPT_PER_ARRAY * x.nbytes
    x.dtype = np.float32  # (the same bytes, another dtype: the broadcast kept again)
    for _ in range(2):
        x[...] = 2.5 if rank == 0 else 0
        pycoll.broadcast(x, src=0, group=group)
        assert_array_equal(x, np.full(1024, 2.5, np.float32))
    assert len(kept) == 6
    assert group._native.held == native.KEPT_PER_ARRAY * x.nbytes


def test_many_arrays_are_kept(group, plain_calls, kept, rank, world_size):
    """A step's worth of arrays, each used once a step and more of them than
    calls between two exchange points, is kept from the second step on, each
    once: a kept call that meets an exchange point (which the plain path
    makes) is not kept again."""
    arrays = [np.zeros(4, np.int32) for _ in range(200)]
    for i in range(3):
        for k, a in enumerate(arrays):
            a[...] = rank + i + k
            pycoll.all_reduce(a, group=group)
            assert_array_equal(a, np.full(4, sum(r + i + k for r in range(world_size))))
    exchanges = 3 * len(arrays) // (group._mask + 1) + 1  # (the plain path makes them)
    assert len(arrays) <= plain_calls["all_reduce"] <= len(arrays) + exchanges
    assert len(kept) == len(arrays)


def test_more_arrays_than_are_kept(group, monkeypatch, plain_calls, kept, rank, world_size):
    """A program cycling through more arrays than a group keeps: the first
    ones stay kept and the rest take the plain path, rather than every call
    being kept afresh (until RENEW_CALLS calls have passed)."""
    monkeypatch.setattr(native, "KEPT_CALLS", 8)
    arrays = [np.zeros(4, np.int64) for _ in range(20)]
    rounds = 6
    for i in range(rounds):
        for k, a in enumerate(arrays):
            a[...] = rank + i + k
            pycoll.all_reduce(a, group=group)
            assert_array_equal(a, np.full(4, sum(r + i + k for r in range(world_size))))
    assert len(kept) == 8
    assert set(group._native.calls) == {id(a) for a in arrays[:8]}
    exchanges = rounds * len(arrays) // (group._mask + 1) + 1
    rest = len(arrays) + (rounds - 1) * (len(arrays) - 8)  # first sightings, then the 12
    assert rest <= plain_calls["all_reduce"] <= rest + exchanges


def test_full_calls_start_over_for_new_arrays(group, monkeypatch, kept, rank, world_size):
    """Once RENEW_CALLS calls have passed since it last started over, a
    group whose kept calls are full drops them for the arrays now in use (a
    program whose arrays change)."""
    monkeypatch.setattr(native, "KEPT_CALLS", 4)
    monkeypatch.setattr(native, "RENEW_CALLS", 40)
    for arrays in ([np.zeros(2, np.int32) for _ in range(4)],
                   [np.zeros(2, np.int32) for _ in range(4)]):  # fmt: skip
        for i in range(12):
            for a in arrays:
                a[...] = rank + i
                pycoll.all_reduce(a, group=group)
                assert_array_equal(a, np.full(2, sum(r + i for r in range(world_size))))
        assert set(group._native.calls) == {id(a) for a in arrays}
    assert len(kept) == 8


def test_the_bytes_kept_are_bounded(group, monkeypatch, rank, world_size):
    """Kept calls hold their arrays, at most KEPT_TOTAL bytes of them (those
    that would hold more take the plain path)."""
    monkeypatch.setattr(native, "KEPT_TOTAL", 3 * 4096)
    arrays = [np.zeros(1024, np.float32) for _ in range(5)]  # 4 KiB each
    for i in range(4):
        for a in arrays:
            a[...] = rank + i
            pycoll.all_reduce(a, group=group)
            assert (a == sum(r + i for r in range(world_size))).all()
            assert group._native.held <= native.KEPT_TOTAL
            held = [known[native._MAIN] for known in group._native.calls.values()]
            assert sum(x.nbytes for x in held) == group._native.held


def test_arrays_over_device_memory_are_not_kept(group, plain_calls, rank, world_size):
    """pycoll.gpu's CUDA-aware calls hand the collectives numpy arrays over
    device memory (``device_aliases``): never kept, since the compiled path's
    copies (the in-place reduce-scatter's, a plan's) run on the CPU."""
    k = 2
    x = np.zeros(k * world_size, np.float32)
    with _common.device_aliases(group):
        for i in range(CALLS):
            x[...] = rank + i
            pycoll.reduce_scatter_tensor(x[k * rank : k * rank + k], x, group=group)
            assert_array_equal(x[k * rank : k * rank + k], sum(r + i for r in range(world_size)))
    assert plain_calls == {"reduce_scatter_tensor": CALLS}
    assert group._native.calls == {}


def test_large_calls_take_the_plain_path(group, plain_calls, rank, world_size):
    x = np.zeros(native.KEPT_BYTES // 8 + 1, np.float64)
    for i in range(3):
        x[...] = i if rank == 0 else -1
        pycoll.broadcast(x, src=0, group=group)
        assert (x == i).all()
    assert plain_calls == {"broadcast": 3}


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("over", [0, 1], ids=["kept", "one-more"])
def test_all_to_all_single_up_to_the_kept_bytes(
    group, plain_calls, rank, world_size, in_place, over
):
    """A kept all-to-all holds its output and its input, or in place a copy
    of it: up to native.KEPT_BYTES in all it is kept (the in-place call of
    1 MiB took 1.19-1.24x MPICH's in-place call on the plain path, 1.04x
    kept: docs/benchmarks.md); an element more a part takes the plain path."""
    n = world_size
    count = native.KEPT_BYTES // 2 // 8 // n + over  # float64 elements a part
    out = np.zeros(count * n, np.float64)
    inp = out if in_place else np.zeros(count * n, np.float64)
    for i in range(3):
        inp[...] = np.arange(count * n) + 1e6 * rank + i
        pycoll.all_to_all_single(out, inp, group=group)
        want = np.concatenate([np.arange(count * rank, count * (rank + 1)) + 1e6 * r + i
                               for r in range(n)])  # fmt: skip
        assert_array_equal(out, want)
    assert plain_calls == {"all_to_all_single": 3 if over else 1}


def test_a_dtype_changed_in_place_is_a_new_call(group, rank, world_size):
    """numpy lets an array's dtype be set to another of the same item size: the
    kept call (MPI's float datatype) must not serve the int32 array it became."""
    x = np.zeros(3, np.float32)
    for i in range(CALLS):
        x[...] = rank + i
        pycoll.all_reduce(x, group=group)
    x.dtype = np.int32
    x[...] = -(rank + 1)  # (as float32 a NaN: a float sum would not give the int sum)
    pycoll.all_reduce(x, group=group)
    assert_array_equal(x, np.full(3, -world_size * (world_size + 1) // 2, np.int32))


@pytest.mark.parametrize("tested", [True, False], ids=["tested", "untested"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_all_reduce_with_works(group, lean_calls, rank, world_size, dtype, tested):
    """``async_op=True`` on the same array: the first call takes the Python
    path, the second keeps the call, and from then on each is started
    compiled. Every Work completes with the right result, whether the
    compiled tests saw the call done (a Work complete as it is handed back)
    or, with no tests, its wait goes on in Python."""
    if not tested:
        group._native.st[native._starts.SPINS] = 0
    x = np.zeros((2, 3), dtype)
    for i in range(CALLS):
        x[...] = np.arange(6).reshape(2, 3) + rank + i
        work = pycoll.all_reduce(x, group=group, async_op=True)
        if not tested:
            assert not work._done  # handed back pending: its wait goes on in Python
        assert work.wait() is True
        assert work.is_completed() and work.is_success() and work.exception() is None
        assert work.result()[0] is x
        want = sum(np.arange(6).reshape(2, 3) + r + i for r in range(world_size))
        assert_array_equal(x, want.astype(dtype))
    assert lean_calls == {"all_reduce": 1}
    assert id(x) in group._native.calls


WORK_CASES = [
    ("broadcast", False),
    ("all_gather_into_tensor", False),
    ("all_gather_into_tensor", True),
    ("reduce_scatter_tensor", False),
    ("reduce_scatter_tensor", True),
    ("all_to_all_single", False),
    ("all_to_all_single", True),
]


@pytest.mark.parametrize("tested", [True, False], ids=["tested", "untested"])
@pytest.mark.parametrize(
    "name,in_place", WORK_CASES, ids=[f"{n}-{'in' if p else 'out'}" for n, p in WORK_CASES]
)
def test_other_collectives_with_works(group, lean_calls, rank, world_size, name, in_place, tested):
    """broadcast, all_gather_into_tensor, reduce_scatter_tensor and
    all_to_all_single with ``async_op=True`` on the same arrays: kept and
    started compiled as all_reduce's, with the right result on every rank,
    tested or not. torch's in-place reduce-scatter receives beside its input,
    and the all-to-all of one array sends from a copy of it (but where every
    rank's call is in place: two ranks on MPICH), each into a buffer its kept
    call owns, which two Works under way would share: every such call takes
    the Python path."""
    if not tested:
        group._native.st[native._starts.SPINS] = 0
    k, n = 3, world_size
    out = np.zeros(k * n if name != "broadcast" and name != "reduce_scatter_tensor" else k,
                   np.float32)  # fmt: skip
    inp = np.zeros(k * n if name != "broadcast" and name != "all_gather_into_tensor" else k,
                   np.float32)  # fmt: skip
    for i in range(CALLS):

        def values(r: int, size: int) -> np.ndarray:
            return (np.arange(size) + 10 * r + i).astype(np.float32)

        if name == "broadcast":
            out[...] = values(rank, k)
            work = pycoll.broadcast(out, n - 1, group=group, async_op=True)
            want, got = values(n - 1, k), out
        elif name == "all_gather_into_tensor":
            out[...] = -1
            if in_place:
                out[k * rank : k * rank + k] = values(rank, k)
                work = pycoll.all_gather_into_tensor(
                    out, out[k * rank : k * rank + k], group=group, async_op=True
                )
            else:
                inp[...] = values(rank, k)
                work = pycoll.all_gather_into_tensor(out, inp, group=group, async_op=True)
            want, got = np.concatenate([values(r, k) for r in range(n)]), out
        elif name == "all_to_all_single":
            inp[...] = values(rank, k * n)
            want = np.concatenate([values(r, k * n)[k * rank : k * rank + k] for r in range(n)])
            if in_place:  # (one array, input and output)
                work = pycoll.all_to_all_single(inp, inp, group=group, async_op=True)
                got = inp
            else:
                out[...] = -1
                work = pycoll.all_to_all_single(out, inp, group=group, async_op=True)
                got = out
        else:
            inp[...] = values(rank, k * n)
            total = sum(values(r, k * n) for r in range(n))
            if in_place:
                work = pycoll.reduce_scatter_tensor(
                    inp[k * rank : k * rank + k], inp, group=group, async_op=True
                )
                want, got = values(rank, k * n), inp
                want[k * rank : k * rank + k] = total[k * rank : k * rank + k]
            else:
                out[...] = -1
                work = pycoll.reduce_scatter_tensor(out, inp, group=group, async_op=True)
                want, got = total[k * rank : k * rank + k], out
        if not tested:
            assert not work._done  # handed back pending: its wait goes on in Python
        work.wait()
        assert work.is_success()
        assert_array_equal(got, want)
    owns = in_place and (  # (the all-to-all's copy: not where every rank sends in place)
        name == "reduce_scatter_tensor"
        or name == "all_to_all_single"
        and alltoall._form(n, inp.nbytes) != alltoall.IN_PLACE
    )
    calls = CALLS if owns else 1
    assert lean_calls == {name: calls}


def test_works_and_synchronous_calls_share_a_kept_call(
    group, plain_calls, lean_calls, rank, world_size
):
    """A call kept by a Work serves the synchronous call on the same array,
    and the other way round."""
    x = np.zeros(4, np.float64)
    for i in range(2 * CALLS):
        x[...] = rank + i
        if i % 2:
            pycoll.all_reduce(x, group=group, async_op=True).wait()
        else:
            pycoll.all_reduce(x, group=group)
        assert_array_equal(x, np.full(4, sum(r + i for r in range(world_size)), np.float64))
    assert plain_calls == {"all_reduce": 1} and lean_calls == {}


def test_works_under_way_together(group, lean_calls, rank, world_size):
    """Works of kept calls on three arrays, all under way (no compiled
    tests) before any is waited for, waited for in the reverse order."""
    group._native.st[native._starts.SPINS] = 0
    xs = [np.zeros(3, np.float32) for _ in range(3)]
    for i in range(CALLS):
        for j, x in enumerate(xs):
            x[...] = rank + 10 * j + i
        works = [pycoll.all_reduce(x, group=group, async_op=True) for x in xs]
        for work in reversed(works):
            work.wait()
        for j, x in enumerate(xs):
            want = np.full(3, sum(r + 10 * j + i for r in range(world_size)), np.float32)
            assert_array_equal(x, want)
    assert lean_calls == {"all_reduce": len(xs)}


@pytest.mark.parametrize("tested", [True, False], ids=["tested", "untested"])
def test_a_works_bookkeeping_is_the_python_paths(group, rank, world_size, tested):
    """Sequence numbers, the progress record and the flight recorder read
    the same for a Work started compiled as for one the Python path started:
    a full flight record entry, open (and the record busy) while the Work is
    pending, closed as completed once it is done."""
    if not tested:
        group._native.st[native._starts.SPINS] = 0
    x = np.ones(2, np.float32)
    for _ in range(CALLS):
        seq = group.sequence_number() + 1
        work = pycoll.all_reduce(x, group=group, async_op=True)
        assert group.sequence_number() == seq
        entry = group._flight[-1]
        assert entry[recorder.SEQ] == seq and entry[recorder.OP] == "all_reduce"
        assert entry[recorder.NBYTES] == x.nbytes
        if not work.is_completed():
            assert entry[recorder.ENDED] is None and entry[recorder.STATE] == recorder.STARTED
        work.wait()
        assert entry[recorder.ENDED] is not None and entry[recorder.STATE] == recorder.COMPLETED
        word = group._rec[group._word]
        assert word >> 8 == seq and not word & BUSY


def test_the_bookkeeping_is_the_plain_paths(group, rank, world_size):
    """Sequence numbers, the progress record and the flight recorder read the
    same after a compiled call as after a plain one."""
    x = np.ones(2, np.float32)
    words: List[int] = []
    for _ in range(CALLS):
        before = group.sequence_number()
        pycoll.all_reduce(x, group=group)
        assert group.sequence_number() == before + 1
        word = group._rec[group._word]
        assert word >> 8 == before + 1 and not word & BUSY  # done, at that seq
        words.append(word & 0xFF)
    assert len(set(words)) == 1  # the same op code, plain (first) and compiled
    ring = list(group._flight)[-CALLS:]
    assert len(set(ring)) == 1  # the same key for the flight recorder


def test_a_mismatch_on_the_compiled_path_is_found(group, rank, world_size):
    """The call check sees compiled calls: ranks that disagree are told within
    two exchanges, with the first call they disagreed on."""
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    if watch.BLOCKING:
        pytest.skip("MPICH's blocking all_reduce reports this mismatch itself (truncated)")
    last = world_size - 1
    x = np.ones(6, np.float32)
    for _ in range(3):  # kept on every rank
        pycoll.all_reduce(x, group=group)
    seq = group.sequence_number() + 1
    op = pycoll.ReduceOp.MAX if rank == last else pycoll.ReduceOp.SUM
    for _ in range(3):  # compiled on every rank; MPI runs them: the results are wrong
        pycoll.all_reduce(x, op=op, group=group)
    assert group._native.calls[id(x)][native._EXTRA] is op  # (kept, and so made compiled)
    with pytest.raises(CollectiveMismatchError) as error:
        for _ in range(2 * crosscheck.DEFAULT_EVERY + 2):
            pycoll.all_reduce(x, group=group)
    assert f"called different collectives at seq {seq}: " in str(error.value)
    assert f"rank {last} called all_reduce(MAX, float32, 6 elements)" in str(error.value)


def test_a_late_rank_is_named_by_the_timeout(pg, rank, world_size, debug_off):
    """A compiled call that one rank never makes: its tests run out, the wait
    goes on in Python, and the group's timeout names the rank that did not come."""
    if world_size == 1:
        pytest.skip("needs a rank to be late")
    if watch.BLOCKING:
        pytest.skip("a blocking call's timeout ends the job (tests/test_hangs.py)")
    g = pycoll.new_group(timeout=timedelta(seconds=3))
    native.attach(g)
    x = np.ones(2)
    for _ in range(3):  # (the first makes this thread the owner) kept: the next is compiled
        pycoll.all_reduce(x, group=g)
    assert g._native.calls
    last = world_size - 1
    if rank != last:
        with pytest.raises(DistTimeoutError) as exc:
            pycoll.all_reduce(x, group=g)
        assert f"rank {last}: has not reached it" in str(exc.value), str(exc.value)
    pycoll.barrier()  # (the default group: the late rank joins here)


def test_a_late_rank_is_named_by_a_works_timeout(pg, rank, world_size, debug_off):
    """A Work of a kept call that one rank never makes: its wait in Python
    ends at the group's timeout, which names the rank that did not come."""
    if world_size == 1:
        pytest.skip("needs a rank to be late")
    g = pycoll.new_group(timeout=timedelta(seconds=3))
    native.attach(g)
    x = np.ones(2)
    for _ in range(3):  # (the first makes this thread the owner) kept: the next is compiled
        pycoll.all_reduce(x, group=g, async_op=True).wait()
    assert id(x) in g._native.calls
    last = world_size - 1
    if rank != last:
        work = pycoll.all_reduce(x, group=g, async_op=True)
        with pytest.raises(DistTimeoutError) as exc:
            work.wait()
        assert f"rank {last}: has not reached it" in str(exc.value), str(exc.value)
    pycoll.barrier()  # (the default group: the late rank joins here)


def test_a_second_thread_sends_the_group_to_the_plain_path(group, plain_calls, rank, world_size):
    x = np.zeros(2, np.int64)
    errors: List[BaseException] = []

    def step(i: int) -> None:
        try:
            x[...] = rank + i
            pycoll.all_reduce(x, group=group)
            assert_array_equal(x, np.full(2, sum(r + i for r in range(world_size))))
        except BaseException as error:  # (a thread's exception would be lost)
            errors.append(error)

    for i in range(CALLS):
        step(i)
    assert plain_calls == {"all_reduce": 1}
    helper = threading.Thread(target=step, args=(CALLS,))
    helper.start()
    helper.join()
    assert group._shared
    for i in range(CALLS):
        step(CALLS + 1 + i)
    assert errors == []
    assert plain_calls == {"all_reduce": 2 + CALLS}  # the locked path, every call


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_a_group_takes_the_compiled_path_from_its_first_exchange(
    pg, monkeypatch, debug_off, async_op
):
    """From the first call check exchange point its calls reach, synchronous
    or with Works (a program whose calls all return Works has them too)."""
    monkeypatch.setattr(native, "MODE", native.AUTO)
    g = pycoll.new_group()

    def call() -> None:
        work = pycoll.all_reduce(x, group=g, async_op=async_op)
        if work is not None:
            work.wait()

    try:
        x = np.ones(2)
        while g.sequence_number() < g._mask - 1:
            call()
        assert g._native is None  # not before
        call()  # the exchange point (seq & mask == mask)
        assert g._native is not None
    finally:
        pycoll.destroy_process_group(g)


def test_groups_stay_plain_with_the_setting_off(pg, monkeypatch):
    monkeypatch.setattr(native, "MODE", native.OFF)
    g = pycoll.new_group()
    try:
        native.attach(g)
        assert g._native is None
        x = np.ones(2)
        for _ in range(g._mask + 2):  # past the exchange point
            pycoll.all_reduce(x, group=g)
        assert g._native is None
    finally:
        pycoll.destroy_process_group(g)


def test_blocking_calls_are_watched(group, monkeypatch, rank, world_size):
    """Under PYCOLL_WAIT=blocking a compiled call is MPI's blocking call, shown
    to the watchdog thread while it runs (watch.inflight) and cleared after."""
    seen: List[object] = []
    real = native._block

    def watched(*args):
        seen.append(watch.inflight)
        return real(*args)

    monkeypatch.setattr(watch, "BLOCKING", True)
    monkeypatch.setattr(native, "_block", watched)
    x = np.zeros(3, np.float64)
    for i in range(CALLS):
        x[...] = rank + i
        pycoll.all_reduce(x, group=group)
        assert_array_equal(x, np.full(3, sum(r + i for r in range(world_size)), np.float64))
    first = group.sequence_number() - (CALLS - 2)
    assert seen == [(group, "all_reduce", seq) for seq in range(first, first + CALLS - 1)]
    assert watch.inflight is None


@pytest.fixture
def planned(pg, debug_off):
    """A new group with persistent plans (PYCOLL_PERSISTENT=1's effect) on the
    compiled path, and its plans' calls counted."""
    if not hasattr(_mpi.load().Comm, "Allreduce_init"):
        pytest.skip("persistent collectives need MPI-4")
    with persistent.forced():
        g = pycoll.new_group(timeout=timedelta(seconds=30))
    native.attach(g)
    assert g._native is not None and g._plans is not None
    pycoll.barrier(group=g)  # (this thread the owner)
    yield g
    pycoll.destroy_process_group(g)
    assert g._native is None


@pytest.fixture
def plan_calls(monkeypatch) -> List[str]:
    """The calls made through a plan's Python path (persistent.Plan.call)."""
    return record_arg(monkeypatch, persistent.Plan, "call", 2)


PLANNED = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather in place",
           "reduce_scatter", "reduce_scatter in place", "all_to_all",
           "all_to_all in place"]  # fmt: skip


@pytest.mark.parametrize("case", PLANNED)
def test_plans_are_started_compiled(planned, plan_calls, rank, world_size, case):
    """On a group with plans, a call a made plan serves is kept like any
    other (its input copied into the plan's buffer, MPI_Start, its result
    copied out, all compiled): from its plan's first use on, no Python (its
    arrays were seen by the calls made before the plan was)."""
    k, n = 3, world_size
    calls = 3 * persistent.PROMOTE
    a = np.zeros(k * n, np.float32)
    b = np.zeros(k * n, np.float32)
    part = np.zeros(k, np.float32)
    main = a
    for i in range(calls):
        values = [np.arange(k * n, dtype=np.float32) * (r + 1) + i for r in range(n)]
        if case == "all_reduce":
            a[...] = values[rank]
            pycoll.all_reduce(a, group=planned)
            assert_array_equal(a, sum(values))
        elif case == "broadcast":
            a[...] = values[0] if rank == 0 else -1
            pycoll.broadcast(a, src=0, group=planned)
            assert_array_equal(a, values[0])
        elif case == "reduce":  # (to the last rank: on more than one, others send only)
            a[...] = values[rank]
            pycoll.reduce(a, dst=n - 1, group=planned)
            assert_array_equal(a, sum(values) if rank == n - 1 else values[rank])
        elif case.startswith("all_gather"):
            mine = a[k * rank : k * rank + k] if case.endswith("place") else part
            mine[...] = values[rank][:k]
            pycoll.all_gather_into_tensor(a, mine, group=planned)
            assert_array_equal(a, np.concatenate([v[:k] for v in values]))
        elif case == "reduce_scatter":
            main = part
            a[...] = values[rank]
            pycoll.reduce_scatter_tensor(part, a, group=planned)
            assert_array_equal(part, sum(values)[k * rank : k * rank + k])
        elif case == "reduce_scatter in place":
            a[...] = values[rank]
            pycoll.reduce_scatter_tensor(a[k * rank : k * rank + k], a, group=planned)
            want = values[rank].copy()
            want[k * rank : k * rank + k] = sum(values)[k * rank : k * rank + k]
            assert_array_equal(a, want)
        else:
            src = a if case.endswith("place") else b
            src[...] = values[rank]
            pycoll.all_to_all_single(a, src, group=planned)
            assert_array_equal(a, np.concatenate([v[k * rank : k * rank + k] for v in values]))
    assert planned._plans.made  # (made on every rank: its own count of the calls)
    assert plan_calls == []  # (kept at the plan's first use)
    known = planned._native.calls[id(main)]
    assert known[native._WORDS][0][words.WHAT] == native.START


def test_plans_are_agreed_when_ranks_keep_different_calls(planned, rank, world_size):
    """Persistent plans are made where every rank has counted the same calls
    (pycoll.persistent's agreement). A rank whose array is kept must not skip
    the count: here rank 0 makes every call on one array and the others on
    arrays made afresh. (The compiled path once skipped it, and the ranks
    then waited out the timeout, one in MPI_Start, the other in
    MPI_Iallreduce.)"""
    kept = np.zeros(2)
    for i in range(3 * persistent.PROMOTE):
        x = kept if rank == 0 else np.zeros(2)
        x[...] = rank + i
        pycoll.all_reduce(x, group=planned)
        assert_array_equal(x, np.full(2, float(sum(r + i for r in range(world_size)))))
    assert planned._plans.made  # (the plan made, and used, on every rank)


def test_calls_no_plan_counts_are_kept_on_a_group_with_plans(planned, plain_calls, rank,
                                                             world_size):  # fmt: skip
    """What pycoll.persistent does not count (a reduce or an all_reduce larger
    than a plan holds) is kept on a group with plans as on any other."""
    x = np.zeros(persistent.LIMIT // 8 + 1, np.float64)
    big = np.zeros(persistent.LIMIT // 8 + 1, np.float64)
    for i in range(CALLS):
        x[...] = rank + i
        pycoll.reduce(x, dst=0, group=planned)
        want = sum(r + i for r in range(world_size)) if rank == 0 else rank + i
        assert (x == want).all()
        big[...] = rank + i
        pycoll.all_reduce(big, group=planned)
        assert (big == sum(r + i for r in range(world_size))).all()
    assert plain_calls == {"reduce": 1, "all_reduce": 1}
    assert not planned._plans.made


def test_a_plan_in_use_is_not_started_again(planned, rank, world_size):
    """A kept plan call waits for the plan's asynchronous use to finish (as
    Plan.call does) rather than start its request while it is active."""
    x, y = np.zeros(4), np.zeros(4)
    for i in range(3 * persistent.PROMOTE):  # the plan made, then kept for x
        x[...] = rank + i
        pycoll.all_reduce(x, group=planned)
    assert planned._native.calls[id(x)][native._PLAN] is not None
    y[...] = 10 * (rank + 1)
    work = pycoll.all_reduce(y, group=planned, async_op=True)  # (the same key: the plan)
    x[...] = rank
    pycoll.all_reduce(x, group=planned)
    assert_array_equal(x, np.full(4, float(sum(range(world_size)))))
    work.wait()
    assert_array_equal(y, np.full(4, 10.0 * sum(range(1, world_size + 1))))


def test_a_plan_waited_for_in_python_is_finished(planned, rank, world_size):
    """With no compiled tests, a kept plan call's wait goes on in Python on
    the plan's own request; the result is still copied out."""
    planned._native.st[native._starts.SPINS] = 0
    x = np.zeros(3, np.int64)
    for i in range(3 * persistent.PROMOTE):
        x[...] = rank + i
        pycoll.all_reduce(x, group=planned)
        assert_array_equal(x, np.full(3, sum(r + i for r in range(world_size))))
    assert planned._native.calls[id(x)][native._PLAN] is not None


def test_the_setting_is_checked(monkeypatch, pg):
    before = native.MODE
    try:
        monkeypatch.setenv(native.ENV, "yes")
        with pytest.raises(ValueError, match=r"PYCOLL_NATIVE='yes': set it to auto"):
            native.configure()
        for value, mode in (("0", native.OFF), ("", native.AUTO), (" AUTO ", native.AUTO)):
            monkeypatch.setenv(native.ENV, value)
            native.configure()
            assert native.MODE == mode
        monkeypatch.setenv(native.ENV, "1")
        native.configure()
        assert native.MODE == native.ON and native.loaded()
    finally:
        native.MODE = before


def test_a_path_that_cannot_load_is_named(monkeypatch, pg):
    """Under auto, a compiled path that cannot load warns once and leaves the
    calls on the Python path; under 1 it is an error naming the way out."""
    from pycoll.kernels import starts

    def broken() -> None:
        raise OSError("no libmpi here")

    monkeypatch.setattr(starts, "bind", broken)
    monkeypatch.setattr(native, "_starts", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setattr(native, "MODE", native.AUTO)
    g = pycoll.new_group()
    try:
        with pytest.warns(RuntimeWarning, match=r"compiled fast path is off \(OSError: no libmpi"):
            native.attach(g)
        assert g._native is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (warned once: no second warning, no second try)
            native.attach(g)
        assert g._native is None
        monkeypatch.setenv(native.ENV, "1")
        with pytest.raises(RuntimeError, match=r"no libmpi here\); unset PYCOLL_NATIVE"):
            native.configure()
        x = np.ones(2)
        for _ in range(CALLS):
            pycoll.all_reduce(x, group=g)
        assert x[0] == pycoll.get_world_size() ** CALLS
    finally:
        pycoll.destroy_process_group(g)
