"""The default mode's call check (pycoll.crosscheck): ranks that disagree about
a collective's arguments, or skip one, get a CollectiveMismatchError on every
rank within 2 x PYCOLL_CHECK_EVERY calls, naming the call, its sequence number
and the ranks; a short program is checked when its group is destroyed."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

import pycoll
from pycoll import CollectiveMismatchError, DistTimeoutError, ReduceOp, crosscheck

EVERY = crosscheck.DEFAULT_EVERY


def mpich_only():
    """Open MPI reports arrays of different sizes itself (MPI_ERR_TRUNCATE on
    one rank; the others then time out), and so does MPICH's blocking
    all_reduce (PYCOLL_WAIT=blocking); MPICH's nonblocking one runs them silently."""
    from pycoll import _mpi, watch

    if _mpi.VENDOR != "MPICH":
        pytest.skip("Open MPI reports this mismatch itself (MPI_ERR_TRUNCATE)")
    if watch.BLOCKING:
        pytest.skip("MPICH's blocking all_reduce reports this mismatch itself (truncated)")


@pytest.fixture
def group(pg, world_size, debug_off):
    """A fresh group of every rank (the mismatch leaves it unusable); DETAIL
    off, since DETAIL stops a mismatched call before it runs (test_detail.py)."""
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    assert crosscheck.EVERY == EVERY  # the suite runs with the default
    g = pycoll.new_group()
    yield g
    try:
        pycoll.destroy_process_group(g)
    except CollectiveMismatchError:
        pass  # the test has already checked what it found


def until_found(group, step, calls=2 * EVERY + 2):
    """Make ``step()`` calls on ``group`` (they agree) until the check raises;
    return the error and how many calls it took."""
    for made in range(1, calls + 1):
        try:
            step()
        except CollectiveMismatchError as error:
            return error, made
    raise AssertionError(f"no CollectiveMismatchError in {calls} calls")


def agreeing(group):
    x = np.ones(3, np.float32)
    return lambda: pycoll.all_reduce(x, group=group)


def others_than(rank_, world_size):
    """'rank 1' or 'ranks 1,2': every rank but ``rank_``."""
    others = [str(r) for r in range(world_size) if r != rank_]
    return ("rank " if len(others) == 1 else "ranks ") + ",".join(others)


def test_different_lengths_are_found_within_two_exchanges(group, rank, world_size):
    mpich_only()
    last = world_size - 1
    seq = group.sequence_number() + 1
    x = np.ones(4 if rank == last else 6, np.float32)
    pycoll.all_reduce(x, group=group)  # MPI runs it: the results are wrong
    error, made = until_found(group, agreeing(group))
    assert made <= 2 * EVERY
    msg = str(error)
    assert msg.startswith(
        f"the ranks of group {group.group_desc!r} called different collectives at seq {seq}: "
        f"{others_than(last, world_size)} called all_reduce(SUM, float32, 6 elements) "
        f"while rank {last} called all_reduce(SUM, float32, 4 elements)."
    ), msg
    assert "the results from seq" in msg and "the group is unusable" in msg
    assert error.seq == seq and error.op == "all_reduce"
    assert error.calls[last] == "all_reduce(SUM, float32, 4 elements)"
    assert isinstance(error, RuntimeError)
    with pytest.raises(CollectiveMismatchError, match="is unusable: its ranks called different"):
        pycoll.all_reduce(np.ones(3, np.float32), group=group)


def test_different_dtypes_of_the_same_size(group, rank, world_size):
    # Of one item size: MPI combines the bytes as each rank's type says and
    # reports nothing (float64 against float32 crashed MPICH instead).
    x = np.ones(5, np.int32 if rank == 0 else np.float32)
    seq = group.sequence_number() + 1
    pycoll.all_reduce(x, group=group)
    error, _ = until_found(group, agreeing(group))
    assert f"called different collectives at seq {seq}: " in str(error)
    assert f"{others_than(0, world_size)} called all_reduce(SUM, float32, 5 elements)" in (
        str(error)
    )
    assert "rank 0 called all_reduce(SUM, int32, 5 elements)" in str(error)


def test_different_roots(group, rank, world_size):
    # The last rank thinks it is src: it sends, and receives nothing. (Had two
    # ranks each waited to receive from the other, it would hang instead: the
    # timeout's diagnosis covers that.)
    last = world_size - 1
    x = np.arange(4, dtype=np.int64)
    pycoll.broadcast(x, src=last if rank == last else 0, group=group)
    error, _ = until_found(group, agreeing(group))
    assert error.calls[0] == "broadcast(src=0, int64, 4 elements)"
    assert error.calls[last] == f"broadcast(src={last}, int64, 4 elements)"


def test_roots_that_never_wait_find_it_within_two_exchanges_too(group, rank, world_size):
    """Every rank broadcasts naming itself the root, so no rank ever waits in
    its calls: the bound must hold all the same, on every rank."""
    x = np.full(4, rank, np.int64)
    seq = group.sequence_number() + 1
    error, made = until_found(group, lambda: pycoll.broadcast(x, src=rank, group=group))
    assert made <= 2 * EVERY, made
    assert f"called different collectives at seq {seq}: " in str(error)
    assert error.calls[rank] == f"broadcast(src={rank}, int64, 4 elements)"


def test_different_reductions(group, rank, world_size):
    x = np.ones(2, np.float32)
    pycoll.all_reduce(x, op=ReduceOp.MAX if rank == 0 else ReduceOp.SUM, group=group)
    error, _ = until_found(group, agreeing(group))
    assert "rank 0 called all_reduce(MAX, float32, 2 elements)" in str(error)


def test_all_gather_into_tensor_with_different_sizes(group, rank, world_size):
    mpich_only()
    n = 3 if rank == 0 else 2
    out = np.zeros(n * world_size, np.int32)
    pycoll.all_gather_into_tensor(out, np.full(n, rank, np.int32), group=group)
    error, _ = until_found(group, agreeing(group))
    assert "rank 0 called all_gather_into_tensor(int32, 3 elements)" in str(error)


def test_a_skipped_collective_is_named(group, rank, world_size):
    """Rank 0 skips one call in a loop of two all_reduces of different dtypes
    of one size: from then on each of its calls pairs with the others' call
    one seq later, and MPI reports nothing. (Had the skipped call been another
    kind of collective, the ranks would hang instead: the timeout's diagnosis
    names the rank that called a different collective.)"""
    x, y = np.ones(2, np.float32), np.ones(2, np.int32)
    seq = group.sequence_number() + 4

    def step(skip):
        pycoll.all_reduce(x, group=group)
        if not skip:
            pycoll.all_reduce(y, group=group)

    step(False)
    step(rank == 0)
    error, _ = until_found(group, lambda: step(False))
    msg = str(error)
    assert f"called different collectives at seq {seq}: " in msg, msg
    assert "rank 0 called all_reduce(SUM, float32, 2 elements)" in msg
    assert f"{others_than(0, world_size)} called all_reduce(SUM, int32, 2 elements)" in msg
    if world_size == 2:  # no majority: either could have skipped
        assert f"one side skipped a collective at seq {seq} (or made one more)" in msg, msg
    else:
        assert f"rank 0 skipped the collective the others made at seq {seq}" in msg, msg


def test_a_short_program_is_checked_when_the_group_is_destroyed(pg, rank, world_size, debug_off):
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    g = pycoll.new_group()
    x = np.ones(2, np.int32 if rank == 1 else np.float32)
    pycoll.all_reduce(x, group=g)  # seq 1, then nothing until destroy
    with pytest.raises(CollectiveMismatchError, match="at seq 1: ") as info:
        pycoll.destroy_process_group(g)
    assert info.value.calls[1] == "all_reduce(SUM, int32, 2 elements)"
    assert g not in pycoll.groups.STATE.groups.values()  # freed all the same


def test_destroy_gives_up_at_once_on_a_rank_whose_call_timed_out(
    pg, rank, world_size, debug_off, monkeypatch
):
    """A rank whose collective timed out takes no part in the group's last
    check; the late rank, destroying the group, reads so in its progress
    record and goes on at once, instead of waiting out FINAL_WAIT (here 90 s:
    the late rank's group timeout is longer, so that is its deadline)."""
    if world_size == 1:
        pytest.skip("needs a rank to be late")
    monkeypatch.setattr(crosscheck, "FINAL_WAIT", 90.0)
    last = world_size - 1
    g = pycoll.new_group(timeout=timedelta(seconds=600 if rank == last else 2))
    pycoll.all_reduce(np.ones(2), group=g)  # seq 1, everyone
    if rank != last:  # seq 2, without the last rank (a Work: waited for in both wait modes)
        work = pycoll.all_reduce(np.ones(2), group=g, async_op=True)
        with pytest.raises(DistTimeoutError, match=f"rank {last}: has not reached it"):
            work.wait()
    pycoll.barrier()  # (the default group: the late rank joins here)
    started = time.monotonic()
    pycoll.destroy_process_group(g)
    assert time.monotonic() - started < 45  # (before this change: 90 s on the late rank)
    assert g not in pycoll.groups.STATE.groups.values()


def test_an_extra_last_call_shows_in_the_counts(pg, rank, world_size, debug_off):
    """Rank 0 broadcasts once more than the others: as src it only sends, so
    its call completes, and MPI reports nothing; the counts tell."""
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    g = pycoll.new_group()
    pycoll.barrier(group=g)
    if rank == 0:
        pycoll.broadcast(np.ones(1), src=0, group=g)
    with pytest.raises(CollectiveMismatchError) as info:
        pycoll.destroy_process_group(g)
    assert f"{others_than(0, world_size)} made 1, rank 0 made 2" in str(info.value)


def test_agreeing_calls_pass_many_exchanges(pg, rank, world_size, debug_off):
    """Thousands of agreeing calls of several kinds, sync and async: no false
    alarm, on the way nor at the end."""
    group = pycoll.new_group()
    x, y = np.ones(5, np.float32), np.zeros(7, np.int16)
    out = np.zeros(5 * world_size, np.float32)
    for i in range(6 * EVERY):
        pycoll.all_reduce(x, op=ReduceOp.MAX, group=group)
        pycoll.broadcast(y, src=i % world_size, group=group)
        pycoll.all_gather_into_tensor(out, x, group=group)
        pycoll.all_reduce(x, group=group, async_op=True).wait()
    pycoll.destroy_process_group(group)


def test_the_check_is_off_with_every_zero(pg, rank, world_size, debug_off, monkeypatch):
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    monkeypatch.setattr(crosscheck, "EVERY", 0)
    g = pycoll.new_group()
    assert len(g._keys) == 1024  # the exchange point comes rarely, and does nothing
    pycoll.all_reduce(np.ones(2, np.int64 if rank else np.float64), group=g)
    for _ in range(2 * EVERY):
        agreeing(g)()
    pycoll.destroy_process_group(g)  # nothing exchanged, nothing found


def test_every_from_env(monkeypatch):
    for raw, every in (("", 128), ("0", 0), ("2", 2), ("64", 64)):
        monkeypatch.setenv("PYCOLL_CHECK_EVERY", raw)
        assert crosscheck.every_from_env() == every
    for raw in ("1", "3", "-4", "many"):
        monkeypatch.setenv("PYCOLL_CHECK_EVERY", raw)
        with pytest.raises(ValueError, match="PYCOLL_CHECK_EVERY must be 0 .* got"):
            crosscheck.every_from_env()


def test_a_row_claiming_more_calls_than_it_holds_is_read_within_its_length():
    """A row of nonsense (a buffer MPI matched from some other collective)
    is read as at most its own length of calls, not walked for 2**62."""
    every = 8
    good = np.zeros(every + 2, np.int64)
    good[0], good[1] = 3, 3
    good[2 + 1 : 2 + 4] = [11, 12, 13]
    assert crosscheck._calls(good, every) == {1: 11, 2: 12, 3: 13}
    bad = np.full(every + 2, 2**62, np.int64)
    started = time.monotonic()
    assert crosscheck._calls(bad, every).keys() == set(range(2**62 - every + 1, 2**62 + 1))
    assert time.monotonic() - started < 5


def test_keys_describe_the_call():
    ranks = [4, 5, 6]
    k = crosscheck.key("reduce", np.dtype(np.float16), 12, 2, "AVG")
    assert crosscheck.describe(k, ranks) == "reduce(AVG, dst=6, float16, 12 elements)"
    assert crosscheck.describe(crosscheck.key("barrier"), ranks) == "barrier()"
    k = crosscheck.key("scatter_object_list", root=1)
    assert crosscheck.describe(k, ranks) == "scatter_object_list(src=5)"
    assert crosscheck.describe(crosscheck.key("all_to_all", np.dtype("bool")), ranks) == (
        "all_to_all(bool)"
    )
    same = crosscheck.key("all_reduce", np.dtype(np.float32), 1, redop="SUM")
    assert same != crosscheck.key("all_reduce", np.dtype(np.float32), 2, redop="SUM")
    assert same != crosscheck.key("all_reduce", np.dtype(np.int32), 1, redop="SUM")
    assert same != crosscheck.key("all_reduce", np.dtype(np.float32), 1, redop="AVG")
    assert same != crosscheck.key("reduce", np.dtype(np.float32), 1, redop="SUM")
    assert 0 < crosscheck.key("broadcast", np.dtype(np.complex128), 2**40, 2**16 - 1) < 2**63
