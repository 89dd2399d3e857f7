"""pycoll.trace in jobs of their own (tests/trace/trace_scenarios.py): a job
hung on purpose leaves flight records from which the tool names the rank
that did not arrive (pycoll-run --timeout makes every rank dump; a pycoll
timeout makes the waiting ranks dump); pycoll-run --trace merges the ranks'
timelines and the summary names the late rank. Each job must end within
its limit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pycoll.trace import flight
from support import job_env, json_reports, remove_stale_segments, shm_segments

SCRIPT = Path(__file__).with_name("trace_scenarios.py")
RANKS = 3
JOB_LIMIT_S = 120


@pytest.fixture(autouse=True)
def no_stale_segments():
    """A job killed (these are, on purpose) leaves its MPI's shared-memory
    segments in /dev/shm, and a later Open MPI job that drew the same job id
    was seen to crash on them: remove the ones each test's jobs left, at once
    (those no process maps: a job beside this test's maps its own)."""
    before = shm_segments()
    yield
    remove_stale_segments(shm_segments() - before)


def run(*argv, **env):
    """A job (argv after the launcher), its environment plus ``env``; (rc, output)."""
    runner = Path(sys.executable).with_name("pycoll-run")
    if not runner.exists():
        pytest.skip(f"no pycoll-run next to {sys.executable}")
    environ = job_env()
    environ.update(env)
    proc = subprocess.run(
        [str(runner), *argv],
        capture_output=True, text=True, env=environ, timeout=JOB_LIMIT_S,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_pycoll_run_timeout_dumps_every_rank_and_the_tool_names_the_stuck_one(tmp_path):
    # The job's limit counts from its start: on a busy machine three ranks were
    # seen still importing at 8 s (when ml_dtypes 0.7's import took 1.4 s of CPU
    # a rank), before any rank had a flight record.
    rc, out = run(
        "--timeout", "15", "-n", str(RANKS), sys.executable, str(SCRIPT), "hang",
        PYCOLL_FLIGHT_DIR=str(tmp_path), PYCOLL_TIMEOUT="600",
    )  # fmt: skip
    assert rc != 0, out
    for rank in range(RANKS):
        assert f"pycoll: rank {rank}: flight record written to {tmp_path}" in out, out
    # faulthandler's stacks still come first (chained to pycoll's handler)
    assert re.search(r'trace_scenarios\.py", line \d+ in hang', out), out
    text = flight.analyze(str(tmp_path))
    furthest = (
        r"furthest: seq 6, reached by ranks 0,1: seq 6 all_reduce\(SUM, float32, 4 elements\), "
        r"started"
    )
    assert re.search(furthest, text), text
    assert re.search(r"BEHIND: rank 2 is at seq 5 \(1 behind\): seq 5 all_reduce", text), text
    assert "ranks 0,1,2: signal SIGUSR1" in text, text


def test_a_pycoll_timeout_dumps_the_waiting_ranks_and_the_tool_names_the_silent_one(tmp_path):
    rc, out = run(
        "-n", str(RANKS), sys.executable, str(SCRIPT), "hang",
        PYCOLL_FLIGHT_DIR=str(tmp_path), PYCOLL_TIMEOUT="3",
    )  # fmt: skip
    assert rc != 0, out
    records = flight.load(str(tmp_path))
    # rank 2 sleeps: it never dumps. The first rank to time out ends the job
    # (its uncaught error aborts it), so the other waiting rank may not get to.
    assert sorted(records) in ([0], [1], [0, 1]), out
    text = flight.analyze(str(tmp_path))
    assert re.search(r"NO RECORD: ranks? ([01],)?2 left none", text), text
    for rank in records:  # each says why it dumped: the timeout's diagnosis, naming rank 2
        why = (
            rf"rank {rank}: all_reduce \(seq 6\) on group 'default_pg' timed out after [\d.]+ s "
            rf"\(timeout 3 s\) on rank {rank}: rank 2 has not reached seq 6"
        )
        assert re.search(why, text), text
        with open(tmp_path / f"flight-{records[rank]['job']}-rank{rank}.txt") as f:
            assert "seq 6  all_reduce(SUM, float32, 4 elements): timed out" in f.read()


def test_pycoll_run_trace_merges_every_rank_and_the_summary_names_the_late_one(tmp_path):
    rc, out = run("--trace", str(tmp_path), "-n", str(RANKS), sys.executable, str(SCRIPT), "late")
    assert rc == 0, out
    merged = tmp_path / "trace.json"
    assert f"timeline of every rank in {merged}" in out, out
    with open(merged) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    reduces = [e for e in events if e["name"] == "all_reduce"]
    assert sorted({e["pid"] for e in reduces}) == list(range(RANKS))
    assert len(reduces) == 20 * RANKS
    assert sum(e["args"]["last_arrived"] == 1 for e in reduces) >= 15 * RANKS
    summary = subprocess.run(
        [sys.executable, "-m", "pycoll.trace", "summarize", str(tmp_path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = re.search(r"rank 1 arrived last in (\d+)% of all_reduces \((\d+) of 20\)", summary)
    assert found and int(found.group(2)) >= 15, summary


def test_a_rank_that_never_starts_a_timeline_is_waited_for_within_the_timeout():
    """pycoll.trace.start is collective: rank 2 never calls it, and the others'
    calls end at the group's timeout, naming it, instead of hanging."""
    rc, out = run(
        "-n", str(RANKS), sys.executable, str(SCRIPT), "absent", PYCOLL_TIMEOUT="3",
    )  # fmt: skip
    assert rc != 0, out
    reports = json_reports(out)
    assert reports and all(r["rank"] in (0, 1) for r in reports), out
    for report in reports:  # the first to give up may end the job before the other reports
        assert report["error"] is not None, report
        assert re.match(
            r"trace_start \(seq 1\) on group 'default_pg' timed out after", report["error"]
        )
        assert "rank 2 has not reached seq 1" in report["error"], report
        assert report["seconds"] < 30, report
