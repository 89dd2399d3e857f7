"""pycoll.watch and pycoll.progress in a healthy job: bounded waits, broken
groups, the per-group issue order. Jobs that really hang are in test_hangs.py."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import DistTimeoutError
from pycoll.groups import STATE
from pycoll.progress import CODE, LAST


def test_threads_sharing_a_group_do_not_interleave(rank, world_size):
    """Three threads per rank issue all_reduce on one group at once: every
    call is counted once and every result is right (identical calls, so any
    cross-rank pairing of the threads' calls is a correct one)."""
    group = pycoll.new_group(group_desc="threads")
    calls, threads = 150, 3
    errors: list = []

    def work() -> None:
        try:
            for _ in range(calls):
                x = np.ones(8)
                pycoll.all_reduce(x, group=group)
                assert (x == world_size).all(), x
                y = np.ones(8)
                # (PYCOLL_WAIT=blocking: the forms must not mix, stay synchronous)
                work = pycoll.all_reduce(y, group=group, async_op=not pycoll.watch.BLOCKING)
                if work is not None:
                    work.wait()
                assert (y == world_size).all(), y
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not [t for t in pool if t.is_alive()], "a thread is stuck"
    assert not errors, errors
    assert group.sequence_number() == 2 * calls * threads
    pycoll.destroy_process_group(group)


def _all_reduced(x, group, async_op):
    work = pycoll.all_reduce(x, group=group, async_op=async_op)
    assert (work is None) != async_op
    if work is not None:
        work.wait()
    return x


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_a_second_thread_ends_the_owners_lock_free_path(rank, world_size, async_op):
    """The first thread's fast calls (synchronous: _common.plain; with Works:
    _common.lean) skip the lock while it is alone; once another thread uses
    the group, every call takes it, and calls issued by both at once are all
    counted and right."""
    group = pycoll.new_group(group_desc="owner")
    for _ in range(20):
        x = _all_reduced(np.ones(4), group, async_op)
        assert (x == world_size).all()
    assert group._owner == threading.get_ident() and not group._shared
    errors: list = []

    def work() -> None:
        try:
            for _ in range(100):
                y = _all_reduced(np.ones(4), group, async_op)
                assert (y == world_size).all(), y
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    helper = threading.Thread(target=work)
    helper.start()
    work()  # the owner goes on at the same time
    helper.join(timeout=120)
    assert not helper.is_alive(), "a thread is stuck"
    assert not errors, errors
    assert group._shared and not group._busy
    assert group.sequence_number() == 20 + 2 * 100
    pycoll.destroy_process_group(group)


def test_progress_record_follows_the_group(pg, rank):
    """This rank's record names the last collective started and whether it ended."""
    rec = STATE.board.rec
    pycoll.broadcast(np.zeros(3), src=0)
    word = rec[pg._word]
    assert rec[LAST] == pg._word
    assert word >> 8 == pg.sequence_number()
    assert (word >> 1) & 0x7F == CODE["broadcast"] and not word & 1
    other = STATE.board.read((rank + 1) % pg.size())
    assert other is not None and other[0] > 0  # a peer's pid, read one-sidedly


def test_group_timeout_bounds_a_blocking_call(debug_off, rank, world_size):
    """On a group made with a 0.5 s timeout, rank 0's barrier gives up, names
    the others, and leaves the group unusable; the others arrive afterwards
    (told by message, not by sleeping) and complete with rank 0's abandoned call."""
    if world_size == 1:
        pytest.skip("needs a second rank to be late")
    group = pycoll.new_group(timeout=timedelta(seconds=0.5), group_desc="short")
    signal = MPI.COMM_WORLD
    if rank == 0:
        others = list(range(1, world_size))
        try:
            with pytest.raises(DistTimeoutError) as info:
                pycoll.barrier(group=group)
            error = info.value
            assert error.op == "barrier" and error.seq == 1 and error.ranks == others
            assert 0.5 <= error.elapsed < 5
            assert re.match(
                r"barrier \(seq 1\) on group 'short' timed out after \d+\.\d s "
                r"\(timeout 0\.5 s\) on rank 0: ",
                str(error),
            )
            for r in others:
                assert f"rank {r}: has not reached it (at seq 0)" in str(error)
            with pytest.raises(DistTimeoutError, match="group 'short' is unusable") as again:
                pycoll.broadcast(np.zeros(1), src=0, group=group)
            assert again.value.ranks == others and again.value.seq == 1
        finally:  # release the others even if an assertion failed here
            for r in others:
                signal.send("go", dest=r, tag=78)
    else:
        assert signal.recv(source=0, tag=78) == "go"
        pycoll.barrier(group=group)
        assert group.sequence_number() == 1
    pycoll.destroy_process_group(group)


def test_recv_timeout_names_the_peer(rank, world_size):
    if world_size == 1:
        pytest.skip("needs a peer")
    group = pycoll.new_group(timeout=timedelta(seconds=0.3), group_desc="p2p")
    if rank == 0:
        with pytest.raises(DistTimeoutError) as info:
            pycoll.recv(np.zeros(2), src=1, group=group)
        assert re.match(
            r"recv on group 'p2p' timed out after \d+\.\d s \(timeout 0\.3 s\) on rank 0: "
            r"rank 1 did not match it\.",
            str(info.value),
        )
        assert "\n  rank 1: " in str(info.value) and info.value.seq is None
        with pytest.raises(DistTimeoutError, match="unusable"):
            pycoll.send(np.zeros(2), dst=1, group=group)
    pycoll.destroy_process_group(group)


def test_irecv_wait_timeout_names_the_peer(rank, world_size):
    """A receive's Work not complete as it started waits as recv does: bounded,
    naming the peer that sent nothing."""
    if world_size == 1:
        pytest.skip("needs a peer")
    group = pycoll.new_group(timeout=timedelta(seconds=0.3), group_desc="p2p-work")
    if rank == 0:
        work = pycoll.irecv(np.zeros(2), src=1, group=group)
        assert not work.is_completed()
        with pytest.raises(DistTimeoutError) as info:
            work.wait()
        assert re.match(
            r"irecv on group 'p2p-work' timed out after \d+\.\d s \(timeout 0\.3 s\) on "
            r"rank 0: rank 1 did not match it\.",
            str(info.value),
        )
        assert "\n  rank 1: " in str(info.value) and info.value.seq is None
    pycoll.destroy_process_group(group)


def test_work_wait_timeout_overrides_the_group(debug_off, rank, world_size):
    """wait(timeout) shorter than the group's: bounded by the Work's own."""
    if world_size == 1:
        pytest.skip("needs a second rank to be late")
    group = pycoll.new_group(group_desc="override")  # 30 min by default
    signal = MPI.COMM_WORLD
    if rank == 0:
        try:
            work = pycoll.all_reduce(np.ones(2), group=group, async_op=True)
            with pytest.raises(
                DistTimeoutError, match=r"timed out after \d+\.\d s \(timeout 0\.2 s\)"
            ) as info:
                work.wait(timeout=timedelta(milliseconds=200))
            assert info.value.elapsed < 5
        finally:  # release the others even if an assertion failed here
            for r in range(1, world_size):
                signal.send("go", dest=r, tag=79)
    else:
        assert signal.recv(source=0, tag=79) == "go"
        x = np.ones(2)
        pycoll.all_reduce(x, group=group, async_op=True).wait()
        np.testing.assert_array_equal(x, world_size)
    pycoll.destroy_process_group(group)


@pytest.mark.parametrize("value", ["block", "1", "POLLING"])
def test_bad_wait_mode_is_refused(pg, monkeypatch, value):
    before = pycoll.watch.BLOCKING
    monkeypatch.setenv("PYCOLL_WAIT", value)
    with pytest.raises(ValueError, match="^The value of PYCOLL_WAIT must be 'poll'"):
        pycoll.watch.set_wait_mode_from_env()
    assert pycoll.watch.BLOCKING is before


@pytest.mark.parametrize("value,blocking", [("", False), ("Poll", False), (" blocking ", True)])
def test_wait_modes_from_env(pg, monkeypatch, value, blocking):
    before = pycoll.watch.BLOCKING
    monkeypatch.setenv("PYCOLL_WAIT", value)
    try:
        pycoll.watch.set_wait_mode_from_env()
        assert pycoll.watch.BLOCKING is blocking
    finally:
        pycoll.watch.BLOCKING = before


def test_waits_spin_only_where_each_rank_has_a_core(pg, world_size):
    # The suite runs 1-4 ranks on one node; with more ranks than cores a wait
    # must yield the core from its second test on.
    import os

    cores = len(os.sched_getaffinity(0))
    expected = pycoll.watch.SPIN_TESTS if world_size <= cores else 2
    assert STATE.local_size == world_size
    assert len(pycoll.watch.spin_tests) == expected


def _late_barrier(group, rank, world_size):
    """Rank 0's barrier on ``group`` times out (the others come only after it
    told them); returns its DistTimeoutError on rank 0, None elsewhere."""
    signal = MPI.COMM_WORLD
    if rank == 0:
        try:
            with pytest.raises(DistTimeoutError) as info:
                pycoll.barrier(group=group)
            return info.value
        finally:  # release the others even if an assertion failed here
            for r in range(1, world_size):
                signal.send("go", dest=r, tag=79)
    assert signal.recv(source=0, tag=79) == "go"
    pycoll.barrier(group=group)
    return None


def test_destroyed_groups_give_their_progress_slots_back(debug_off, pg, rank, world_size):
    """A job that makes and frees many groups: every new group gets a slot of
    its own on the progress board, never the default group's, and a timeout
    on it is diagnosed from its own slot (before, the 65th group took the
    default group's slot, and a diagnosis read the default group's state)."""
    from pycoll import progress

    board = STATE.board
    mine = pg._word
    for _ in range(2 * progress.SLOTS):
        pycoll.destroy_process_group(pycoll.new_group())
    group = pycoll.new_group(timeout=timedelta(seconds=0.5), group_desc="after many")
    assert group._word not in (mine, progress.SINK)
    assert board.rec[mine - 1] == pg._uid  # the default group still holds its slot
    pycoll.broadcast(np.zeros(2), src=0)
    assert board.rec[mine] >> 8 == pg.sequence_number()
    if world_size > 1:
        error = _late_barrier(group, rank, world_size)
        if rank == 0:
            for r in range(1, world_size):
                assert f"rank {r}: has not reached it (at seq 0)" in str(error), str(error)
    pycoll.destroy_process_group(group)


def test_more_live_groups_than_slots(debug_off, pg, rank, world_size):
    """With more live groups than slots the oldest (never the default) lose
    theirs and write nowhere anyone reads; a timeout on such a group says the
    board no longer follows it instead of inventing where the ranks are."""
    from pycoll import progress

    made = [
        pycoll.new_group(timeout=timedelta(seconds=0.5), group_desc=f"live {i}")
        for i in range(progress.SLOTS + 2)
    ]
    try:
        words = [g._word for g in made if g._word != progress.SINK]
        assert len(words) == len(set(words)) and pg._word not in words
        assert made[0]._word == progress.SINK  # the oldest lost its slot
        assert STATE.board.rec[pg._word - 1] == pg._uid
        if world_size > 1:
            error = _late_barrier(made[0], rank, world_size)
            if rank == 0:
                assert "cannot tell where the ranks are" in str(error), str(error)
                assert "no longer follows this group" in str(error)
    finally:
        for g in made:
            pycoll.destroy_process_group(g)
