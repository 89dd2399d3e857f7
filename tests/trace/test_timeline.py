"""The timeline (pycoll.trace) in a live job, on every rank: valid Chrome
trace JSON with one event per operation, consistent sequence numbers and
durations, a merged file with every rank, the summary naming the rank made
late on purpose, RPC calls on the timeline, and the tools' errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
import support
from pycoll.trace import merge

# Any size of job: what is recorded of a call does not depend on the group's size.
pytestmark = pytest.mark.any_size

CALLS = 12


shared_dir = pytest.fixture(support.shared_dir)


def my_events(path):
    with open(path) as f:
        trace = json.load(f)
    return [e for e in trace["traceEvents"] if e["ph"] == "X"], trace


def test_one_event_per_operation_with_its_facts(rank, world_size, shared_dir):
    group = pycoll.new_group(group_desc="traced")
    x = np.ones(256, np.float32)
    with pycoll.trace(shared_dir):
        for _ in range(CALLS):
            pycoll.all_reduce(x, group=group)
        pycoll.broadcast(x, src=0, group=group, async_op=True).wait()
        if world_size > 1:  # (a rank's send to itself would wait for its own receive)
            pycoll.send(np.ones(2), dst=(rank + 1) % world_size, group=group)
            pycoll.recv(np.zeros(2), src=(rank - 1) % world_size, group=group)
        assert pycoll.trace.is_tracing()
    assert not pycoll.trace.is_tracing()
    path = os.path.join(shared_dir, f"trace-rank{rank}.json")
    events, trace = my_events(path)
    mine = [e for e in events if e["args"].get("group") == group.group_name]
    collectives = [e for e in mine if e["cat"] == "collective"]
    assert [e["name"] for e in collectives] == ["all_reduce"] * CALLS + ["broadcast"]
    assert [e["args"]["seq"] for e in collectives] == list(range(1, CALLS + 2))
    first = collectives[0]
    assert first["pid"] == rank and first["args"]["bytes"] == 1024
    assert first["args"]["call"] == "all_reduce(SUM, float32, 256 elements)"
    starts = [e["ts"] for e in collectives]
    assert starts == sorted(starts)  # in issue order on one clock
    for earlier, later in zip(collectives, collectives[1:]):
        assert earlier["ts"] + earlier["dur"] <= later["ts"] + 1  # (us, rounded)
    assert all(e["dur"] >= 0 for e in mine)
    if world_size > 1:
        p2p = [e for e in mine if e["cat"] == "p2p"]
        assert [(e["name"], e["args"]["peer"]) for e in p2p] == [
            ("send", (rank + 1) % world_size), ("recv", (rank - 1) % world_size)
        ]  # fmt: skip
    names = {m["args"]["name"] for m in trace["traceEvents"] if m["ph"] == "M"}
    assert f"rank {rank} ({socket.gethostname()})" in names and "traced" in names
    assert trace["otherData"]["pycoll"]["host"] == socket.gethostname()
    assert trace["otherData"]["pycoll"]["clock_offset_s"] == 0.0  # one host: one clock
    pycoll.destroy_process_group(group)


def test_each_collective_names_the_path_it_took(rank, world_size, shared_dir, monkeypatch):
    """The timeline gives each collective the path it took (pycoll.paths):
    pycoll's ring for an all_reduce the rule sends there (its size made
    1 KiB), MPI's own call for a broadcast; on one rank MPI's call, since
    a ring needs two."""
    from pycoll import _mpi
    from pycoll.paths import rule

    monkeypatch.setattr(rule, "RING_BYTES", 1024)
    group = pycoll.new_group(group_desc="paths")
    support.rule_only(monkeypatch, group)
    x = np.ones(256, np.float32)  # 1 KiB
    with pycoll.trace(shared_dir):
        pycoll.all_reduce(x, group=group)
        pycoll.broadcast(x, src=0, group=group)
    support.assert_equal(x, np.full(256, world_size, np.float32))
    events, _ = my_events(os.path.join(shared_dir, f"trace-rank{rank}.json"))
    mine = [e for e in events if e["args"].get("group") == group.group_name]
    ring = "ring" if world_size > 1 and _mpi.has("MPI_Isendrecv") else "mpi"
    assert [(e["name"], e["args"]["path"]) for e in mine] == [
        ("all_reduce", ring), ("broadcast", "mpi")
    ]  # fmt: skip
    pycoll.destroy_process_group(group)


def test_merged_file_has_every_rank_and_the_arrival_waits(rank, world_size, shared_dir):
    group = pycoll.new_group(group_desc="merged")
    with pycoll.trace(shared_dir):
        for _ in range(CALLS):
            pycoll.all_reduce(np.ones(8), group=group)
    MPI.COMM_WORLD.Barrier()  # every rank's file is written
    if rank == 0:
        path = merge.merge(shared_dir)
        events, _ = my_events(path)
        calls = [e for e in events if e["args"].get("group") == group.group_name]
        assert sorted({e["pid"] for e in calls}) == list(range(world_size))
        for seq in range(1, CALLS + 1):
            ranks = [e for e in calls if e["args"]["seq"] == seq]
            assert len(ranks) == world_size
            if world_size > 1:
                last = max(ranks, key=lambda e: e["ts"])
                assert all(e["args"]["last_arrived"] == last["pid"] for e in ranks)
                assert last["args"]["waited_ms"] == 0
                assert all(e["args"]["waited_ms"] >= 0 for e in ranks)
    pycoll.destroy_process_group(group)


def test_the_summary_names_the_rank_made_late(rank, world_size, shared_dir):
    """The last rank sleeps 20 ms before each all_reduce: the summary says it
    arrived last in most of them (the others meet within far less)."""
    if world_size == 1:
        pytest.skip("needs ranks to be late against")
    late = world_size - 1
    group = pycoll.new_group(group_desc="summary")
    with pycoll.trace(shared_dir):
        for _ in range(CALLS):
            if rank == late:
                time.sleep(0.02)  # the lateness this test is about, not synchronisation
            pycoll.all_reduce(np.ones(8), group=group)
    MPI.COMM_WORLD.Barrier()
    if rank == 0:
        text = merge.summarize(shared_dir)
        found = re.search(
            rf"rank {late} arrived last in (\d+)% of all_reduces \((\d+) of {CALLS}\), "
            r"by ([\d.]+) ms median",
            text,
        )
        assert found, text
        assert int(found.group(2)) >= CALLS * 3 // 4, text
        assert float(found.group(3)) > 10, text
        assert re.search(rf"all_reduce +64 B +{CALLS * world_size} ", text), text
        waited = re.search(rf"  rank 0: ([\d.e+]+) ms in {CALLS} collectives", text)
        assert waited and float(waited.group(1)) > CALLS * 10 * 0.75, text  # ~20 ms each
    pycoll.destroy_process_group(group)


def test_start_is_refused_twice_and_without_a_directory(pg, shared_dir):
    with pycoll.trace(shared_dir):
        with pytest.raises(RuntimeError, match="a timeline is being recorded already"):
            pycoll.trace.start(shared_dir)
    with pytest.raises(ValueError, match="give the directory"):
        pycoll.trace.start("")
    assert pycoll.trace.stop() is None  # nothing to stop


def test_a_rank_that_cannot_start_makes_every_rank_raise(rank, world_size, shared_dir):
    """Rank 0 gives no directory: it raises a ValueError, the others a
    RuntimeError naming rank 0, and none is left recording or waiting."""
    directory = "" if rank == 0 else shared_dir
    kind = ValueError if rank == 0 else RuntimeError
    with pytest.raises(kind, match="rank\\(s\\) 0 could not start recording, so no rank did"):
        pycoll.trace.start(directory)
    assert not pycoll.trace.is_tracing()
    x = np.ones(2)
    pycoll.all_reduce(x)  # the group goes on
    assert (x == world_size).all()


def test_rpc_calls_are_on_the_timeline(rank, world_size, shared_dir):
    import operator

    import pycoll.rpc as rpc

    rpc.init_rpc(f"worker{rank}")
    try:
        with pycoll.trace(shared_dir):
            assert rpc.rpc_sync((rank + 1) % world_size, operator.add, args=(rank, 1)) == rank + 1
    finally:
        rpc.shutdown()
    events, _ = my_events(os.path.join(shared_dir, f"trace-rank{rank}.json"))
    calls = [e for e in events if e["cat"] == "rpc"]
    assert [e["name"] for e in calls] == ["rpc add"]
    assert calls[0]["args"]["peer"] == f"worker{(rank + 1) % world_size}"


def test_the_tools_say_what_is_missing(tmp_path):
    for command in ("summarize", "merge", "flight"):
        out = subprocess.run(
            [sys.executable, "-m", "pycoll.trace", command, str(tmp_path)],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 1
        assert str(tmp_path) in out.stderr
        assert re.search(r"no (trace-rank<r>\.json|flight record) in", out.stderr), out.stderr
