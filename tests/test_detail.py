"""PYCOLL_DEBUG=DETAIL: ranks that disagree on a collective get a
CollectiveMismatchError naming what each called, and no data moves."""

import numpy as np
import pytest

import pycoll
from pycoll import DebugLevel
from pycoll.errors import CollectiveMismatchError


@pytest.fixture
def detail(pg, world_size):
    if world_size == 1:
        pytest.skip("needs two ranks to disagree")
    before = pycoll.get_debug_level()
    pycoll.set_debug_level(DebugLevel.DETAIL)
    yield pg
    pycoll.set_debug_level(before)


def others(world_size):
    return ",".join(str(r) for r in range(world_size - 1))


def usable_afterwards(world_size, group=None):
    x = np.ones(1)
    pycoll.all_reduce(x, group=group)
    assert x[0] == (world_size if group is None else group.size())


def test_shape_mismatch_names_every_rank(detail, rank, world_size):
    last = world_size - 1
    x = np.full(5 if rank == last else 4, rank + 1.0, np.float32)
    seq = detail.sequence_number() + 1
    with pytest.raises(CollectiveMismatchError) as info:
        pycoll.all_reduce(x)
    msg = str(info.value)
    assert f"rank {last} called all_reduce(SUM, shape=(5,), float32) at seq {seq}" in msg
    assert (
        f"{'rank' if world_size == 2 else 'ranks'} {others(world_size)} called "
        f"all_reduce(SUM, shape=(4,), float32) at seq {seq}" in msg
    )
    assert " while " in msg
    if world_size > 2:  # the odd one out is named first
        assert msg.index(f"rank {last} called") < msg.index(f"ranks {others(world_size)}")
    assert info.value.seq == seq and info.value.op == "all_reduce"
    assert sorted(info.value.calls) == list(range(world_size))
    assert isinstance(info.value, RuntimeError)
    np.testing.assert_array_equal(x, rank + 1.0)  # nothing was exchanged
    assert detail.sequence_number() == seq - 1
    usable_afterwards(world_size)


def test_different_collectives(detail, rank, world_size):
    """The issue's example: one rank calls broadcast while the others all_reduce."""
    odd = world_size - 1
    x = np.zeros(4, np.float32)
    seq = detail.sequence_number() + 1
    with pytest.raises(CollectiveMismatchError) as info:
        if rank == odd:
            pycoll.broadcast(x, src=0)
        else:
            pycoll.all_reduce(x)
    msg = str(info.value)
    assert f"rank {odd} called broadcast(src=0, shape=(4,), float32) at seq {seq}" in msg
    assert f"called all_reduce(SUM, shape=(4,), float32) at seq {seq}" in msg
    usable_afterwards(world_size)


def test_a_skipped_collective_is_caught_at_the_next(detail, rank, world_size):
    x = np.zeros(2)
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 called all_reduce\(SUM") as info:
        if rank != 0:
            pycoll.barrier()  # rank 0 skipped this barrier...
        else:
            pycoll.all_reduce(x)  # ...and went on to the next collective
    assert "called barrier()" in str(info.value)
    usable_afterwards(world_size)


def test_roots_and_ops_must_agree(detail, rank, world_size):
    x = np.zeros(3)
    with pytest.raises(CollectiveMismatchError, match="src=1.*src=0|src=0.*src=1"):
        pycoll.broadcast(x, src=1 if rank == 0 else 0)
    op = pycoll.ReduceOp.MAX if rank == 0 else pycoll.ReduceOp.SUM
    with pytest.raises(CollectiveMismatchError, match=r"all_reduce\(MAX.*all_reduce\(SUM"):
        pycoll.all_reduce(x, op=op)
    usable_afterwards(world_size)


def test_object_collectives_and_subgroups(detail, rank, world_size):
    dst = 0 if rank == 0 else 1  # rank 0 disagrees with the others about the root
    slots = [None] * world_size if rank == dst else None
    with pytest.raises(CollectiveMismatchError, match=r"gather_object\(dst=0\)") as info:
        pycoll.gather_object(rank, slots, dst=dst)
    assert "gather_object(dst=1)" in str(info.value)
    pair = pycoll.new_group([0, 1])
    if rank in (0, 1):
        with pytest.raises(CollectiveMismatchError, match=f"group '{pair.group_name}'"):
            pycoll.all_reduce(np.zeros(2 + rank), group=pair)
        usable_afterwards(world_size, pair)
        pycoll.destroy_process_group(pair)
    usable_afterwards(world_size)


def test_matching_calls_run_normally(detail, rank, world_size):
    x = np.full(3, rank + 1.0)
    pycoll.all_reduce(x, op=pycoll.ReduceOp.AVG)
    np.testing.assert_array_equal(x, (world_size + 1) / 2)
    out = [None] * world_size
    pycoll.all_gather_object(out, rank)
    assert out == list(range(world_size))
    work = pycoll.broadcast(x, src=0, async_op=True)
    work.wait()
