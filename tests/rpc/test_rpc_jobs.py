"""pycoll.rpc's failures, in 4-rank jobs of their own (tests/rpc/rpc_scenarios.py):
a stopped peer named by the heartbeat, a worker that never comes to shutdown,
and the shutdown at exit. Each job must end within its limit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from support import job_env, json_reports, run_mpiexec

SCRIPT = Path(__file__).with_name("rpc_scenarios.py")
RANKS = 4
JOB_LIMIT_S = 120


def run_job(scenario):
    environ = job_env()
    start = time.monotonic()
    argv = [sys.executable, str(SCRIPT), scenario]
    proc = run_mpiexec(RANKS, argv, env=environ, timeout=JOB_LIMIT_S)
    return proc.returncode, json_reports(proc.stdout), proc.stderr, time.monotonic() - start


def test_a_stopped_peer_is_named_by_the_heartbeat():
    rc, reports, err, _ = run_job("stopped")
    assert rc == 0, err
    failed = [r for r in reports if "error" in r]
    assert len(failed) == 1 and failed[0]["rank"] == 0, reports
    report = failed[0]
    assert "worker1" in report["error"] and "stopped answering" in report["error"], report
    assert report["ranks"] == [1]
    assert report["seconds"] < 10, report  # the call's own timeout is 60 s
    assert sorted(r["rank"] for r in reports if r.get("shutdown")) == [0, 1, 2, 3], reports
    assert {r["rank"]: r["value"] for r in reports if "value" in r} == {2: 3, 3: 4}


def test_a_worker_absent_from_shutdown_is_named_and_the_job_ends():
    rc, reports, err, elapsed = run_job("absent")
    assert rc != 0  # the ranks that gave up end without MPI_Finalize
    errors = {r["rank"]: r for r in reports if "error" in r}
    # the first rank to give up ends the job (its exit without MPI_Finalize
    # makes the launcher stop the others), so not every rank may get to report
    assert errors and 3 not in errors, reports
    for rank in errors:
        report = errors[rank]
        assert "shutdown: timed out after 2 s" in report["error"], report
        assert "worker3 never called shutdown" in report["error"], report
        assert report["ranks"] == [3]
        assert 2 <= report["seconds"] < 10, report
    assert "ending the process without finalizing MPI" in err
    assert elapsed < JOB_LIMIT_S


def test_shutdown_at_exit_waits_for_calls_in_flight():
    rc, reports, err, _ = run_job("exit")
    assert rc == 0, err
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]


def test_without_thread_multiple_init_rpc_says_what_to_do():
    """A process whose MPI was initialized with MPI_THREAD_SERIALIZED (a
    singleton MPI process, no launcher)."""
    environ = job_env()
    code = (
        "import mpi4py; mpi4py.rc.thread_level = 'serialized'\n"
        "import pycoll.rpc as rpc\n"
        "try:\n"
        "    rpc.init_rpc('w')\n"
        "except RuntimeError as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: init_rpc: pycoll.rpc needs MPI_THREAD_MULTIPLE" in proc.stdout
    assert "MPI_THREAD_SERIALIZED" in proc.stdout and "thread_level" in proc.stdout
