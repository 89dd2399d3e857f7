"""send, recv, isend, irecv, batch_isend_irecv."""

import time

import numpy as np
import pytest

import pycoll
from pycoll.trace import recorder
from support import ALL_DTYPES, assert_equal, data, group_record


@pytest.fixture
def peers(rank, world_size):
    if world_size == 1:
        pytest.skip("point-to-point needs two ranks")
    return (rank + 1) % world_size, (rank - 1) % world_size


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_ring_with_isend_and_recv(dtype, rank, peers):
    right, left = peers
    work = pycoll.isend(data(rank, dtype, (3,)), dst=right, tag=5)
    out = np.zeros(3, dtype)
    assert pycoll.recv(out, src=left, tag=5) == left
    work.wait()
    assert_equal(out, data(left, dtype, (3,)))


def test_send_and_recv_from_any_source(rank, world_size, peers):
    """Every rank sends to rank 0, which learns who sent what from recv's return value."""
    if rank != 0:
        pycoll.send(np.full(2, rank, np.int32), dst=0)
        return
    seen = set()
    for _ in range(world_size - 1):
        out = np.zeros(2, np.int32)
        sender = pycoll.recv(out)
        assert out[0] == sender and out[1] == sender
        seen.add(sender)
    assert seen == set(range(1, world_size))


def test_irecv_any_source_reports_sender(rank, world_size, peers):
    right, left = peers
    out = np.zeros(1, np.int64)
    work = pycoll.irecv(out)
    pycoll.send(np.array([rank], np.int64), dst=right)
    work.wait()
    assert work.source_rank() == left and out[0] == left
    assert work.result() == [out]


def test_irecv_from_a_named_peer_reports_it_in_global_ranks(rank, world_size):
    """A receive from a named peer keeps no status (its sender is known):
    source_rank() still gives the peer, as a global rank on a group whose
    ranks are not the world's; a send has no source."""
    if world_size < 3:
        pytest.skip("needs a group of two ranks or more without rank 0")
    group = pycoll.new_group(list(range(1, world_size)))
    if rank == 0:
        return
    members = list(range(1, world_size))
    i = members.index(rank)
    right, left = members[(i + 1) % len(members)], members[(i - 1) % len(members)]
    out = np.zeros(1, np.int64)
    work = pycoll.irecv(out, src=left, group=group)
    sent = pycoll.isend(np.array([rank], np.int64), dst=right, group=group)
    work.wait()
    sent.wait()
    assert work.source_rank() == left and out[0] == left
    with pytest.raises(RuntimeError, match="applies to receives"):
        sent.source_rank()
    pycoll.destroy_process_group(group)


def test_a_receive_whose_message_has_arrived_comes_back_complete(monkeypatch, rank, peers):
    """irecv tests its request once as it starts: a message already here
    completes it there, from a named peer and from any source, with its
    flight record closed and its sender known before anything waits."""
    right, left = peers
    monkeypatch.setenv(recorder.RECORDS_ENV, "8")  # (whatever the run's setting)
    group = pycoll.new_group(group_desc="arrived")
    for tag, src in ((1, left), (2, None)):
        sent = pycoll.isend(np.array([rank, tag], np.int64), dst=right, group=group, tag=tag)
        deadline = time.monotonic() + 60
        while not group.comm.Iprobe(source=left, tag=tag):  # (drives MPI's progress)
            assert time.monotonic() < deadline, f"rank {left}'s message never arrived"
        out = np.zeros(2, np.int64)
        work = pycoll.irecv(out, src=src, group=group, tag=tag)
        (entry,) = [e for e in group_record(group.group_name)["entries"] if e["op"] == "irecv"][-1:]
        assert entry["state"] == "completed" and "completed" in repr(work)
        assert out.tolist() == [left, tag]
        assert work.source_rank() == left and work.result() == [out]
        sent.wait()
    pycoll.destroy_process_group(group)


def test_tags_keep_messages_apart(rank, peers):
    right, left = peers
    a, b = np.zeros(1), np.zeros(1)
    w1 = pycoll.isend(np.array([1.0 + rank]), dst=right, tag=1)
    w2 = pycoll.isend(np.array([2.0 + rank]), dst=right, tag=2)
    pycoll.recv(b, src=left, tag=2)
    pycoll.recv(a, src=left, tag=1)
    w1.wait()
    w2.wait()
    assert a[0] == 1.0 + left and b[0] == 2.0 + left


def test_batch_isend_irecv_ring(rank, peers):
    right, left = peers
    out = np.zeros(4, np.float32)
    ops = [
        pycoll.P2POp(pycoll.isend, np.full(4, rank, np.float32), right),
        pycoll.P2POp(pycoll.irecv, out, left),
    ]
    works = pycoll.batch_isend_irecv(ops)
    assert len(works) == 2
    for w in works:
        w.wait()
    assert_equal(out, np.full(4, left, np.float32))


def test_p2p_does_not_count_in_the_sequence_number(pg, rank, peers):
    right, left = peers
    before = pg.sequence_number()
    w = pycoll.isend(np.zeros(1), dst=right)
    pycoll.recv(np.zeros(1), src=left)
    w.wait()
    assert pg.sequence_number() == before


def test_batch_checks_every_op_before_sending(rank, peers):
    right, left = peers
    ops = [
        pycoll.P2POp(pycoll.isend, np.zeros(2), right),
        pycoll.P2POp(pycoll.irecv, np.zeros(4)[::2], left),
    ]
    with pytest.raises(ValueError, match="not C-contiguous"):
        pycoll.batch_isend_irecv(ops)
    # Nothing was sent: a receive now would find no message; check with a
    # fresh exchange that the channel carries exactly the new message.
    out = np.zeros(1)
    w = pycoll.isend(np.array([7.0]), dst=right)
    pycoll.recv(out, src=left)
    w.wait()
    assert out[0] == 7.0


def test_p2pop_takes_send_and_recv_as_isend_and_irecv():
    x = np.zeros(1)
    for given, taken in (
        (pycoll.isend, pycoll.isend),
        (pycoll.send, pycoll.isend),
        (pycoll.irecv, pycoll.irecv),
        (pycoll.recv, pycoll.irecv),
    ):
        assert pycoll.P2POp(given, x, 0).op is taken


def test_p2pop_rejects_other_functions():
    with pytest.raises(ValueError, match="op must be pycoll.isend or pycoll.irecv"):
        pycoll.P2POp(pycoll.broadcast, np.zeros(1), 0)
    with pytest.raises(ValueError, match="non-empty list"):
        pycoll.batch_isend_irecv([])


def _nothing_arrived(pg) -> bool:
    """No message waits on ``pg``'s communicator (probed after a barrier, as
    support.stray_messages probes)."""
    from mpi4py import MPI

    pg.comm.Barrier()
    return not any(pg.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG) for _ in range(2000))


def test_the_inline_check_leaves_bad_input_to_the_full_checks(pg, rank, peers):
    """A plain array to a named peer is checked inline (p2p._plain_peer,
    p2p._plain); whatever that check does not pass takes the full checks,
    which refuse bad input with their own message before anything is sent."""
    right, left = peers
    x = np.zeros(2)
    read_only = np.zeros(2)
    read_only.flags.writeable = False
    strided = np.zeros(4)[::2]
    for tag in (-1, 32766, True, 1.0):
        for call in (
            lambda: pycoll.send(x, right, tag=tag),
            lambda: pycoll.isend(x, right, tag=tag),
            lambda: pycoll.recv(x, left, tag=tag),
            lambda: pycoll.irecv(x, left, tag=tag),
        ):
            with pytest.raises(ValueError, match="tag must be an int in 0..32765"):
                call()
    for call in (lambda: pycoll.recv(read_only, left), lambda: pycoll.irecv(read_only, left)):
        with pytest.raises(ValueError, match="is read-only"):
            call()
    for call in (lambda: pycoll.recv(strided, left), lambda: pycoll.irecv(strided, left)):
        with pytest.raises(ValueError, match="is not C-contiguous"):
            call()
    with pytest.raises(ValueError, match="has dtype object, which pycoll cannot send"):
        pycoll.send(np.zeros(2, object), right)
    with pytest.raises(TypeError, match="dst must be an int"):
        pycoll.send(x, True)
    with pytest.raises(ValueError, match="own rank"):
        pycoll.isend(x, rank)
    # batch_isend_irecv checks its entries the same way, naming the entry.
    good, P2POp = pycoll.P2POp(pycoll.isend, x, right), pycoll.P2POp
    for tag in (-1, 32766, True, 1.0):
        with pytest.raises(ValueError, match="tag must be an int in 0..32765"):
            pycoll.batch_isend_irecv([good, P2POp(pycoll.irecv, x, left, tag=tag)])
    with pytest.raises(ValueError, match=r"\[1\]\.tensor.* is read-only"):
        pycoll.batch_isend_irecv([good, P2POp(pycoll.irecv, read_only, left)])
    with pytest.raises(ValueError, match=r"\[1\]\.tensor.* has dtype object"):
        pycoll.batch_isend_irecv([good, P2POp(pycoll.isend, np.zeros(2, object), right)])
    with pytest.raises(ValueError, match="own rank"):
        pycoll.batch_isend_irecv([good, P2POp(pycoll.isend, x, rank)])
    assert _nothing_arrived(pg)


def test_what_the_inline_check_passes_on_arrives_as_before(rank, peers):
    """A strided input (copied), a peer named by a numpy integer, and a
    receive from a named peer (its sender known without a status) give the
    same results as the common case."""
    right, left = peers
    base = np.arange(8.0) + 10 * rank
    work = pycoll.isend(base[::2], np.int64(right), tag=3)
    out = np.zeros(4)
    assert pycoll.recv(out, np.int64(left), tag=3) == left
    work.wait()
    np.testing.assert_array_equal(out, (np.arange(8.0) + 10 * left)[::2])
    pycoll.send(np.full(3, rank, np.int32), right)
    got = np.zeros(3, np.int32)
    assert pycoll.recv(got, left) == left
    np.testing.assert_array_equal(got, np.full(3, left, np.int32))
