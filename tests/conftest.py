"""Fixtures of pycoll's own suite.

The suite runs on one rank (plain ``pytest``), on N ranks from a plain pytest
(``pytest --suite-ranks N --mpi-reuse-all``: pycoll.testing runs the tests as
one N-rank job and merges the ranks' outcomes), or in place
(``mpiexec -n N python -m pytest --with-mpi``).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Without a GPU, pycoll.gpu's kernels run in numba's CUDA simulator; it must be
# chosen before numba is imported. PYCOLL_TEST_GPU=1 (a GPU machine) keeps CUDA.
if os.environ.get("PYCOLL_TEST_GPU", "") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


# Tests that start their own jobs or processes: they run in the plain pass only
# (an N-rank pass does not even collect them: tests/launch's collection alone
# asks every venv's MPI its name, 9 s).
_OWN_JOBS = (
    "cluster/",
    "launch/",
    "testing/",
    "test_hangs.py",
    "test_docs.py",
    "torch_backend/test_torch_jobs.py",
    "rpc/test_rpc_jobs.py",
    "rpc/test_rpc_autograd_jobs.py",
    "trace/test_trace_jobs.py",
)


# The most ranks an any_size test runs at: both MPIs, both wait modes and
# DETAIL meet it at 2 ranks (scripts/test's 2-rank passes).
ANY_SIZE_UP_TO = 2


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "one_process: a test of one process's code (no MPI, or fresh interpreters "
        "reading a setting at import) that an N-rank pass would only repeat: the "
        "plain pass runs it once, --suite-ranks leaves it out",
    )
    config.addinivalue_line(
        "markers",
        "beside_pytest_mpi: a test of the harness that its pass beside pytest-mpi "
        "runs again (tests/testing/test_plugin.py)",
    )
    config.addinivalue_line(
        "markers",
        "any_size: a test whose code takes no path by the group's size (it needs "
        f"peers, not a number of them): passes of more than {ANY_SIZE_UP_TO} ranks "
        "leave it out",
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-ranks",
        type=int,
        metavar="N",
        help="run the suite's tests on N ranks: each is marked mpi(ranks=N) for "
        "pycoll.testing (with --mpi-reuse-all, one job runs them all)",
    )


def pytest_ignore_collect(collection_path, config: pytest.Config) -> Optional[bool]:
    if not config.getoption("suite_ranks"):
        return None
    path = collection_path.as_posix() + ("/" if collection_path.is_dir() else "")
    return any(f"/tests/{part}" in path for part in _OWN_JOBS) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    ranks = config.getoption("suite_ranks")
    if not ranks:
        return
    keep, drop = [], []
    for item in items:
        own = any(part in item.nodeid for part in _OWN_JOBS)
        own = own or item.get_closest_marker("one_process") is not None
        own = own or (ranks > ANY_SIZE_UP_TO and item.get_closest_marker("any_size") is not None)
        (drop if own else keep).append(item)
        if not own:
            item.add_marker(pytest.mark.mpi(ranks=ranks))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    from mpi4py import MPI

    ranks = config.getoption("suite_ranks")
    where = f"{ranks} ranks per job" if ranks else f"{MPI.COMM_WORLD.Get_size()} rank(s)"
    return f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}, {where}"


@pytest.fixture(scope="session", autouse=True)
def _no_stale_segments():
    """Jobs the tests kill on purpose leave MPI's shared-memory segments in
    /dev/shm (about 100 MB a run of scripts/test, held until reboot): what the
    session's jobs left is removed at its end. A segment made in the last 5 s
    and not mapped yet may be a job's beside this one, starting: it stays."""
    from support import remove_stale_segments, shm_segments

    before = shm_segments()
    yield
    remove_stale_segments(shm_segments() - before, min_age=5.0)


@pytest.fixture(scope="session")
def _session_group():
    import pycoll

    yield
    if pycoll.is_initialized():
        pycoll.destroy_process_group()


@pytest.fixture
def pg(_session_group):
    """The default group, initialized once and re-initialized after tests that
    destroy it."""
    import pycoll

    if not pycoll.is_initialized():
        pycoll.init_process_group()
    return pycoll.group.WORLD


@pytest.fixture
def rank(pg) -> int:
    return pg.rank()


@pytest.fixture
def world_size(pg) -> int:
    return pg.size()


@pytest.fixture
def unsent(pg, world_size):
    """Asserts, after the test body, that nothing was issued on the group
    (bad input refused before anything is sent); then a real collective, which
    would hang or mismatch if any rank had sent something, proves every rank
    is still in step."""
    import numpy as np

    import pycoll

    before = pg.sequence_number()
    yield
    assert pg.sequence_number() == before
    x = np.ones(1)
    pycoll.all_reduce(x)
    assert x[0] == world_size


@pytest.fixture
def uninitialized(_session_group):
    """pycoll with no default group (the next test's ``pg`` re-creates it)."""
    import pycoll

    if pycoll.is_initialized():
        pycoll.destroy_process_group()
    yield


@pytest.fixture
def debug_off():
    """Pin the debug level to OFF for a test about OFF-mode behaviour (the suite
    also runs with PYCOLL_DEBUG=DETAIL, which catches some mistakes earlier)."""
    import pycoll

    before = pycoll.get_debug_level()
    pycoll.set_debug_level(pycoll.DebugLevel.OFF)
    yield
    pycoll.set_debug_level(before)
