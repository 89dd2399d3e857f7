"""pycoll-run's command line: --dry-run for every family, and usage errors."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

import pycoll.launch
from pycoll.launch.cli import main
from pycoll.launch.families import family_of_mpiexec

PY = sys.executable
LAUNCH = Path(pycoll.launch.__file__).resolve().parent  # where pycoll.launch is installed
RANK = [PY, "-S", str(LAUNCH / "wrap.py")]
BOOT = [PY, str(LAUNCH / "boot.py")]
ROOT_FLAG = ["--allow-run-as-root"] if os.geteuid() == 0 else []
HYDRA_VARS = ["-genv", "PYCOLL_RUN_RANK_VARS", "PMI_RANK,PMI_SIZE"]
OMPI_VARS = ["-x", "PYCOLL_RUN_RANK_VARS=OMPI_COMM_WORLD_RANK,OMPI_COMM_WORLD_SIZE"]


@pytest.fixture(autouse=True)
def outside_any_allocation(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("SLURM_", "PBS_", "PYCOLL_RUN_", "MASTER_")):
            monkeypatch.delenv(key)


def dry_run(capsys, *args):
    assert main(["--dry-run", *args]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    exports = dict(
        line[len("export ") :].split("=", 1) for line in lines if line.startswith("export ")
    )
    return shlex.split(lines[-1]), {k: shlex.split(v)[0] for k, v in exports.items()}


COMMON = ["-n", "8", "--hosts", "a:4,b:4", "--ppn", "4", "--bind", "core", "--env", "X=1 2"]


def test_mpich(capsys):
    cmd, env = dry_run(capsys, "--launcher", "mpich", *COMMON, "train.py", "--lr", "3")
    assert Path(cmd[0]).name == "mpiexec"
    assert cmd[1:] == [
        "-bind-to", "core", "-genv", "X", "1 2", *HYDRA_VARS,
        "-n", "8", "-hosts", "a:4,b:4", "-ppn", "4",
        *RANK, *BOOT, "train.py", "--lr", "3",
    ]  # fmt: skip
    assert env == {"X": "1 2", "PYCOLL_RUN_RANK_VARS": "PMI_RANK,PMI_SIZE"}


def test_open_mpi(capsys):
    cmd, env = dry_run(capsys, "--launcher", "openmpi", *COMMON, "train.py")
    assert Path(cmd[0]).name == "mpiexec"
    assert cmd[1:] == [
        "-n", "8", *ROOT_FLAG, "--host", "a:4,b:4", "--map-by", "ppr:4:node:OVERSUBSCRIBE",
        "--bind-to", "core", "-x", "X=1 2", *OMPI_VARS,
        *RANK, *BOOT, "train.py",
    ]  # fmt: skip
    assert env["OMPI_MCA_osc"] == "^ucx" and env["X"] == "1 2"
    # libnbc's ring all_reduce and binomial reduce (docs/benchmarks.md)
    assert env["OMPI_MCA_coll_libnbc_iallreduce_algorithm"] == "1"
    assert env["OMPI_MCA_coll_libnbc_ireduce_algorithm"] == "2"


def test_open_mpi_local_oversubscribes_and_socket_is_package(capsys):
    cmd, _ = dry_run(capsys, "--launcher", "openmpi", "-n", "64", "--bind", "socket", "t.py")
    assert cmd[1:] == [
        "-n", "64", *ROOT_FLAG, "--map-by", "slot:OVERSUBSCRIBE", "--bind-to", "package",
        *OMPI_VARS, *RANK, *BOOT, "t.py",
    ]  # fmt: skip


def test_intel_mpi(capsys):
    cmd, _ = dry_run(capsys, "--launcher", "intel", *COMMON, "-m", "pkg.train")
    assert cmd[1:] == [
        "-genv", "X", "1 2", *HYDRA_VARS,
        "-genv", "I_MPI_PIN", "1", "-genv", "I_MPI_PIN_DOMAIN", "core",
        "-n", "8", "-hosts", "a,b", "-ppn", "4", *RANK, *BOOT, "-m", "pkg.train",
    ]  # fmt: skip


def test_intel_mpi_uneven_hosts_use_one_argument_set_per_host(capsys):
    cmd, _ = dry_run(capsys, "--launcher", "intel", "-n", "5", "--hosts", "a:4,b:2", "t.py")
    program = [*RANK, *BOOT, "t.py"]
    assert cmd[1:] == [
        *HYDRA_VARS,
        "-host", "a", "-n", "4", *program, ":", "-host", "b", "-n", "1", *program,
    ]  # fmt: skip


def test_srun(capsys):
    cmd, env = dry_run(capsys, "--launcher", "srun", *COMMON, "--", "./a.out", "-v")
    assert Path(cmd[0]).name == "srun"
    mpi = "pmix" if family_of_mpiexec(str(Path(PY).with_name("mpiexec"))) == "openmpi" else "pmi2"
    assert cmd[1:] == [
        "-n", "8", "--kill-on-bad-exit=1", "--nodelist", "a,b", "--ntasks-per-node", "4",
        "--cpu-bind=cores", f"--mpi={mpi}", *RANK, "./a.out", "-v",
    ]  # fmt: skip
    assert env == {
        "X": "1 2",
        "PYCOLL_RUN_RANK_VARS": "SLURM_PROCID,SLURM_NTASKS",
    }  # srun passes its environment on


def test_hostfile_gives_hosts_and_rank_count(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=3\n")
    cmd, _ = dry_run(capsys, "--launcher", "mpich", "--hostfile", str(hostfile), "t.py")
    assert cmd[4:8] == ["-n", "5", "-hosts", "a:2,b:3"]


def test_env_forward(capsys, monkeypatch):
    monkeypatch.setenv("PYCOLL_TEST_FWD", "here")
    cmd, env = dry_run(
        capsys, "--launcher", "mpich", "-n", "1", "--env-forward", "PYCOLL_TEST_FWD", "t.py"
    )
    assert cmd[1:4] == ["-genv", "PYCOLL_TEST_FWD", "here"] and env["PYCOLL_TEST_FWD"] == "here"


@pytest.mark.parametrize(
    "args, problem",
    [
        (["t.py"], "how many ranks? give -n N"),
        (["-n", "2"], "nothing to run"),
        (["-n", "0", "t.py"], "-n 0: need at least one rank"),
        (["-n", "2", "--env", "NOVALUE", "t.py"], "--env 'NOVALUE': write --env KEY=VALUE"),
        (["-n", "2", "--env-forward", "PYCOLL_UNSET_VAR", "t.py"], "PYCOLL_UNSET_VAR is not set"),
        (["-n", "2", "--hosts", "a", "--hostfile", "f", "t.py"], "give --hosts or --hostfile"),
        (["-n", "2", "--gpus-per-rank", "x", "t.py"], "give a count or 'auto'"),
        (["-n", "2", "--hosts", "a:0", "t.py"], "slot count '0'"),
    ],
)
def test_usage_errors(capsys, args, problem):
    with pytest.raises(SystemExit) as info:
        main(["--launcher", "mpich", "--dry-run", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pycoll-run: error: ") and problem in err, err


def test_malformed_hostfile_line_through_the_command_line(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots\n")
    with pytest.raises(SystemExit):
        main(["--dry-run", "--launcher", "mpich", "--hostfile", str(hostfile), "t.py"])
    assert f"hostfile {hostfile}, line 2 ('b slots'): 'slots' is not key=value" in (
        capsys.readouterr().err
    )


@pytest.mark.skipif(shutil.which("srun") is None, reason="needs Slurm's srun")
def test_inside_a_slurm_allocation_mpich_goes_through_srun(capsys, monkeypatch):
    if family_of_mpiexec(str(Path(PY).with_name("mpiexec"))) != "mpich":
        pytest.skip("this Python's MPI is not MPICH")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1,n2")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3(x2)")
    monkeypatch.setenv("SLURM_NTASKS", "6")
    cmd, _ = dry_run(capsys, "t.py")  # no -n: the allocation's task count
    assert Path(cmd[0]).name == "srun"
    assert cmd[1:5] == ["-n", "6", "--kill-on-bad-exit=1", "--mpi=pmi2"]
