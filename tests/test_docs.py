"""The README's and the user guide's example programs run as written: every
``python`` block that is a whole program (it calls init_process_group or
init_rpc) runs as
a 2-rank MPI job and must end with status 0; blocks that are fragments, or
pytest files (the harness's own tests cover those), are left out."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from support import job_env, run_mpiexec

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def programs():
    found = []
    for page in PAGES:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            whole = "init_process_group()" in block or "rpc.init_rpc(f" in block
            if whole and "pytest" not in block:
                torch = ":torch" if "import torch" in block else ""
                found.append(pytest.param(block, id=f"{page.name}:{i}{torch}"))
    return found


def test_the_pages_have_programs():
    assert any("README.md" in p.id for p in programs())  # the README's example is found
    assert len(programs()) >= 3


@pytest.fixture
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("launches its own 2-rank jobs; runs in the single-rank pass")


@pytest.mark.parametrize("source", programs())
def test_example_program_runs_as_written(one_rank, source, tmp_path):
    if "import cupy" in source and importlib.util.find_spec("cupy") is None:
        pytest.skip("a GPU example: cupy is not installed")
    if "import torch" in source and importlib.util.find_spec("torch") is None:
        pytest.skip("a torch example: runs in the torch venv (scripts/test)")
    script = tmp_path / "example.py"
    script.write_text(source)
    env = job_env()
    proc = run_mpiexec(2, [sys.executable, str(script)], env=env, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
