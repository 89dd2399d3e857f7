"""new_group (both modes), new_subgroups, new_subgroups_by_enumeration, split_group,
and collectives on the groups they make."""

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import GroupMember


@pytest.fixture
def two(world_size):
    if world_size < 2:
        pytest.skip("needs two ranks")


def test_new_group_of_everyone_is_a_new_communicator(pg, rank, world_size):
    g = pycoll.new_group()
    assert isinstance(g, pycoll.ProcessGroup) and g is not pg
    assert g.rank() == rank and g.size() == world_size and g.name() == "mpi"
    assert MPI.Comm.Compare(g.comm, pg.comm) == MPI.CONGRUENT
    assert g.sequence_number() == 0
    x = np.array([rank + 1.0])
    pycoll.all_reduce(x, group=g)
    assert x[0] == world_size * (world_size + 1) / 2
    assert g.sequence_number() == 1
    pycoll.destroy_process_group(g)


def test_members_and_non_members(pg, rank, world_size, two):
    members = [world_size - 1, 0]  # any order; the group sorts them
    g = pycoll.new_group(members)
    if rank in members:
        assert pycoll.get_process_group_ranks(g) == [0, world_size - 1]
        assert g.rank() == (0 if rank == 0 else 1) and g.size() == 2
        assert pycoll.get_rank(g) == g.rank() and pycoll.get_world_size(g) == 2
        x = np.array([float(rank)])
        pycoll.broadcast(x, src=world_size - 1, group=g)  # src is a global rank
        assert x[0] == world_size - 1
        pycoll.destroy_process_group(g)
    else:
        assert g == GroupMember.NON_GROUP_MEMBER
        assert pycoll.get_rank(g) == -1 and pycoll.get_world_size(g) == -1


def test_sequence_numbers_of_a_new_group(pg, rank, world_size, two):
    """as torch's _test_sequence_num_set_new_group, checked over a separate group
    so that checking does not count"""
    g = pycoll.new_group([0, 1])
    if rank not in (0, 1):
        return
    verify = pycoll.new_group([0, 1], use_local_synchronization=True)
    before = pg.sequence_number()
    for i in range(4):
        seen = [None] * 2
        pycoll.all_gather_object(seen, g.sequence_number(), group=verify)
        assert seen == [i, i]
        pycoll.all_reduce(np.ones(1), group=g)
    assert pg.sequence_number() == before  # the world's count did not move
    pycoll.destroy_process_group(verify)
    pycoll.destroy_process_group(g)


def test_sequence_numbers_on_a_subgroup_with_one_rank_ahead(debug_off, pg, rank, world_size):
    """as torch's _test_sequence_num_incremented_subgroup, on ranks [0, 1, 2]"""
    if world_size < 3:
        pytest.skip("needs three ranks")
    g = pycoll.new_group([0, 1, 2])
    if rank > 2:
        return
    verify = pycoll.new_group([0, 1, 2], use_local_synchronization=True)
    for i in range(3):
        pycoll.all_reduce(np.ones(1), group=g)
        seen = [None] * 3
        pycoll.all_gather_object(seen, g.sequence_number(), group=verify)
        assert seen == [i + 1] * 3
    t = np.ones(1)
    work = pycoll.all_reduce(t, group=g, async_op=True) if rank == 1 else None
    table = [None] * 3
    pycoll.all_gather_object(table, g.sequence_number(), group=verify)
    assert table[0] == table[2] == 3 and table[1] == 4
    if rank != 1:
        work = pycoll.all_reduce(t, group=g, async_op=True)
    work.wait()
    assert t[0] == 3
    pycoll.destroy_process_group(verify)
    pycoll.destroy_process_group(g)


def test_warn_not_in_group(pg, rank, world_size, two):
    """as torch's _test_warn_not_in_group: even ranks form the group"""
    members = [r for r in range(world_size) if r % 2 == 0]
    g = pycoll.new_group(members)
    x = np.zeros((2, 2))
    xs = [np.zeros((2, 2)) for _ in members]
    if rank not in members:
        for name, call in [
            ("all_gather", lambda: pycoll.all_gather(xs, x, group=g)),
            ("all_reduce", lambda: pycoll.all_reduce(x, group=g)),
            ("barrier", lambda: pycoll.barrier(group=g)),
            ("broadcast", lambda: pycoll.broadcast(x, src=0, group=g)),
        ]:
            with pytest.warns(UserWarning, match=f".*{name}.*does not belong to.*"):
                assert call() is None
    else:
        pycoll.all_gather(xs, x, group=g)
        pycoll.all_reduce(x, group=g)
        pycoll.barrier(group=g)
        pycoll.broadcast(x, src=0, group=g)
        pycoll.destroy_process_group(g)


def test_rank_membership(pg, rank, world_size, two):
    """as torch's _test_rank_membership, on the member rank"""
    g = pycoll.new_group(ranks=[1])
    if rank != 1:
        assert g == GroupMember.NON_GROUP_MEMBER
        with pytest.raises(ValueError, match="not registered"):
            pycoll.get_group_rank(g, 1)
        return
    assert pycoll.get_group_rank(g, 1) == 0
    with pytest.raises(ValueError, match="not part of group"):
        pycoll.get_group_rank(g, 0)
    assert pycoll.get_global_rank(g, 0) == 1
    with pytest.raises(ValueError, match="not part of group"):
        pycoll.get_global_rank(g, 1)
    assert pycoll.get_process_group_ranks(g) == [1]
    with pytest.raises(ValueError, match="not registered"):
        pycoll.get_group_rank(object(), 0)
    pycoll.destroy_process_group(g)
    with pytest.raises(ValueError, match="not registered"):
        pycoll.get_group_rank(g, 1)


def test_new_group_local_sync(pg, rank, world_size):
    """as torch's _test_new_group_local_sync, for any even world size: each rank
    makes the group of itself and its partner, while others make theirs."""
    if world_size % 2:
        pytest.skip("needs an even number of ranks")
    partner = rank ^ 1
    ranks_in = [rank, partner]
    ranks_out = [r for r in range(world_size) if r not in ranks_in]
    before = pg.sequence_number()
    assert pycoll.new_group(ranks=ranks_out, use_local_synchronization=True) is None
    g = pycoll.new_group(ranks=ranks_in, use_local_synchronization=True)
    assert isinstance(g, pycoll.ProcessGroup)
    assert pycoll.get_group_rank(g, rank) == sorted(ranks_in).index(rank)
    assert pycoll.get_process_group_ranks(g) == sorted(ranks_in)
    out = [np.full(2, -1) for _ in range(2)]
    pycoll.all_gather(out, np.array([rank // 2, rank]), group=g)
    assert [o.tolist() for o in out] == [[rank // 2, r] for r in sorted(ranks_in)]
    assert pg.sequence_number() == before  # the world did not synchronize
    pycoll.destroy_process_group(g)


def test_new_group_local_sync_duplicate(pg, rank, world_size):
    """as torch's _test_new_group_local_sync_duplicate_pg: the same members twice
    make two independent groups with different names."""
    if world_size % 2:
        pytest.skip("needs an even number of ranks")
    ranks_in = [rank // 2 * 2, rank // 2 * 2 + 1]
    groups = [pycoll.new_group(ranks_in, use_local_synchronization=True) for _ in range(2)]
    assert groups[0].group_name != groups[1].group_name
    assert MPI.Comm.Compare(groups[0].comm, groups[1].comm) != MPI.IDENT
    # Interleave nonblocking operations on both: if they shared a communicator
    # the messages could cross.
    a, b = np.array([rank]), np.array([100 + rank])
    wa = pycoll.all_reduce(a, group=groups[0], async_op=True)
    wb = pycoll.all_reduce(b, group=groups[1], async_op=True)
    wb.wait()
    wa.wait()
    assert a[0] == sum(ranks_in) and b[0] == 200 + sum(ranks_in)
    for g in groups:
        pycoll.destroy_process_group(g)


def test_new_subgroups_per_node_and_by_size(pg, rank, world_size):
    mine, subgroups = pycoll.new_subgroups()
    assert subgroups == [mine]  # the test job runs on one node
    assert mine.ranks == list(range(world_size))
    pycoll.destroy_process_group(mine)
    if world_size % 2 == 0:
        mine, subgroups = pycoll.new_subgroups(group_size=2)
        assert len(subgroups) == world_size // 2
        assert subgroups[rank // 2] is mine
        assert all(
            s == GroupMember.NON_GROUP_MEMBER for i, s in enumerate(subgroups) if i != rank // 2
        )
        assert mine.ranks == [rank // 2 * 2, rank // 2 * 2 + 1]
        x = np.array([rank])
        pycoll.all_reduce(x, group=mine)
        assert x[0] == 4 * (rank // 2) + 1
        pycoll.destroy_process_group(mine)
    with pytest.raises(ValueError, match="must be divisible by group_size"):
        pycoll.new_subgroups(group_size=world_size + 1)
    with pytest.raises(ValueError, match="positive int"):
        pycoll.new_subgroups(group_size=0)


def test_new_subgroups_by_enumeration(pg, rank, world_size, two):
    lists = [[0], list(range(1, world_size))] if world_size > 2 else [[1]]
    mine, subgroups = pycoll.new_subgroups_by_enumeration(lists)
    assert len(subgroups) == len(lists)
    if world_size == 2 and rank == 0:
        assert mine is None
        return
    where = [i for i, part in enumerate(lists) if rank in part][0]
    assert subgroups[where] is mine and mine.ranks == lists[where]
    x = np.array([1])
    pycoll.all_reduce(x, group=mine)
    assert x[0] == len(lists[where])
    pycoll.destroy_process_group(mine)


def test_enumeration_refuses_overlaps(pg, world_size):
    with pytest.raises(ValueError, match="rank 0 appears in both subgroup 0 and subgroup 1"):
        pycoll.new_subgroups_by_enumeration([[0], [0]])
    with pytest.raises(ValueError, match="not ranks of the group"):
        pycoll.new_subgroups_by_enumeration([[world_size]])


def test_split_group_and_split_again(pg, rank, world_size, two):
    evens = list(range(0, world_size, 2))
    odds = list(range(1, world_size, 2))
    half = pycoll.split_group(split_ranks=[evens, odds])
    assert half.ranks == (evens if rank % 2 == 0 else odds)
    # Split the half again by *its* group ranks: its first member alone.
    first = pycoll.split_group(half, split_ranks=[[0]])
    if half.rank() == 0:
        assert first.ranks == [half.ranks[0]] and first.size() == 1
        pycoll.destroy_process_group(first)
    else:
        assert first is None
    x = np.array([rank])
    pycoll.reduce(x, dst=half.ranks[-1], group=half)  # dst is a global rank
    if rank == half.ranks[-1]:
        assert x[0] == sum(half.ranks)
    pycoll.destroy_process_group(half)


def test_bad_group_arguments(pg, world_size):
    with pytest.raises(ValueError, match="more than once"):
        pycoll.new_group([0, 0])
    with pytest.raises(ValueError, match=f"holds \\[{world_size}\\], which are not ranks"):
        pycoll.new_group([world_size])
    with pytest.raises(TypeError, match="must be a list of ranks"):
        pycoll.new_group(3)
    with pytest.raises(ValueError, match="backend 'nccl' is not available"):
        pycoll.new_group(backend="nccl")
    with pytest.raises(ValueError, match="split_ranks is required"):
        pycoll.split_group()


def test_destroyed_group_refuses_use(pg, rank, world_size):
    g = pycoll.new_group()
    pycoll.destroy_process_group(g)
    with pytest.raises(RuntimeError, match="has been destroyed"):
        pycoll.all_reduce(np.zeros(1), group=g)
    with pytest.raises(RuntimeError, match="has been destroyed"):
        pycoll.barrier(group=g)
    x = np.ones(1)
    pycoll.all_reduce(x)  # the world is untouched
    assert x[0] == world_size


def test_many_local_groups_do_not_touch_the_world(pg, rank, world_size):
    if world_size % 2:
        pytest.skip("needs an even number of ranks")
    before = pg.sequence_number()
    pair = [rank // 2 * 2, rank // 2 * 2 + 1]
    groups = [pycoll.new_group(pair, use_local_synchronization=True) for _ in range(16)]
    assert len({g.group_name for g in groups}) == 16
    for g in groups:
        pycoll.destroy_process_group(g)
    assert pg.sequence_number() == before


def test_empty_group_has_no_members(pg):
    assert pycoll.new_group([]) == GroupMember.NON_GROUP_MEMBER
    assert pycoll.new_group([], use_local_synchronization=True) is None


def test_running_out_of_communicators_says_to_destroy_groups(pg):
    """MPICH allows 2048 communicators per process; the error names the fix."""
    made, error = [], None
    try:
        for _ in range(5000):
            made.append(pycoll.new_group())
    except pycoll.DistBackendError as exc:
        error = exc
    finally:
        for group in made:
            pycoll.destroy_process_group(group)
    if error is None:
        pytest.skip("this MPI had communicators for 5000 groups")
    message = str(error)
    assert message.startswith("new_group: MPI has no communicator left for a new group")
    assert "Destroy the groups you no longer use with pycoll.destroy_process_group(group)" in (
        message
    )
    # MPICH's words: "Too many communicators", or, where the ranks' free
    # context ids no longer line up, "Cannot allocate context ID".
    assert "Too many communicators" in message or "context ID" in message, message
    pycoll.destroy_process_group(pycoll.new_group())  # usable again once freed
