"""barrier."""

import os
import tempfile
from datetime import timedelta

import pytest
from mpi4py import MPI

import pycoll
from pycoll import CollectiveMismatchError, DistTimeoutError
from support import stray_messages


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_nobody_leaves_before_everyone_arrived(rank, world_size, async_op):
    """Ranks other than 0 write a file only after rank 0 has started; rank 0
    then passes the barrier and must find every file written."""
    world = MPI.COMM_WORLD
    folder = world.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)
    if rank == 0:
        for r in range(1, world_size):
            world.send("go", dest=r, tag=78)
    else:
        assert world.recv(source=0, tag=78) == "go"
    with open(os.path.join(folder, f"arrived.{rank}"), "w") as f:
        f.write("here")
    work = pycoll.barrier(async_op=async_op)
    if async_op:
        work.wait()
    assert sorted(os.listdir(folder)) == sorted(f"arrived.{r}" for r in range(world_size))
    pycoll.barrier()
    os.remove(os.path.join(folder, f"arrived.{rank}"))
    pycoll.barrier()
    if rank == 0:
        os.rmdir(folder)


def test_monitored_barrier_when_everyone_arrives(pg, rank, world_size):
    before = pg.sequence_number()
    assert pycoll.monitored_barrier(timeout=timedelta(seconds=60)) is None
    assert pycoll.monitored_barrier(timeout=60, wait_all_ranks=True) is None
    assert pg.sequence_number() == before + 2
    seen = MPI.COMM_WORLD.allgather(pg.sequence_number())
    assert len(set(seen)) == 1


def skip_on(group, skipping, wait_all=False):
    """Ranks not in ``skipping`` enter a monitored barrier on ``group`` that the
    others never reach; returns the error each caller got (None if skipped)."""
    if pycoll.get_rank() in skipping:
        return None
    with pytest.raises(DistTimeoutError) as info:
        pycoll.monitored_barrier(
            group, timeout=timedelta(milliseconds=1000), wait_all_ranks=wait_all
        )
    return info.value


def destroy_out_of_step(group, skipped, world_size):
    """The group's call counts are out of step: its destruction (the call
    check's last exchange) says so on every rank, after freeing it."""
    made = [r for r in range(world_size) if r not in skipped]
    names = ",".join(map(str, skipped))
    who = f"rank {names}" if len(skipped) == 1 else f"ranks {names}"
    others = ",".join(map(str, made))
    with pytest.raises(CollectiveMismatchError, match=f"{who} made 0, ranks? {others} made 1"):
        pycoll.destroy_process_group(group)
    assert group not in pycoll.groups.STATE.groups.values()


def test_monitored_barrier_names_the_missing_rank(pg, rank, world_size):
    if world_size == 1:
        pytest.skip("needs a rank to be missing")
    g = pycoll.new_group()  # a group of its own: its counts go out of step
    last = world_size - 1
    err = skip_on(g, {last})
    if rank == 0:
        assert str(err).startswith(f"Rank {last} failed to pass monitoredBarrier in 1000 ms")
        assert err.ranks == [last] and err.op == "monitored_barrier"
        assert err.elapsed >= 1.0
    elif rank != last:
        assert "waited 1000 ms for rank 0 to confirm" in str(err)
        assert isinstance(err, RuntimeError)
    destroy_out_of_step(g, [last], world_size)


def test_monitored_barrier_with_no_time_says_so_in_gloos_words(pg, rank, world_size):
    if world_size == 1:
        pytest.skip("needs a rank to wait for")
    g = pycoll.new_group()
    if rank == 0:  # the others never come: a timeout of zero gives up at once
        with pytest.raises(DistTimeoutError) as info:
            pycoll.monitored_barrier(group=g, timeout=timedelta(seconds=0))
        assert str(info.value).startswith(
            "Rank 0 timed out in monitoredBarrier after 0 ms: Rank 1 failed to pass"
        ), info.value
    destroy_out_of_step(g, list(range(1, world_size)), world_size)


def test_monitored_barrier_names_every_missing_rank(pg, rank, world_size):
    if world_size < 3:
        pytest.skip("needs two ranks to be missing")
    missing = [r for r in range(1, world_size) if r % 2 == 1]
    for wait_all in (True, False):
        g = pycoll.new_group()
        err = skip_on(g, set(missing), wait_all)
        if rank == 0:
            assert err.ranks == missing
            if wait_all and len(missing) > 1:
                names = ", ".join(map(str, missing))
                assert str(err).startswith(f"Ranks {names} failed to pass monitoredBarrier")
            else:  # only the first is named
                assert str(err).startswith(f"Rank {missing[0]} failed to pass monitoredBarrier")
        destroy_out_of_step(g, missing, world_size)


def test_a_late_token_is_never_left_for_another_communicator(rank, world_size):
    """A rank that reaches monitored_barrier after the first rank gave up
    sends its token anyway. Ranks that gave up keep the group's communicator
    when it is destroyed: freed, its context id would go to a later
    communicator, which would receive the token (Open MPI aborts when that
    one is a single rank's; a larger one would hold a stray message)."""
    if world_size == 1:
        pytest.skip("needs a late rank")
    world = MPI.COMM_WORLD
    g = pycoll.new_group(timeout=timedelta(seconds=1))
    last = world_size - 1
    if rank != last:
        with pytest.raises(DistTimeoutError):
            pycoll.monitored_barrier(g, timeout=timedelta(milliseconds=300))
        pycoll.destroy_process_group(g)  # gives up on the last rank's exchange
        if rank == 0:
            world.send("destroyed", dest=last, tag=79)
    else:  # late: only once rank 0 has destroyed the group
        assert world.recv(source=0, tag=79) == "destroyed"
        with pytest.raises(DistTimeoutError):
            pycoll.monitored_barrier(g, timeout=timedelta(milliseconds=300))
        pycoll.destroy_process_group(g)
    world.Barrier()
    assert stray_messages(world, tag=12) == 0
