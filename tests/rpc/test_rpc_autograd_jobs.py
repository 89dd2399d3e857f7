"""Distributed autograd when a worker stops answering mid-backward, in a
4-rank job of its own (tests/rpc/rpc_scenarios.py, CI's torch venvs)."""

from __future__ import annotations

import pytest
from test_rpc_jobs import run_job

pytest.importorskip("torch")


def test_a_worker_stopped_during_backward_is_named():
    """Rank 2, two hops down rank 0's graph, stops: rank 1's call to it fails
    by the heartbeat, and rank 0's backward raises naming rank 2."""
    rc, reports, err, _ = run_job("backward_stopped")
    assert rc == 0, err
    failed = [r for r in reports if "error" in r]
    assert len(failed) == 1 and failed[0]["rank"] == 0, reports
    report = failed[0]
    assert report["error"] is not None, reports
    assert report["error"].startswith("Error on Node 2: "), report
    assert "worker2" in report["error"] and "has stopped answering" in report["error"], report
    assert report["seconds"] < 30, report  # the RPC timeout is 60 s
    assert sorted(r["rank"] for r in reports if r.get("shutdown")) == [0, 1, 2, 3], reports
