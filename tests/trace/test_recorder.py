"""The flight recorder (pycoll.trace.recorder) in a live job, on every rank:
every kind of call is recorded in issue order with its call, state and peer;
the ring keeps the last N; it can be turned off; dumps are readable and
JSON; a timeout dumps beside its diagnosis; SIGUSR1 dumps without stopping."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from datetime import timedelta

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
import support
from pycoll import DistTimeoutError
from pycoll.trace import recorder

# Any size of job: what is recorded of a call does not depend on the group's size.
pytestmark = pytest.mark.any_size

shared_dir = pytest.fixture(support.shared_dir)
group_record = support.group_record


def test_every_kind_of_call_is_recorded_in_issue_order(rank, world_size):
    group = pycoll.new_group(group_desc="flight")
    x = np.ones(4, np.float32)
    pycoll.all_reduce(x, group=group)  # the synchronous fast path
    pycoll.broadcast(x, src=0, group=group)
    pycoll.all_reduce(x, group=group, async_op=True).wait()  # a Work
    objects = [None] * world_size
    pycoll.all_gather_object(objects, rank, group=group)  # several MPI operations
    assert objects == list(range(world_size))
    ops = ["all_reduce", "broadcast", "all_reduce", "all_gather_object"]
    if world_size > 1:  # (a rank cannot send to itself)
        peer, source = (rank + 1) % world_size, (rank - 1) % world_size
        request = pycoll.irecv(np.zeros(3), src=source, group=group)
        pycoll.send(np.ones(3), dst=peer, group=group)
        request.wait()
        ops += ["irecv", "send"]
    record = group_record(group.group_name)
    entries = record["entries"]
    assert [e["op"] for e in entries] == ops
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, None, None][: len(ops)]
    assert record["seq"] == 4 and record["kept"] == recorder.DEFAULT_RECORDS
    assert all(e["state"] == "completed" for e in entries), entries
    assert entries[0]["call"] == "all_reduce(SUM, float32, 4 elements)"
    assert entries[1]["call"] == "broadcast(src=0, float32, 4 elements)"
    if world_size > 1:
        assert entries[4]["peer"] == source and entries[5]["peer"] == peer
        assert entries[4]["bytes"] == 24 and entries[5]["bytes"] == 24
    timed = [e["issued_s_ago"] is not None for e in entries]
    assert [e["duration_s"] is not None for e in entries] == timed
    # the synchronous fast path (all_reduce, broadcast; not under DETAIL) keeps no
    # times; a Work's call and an object collective do
    assert timed[:4] == [not pycoll.debug.PLAIN] * 2 + [True, True]
    # (the irecv and the send: timed where they waited, compact and untimed
    # where they were done at their first test, which a small send mostly is:
    # test_a_send_recorded_once_done_keeps_the_collectives_count)
    pycoll.destroy_process_group(group)


def test_a_send_recorded_once_done_keeps_the_collectives_count(rank, world_size):
    """A send or receive done at its first test is recorded compact, as
    ``(op, peer, nbytes)``: the record shows it complete, untimed, and the
    collectives around it keep their sequence numbers."""
    group = pycoll.new_group(group_desc="compact")
    x = np.ones(2, np.float32)
    pycoll.all_reduce(x, group=group)
    group._flight.append(("send", world_size - 1 - rank, 24))  # as pycoll.send records one
    pycoll.all_reduce(x, group=group)
    entries = group_record(group.group_name)["entries"]
    assert [(e["op"], e["seq"]) for e in entries] == [
        ("all_reduce", 1), ("send", None), ("all_reduce", 2)
    ]  # fmt: skip
    sent = entries[1]
    assert (sent["peer"], sent["bytes"], sent["state"]) == (world_size - 1 - rank, 24, "completed")
    assert sent["issued_s_ago"] is None and sent["duration_s"] is None
    assert recorder.p2p_done(group, ("recv", 3, 8)) == [
        None, "recv", 0, 3, 8, None, None, recorder.COMPLETED, group, None
    ]  # fmt: skip
    pycoll.destroy_process_group(group)


def test_the_ring_keeps_the_last_n(monkeypatch, rank, world_size):
    monkeypatch.setenv(recorder.RECORDS_ENV, "8")
    group = pycoll.new_group(group_desc="ring")
    for i in range(20):
        x = np.full(2, i, np.int64)
        pycoll.all_reduce(x, group=group)
        assert (x == i * world_size).all()
    record = group_record(group.group_name)
    assert record["kept"] == 8
    assert [e["seq"] for e in record["entries"]] == list(range(13, 21))
    pycoll.destroy_process_group(group)


def test_zero_records_turns_the_recorder_off(monkeypatch, rank, world_size):
    monkeypatch.setenv(recorder.RECORDS_ENV, "0")
    group = pycoll.new_group(group_desc="off")
    x = np.ones(3)
    pycoll.all_reduce(x, group=group)
    pycoll.all_reduce(x, group=group, async_op=True).wait()
    assert (x == world_size**2).all()
    assert group._flight is None
    assert group.group_name not in [g["name"] for g in recorder.snapshot()["groups"]]
    pycoll.destroy_process_group(group)


@pytest.mark.parametrize("value", ["-2", "many", "1.5"])
def test_a_bad_records_value_says_what_is_wanted(monkeypatch, value):
    monkeypatch.setenv(recorder.RECORDS_ENV, value)
    with pytest.raises(ValueError, match="PYCOLL_FLIGHT_RECORDS must be the number of operations"):
        recorder.records_from_env()
    monkeypatch.setenv(recorder.RECORDS_ENV, "3")  # any count will do
    assert recorder.records_from_env() == 3


def test_a_dump_is_json_and_a_readable_report(pg, rank, shared_dir):
    x = np.ones(5, np.float64)
    pycoll.all_reduce(x)
    path = pycoll.dump_flight_record(shared_dir)
    assert path == os.path.join(shared_dir, f"flight-{recorder.JOB}-rank{rank}.json")
    with open(path) as f:
        record = json.load(f)
    assert record["rank"] == rank and record["pid"] == os.getpid()
    assert record["reason"] == "pycoll.dump_flight_record()"
    (world,) = [g for g in record["groups"] if g["name"] == pg.group_name]
    assert world["entries"][-1]["call"] == "all_reduce(SUM, float64, 5 elements)"
    with open(path[: -len(".json")] + ".txt") as f:
        text = f.read()
    assert text.startswith(f"pycoll flight record of rank {rank} (pid {os.getpid()}")
    assert re.search(
        rf"seq +{world['seq']}  all_reduce\(SUM, float64, 5 elements\): completed", text
    )
    MPI.COMM_WORLD.Barrier()
    names = sorted(os.listdir(shared_dir))
    assert len([n for n in names if n.endswith(".json")]) == MPI.COMM_WORLD.Get_size()


def test_a_timeout_dumps_the_record_beside_its_diagnosis(monkeypatch, rank, world_size, shared_dir):
    """Rank 0 receives from rank 1, which never sends: its error names its
    dump, where that receive is 'timed out'."""
    if world_size == 1:
        pytest.skip("needs a peer that does not send")
    monkeypatch.setenv(recorder.DIR_ENV, shared_dir)
    group = pycoll.new_group(timeout=timedelta(seconds=0.3), group_desc="late")
    if rank == 0:
        with pytest.raises(DistTimeoutError) as info:
            pycoll.recv(np.zeros(2), src=1, group=group)
        path = os.path.join(shared_dir, f"flight-{recorder.JOB}-rank0.json")
        assert f"flight record: {path} (every rank's that dumped: python -m pycoll.trace " in str(
            info.value
        )
        with open(path) as f:
            record = json.load(f)
        (late,) = [g for g in record["groups"] if g["name"] == group.group_name]
        assert late["entries"][-1]["op"] == "recv" and late["entries"][-1]["peer"] == 1
        assert late["entries"][-1]["state"] == "timed out"
        assert record["reason"].startswith("recv on group 'late' timed out")
    pycoll.destroy_process_group(group)


def test_sigusr1_dumps_without_stopping_the_job(monkeypatch, pg, rank, world_size, shared_dir):
    monkeypatch.setenv(recorder.DIR_ENV, shared_dir)
    assert signal.getsignal(signal.SIGUSR1) == recorder._on_signal  # installed by init
    path = os.path.join(shared_dir, f"flight-{recorder.JOB}-rank{rank}.json")
    os.kill(os.getpid(), signal.SIGUSR1)  # Python runs the handler at its next instruction
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "no dump within 30 s of SIGUSR1"
        time.sleep(0.01)
    with open(path) as f:
        assert json.load(f)["reason"].startswith("signal SIGUSR1")
    x = np.ones(2)
    pycoll.all_reduce(x)  # the job goes on
    assert (x == world_size).all()
