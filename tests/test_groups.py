"""init_process_group and friends: the default group, its queries, sequence
numbers, node-local rank."""

import os
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import GroupMember


def test_default_group_matches_mpi(pg):
    world = MPI.COMM_WORLD
    assert pycoll.is_initialized()
    assert pycoll.get_rank() == pg.rank() == world.Get_rank()
    assert pycoll.get_world_size() == pg.size() == world.Get_size()
    assert pycoll.get_backend() == pg.name() == "mpi"
    assert pycoll.group.WORLD is pg and GroupMember.WORLD is pg
    assert GroupMember.NON_GROUP_MEMBER == -100
    assert pycoll.get_process_group_ranks(pg) == list(range(world.Get_size()))
    assert pycoll.is_mpi_available()


def test_default_group_has_its_own_communicator(pg):
    """pycoll's traffic never mixes with the caller's: its communicator is a duplicate."""
    assert MPI.Comm.Compare(pg.comm, MPI.COMM_WORLD) == MPI.CONGRUENT


def test_second_init_raises(pg):
    with pytest.raises(RuntimeError, match="initialize the default process group twice"):
        pycoll.init_process_group()


def test_destroy_and_init_again(pg, rank):
    pycoll.destroy_process_group()
    assert not pycoll.is_initialized()
    assert pycoll.group.WORLD is None and GroupMember.WORLD is None
    with pytest.raises(RuntimeError, match="destroyed"):
        pycoll.all_reduce(np.zeros(1), group=pg)
    pycoll.init_process_group(timeout=timedelta(seconds=90), group_name="again")
    assert pycoll.get_rank() == rank
    assert pycoll.group.WORLD.group_name == "again"
    assert pycoll.group.WORLD.timeout == timedelta(seconds=90)


def test_world_size_and_rank_that_disagree_name_both_values(uninitialized):
    world = MPI.COMM_WORLD
    n, me = world.Get_size(), world.Get_rank()
    with pytest.raises(ValueError, match=f"world_size={n + 1} was given but MPI runs {n} ranks"):
        pycoll.init_process_group(world_size=n + 1)
    with pytest.raises(
        ValueError, match=f"rank={me + 1} was given but MPI says this process is rank {me}"
    ):
        pycoll.init_process_group(rank=me + 1)
    assert not pycoll.is_initialized()
    pycoll.init_process_group(world_size=n, rank=me)
    assert pycoll.get_world_size() == n


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(backend="nccl"), ValueError, "backend 'nccl' is not available"),
        (dict(backend=3), TypeError, "backend must be a string"),
        (dict(init_method="tcp://10.0.0.1:23456"), ValueError, "init_method"),
        (dict(store=object()), ValueError, "store must be None"),
        (dict(timeout=30), TypeError, "timeout must be a datetime.timedelta"),
        (dict(timeout=timedelta(0)), ValueError, "timeout must be positive"),
        (dict(comm="world"), TypeError, "comm must be an mpi4py intracommunicator"),
    ],
)
def test_init_rejects_what_mpi_does_not_do(uninitialized, kwargs, error, match):
    with pytest.raises(error, match=match):
        pycoll.init_process_group(**kwargs)
    assert not pycoll.is_initialized()


def test_backend_spellings(uninitialized):
    for backend in ("mpi", "MPI", None):
        pycoll.init_process_group(backend=backend, init_method="env://")
        assert pycoll.get_backend() == "mpi"
        pycoll.destroy_process_group()


def test_init_on_a_given_communicator(uninitialized):
    """comm= wraps an existing communicator, here each rank alone."""
    world = MPI.COMM_WORLD
    pycoll.init_process_group(comm=MPI.COMM_SELF)
    assert pycoll.get_world_size() == 1 and pycoll.get_rank() == 0
    x = np.array([world.Get_rank() + 1.0])
    pycoll.all_reduce(x)
    assert x[0] == world.Get_rank() + 1.0  # reduced over this rank only
    pycoll.destroy_process_group()
    split = world.Split(color=world.Get_rank() % 2, key=world.Get_rank())
    pycoll.init_process_group(comm=split)
    x = np.array([1.0])
    pycoll.all_reduce(x)
    assert x[0] == split.Get_size()
    pycoll.destroy_process_group()
    split.Free()


CALLS = {
    "all_reduce": lambda: pycoll.all_reduce(np.zeros(1)),
    "all_reduce_coalesced": lambda: pycoll.all_reduce_coalesced([np.zeros(1)]),
    "reduce": lambda: pycoll.reduce(np.zeros(1), dst=0),
    "broadcast": lambda: pycoll.broadcast(np.zeros(1), src=0),
    "all_gather": lambda: pycoll.all_gather([np.zeros(1)], np.zeros(1)),
    "all_gather_into_tensor": lambda: pycoll.all_gather_into_tensor(np.zeros(1), np.zeros(1)),
    "all_gather_coalesced": lambda: pycoll.all_gather_coalesced([[np.zeros(1)]], [np.zeros(1)]),
    "gather": lambda: pycoll.gather(np.zeros(1), [np.zeros(1)], dst=0),
    "scatter": lambda: pycoll.scatter(np.zeros(1), [np.zeros(1)], src=0),
    "reduce_scatter": lambda: pycoll.reduce_scatter(np.zeros(1), [np.zeros(1)]),
    "reduce_scatter_tensor": lambda: pycoll.reduce_scatter_tensor(np.zeros(1), np.zeros(1)),
    "all_to_all": lambda: pycoll.all_to_all([np.zeros(1)], [np.zeros(1)]),
    "all_to_all_single": lambda: pycoll.all_to_all_single(np.zeros(1), np.zeros(1)),
    "barrier": lambda: pycoll.barrier(),
    "send": lambda: pycoll.send(np.zeros(1), dst=1),
    "recv": lambda: pycoll.recv(np.zeros(1), src=1),
    "isend": lambda: pycoll.isend(np.zeros(1), dst=1),
    "irecv": lambda: pycoll.irecv(np.zeros(1), src=1),
    "all_gather_object": lambda: pycoll.all_gather_object([None], 1),
    "gather_object": lambda: pycoll.gather_object(1, [None], dst=0),
    "broadcast_object_list": lambda: pycoll.broadcast_object_list([1], src=0),
    "scatter_object_list": lambda: pycoll.scatter_object_list([None], [1], src=0),
    "send_object_list": lambda: pycoll.send_object_list([1], dst=1),
    "recv_object_list": lambda: pycoll.recv_object_list([None], src=1),
    "get_rank": lambda: pycoll.get_rank(),
    "get_world_size": lambda: pycoll.get_world_size(),
    "get_backend": lambda: pycoll.get_backend(),
    "destroy_process_group": lambda: pycoll.destroy_process_group(),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_calls_before_init_name_init_process_group(uninitialized, name):
    with pytest.raises(
        RuntimeError,
        match=f"{name}: the default process group has not been initialized.*init_process_group",
    ):
        CALLS[name]()


# name -> call(n, rank, async_op); object collectives have no async form.
SEQUENCED = {
    "all_reduce": lambda n, r, a: pycoll.all_reduce(np.zeros(1), async_op=a),
    "all_reduce_coalesced": lambda n, r, a: pycoll.all_reduce_coalesced([np.zeros(1)], async_op=a),
    "reduce": lambda n, r, a: pycoll.reduce(np.zeros(1), dst=0, async_op=a),
    "broadcast": lambda n, r, a: pycoll.broadcast(np.zeros(1), src=0, async_op=a),
    "all_gather": lambda n, r, a: pycoll.all_gather([np.zeros(1)] * n, np.zeros(1), async_op=a),
    "all_gather_into_tensor": lambda n, r, a: pycoll.all_gather_into_tensor(
        np.zeros(n), np.zeros(1), async_op=a
    ),
    "all_gather_coalesced": lambda n, r, a: pycoll.all_gather_coalesced(
        [[np.zeros(1)] for _ in range(n)], [np.zeros(1)], async_op=a
    ),
    "gather": lambda n, r, a: pycoll.gather(
        np.zeros(1), [np.zeros(1)] * n if r == 0 else None, async_op=a
    ),
    "scatter": lambda n, r, a: pycoll.scatter(
        np.zeros(1), [np.zeros(1)] * n if r == 0 else None, async_op=a
    ),
    "reduce_scatter": lambda n, r, a: pycoll.reduce_scatter(
        np.zeros(1), [np.zeros(1)] * n, async_op=a
    ),
    "reduce_scatter_tensor": lambda n, r, a: pycoll.reduce_scatter_tensor(
        np.zeros(1), np.zeros(n), async_op=a
    ),
    "all_to_all": lambda n, r, a: pycoll.all_to_all(
        [np.zeros(1)] * n, [np.zeros(1)] * n, async_op=a
    ),
    "all_to_all_single": lambda n, r, a: pycoll.all_to_all_single(
        np.zeros(n), np.zeros(n), async_op=a
    ),
    "all_to_all_single_uneven": lambda n, r, a: pycoll.all_to_all_single(
        np.zeros(n), np.zeros(n), [1] * n, [1] * n, async_op=a
    ),
    "barrier": lambda n, r, a: pycoll.barrier(async_op=a),
}
OBJECTS = {
    "all_gather_object": lambda n, r: pycoll.all_gather_object([None] * n, r),
    "gather_object": lambda n, r: pycoll.gather_object(r, [None] * n if r == 0 else None),
    "broadcast_object_list": lambda n, r: pycoll.broadcast_object_list([r]),
    "scatter_object_list": lambda n, r: pycoll.scatter_object_list(
        [None], list(range(n)) if r == 0 else None
    ),
}


def assert_counted_once(pg, before, world_size):
    assert pg.sequence_number() == before + 1
    seen = [None] * world_size
    pycoll.all_gather_object(seen, pg._get_sequence_number_for_group())
    assert len(set(seen)) == 1, seen


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", sorted(SEQUENCED))
def test_every_collective_counts_once(pg, rank, world_size, name, async_op):
    """Each collective raises the group's sequence number by exactly one on
    every rank, and the ranks agree on the number."""
    before = pg.sequence_number()
    work = SEQUENCED[name](world_size, rank, async_op)
    if async_op:
        assert work.seq == before + 1
        work.wait()
    assert_counted_once(pg, before, world_size)


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_every_object_collective_counts_once(pg, rank, world_size, name):
    before = pg.sequence_number()
    OBJECTS[name](world_size, rank)
    assert_counted_once(pg, before, world_size)


def test_sequence_numbers_when_some_ranks_are_one_ahead(debug_off, pg, rank, world_size):
    """as torch's _test_sequence_num_incremented: after ranks other than 0 and 2
    issue one more collective, the counts differ by exactly one."""
    if world_size < 3:
        pytest.skip("needs three ranks")
    verify = MPI.COMM_WORLD  # not pg's communicator, so checking does not count
    start = pg.sequence_number()
    for i in range(10):
        pycoll.all_reduce(np.ones(1))
        seen = verify.allgather(pg.sequence_number())
        assert seen == [start + i + 1] * world_size
    t = np.ones(1)
    work = None if rank in (0, 2) else pycoll.all_reduce(t, async_op=True)
    table = dict(verify.allgather((rank, pg.sequence_number())))
    assert len(set(table.values())) == 2
    assert table[0] == table[2] == start + 10
    assert table[1] == table[0] + 1
    assert len({table[r] for r in table if r not in (0, 2)}) == 1
    if rank in (0, 2):  # catch up, so the pending all_reduce completes
        work = pycoll.all_reduce(t, async_op=True)
    work.wait()
    assert t[0] == world_size


def test_node_local_rank_from_env(monkeypatch, rank):
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    assert pycoll.get_node_local_rank() == rank
    assert pycoll.get_node_local_rank(fallback_rank=123) == rank


def test_node_local_rank_without_env_and_without_init(monkeypatch, uninitialized):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        pycoll.get_node_local_rank()
    assert pycoll.get_node_local_rank(fallback_rank=2) == 2


def test_node_local_rank_from_mpi_once_initialized(monkeypatch, pg):
    """All ranks of the test job share one node, so the node-local rank is the rank."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert pycoll.get_node_local_rank(fallback_rank=99) == MPI.COMM_WORLD.Get_rank()


def test_non_member_marker_warns_and_returns(pg):
    with pytest.warns(UserWarning, match="all_reduce.*does not belong to"):
        assert pycoll.all_reduce(np.zeros(1), group=GroupMember.NON_GROUP_MEMBER) is None
    with pytest.warns(UserWarning, match="barrier.*does not belong to"):
        pycoll.barrier(group=GroupMember.NON_GROUP_MEMBER)
    assert pycoll.get_rank(GroupMember.NON_GROUP_MEMBER) == -1
    assert pycoll.get_world_size(GroupMember.NON_GROUP_MEMBER) == -1


def test_rank_translation_errors(pg, world_size):
    assert pycoll.get_group_rank(pg, world_size - 1) == world_size - 1
    assert pycoll.get_global_rank(pg, 0) == 0
    with pytest.raises(ValueError, match="not part of group"):
        pycoll.get_group_rank(pg, world_size)
    with pytest.raises(ValueError, match="not part of group"):
        pycoll.get_global_rank(pg, world_size)
    with pytest.raises(ValueError, match="not registered"):
        pycoll.get_group_rank(object(), 0)
    with pytest.raises(ValueError, match="not registered"):
        pycoll.get_global_rank(object(), 0)


def test_import_does_not_start_mpi():
    """A launcher or a pytest parent imports pycoll without becoming an MPI process."""
    code = (
        "import sys, pycoll; assert 'mpi4py.MPI' not in sys.modules, 'MPI imported'; "
        "assert pycoll.is_mpi_available() and not pycoll.is_initialized()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_public_surface():
    for name in pycoll.__all__:
        assert hasattr(pycoll, name), name
    assert len(set(pycoll.__all__)) == len(pycoll.__all__)


def test_pycoll_timeout_is_the_default_timeout(uninitialized, monkeypatch):
    monkeypatch.setenv("PYCOLL_TIMEOUT", "42.5")
    pycoll.init_process_group()
    assert pycoll.group.WORLD.timeout == timedelta(seconds=42.5)
    pycoll.destroy_process_group()
    # An explicit timeout still wins.
    pycoll.init_process_group(timeout=timedelta(seconds=7))
    assert pycoll.group.WORLD.timeout == timedelta(seconds=7)


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "inf", "nan"])
def test_pycoll_timeout_that_is_not_a_positive_number_is_refused(uninitialized, monkeypatch, raw):
    monkeypatch.setenv("PYCOLL_TIMEOUT", raw)
    with pytest.raises(ValueError, match=r"PYCOLL_TIMEOUT must be a positive number of seconds"):
        pycoll.init_process_group()
    assert not pycoll.is_initialized()


def test_pycoll_abort_on_exception_takes_0_or_1(uninitialized, monkeypatch):
    monkeypatch.setenv("PYCOLL_ABORT_ON_EXCEPTION", "no")
    with pytest.raises(ValueError, match=r"PYCOLL_ABORT_ON_EXCEPTION must be 1 .* or 0"):
        pycoll.init_process_group()
    assert not pycoll.is_initialized()


def test_the_exception_hook_lives_as_long_as_the_default_group(uninitialized, monkeypatch):
    monkeypatch.delenv("PYCOLL_ABORT_ON_EXCEPTION", raising=False)
    before = sys.excepthook
    pycoll.init_process_group()
    assert sys.excepthook is not before and sys.excepthook.previous is before
    pycoll.destroy_process_group()
    assert sys.excepthook is before


def test_a_layer_keeps_its_state_with_the_group_until_it_is_destroyed(pg, world_size):
    """ProcessGroup.attach: what a layer keeps per group (pycoll.gpu.nccl's
    communicator) is found on the group and freed with it."""
    freed = []
    sub = pycoll.new_group(list(range(world_size)))
    assert sub.attached("layer") is None
    state = object()
    assert sub.attach("layer", state, freed.append) is state
    assert sub.attached("layer") is state and pg.attached("layer") is None
    with pytest.raises(RuntimeError, match="already has 'layer' attached"):
        sub.attach("layer", object())
    assert freed == []
    pycoll.destroy_process_group(sub)
    assert freed == [state] and sub.attached("layer") is None


def test_the_backend_is_the_groups_from_its_making(uninitialized):
    pycoll.init_process_group(backend="cpu:mpi,cuda:nccl")
    try:
        assert pycoll.group.WORLD.name() == "cpu:mpi,cuda:nccl"
        sub = pycoll.new_group(list(range(pycoll.get_world_size())), backend="mpi")
        assert sub.name() == "mpi" and pycoll.get_backend(sub) == "mpi"
    finally:
        pycoll.destroy_process_group()
