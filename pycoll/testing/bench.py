"""What a multi-rank test costs under pycoll.testing: empty 2-rank tests run
isolated (one job each), with --mpi-reuse (one job for the file), and in place
under mpiexec, against the same tests as plain single-process tests.

    python -m pycoll.testing.bench [--tests 20] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

from pycoll.launch.families import Job, choose


def _time(cmd: List[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pycoll.testing.bench", description=__doc__)
    p.add_argument("--tests", type=int, default=20)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args(argv)
    n, ranks = args.tests, args.ranks
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "test_marked.py").write_text(
            "import pytest\n\n"
            f"@pytest.mark.mpi(ranks={ranks})\n"
            f"@pytest.mark.parametrize('i', range({n}))\n"
            "def test_empty(comm, i):\n    pass\n"
        )
        (root / "test_plain.py").write_text(
            f"import pytest\n\n@pytest.mark.parametrize('i', range({n}))\n"
            "def test_empty(i):\n    pass\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
        pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        opts = ["--mpi-oversubscribe"]
        family, mpiexec, _ = choose(None, env)
        inplace = family.command(
            mpiexec, Job(nprocs=ranks, program=[*pytest_cmd, "--with-mpi", "test_marked.py"])
        )
        env_inplace = {**env, **family.defaults()}
        rows = [
            (
                "plain pytest, unmarked (1 process)",
                _time([*pytest_cmd, "test_plain.py"], root, env),
            ),
            (
                "isolated: one job per test",
                _time([*pytest_cmd, *opts, "test_marked.py"], root, env),
            ),
            (
                "--mpi-reuse: one job for the file",
                _time([*pytest_cmd, *opts, "--mpi-reuse", "test_marked.py"], root, env),
            ),
            ("in place: mpiexec ... pytest --with-mpi", _time(inplace, root, env_inplace)),
        ]
    print(f"# {n} empty tests on {ranks} ranks, {family.label}")
    print(f"{'way':42s} {'total s':>8s} {'per test s':>11s}")
    for name, total in rows:
        print(f"{name:42s} {total:8.2f} {total / n:11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
