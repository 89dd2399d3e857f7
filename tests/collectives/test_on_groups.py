"""The same collective bodies on the world, on a duplicate of it (new_group()) and
on a subgroup that leaves rank 0 out, so that global-rank translation (roots,
peers) and the non-member path are exercised by every family."""

import numpy as np
import pytest

import pycoll
from pycoll import GroupMember


@pytest.fixture(params=["world", "dup", "subgroup"])
def on(request, pg, world_size):
    """(group argument, its members' global ranks) for each kind of group."""
    if request.param == "world":
        yield None, list(range(world_size))
        return
    members = (
        list(range(world_size))
        if request.param == "dup" or world_size == 1
        else list(range(1, world_size))
    )
    g = pycoll.new_group(members)
    yield g, members
    if g != GroupMember.NON_GROUP_MEMBER:
        pycoll.destroy_process_group(g)


def outside(call):
    """A non-member's call: a warning, nothing done, None returned."""
    with pytest.warns(UserWarning, match="does not belong to"):
        assert call() is None


def test_all_reduce(on, rank):
    g, members = on
    x = np.full(3, rank + 1.0)
    if rank not in members:
        outside(lambda: pycoll.all_reduce(x, group=g))
        assert (x == rank + 1).all()
        return
    pycoll.all_reduce(x, group=g)
    assert (x == sum(m + 1 for m in members)).all()


def test_broadcast_and_reduce_with_global_roots(on, rank):
    g, members = on
    src, dst = members[-1], members[0]
    x = np.full(2, float(rank))
    y = np.full(2, float(rank))
    if rank not in members:
        outside(lambda: pycoll.broadcast(x, src=src, group=g))
        outside(lambda: pycoll.reduce(y, dst=dst, group=g))
        return
    pycoll.broadcast(x, src=src, group=g)
    assert (x == src).all()
    pycoll.reduce(y, dst=dst, group=g)
    if rank == dst:
        assert (y == sum(members)).all()
    with pytest.raises(ValueError, match="not a rank of the group"):
        pycoll.broadcast(x, src=-5, group=g)


def test_gathers_and_scatters(on, rank):
    g, members = on
    n = len(members)
    if rank not in members:
        outside(lambda: pycoll.all_gather_object([None] * n, rank, group=g))
        return
    out = [None] * n
    pycoll.all_gather_object(out, rank, group=g)
    assert out == members
    stacked = np.zeros((n, 2), np.int64)
    pycoll.all_gather_into_tensor(stacked, np.full(2, rank, np.int64), group=g)
    assert stacked[:, 0].tolist() == members
    root = members[-1]
    got = np.zeros(1, np.int64)
    parts = [np.array([10 * m]) for m in members] if rank == root else None
    pycoll.scatter(got, parts, src=root, group=g)
    assert got[0] == 10 * rank
    slots = [None] * n if rank == root else None
    pycoll.gather_object(rank * rank, slots, dst=root, group=g)
    if rank == root:
        assert slots == [m * m for m in members]


def test_uneven_all_to_all_single(on, rank):
    g, members = on
    n = len(members)
    if rank not in members:
        return
    me = members.index(rank)
    send = [(me + i) % 2 + 1 for i in range(n)]  # rows to group rank i
    recv = [(i + me) % 2 + 1 for i in range(n)]  # rows from group rank i
    x = np.concatenate([np.full(send[i], 100 * rank + members[i]) for i in range(n)])
    out = np.zeros(sum(recv), x.dtype)
    pycoll.all_to_all_single(out, x, recv, send, group=g)
    expected = np.concatenate([np.full(recv[i], 100 * members[i] + rank) for i in range(n)])
    np.testing.assert_array_equal(out, expected)


def test_point_to_point_by_global_rank(on, rank):
    g, members = on
    if rank not in members or len(members) < 2:
        return
    me = members.index(rank)
    right, left = members[(me + 1) % len(members)], members[(me - 1) % len(members)]
    work = pycoll.isend(np.array([rank]), dst=right, group=g)
    got = np.zeros(1, np.int64)
    assert pycoll.recv(got, src=None, group=g) == left
    work.wait()
    assert got[0] == left
