"""The torch backend in jobs of its own: rendezvous with no variables set,
errors that must name the problem, the ``import torch`` hook.

Each test starts a 2-rank job with the mpiexec beside this Python (so it
runs in the single-rank pass), with the launcher's and torch's rendezvous
variables of the surrounding job removed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from support import run_mpiexec

pytest.importorskip("torch")

SCRIPT = Path(__file__).with_name("torch_scenarios.py")
JOB_LIMIT_S = 120
_DROP = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "OMPI_COMM_WORLD", "PRTE_JOB", "SLURM_")
_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture(autouse=True)
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("launches its own jobs; runs in the single-rank pass")


def clean_env(**extra: str) -> Dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_DROP) and k not in _RENDEZVOUS and k != "PYCOLL_DEBUG"
    }
    env.update(extra)
    return env


def run_job(scenario: str, stderr: Optional[List[str]] = None, **env: str) -> List[Dict]:
    argv = [sys.executable, str(SCRIPT), scenario]
    proc = run_mpiexec(2, argv, env=clean_env(**env), timeout=JOB_LIMIT_S)
    if stderr is not None:
        stderr.append(proc.stderr)
    reports, decoder, text = [], json.JSONDecoder(), proc.stdout
    at = text.find("{")
    while at != -1:  # launchers may glue the ranks' lines together
        obj, end = decoder.raw_decode(text, at)
        reports.append(obj)
        at = text.find("{", end)
    assert reports, f"no reports; rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return reports


@pytest.mark.parametrize("scenario", ["mpi_url", "plain"])
def test_rendezvous_needs_no_variables(scenario):
    reports = run_job(scenario)
    assert sorted(r["rank_seen"] for r in reports) == [0, 1]
    for r in reports:
        assert r["size"] == 2 and r["sum"] == [3.0, 3.0, 3.0]
        assert r["gloo"] == 2.0 and r["backend"] == "pycoll"


def test_rank_and_world_size_alone_take_the_rest_from_mpi():
    reports = run_job("half_env")  # torch's env:// alone: "MASTER_ADDR expected"
    assert sorted(r.get("rank_seen") for r in reports) == [0, 1], reports
    for r in reports:
        assert r["size"] == 2 and r["sum"] == [3.0, 3.0, 3.0] and r["gloo"] == 2.0


def test_a_world_size_in_the_environment_that_disagrees_with_mpi_is_refused():
    reports = run_job("half_env_wrong")
    assert len(reports) == 2
    for r in reports:
        assert (
            "the environment sets WORLD_SIZE=3, but MPI started this process as rank"
            in (r["error"])
        )
        assert "unset WORLD_SIZE" in r["error"]


def test_torchs_debug_level_applies_to_the_start_it_was_given_to():
    reports = run_job("debug_lent")
    assert len(reports) == 2
    for r in reports:  # (PYCOLL_DEBUG was once left set for good: later groups kept DETAIL)
        assert r["first"] == "DETAIL" and r["then"] == "OFF" and r["env"] is None, r


def test_a_mismatch_found_at_destroy_is_said_and_torch_starts_again():
    err: List[str] = []
    reports = run_job("mismatch_at_destroy", stderr=err)
    assert sorted(r["rank_seen"] for r in reports) == [0, 1], (reports, err[0][-3000:])
    for r in reports:
        assert r["sum"] == [3.0, 3.0, 3.0], r
    for rank in (0, 1):
        assert f"pycoll: rank {rank}: destroy_process_group: the ranks of group" in err[0], err[0]
    assert "called different collectives at seq " in err[0]


def test_a_rank_that_disagrees_with_mpi_is_refused_by_name():
    reports = run_job("wrong_rank")
    assert len(reports) == 2
    for r in reports:
        assert "rank=5 was given, but MPI started this process as rank" in r["error"]
        assert "leave rank and world_size out" in r["error"]


@pytest.mark.parametrize("via", ["wait", "future"])
def test_a_hang_ends_in_torchs_error_family_with_pycolls_diagnosis(via):
    reports = run_job(
        "timeout", PYCOLL_TIMEOUT="3", **({"VIA_FUTURE": "1"} if via == "future" else {})
    )
    r0 = next(r for r in reports if "kind" in r)
    assert r0["is_torch"], r0["kind"]
    assert "DistTimeoutError" in r0["kind"]
    assert "all_reduce" in r0["error"] and "rank 1" in r0["error"], r0["error"]
    # torch's wording first (the regex torch's own suite matches), then pycoll's diagnosis
    # (a future's completer raises the error once the deadline has passed: its own short wait)
    waited = "3000" if via == "wait" else r"\d+"
    assert re.match(
        rf"\[Rank 0\] Timed out waiting {waited}ms for all_reduce \(seq \d+\)", r0["error"]
    )
    assert re.search(" (Timed out|closed|timeout) ", r0["error"]), r0["error"]
    assert "failed to pass monitoredBarrier" not in r0["error"]


def test_a_hang_at_detail_says_torchs_monitored_barrier_words():
    reports = run_job("timeout", PYCOLL_TIMEOUT="3", TORCH_DISTRIBUTED_DEBUG="DETAIL")
    r0 = next(r for r in reports if "kind" in r)
    assert "DistTimeoutError" in r0["kind"], r0
    assert "Rank 1 failed to pass monitoredBarrier in 3000 ms" in r0["error"], r0["error"]
    assert re.search(" (Timed out|closed|timeout) ", r0["error"]), r0["error"]


def test_a_mismatch_under_detail_is_named(tmp_path):
    reports = run_job("mismatch", TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert len(reports) == 2
    for r in reports:
        assert r["is_torch"] and "CollectiveMismatchError" in r["kind"], r
        assert "all_reduce" in r["error"]


def python(code: str) -> str:
    """The output of ``python -c code`` in a fresh process (which must succeed)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=JOB_LIMIT_S,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_import_torch_hook_registers_and_starts_nothing():
    code = (
        "import sys, torch, torch.distributed as d;"
        "print(d.is_backend_available('pycoll'), 'mpi4py.MPI' in sys.modules,"
        " 'pycoll.torch' in sys.modules)"
    )
    assert python(code).split() == ["True", "False", "True"]


def test_a_failing_hook_warns_and_import_torch_goes_on():
    code = (
        "import sys, warnings; sys.modules['pycoll.torch'] = None\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import torch\n"
        "    from pycoll._torch_hook import autoload; autoload()\n"
        "print([str(w.message) for w in seen if 'pycoll' in str(w.message)])"
    )
    assert "could not register its torch backend" in python(code)
