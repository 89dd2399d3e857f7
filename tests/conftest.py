"""Runs the suite on one rank (plain ``pytest``) or on N (``mpiexec -n N python -m pytest``).

Under mpiexec every rank runs the whole session. After each test phase the
ranks exchange their outcomes, so every rank records the same result: a test
fails if it failed on any rank (the report shows each failing rank's
traceback, labelled), and ranks that disagree (one skipped, one passed) fail
it too. Ranks other than 0 print no report of their own: rank 0's speaks
for all, and the exit status is the same on every rank.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

_COMM = None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _COMM
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return
    _COMM = world.Dup()
    if _COMM.Get_rank():
        # Rank 0 reports for everyone (the outcomes are merged below); the
        # other ranks' tracebacks reach it through the merge, and anything
        # they write to stderr outside pytest still shows.
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if _COMM is None:
        return
    mine = (report.outcome, report.longreprtext if report.failed else "")
    everyone = _COMM.allgather(mine)
    failed = [(r, text) for r, (o, text) in enumerate(everyone) if o == "failed"]
    if failed:
        report.outcome = "failed"
        report.longrepr = "\n".join(f"---------- rank {r} ----------\n{text}" for r, text in failed)
    elif len({o for o, _ in everyone}) > 1:
        report.outcome = "failed"
        report.longrepr = "ranks disagree on the outcome: " + ", ".join(
            f"rank {r} {o}" for r, (o, _) in enumerate(everyone)
        )


def pytest_report_header(config: pytest.Config) -> str:
    from mpi4py import MPI

    return (
        f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}, "
        f"{MPI.COMM_WORLD.Get_size()} rank(s)"
    )


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
