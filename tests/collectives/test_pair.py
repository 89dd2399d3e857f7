"""Small all_reduce, reduce and reduce_scatter_tensor of two ranks as one exchange
(pycoll.collectives.pair).

The tests make every call on two ranks below the path's size take it (by
default only Open MPI in the default wait mode does), on a group of ranks 0
and 1 (the world on two ranks; a rank outside it checks that the call is
none of its business), and check the results against numpy's own reduction,
the bits against the other rank's, and the calls the compiled path keeps
(pycoll.native) against the plain path's on the other rank."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import List

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, _mpi, crosscheck, debug, native, watch
from pycoll.collectives import pair as pair_mod
from pycoll.kernels import words
from support import (
    BF16,
    FLOATS,
    LATE_TIMEOUT,
    assert_equal,
    at_detail,
    data,
    late_rank_named,
    record_arg,
    reduce_all,
    rop,
    two_rank_reduce_checked,
    valid_pairs,
)

# Any size of job: the two-rank exchange runs on a group of ranks 0 and 1.
pytestmark = pytest.mark.any_size

PAIRS = valid_pairs()
K = 13


def count_pairs(monkeypatch) -> List[str]:
    """Record the collective of every call the path makes in Python (a kept
    call's later calls are made by the compiled code), the real function
    still making it."""
    return record_arg(monkeypatch, pair_mod, "_call", 1)


@pytest.fixture
def forced(monkeypatch, world_size):
    """Every all_reduce, reduce and reduce_scatter_tensor on two ranks below
    64 KiB takes the path, on any MPI and in either wait mode. Yields the
    calls made."""
    if world_size == 1:
        pytest.skip("the path runs on two ranks")
    monkeypatch.setattr(
        pair_mod, "applies", lambda func, ranks, nbytes: ranks == 2 and nbytes < 65536
    )
    yield count_pairs(monkeypatch)


@pytest.fixture
def two(forced, rank):
    """A group of ranks 0 and 1 (on the others, what new_group gives a rank
    outside), destroyed after the test unless a fault broke it."""
    g = pycoll.new_group([0, 1])
    yield g
    if rank < 2 and g._broken is None:
        pycoll.destroy_process_group(g)


def plain_op(op, dtype) -> bool:
    """Whether MPI alone carries the op (no pre-scaling, no division after):
    the path's calls. A two-rank AVG is one user op, but not for complex."""
    if op == "PREMUL_SUM":
        return False
    return not (op == "AVG" and np.dtype(dtype).kind in "cbiu")


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_all_reduce_every_op_and_dtype(two, forced, op, dtype, async_op, rank):
    x = data(rank, dtype, (K, 2))
    work = pycoll.all_reduce(x, op=rop(op), group=two, async_op=async_op)
    if rank >= 2:
        assert work is None and forced == []
        return
    if async_op:
        assert work.wait() is True and work.result() == [x]
    assert_equal(x, reduce_all(op, [data(r, dtype, (K, 2)) for r in range(2)], 2))
    assert forced == ["all_reduce"] * plain_op(op, dtype)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("dst", [0, 1])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_every_op_and_dtype(two, forced, op, dtype, dst, async_op, rank):
    x = data(rank, dtype, (K, 2))
    before = x.copy()
    work = pycoll.reduce(x, dst=dst, op=rop(op), group=two, async_op=async_op)
    if not two_rank_reduce_checked(work, x, before, op, dtype, (K, 2), rank, dst, async_op):
        assert forced == []  # (outside the group)
        return
    # (a two-rank AVG reduce keeps its division after MPI's sum: not the path's)
    assert forced == ["reduce"] * (plain_op(op, dtype) and op != "AVG")


def takes_exchange_scattered(op, dtype) -> bool:
    """Whether a reduce-scatter with ``op`` on ``dtype`` is the exchange's: MPI's
    op alone, and not MIN or MAX of floats (their bits follow the order)."""
    ordered = op in ("MIN", "MAX") and np.dtype(dtype) in FLOATS
    return plain_op(op, dtype) and op != "AVG" and not ordered


def scatter_output(form, x, rank, dtype):
    """The output of a reduce-scatter of ``x`` (2K rows): this rank's half of
    ``x`` itself, as torch's in-place form, or an array of its own."""
    if form == "in place":
        return x[K * rank : K * (rank + 1)] if rank < 2 else x[:K]
    return np.zeros((K,) + x.shape[1:], dtype)


def scattered_inside(work, out, forced, async_op, rank) -> bool:
    """Whether this rank is inside the group of a reduce-scatter into ``out``
    that gave ``work``: outside it, the call is none of its business (no Work,
    no call made); inside, an async call's Work completes with ``out`` first."""
    if rank >= 2:
        assert work is None and forced == []
        return False
    if async_op:
        assert work.wait() is True and work.result()[0] is out
    return True


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("form", ["out of place", "in place"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_every_op_and_dtype(two, forced, op, dtype, form, async_op, rank):
    x = data(rank, dtype, (2 * K, 3))
    before = x.copy()
    out = scatter_output(form, x, rank, dtype)
    work = pycoll.reduce_scatter_tensor(out, x, op=rop(op), group=two, async_op=async_op)
    if not scattered_inside(work, out, forced, async_op, rank):
        return
    want = reduce_all(op, [data(r, dtype, (2 * K, 3)) for r in range(2)], 2)
    assert_equal(out, want[K * rank : K * (rank + 1)])
    if form == "out of place":
        assert_equal(x, before)  # (the input only read)
    else:
        assert_equal(x[K * (1 - rank) : K * (2 - rank)], before[K * (1 - rank) : K * (2 - rank)])
    assert forced == ["reduce_scatter_tensor"] * takes_exchange_scattered(op, dtype)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_list_every_op_and_dtype(two, forced, op, dtype, async_op, rank):
    """torch's list form: one array per rank, each sent or folded where it is."""
    inputs = [data(rank, dtype, (K, 3), salt=d) for d in range(2)]
    before = [x.copy() for x in inputs]
    out = np.zeros((K, 3), dtype)
    work = pycoll.reduce_scatter(out, inputs, op=rop(op), group=two, async_op=async_op)
    if not scattered_inside(work, out, forced, async_op, rank):
        return
    assert_equal(out, reduce_all(op, [data(r, dtype, (K, 3), salt=rank) for r in range(2)], 2))
    for x, was in zip(inputs, before):
        assert_equal(x, was)  # (the list only read)
    assert forced == ["reduce_scatter"] * takes_exchange_scattered(op, dtype)


def test_a_reduce_scatter_list_holding_its_output(two, forced, rank):
    """The output one of the list's arrays (MPI's buffers may not overlap):
    folded aside, then copied in."""
    if rank >= 2:
        return
    inputs = [np.arange(K, dtype=np.float64) + 10 * d + rank for d in range(2)]
    want = np.arange(K, dtype=np.float64) * 2 + 20 * rank + 1
    pycoll.reduce_scatter(inputs[rank], inputs, group=two)
    assert_equal(inputs[rank], want)
    assert forced == ["reduce_scatter"]


@pytest.mark.parametrize("form", ["tensor", "list"])
def test_ranks_whose_outputs_lie_differently_meet(forced, form, rank):
    """Rank 0's output overlaps its input (straddling the tensor's parts, or
    one of the list's arrays), rank 1's is an array of its own: the path
    follows only what both ranks share, so the two meet, where a path chosen
    by each rank's layout left them in different calls until the timeout (in
    blocking mode, until the watchdog ended the job)."""
    g = pycoll.new_group([0, 1], timeout=timedelta(seconds=20))
    if rank >= 2:
        pycoll.barrier()  # (outside the group: only the barrier the others meet at)
        return
    want = np.arange(2 * K, dtype=np.float64) * 2 + 1  # (the sum of both ranks' inputs)
    if form == "tensor":
        x = np.arange(2 * K, dtype=np.float64) + rank
        out = x[K // 2 : K // 2 + K] if rank == 0 else np.zeros(K)
        pycoll.reduce_scatter_tensor(out, x, group=g)
    else:
        inputs = [np.arange(K, dtype=np.float64) + K * d + rank for d in range(2)]
        out = inputs[1] if rank == 0 else np.zeros(K)
        pycoll.reduce_scatter(out, inputs, group=g)
    assert_equal(out, want[K * rank : K * (rank + 1)])
    assert forced == [{"tensor": "reduce_scatter_tensor", "list": "reduce_scatter"}[form]]
    pycoll.barrier()


@pytest.mark.parametrize("count", [0, 1, 7, 8191], ids=lambda c: f"{c} elements a part")
def test_reduce_scatter_sizes(two, forced, count, rank):
    """Parts of no element, one, an odd count, the largest below 64 KiB of
    input; out of place and in place."""
    if rank >= 2:
        return
    x = np.arange(2 * count, dtype=np.float32) + rank
    want = np.arange(2 * count, dtype=np.float32) * 2 + 1
    out = np.empty(count, np.float32)
    pycoll.reduce_scatter_tensor(out, x, group=two)
    assert_equal(out, want[count * rank : count * (rank + 1)])
    pycoll.reduce_scatter_tensor(x[count * rank : count * (rank + 1)], x, group=two)
    assert_equal(x[count * rank : count * (rank + 1)], want[count * rank : count * (rank + 1)])
    assert forced == ["reduce_scatter_tensor"] * 2


def test_a_reduce_scatter_output_straddling_the_parts(two, forced, rank):
    """An output inside the input that is not this rank's part (torch's
    in-place form is): folded aside, then copied in."""
    if rank >= 2:
        return
    x = np.arange(2 * K, dtype=np.float64) + rank
    want = np.arange(2 * K, dtype=np.float64) * 2 + 1
    out = x[K // 2 : K // 2 + K]
    pycoll.reduce_scatter_tensor(out, x, group=two)
    assert_equal(out, want[K * rank : K * (rank + 1)])
    assert forced == ["reduce_scatter_tensor"]


def test_the_other_ranks_array_may_be_read_only(two, forced, rank):
    x = np.full(K, rank + 1.0)
    if rank == 1:
        x.flags.writeable = False
    if rank < 2:
        pycoll.reduce(x, dst=0, group=two)
        assert_equal(x, np.full(K, 3.0 if rank == 0 else 2.0))
        assert forced == ["reduce"]


@pytest.mark.parametrize("op", ["MIN", "MAX", "SUM", "PRODUCT"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16], ids=str)
def test_both_ranks_end_with_the_same_bits(two, forced, op, dtype, rank):
    """Signed zeros, NaN and infinities on one rank and not the other: MIN and
    MAX of 0.0 and -0.0 give either zero by their order, so both ranks fold
    rank 0's array into rank 1's."""
    if rank >= 2:
        return
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(11 + rank)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0], np.float64)
    x = rng.choice(specials, 600).astype(dtype)
    x[:4] = [0.0, -0.0, -0.0, 0.0] if rank else [-0.0, 0.0, -0.0, 0.0]
    mine = x.copy()
    with np.errstate(invalid="ignore"):
        pycoll.all_reduce(x, op=rop(op), group=two)
    words = x.view(f"u{dtype.itemsize}")
    both: list = [None, None]
    pycoll.all_gather_object(both, (words.tobytes(), mine), group=two)
    theirs = np.frombuffer(both[1 - rank][0], words.dtype)
    assert np.array_equal(words, theirs), "the ranks differ in some element's bits"
    with np.errstate(invalid="ignore"):
        want = reduce_all(op, [both[0][1], both[1][1]], 2).astype(np.float32)
    got = x.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])  # (0.0 == -0.0)
    assert forced == ["all_reduce"]


@pytest.mark.parametrize("count", [0, 1, 2, 1000, 16383], ids=lambda c: f"{c} elements")
def test_sizes(two, forced, count, rank):
    """No element, one, two, many, the largest below 64 KiB; a 0-d array."""
    if rank >= 2:
        return
    x = np.arange(count, dtype=np.float32) + rank
    pycoll.all_reduce(x, group=two)
    assert_equal(x, np.arange(count, dtype=np.float32) * 2 + 1)
    y = np.arange(count, dtype=np.float32) + rank
    pycoll.reduce(y, dst=1, group=two)
    assert_equal(y, np.arange(count, dtype=np.float32) * (2 if rank else 1) + rank)
    z = np.array(rank + 2.0)
    pycoll.all_reduce(z, op=ReduceOp.PRODUCT, group=two)
    assert z.shape == () and z == 6.0
    assert forced == ["all_reduce", "reduce", "all_reduce"]


def test_calls_in_flight_keep_their_messages_apart(two, forced, rank):
    """Three async calls, waited for in opposite orders on the two ranks:
    without a tag per call one call's message would match another's."""
    if rank >= 2:
        return
    xs = [np.arange(37, dtype=np.float64) * (k + 1) + rank for k in range(3)]
    works = [pycoll.all_reduce(x, group=two, async_op=True) for x in xs]
    works.append(pycoll.reduce(xs[0] * 0 + rank + 5, dst=0, group=two, async_op=True))
    out = np.zeros(37)
    works.append(pycoll.reduce_scatter_tensor(out, np.arange(74.0) + rank, group=two,
                                              async_op=True))  # fmt: skip
    for k in range(5) if rank == 0 else reversed(range(5)):
        assert works[k].wait() is True
    for k in range(3):
        assert_equal(xs[k], np.arange(37, dtype=np.float64) * (k + 1) * 2 + 1)
    assert_equal(out, (np.arange(74.0) * 2 + 1)[37 * rank : 37 * (rank + 1)])
    assert len(forced) == 5


def test_sync_and_async_calls_match(two, forced, rank):
    if rank >= 2:
        return
    x = np.full(K, rank + 1.0)
    if rank:
        assert pycoll.all_reduce(x, group=two, async_op=True).wait() is True
    else:
        assert pycoll.all_reduce(x, group=two) is None
    assert_equal(x, np.full(K, 3.0))


def test_detail_checks_it(two, forced, rank):
    if rank >= 2:
        return
    with at_detail():
        x = np.full(K, rank + 1.0, np.float32)
        pycoll.all_reduce(x, op=ReduceOp.AVG, group=two)
        assert_equal(x, np.full(K, 1.5, np.float32))
        y = np.full(K, rank + 1.0)
        pycoll.reduce(y, dst=1, op=ReduceOp.MAX, group=two)
        assert_equal(y, np.full(K, 2.0 if rank else 1.0))
        z = np.full(2 * K, rank + 1, np.int64)
        pycoll.reduce_scatter_tensor(z[K * rank : K * (rank + 1)], z, op=ReduceOp.MIN, group=two)
        assert_equal(z[K * rank : K * (rank + 1)], np.ones(K, np.int64))
    assert forced == ["all_reduce", "reduce", "reduce_scatter_tensor"]


def kept_what(g, x) -> List[int]:
    """What the compiled calls kept on ``x`` start (pycoll.native's WHAT words)."""
    found, link = [], g._native.calls.get(id(x)) if g._native is not None else None
    while link is not None:
        found.append(int(link[native._WORDS][0][words.WHAT]))
        link = link[native._NEXT]
    return found


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.complex128, BF16], ids=str)
def test_kept_calls_against_calls_made_afresh(two, forced, dtype, rank):
    """Rank 0 makes the same calls again on the same arrays, so the compiled
    code makes them (pycoll.native, attached from the group's first call);
    rank 1 makes each on a new array, on the plain path: the two meet, and
    the results are right on both, the fold and the copy back included."""
    if not debug.PLAIN:
        pytest.skip("the compiled path is off at DETAIL")
    if rank >= 2:
        return
    native.attach(two)
    if two._native is None:
        pytest.skip("the compiled path is off in this process")
    dtype = np.dtype(dtype)
    op = "SUM" if dtype.kind == "c" else "MAX"
    x, y = np.empty(5, dtype), np.empty(5, dtype)
    z, w = np.empty(10, dtype), np.empty(5, dtype)  # (a reduce-scatter's input and output)
    v, parts = np.empty(5, dtype), [np.empty(5, dtype), np.empty(5, dtype)]  # (its list form's)
    for k in range(6):
        if rank == 1:
            x, y = np.empty(5, dtype), np.empty(5, dtype)
            z, w = np.empty(10, dtype), np.empty(5, dtype)
        x[...] = data(rank, dtype, (5,), salt=k)
        pycoll.all_reduce(x, op=rop(op), group=two)
        assert_equal(x, reduce_all(op, [data(r, dtype, (5,), salt=k) for r in (0, 1)], 2))
        y[...] = data(rank, dtype, (5,), salt=k)
        pycoll.reduce(y, dst=k % 2, group=two)
        if rank == k % 2:
            assert_equal(y, reduce_all("SUM", [data(r, dtype, (5,), salt=k) for r in (0, 1)], 2))
        else:
            assert_equal(y, data(rank, dtype, (5,), salt=k))
        z[...] = data(rank, dtype, (10,), salt=k)
        want = reduce_all("SUM", [data(r, dtype, (10,), salt=k) for r in (0, 1)], 2)
        pycoll.reduce_scatter_tensor(w, z, group=two)
        assert_equal(w, want[5 * rank : 5 * rank + 5])
        pycoll.reduce_scatter_tensor(z[5 * rank : 5 * rank + 5], z, group=two)  # (torch's in place)
        assert_equal(z[5 * rank : 5 * rank + 5], want[5 * rank : 5 * rank + 5])
        mine = data(rank, dtype, (10,), salt=k)
        parts[0][...], parts[1][...] = mine[:5], mine[5:]
        pycoll.reduce_scatter(v, parts, group=two)  # (the list form)
        assert_equal(v, want[5 * rank : 5 * rank + 5])
        if rank == 1:
            v, parts = np.empty(5, dtype), [np.empty(5, dtype), np.empty(5, dtype)]
    if rank == 0:  # (kept from their second call: two calls each in Python)
        assert kept_what(two, x) == [native.PAIR]
        assert kept_what(two, y) == [native.PAIR, native.PAIR]  # (dst 1, then dst 0)
        assert kept_what(two, w) == [native.PAIR] and kept_what(two, z) == [native.PAIR]
        assert kept_what(two, v) == [native.PAIR]
        assert forced.count("all_reduce") == 2 and forced.count("reduce") == 3
        assert forced.count("reduce_scatter_tensor") == 4 and forced.count("reduce_scatter") == 2
    else:
        assert forced.count("all_reduce") == 6 and forced.count("reduce") == 6
        assert forced.count("reduce_scatter_tensor") == 12 and forced.count("reduce_scatter") == 6


def test_a_late_rank_is_named_by_the_timeout(forced, rank):
    if watch.BLOCKING:
        pytest.skip("a blocking call's timeout ends the job (tests/test_hangs.py)")
    g = pycoll.new_group([0, 1], timeout=LATE_TIMEOUT)
    x = np.ones(K)
    if rank < 2:
        late_rank_named(lambda: pycoll.all_reduce(x, group=g), "all_reduce", rank, 1)
    else:
        pycoll.barrier()  # (outside the group: only the barrier the others meet at)
    assert forced == (["all_reduce"] if rank == 0 else [])


def test_a_late_rank_is_named_on_the_compiled_path(forced, rank):
    """A kept call whose tests run out waits in Python, within the group's
    timeout, for the request the compiled code left."""
    if watch.BLOCKING or not debug.PLAIN:
        pytest.skip("blocking mode ends the job at a timeout; DETAIL has no compiled path")
    g = pycoll.new_group([0, 1], timeout=timedelta(seconds=3))
    if rank < 2:
        native.attach(g)
    x = np.ones(K)
    if rank < 2:
        for _ in range(2):
            pycoll.all_reduce(x, group=g)
    if rank == 0 and g._native is not None:
        assert kept_what(g, x) == [native.PAIR]
    started = time.monotonic()
    if rank == 0:
        with pytest.raises(pycoll.DistTimeoutError, match=r"all_reduce \(seq 3\)") as caught:
            pycoll.all_reduce(x, group=g)
        assert time.monotonic() - started < 60
        assert "rank 1: has not reached it" in str(caught.value)
    pycoll.barrier()


@pytest.mark.parametrize("how", ["sync", "async", "detail"])
def test_a_fold_mpi_refuses_fails_the_call_as_mpis_errors_do(two, forced, how, rank):
    """MPI_Reduce_local refusing the fold (BAND of floats, which MPI has not
    and pycoll's checks never let through: given here straight to the path)
    fails the call on both ranks with the DistBackendError an MPI operation's
    error gives, on the plain path, a Work's and the checked one; the group
    goes on."""
    if rank >= 2:
        return
    MPI = _mpi.MPI
    x = np.ones(K, np.float32)
    key = crosscheck.key("all_reduce", x.dtype, x.size, 0, "BAND")

    def call():
        work = pair_mod.all_reduce(
            two, x, MPI.BAND, MPI.FLOAT, False, how == "async", key,
            lambda: "all_reduce(BAND)", ReduceOp.BAND, None,
        )  # fmt: skip
        if how == "async":
            work.wait()

    with pytest.raises(pycoll.DistBackendError, match=r"all_reduce \(seq \d+\) failed in MPI"):
        if how == "detail":
            with at_detail():
                call()
        else:
            call()
    y = np.full(K, rank + 1.0, np.float32)
    pycoll.all_reduce(y, group=two)
    assert_equal(y, np.full(K, 3.0, np.float32))


def test_not_for_arrays_that_alias_device_memory(two, forced, rank):
    from pycoll.collectives._common import device_aliases

    if rank >= 2:
        return
    x = np.full(K, rank + 1.0, np.float32)
    with device_aliases(two):
        pycoll.all_reduce(x, group=two)
    assert_equal(x, np.full(K, 3.0, np.float32))
    assert forced == []


def test_the_built_in_rule(rank, world_size):
    """By default, in the default wait mode, below 64 KiB on two ranks: an
    all_reduce on Open MPI, an all_reduce or reduce on MPICH from 16 KiB; a
    reduce_scatter_tensor below where the pairwise exchange takes over;
    never in blocking mode, nor on more ranks."""
    from pycoll import _mpi

    if pair_mod._SET is not None:
        pytest.skip("PYCOLL_PAIR_BYTES is set")
    assert (pair_mod.BYTES, pair_mod.MPICH_FROM) == (64 << 10, 16 << 10)
    assert pair_mod.SCATTER_BELOW == {"Open MPI": 256 << 10, "MPICH": 1 << 20}
    poll = not watch.BLOCKING
    open_mpi, mpich = _mpi.VENDOR == "Open MPI", _mpi.VENDOR == "MPICH"
    below = (64 << 10) - 1
    for ranks, nbytes, all_reduce, reduce in [
        (2, 0, open_mpi, False),
        (2, 8, open_mpi, False),
        (2, (16 << 10) - 1, open_mpi, False),
        (2, 16 << 10, open_mpi or mpich, mpich),
        (2, below, open_mpi or mpich, mpich),
        (2, 64 << 10, False, False),
        (3, 8, False, False),
        (4, 16 << 10, False, False),
    ]:
        assert pair_mod.applies("all_reduce", ranks, nbytes) is (all_reduce and poll)
        assert pair_mod.applies("reduce", ranks, nbytes) is (reduce and poll)
    # reduce_scatter_tensor, by its input's bytes: on Open MPI below 256 KiB, on
    # MPICH from 16 KiB below 1 MiB (where pycoll's pairwise exchange takes over)
    for ranks, nbytes, scattered in [
        (2, 0, open_mpi),
        (2, 8, open_mpi),
        (2, (16 << 10) - 1, open_mpi),
        (2, 16 << 10, open_mpi or mpich),
        (2, (256 << 10) - 1, open_mpi or mpich),
        (2, 256 << 10, mpich),
        (2, (1 << 20) - 1, mpich),
        (2, 1 << 20, False),
        (3, 16 << 10, False),
        (4, 8, False),
    ]:
        assert pair_mod.applies("reduce_scatter_tensor", ranks, nbytes) is (scattered and poll)
        assert pair_mod.applies("reduce_scatter", ranks, nbytes) is (scattered and poll)


def test_the_rule_in_blocking_mode(monkeypatch):
    monkeypatch.setattr(watch, "BLOCKING", True)
    if pair_mod._SET is not None:
        pytest.skip("PYCOLL_PAIR_BYTES is set")
    assert not pair_mod.applies("all_reduce", 2, 8)
    assert not pair_mod.applies("all_reduce", 2, 16 << 10)
    assert not pair_mod.applies("reduce", 2, 16 << 10)
    assert not pair_mod.applies("reduce_scatter_tensor", 2, 16 << 10)
    assert not pair_mod.applies("reduce_scatter", 2, 16 << 10)


def test_not_on_an_mpi_without_isendrecv(monkeypatch):
    """MPI_Isendrecv came with MPI-4.0: on an older MPI the path is never
    taken, whatever PYCOLL_PAIR_BYTES says, and the compiled code links its
    symbol to a stub that returns MPI_ERR_OTHER."""
    from pycoll import _mpi

    assert _mpi.has("MPI_Isendrecv") and _mpi.has("MPI_Reduce_local")
    assert not _mpi.has("MPI_No_such_function")
    monkeypatch.setattr(pair_mod, "_SET", 1 << 20)
    monkeypatch.setattr(pair_mod, "BYTES", 1 << 20)
    assert pair_mod.applies("all_reduce", 2, 8)
    monkeypatch.setitem(_mpi._HAS, "MPI_Isendrecv", False)
    assert not pair_mod.applies("all_reduce", 2, 8)
    assert not pair_mod.applies("reduce", 2, 16 << 10)
    starts = pytest.importorskip("pycoll.kernels.starts")
    import ctypes

    stub = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_int64] * 12)(starts._stub("MPI_Isendrecv"))
    assert stub(*range(12)) == _mpi.MPI.ERR_OTHER


def test_pycolls_other_point_to_point_paths_need_isendrecv_too(monkeypatch):
    """The ring, the doubling, the pairwise exchange and the reduce to a root
    (their common rule, pycoll.paths.own_carries) and the device ring send
    with MPI_Isendrecv too: on an MPI without it MPI's own calls stay."""
    from pycoll import _mpi, paths
    from pycoll.ops import plan

    f32 = np.dtype(np.float32)
    call = paths.Call("all_reduce", "SUM", f32, 1 << 20, 2, plan(ReduceOp.SUM, f32, "all_reduce"))
    assert paths.own_carries(call)
    monkeypatch.setitem(_mpi._HAS, "MPI_Isendrecv", False)
    assert not paths.own_carries(call)
