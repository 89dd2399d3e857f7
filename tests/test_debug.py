"""Debug levels from PYCOLL_DEBUG, and the INFO log of collectives."""

import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import pycoll
from pycoll import DebugLevel

# Any size of job: the debug levels log and check alike at every size.
pytestmark = pytest.mark.any_size


@pytest.fixture
def restore_level(monkeypatch):
    """PYCOLL_DEBUG unset for the test; the level in force before is restored after
    (the suite also runs under DETAIL, which later tests must keep)."""
    before = pycoll.get_debug_level()
    monkeypatch.delenv("PYCOLL_DEBUG", raising=False)
    yield monkeypatch
    pycoll.set_debug_level(before)


def test_default_is_off(restore_level):
    pycoll.set_debug_level_from_env()
    assert pycoll.get_debug_level() == DebugLevel.OFF


@pytest.mark.parametrize(
    "value,level",
    [
        ("OFF", DebugLevel.OFF),
        ("off", DebugLevel.OFF),
        ("oFf", DebugLevel.OFF),
        ("INFO", DebugLevel.INFO),
        ("info", DebugLevel.INFO),
        ("INfO", DebugLevel.INFO),
        ("DETAIL", DebugLevel.DETAIL),
        ("detail", DebugLevel.DETAIL),
        ("DeTaIl", DebugLevel.DETAIL),
        ("", DebugLevel.OFF),  # set but empty, as `PYCOLL_DEBUG= cmd` leaves it
        (" ", DebugLevel.OFF),
    ],
)
def test_levels_from_env_any_case(restore_level, value, level):
    restore_level.setenv("PYCOLL_DEBUG", value)
    pycoll.set_debug_level_from_env()
    assert pycoll.get_debug_level() == level


@pytest.mark.parametrize("value", ["foo", "0", "1", "-1"])
def test_invalid_values_raise(restore_level, value):
    restore_level.setenv("PYCOLL_DEBUG", value)
    with pytest.raises(ValueError, match="^The value of PYCOLL_DEBUG must be"):
        pycoll.set_debug_level_from_env()


def test_info_logs_every_collective(restore_level, pg, caplog):
    pycoll.set_debug_level(DebugLevel.INFO)
    x = np.ones(4, np.float32)
    with caplog.at_level(logging.INFO, logger="pycoll"):
        pycoll.all_reduce(x)
        seq = pg.sequence_number()
        pycoll.broadcast(x, src=0)
        pycoll.all_reduce(x, async_op=True).wait()
        pycoll.barrier()
    lines = [r.getMessage() for r in caplog.records if r.name == "pycoll"]
    assert len(lines) == 4, lines
    assert lines[0].startswith("all_reduce ")
    assert f"seq={seq} " in lines[0] and "bytes=16 " in lines[0] and "duration_us=" in lines[0]
    assert lines[1].startswith("broadcast ") and f"seq={seq + 1} " in lines[1]
    assert lines[2].startswith("all_reduce ") and f"seq={seq + 2} " in lines[2]
    assert lines[3].startswith("barrier ")


def test_off_logs_nothing(restore_level, pg, caplog):
    pycoll.set_debug_level(DebugLevel.OFF)
    with caplog.at_level(logging.INFO, logger="pycoll"):
        pycoll.all_reduce(np.ones(2))
    assert not [r for r in caplog.records if r.name == "pycoll"]


def test_init_reads_the_environment(restore_level, uninitialized):
    restore_level.setenv("PYCOLL_DEBUG", "bogus")
    with pytest.raises(ValueError, match="The value of PYCOLL_DEBUG must be"):
        pycoll.init_process_group()
    assert not pycoll.is_initialized()
    restore_level.setenv("PYCOLL_DEBUG", "info")
    pycoll.init_process_group()
    assert pycoll.get_debug_level() == DebugLevel.INFO


# A launcher's variables must not reach a program started from a rank.
LAUNCHER_VARS = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "OMPI_COMM_WORLD", "PRTE_JOB")


def test_info_reaches_stderr_without_logging_set_up(tmp_path, world_size):
    """A program that configures no logging still shows INFO, rank-prefixed."""
    if world_size != 1:
        pytest.skip("starts a program of its own; runs in the single-rank pass")
    script = tmp_path / "info.py"
    script.write_text(
        "import numpy as np, pycoll\n"
        "pycoll.init_process_group()\n"
        "pycoll.all_reduce(np.ones(4, np.float32))\n"
        "pycoll.destroy_process_group()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env["PYCOLL_DEBUG"] = "INFO"
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(
        r"^\[rank 0\] pycoll INFO: all_reduce group=default_pg seq=1 bytes=16 duration_us=",
        proc.stderr,
        re.M,
    ), proc.stderr
