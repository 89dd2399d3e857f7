"""pycoll-run batch: the scripts it writes, and real jobs on a real Slurm
(scripts/slurm-up starts a one-node cluster; scripts/test runs it)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Tuple

import pytest
from launch_support import HERE, PYTHONS, ROOT, TARGET, clean_env, family_params, reports

from pycoll.launch.cli import main


@pytest.fixture(autouse=True)
def outside_any_allocation(monkeypatch):
    for key in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(key, raising=False)


def render(capsys, *args: str) -> str:
    assert main(["batch", *args]) == 0
    return capsys.readouterr().out


def test_slurm_script(capsys):
    text = render(
        capsys, "--scheduler", "slurm", "--nodes", "2", "--ppn", "4", "--time", "01:00:00",
        "--partition", "gpu", "--account", "proj", "--gpus-per-node", "4", "--job-name", "t",
        "--extra", "#SBATCH --mem=0", "--timeout", "3000", "--env", "A=b c",
        "train.py", "--lr", "0.1",
    )  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=t",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --time=01:00:00",
        "#SBATCH --output=%x-%j.out",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --mem=0",
    ]
    assert lines[-1] == (
        f"exec {sys.executable} -m pycoll.launch --env 'A=b c' --timeout 3000 train.py --lr 0.1"
    )
    assert "2 node(s) x 4 rank(s) = 8 rank(s)" in text


def test_pbs_script(capsys):
    text = render(
        capsys, "--scheduler", "pbs", "--nodes", "3", "--ppn", "2", "--time", "00:30:00",
        "--partition", "short", "--gpus-per-node", "1", "-m", "pkg.train",
    )  # fmt: skip
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("#PBS")] == [
        "#PBS -N pkg.train",
        "#PBS -l select=3:ncpus=2:mpiprocs=2:ngpus=1",
        "#PBS -l walltime=00:30:00",
        "#PBS -j oe",
        "#PBS -q short",
    ]
    assert 'cd "$PBS_O_WORKDIR"' in lines
    assert lines[-1] == f"exec {sys.executable} -m pycoll.launch -m pkg.train"


def test_the_script_goes_to_the_submit_directory_in_its_environment(capsys):
    text = render(
        capsys, "--scheduler", "slurm", "--nodes", "1", "--ppn", "2", "--time", "00:10:00",
        "--", "train.py", "--lr", "0.1",
    )  # fmt: skip
    lines = text.splitlines()
    assert lines.index('cd "$SLURM_SUBMIT_DIR"') < len(lines) - 1
    if sys.prefix != sys.base_prefix:
        assert f"source {os.path.join(sys.prefix, 'bin', 'activate')}" in lines
    else:
        assert f"# Python: {sys.executable} (named in full below)." in lines
    # A script after -- is written as the script form (it ran as a command
    # before, and failed with 'cannot run train.py' where it is not executable).
    assert lines[-1] == f"exec {sys.executable} -m pycoll.launch train.py --lr 0.1"
    assert "#SBATCH --job-name=train.py" in lines


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--time", "1h"], "--time '1h': write HH:MM:SS"),
        (["--time", "1-00:00:00", "--scheduler", "pbs"], "PBS takes HH:MM:SS"),
        (["--extra=--mem=0"], "a slurm directive starts with #SBATCH"),
        (["-n", "9"], "-n 9 is more than --nodes x --ppn = 8"),
        (["--hosts", "a:4"], "the scheduler chooses the hosts"),
        (
            ["--job-name", "x\n/usr/bin/touch /tmp/PWNED"],
            "--job-name 'x\\n/usr/bin/touch /tmp/PWNED': a batch directive is one line, "
            "so it cannot hold '\\n'",
        ),
        (["--partition", "gpu\rx"], "--partition 'gpu\\rx': a batch directive is one line"),
        (["--account", "a\x1bb"], "--account 'a\\x1bb': a batch directive is one line"),
        (["--extra", "#SBATCH --mem=0\nrm -rf ~"], "--extra '#SBATCH --mem=0\\nrm -rf ~'"),
        (["--time", "01:00:00\n"], "--time '01:00:00\\n': a batch directive is one line"),
        (["--job-name", "my job"], "--job-name 'my job': use letters, digits and . _ - + only"),
    ],
)
def test_batch_errors(capsys, args, problem):
    base = {"--scheduler": "slurm", "--nodes": "2", "--ppn": "4", "--time": "01:00:00"}
    for key in args[::2]:
        base.pop(key, None)
    argv = [x for kv in base.items() for x in kv] + args + ["t.py"]
    with pytest.raises(SystemExit) as info:
        main(["batch", *argv])
    assert info.value.code == 2
    assert problem in capsys.readouterr().err


# -- a real Slurm ------------------------------------------------------------


def _slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(
        ["sinfo", "-h", "-t", "idle,mix", "-o", "%n"], capture_output=True, text=True
    )
    return out.returncode == 0 and bool(out.stdout.strip())


slurm = pytest.mark.skipif(not _slurm_up(), reason="no Slurm cluster here (scripts/slurm-up)")


def _job(job_id: str, limit: float = 120) -> Dict[str, str]:
    """The finished job's fields, from scontrol (polled until it leaves the queue)."""
    deadline = time.monotonic() + limit
    while True:
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True
        ).stdout
        fields = dict(re.findall(r"(\w+)=(\S*)", out))
        if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return fields
        assert time.monotonic() < deadline, f"job {job_id} still {fields.get('JobState')}"
        time.sleep(0.2)


def _finished(submit: subprocess.CompletedProcess, folder: Path, name: str) -> Tuple[Dict, str]:
    """The fields and the output file of the job that ``submit`` submitted, once it ended."""
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip()
    assert job_id.isdigit(), submit.stdout
    fields = _job(job_id)
    return fields, (folder / f"{name}-{job_id}.out").read_text()


@slurm
@pytest.mark.parametrize("family", family_params())
def test_submitted_job_runs_every_rank(family, tmp_path, world_size):
    if world_size != 1:
        pytest.skip("submits its own jobs; runs in the single-rank pass")
    submit = subprocess.run(
        [
            PYTHONS[family], "-m", "pycoll.launch", "batch", "--scheduler", "slurm",
            "--nodes", "1", "--ppn", "4", "--time", "00:05:00", "--job-name", "ok",
            "--timeout", "120", "--output", "job.sh", "--submit", str(HERE / TARGET), "ok",
        ],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip()
    assert job_id.isdigit(), submit.stdout
    fields = _job(job_id)
    output = (tmp_path / f"ok-{job_id}.out").read_text()
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    seen = reports(output)
    assert sorted(seen) == [0, 1, 2, 3], output
    for rank, r in seen.items():
        assert (r["RANK"], r["WORLD_SIZE"], r["LOCAL_RANK"]) == (str(rank), "4", str(rank))
    if family == "mpich":  # through srun: each rank is a task of a job step
        assert {r["SLURM_STEP_ID"] for r in seen.values()} == {"0"}, output


@slurm
def test_failing_batch_job_fails_with_the_ranks_traceback(tmp_path, world_size):
    if world_size != 1:
        pytest.skip("submits its own jobs; runs in the single-rank pass")
    family = next(iter(PYTHONS))
    submit = subprocess.run(
        [
            PYTHONS[family], "-m", "pycoll.launch", "batch", "--scheduler", "slurm",
            "--nodes", "1", "--ppn", "3", "--time", "00:05:00", "--job-name", "bad",
            "--submit", str(HERE / TARGET), "raise", "1",
        ],
        cwd=tmp_path, capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    fields, output = _finished(submit, tmp_path, "bad")
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "1:0"), output
    assert "pycoll-run: rank 1 on " in output and "[1] ValueError: rank 1 refuses" in output


TRAIN = """\
import argparse
import numpy as np
import pycoll

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float)
lr = parser.parse_args().lr
pycoll.init_process_group()
x = np.full(3, lr * (pycoll.get_rank() + 1))
pycoll.all_reduce(x)
print(f"TRAINED rank={pycoll.get_rank()} sum={x[0]:.1f}", flush=True)
pycoll.destroy_process_group()
"""


@slurm
def test_the_guides_batch_example_runs_as_written(tmp_path, world_size):
    """The launcher guide's Slurm line (docs/guide/launcher.md), run as written
    (pycoll-run being this Python's), then sbatch job.sh: train.py after -- is
    not executable, and runs."""
    if world_size != 1:
        pytest.skip("submits its own jobs; runs in the single-rank pass")
    if "mpich" not in PYTHONS:
        pytest.skip("srun runs MPICH ranks here (Open MPI's wheel has no PMIx for srun)")
    readme = (ROOT / "docs" / "guide" / "launcher.md").read_text()
    line = next(
        x for x in readme.splitlines() if x.startswith("pycoll-run batch --scheduler slurm")
    )
    command, _, redirect = line.partition(" > ")
    assert redirect == "job.sh" and "-- train.py --lr 0.1" in command, line
    (tmp_path / "train.py").write_text(TRAIN)
    assert not os.access(tmp_path / "train.py", os.X_OK)
    argv = [PYTHONS["mpich"], "-m", "pycoll.launch", *shlex.split(command)[1:]]
    made = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=clean_env())
    assert made.returncode == 0, made.stderr
    (tmp_path / "job.sh").write_text(made.stdout)
    submit = subprocess.run(
        ["sbatch", "--parsable", "job.sh"], cwd=tmp_path, capture_output=True, text=True,
        env=clean_env(), timeout=60,
    )  # fmt: skip
    fields, output = _finished(submit, tmp_path, "train.py")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    for rank in range(4):  # 0.1 * (1 + 2 + 3 + 4) on every rank
        assert f"[{rank}] TRAINED rank={rank} sum=1.0" in output, output


@slurm
def test_inside_salloc_without_n_uses_the_whole_allocation(world_size):
    if world_size != 1:
        pytest.skip("starts its own jobs; runs in the single-rank pass")
    if "mpich" not in PYTHONS:
        pytest.skip("srun runs MPICH ranks here (Open MPI's wheel has no PMIx for srun)")
    proc = subprocess.run(
        ["salloc", "-Q", "-n", "3", PYTHONS["mpich"], "-m", "pycoll.launch", TARGET, "ok"],
        cwd=HERE, capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = reports(proc.stdout)
    assert sorted(seen) == [0, 1, 2]
    assert {r["SLURM_STEP_ID"] for r in seen.values()} == {"0"}  # started by srun


def test_submit_without_the_scheduler_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no qsub here
    with pytest.raises(SystemExit) as info:
        main(["batch", "--scheduler", "pbs", "--nodes", "1", "--ppn", "2", "--time",
              "00:10:00", "--submit", "t.py"])  # fmt: skip
    assert info.value.code == 2
    assert "--submit: qsub is not on PATH (is this a pbs login node?)" in capsys.readouterr().err
