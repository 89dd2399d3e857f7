"""torch's own distributed test suite over the backend "pycoll", with gloo as the baseline.

torch's ``DistributedTest._DistTestBase`` (shipped in the wheel) runs in a
3-rank MPI job per backend (tests/torch_backend/torch_suite.py says how),
first on gloo, then on pycoll, in the same harness. A test passes where it
passed on every rank. The rule: every test gloo passes, pycoll passes, and
every test gloo runs, pycoll runs, but for GLOO_ONLY, each with its reason.

The counts go to stdout (``-s``) and into docs/guide/torch.md. The job runs
in the single-rank pass, with torch (CI's .venv-torch): scripts/test runs this
file as a pass of its own.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Dict, Tuple

import pytest

from support import job_env, run_mpiexec

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's test utilities import it

SCRIPT = Path(__file__).with_name("torch_suite.py")
RANKS = 3  # torch ran its MPI backend's suite at 3 ranks; some tests need an odd size
JOB_LIMIT_S = 420

# Tests that run for gloo and cannot for pycoll, each with its reason.
GLOO_ONLY = {
    "test_monitored_barrier_gloo": (
        "torch.distributed.monitored_barrier accepts gloo groups alone (torch's own check); "
        "pycoll's is the group's monitored_barrier method, tested by test_monitored_barrier_"
        "gloo_rank_0_timeout here and tests/collectives/test_barrier.py"
    ),
    "test_monitored_barrier_gloo_subgroup": (
        "torch.distributed.monitored_barrier accepts gloo groups alone (torch's own check)"
    ),
}

Outcomes = Dict[str, Tuple[str, str]]


@pytest.fixture(autouse=True)
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("launches its own 3-rank jobs; runs in the single-rank pass")


def run_suite(backend: str) -> Outcomes:
    """test -> (outcome on every rank together, what the first rank not passing said)."""
    with tempfile.TemporaryDirectory(prefix=f"pycoll-torch-suite-{backend}-") as temp:
        for sub in ("barrier", "test_dir", "init_dir", "out"):
            os.mkdir(os.path.join(temp, sub))
        env = job_env()
        for var in ("PYCOLL_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "RANK", "WORLD_SIZE"):
            env.pop(var, None)
        env.update(TEMP_DIR=temp, PYTORCH_PRINT_REPRO_ON_FAILURE="0")
        argv = [sys.executable, str(SCRIPT), backend, os.path.join(temp, "out")]
        proc = run_mpiexec(RANKS, argv, env=env, timeout=JOB_LIMIT_S, cwd=temp)
        per_rank = []
        for rank in range(RANKS):
            path = Path(temp, "out", f"rank{rank}.jsonl")
            lines = (
                [json.loads(line) for line in path.read_text().splitlines()]
                if path.exists()
                else []
            )
            per_rank.append(lines)
        finished = all(lines and lines[-1].get("done") for lines in per_rank)
        assert proc.returncode == 0 and finished, (
            f"the {backend} job did not finish: rc={proc.returncode}, last test on each rank: "
            f"{[lines[-1] if lines else None for lines in per_rank]}\n{proc.stderr[-4000:]}"
        )
    merged: Outcomes = {}
    for lines in per_rank:
        for line in lines[:-1]:
            name, outcome, said = line["test"], line["outcome"], line["said"]
            before = merged.get(name)
            if before is None or _rank_of(outcome) > _rank_of(before[0]):
                merged[name] = (outcome, said)
    return merged


def _rank_of(outcome: str) -> int:
    """How outcomes combine across ranks: a failure anywhere fails, then a skip."""
    return {"passed": 0, "skipped": 1, "failed": 2}[outcome]


@pytest.fixture(scope="module")
def suites() -> Dict[str, Outcomes]:
    from mpi4py import MPI

    # (module-scoped: made before the per-test one_rank skip, so it checks itself)
    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("launches its own 3-rank jobs; runs in the single-rank pass")
    found = {backend: run_suite(backend) for backend in ("gloo", "pycoll")}
    for backend, outcomes in found.items():
        counts = Counter(outcome for outcome, _ in outcomes.values())
        print(f"\ntorch's DistributedTest over {backend} at {RANKS} ranks: {dict(counts)}")
    return found


def test_the_harness_runs_the_whole_suite(suites):
    # (torch 2.13's suite has 285 tests; far fewer would mean the harness lost some)
    assert len(suites["gloo"]) > 250 and suites["gloo"].keys() == suites["pycoll"].keys()
    assert sum(o == "passed" for o, _ in suites["gloo"].values()) >= 80


def test_pycoll_passes_every_test_gloo_passes(suites):
    gloo, ours = suites["gloo"], suites["pycoll"]
    lost = {
        name: ours[name]
        for name, (outcome, _) in gloo.items()
        if outcome == "passed" and name not in GLOO_ONLY and ours[name][0] != "passed"
    }
    assert not lost, "\n\n".join(f"{n}: {o}\n{said[-1500:]}" for n, (o, said) in lost.items())


def test_every_test_gloo_runs_runs_for_pycoll_but_the_listed(suites):
    gloo, ours = suites["gloo"], suites["pycoll"]
    unlisted = [
        name
        for name, (outcome, _) in gloo.items()
        if outcome != "skipped" and ours[name][0] == "skipped" and name not in GLOO_ONLY
    ]
    assert not unlisted, {name: ours[name][1][-300:] for name in unlisted}


def test_the_gloo_only_list_is_current(suites):
    """Each listed test passes for gloo and does not for pycoll: a stale entry goes."""
    for name in GLOO_ONLY:
        assert suites["gloo"][name][0] == "passed", (name, suites["gloo"][name])
        assert suites["pycoll"][name][0] != "passed", (name, "passes now: take it off the list")
