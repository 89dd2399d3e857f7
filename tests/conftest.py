"""Fixtures of pycoll's own suite.

The suite runs on one rank (plain ``pytest``) or in place on N
(``mpiexec -n N python -m pytest --with-mpi``); pycoll.testing, pycoll's pytest
plugin, merges the ranks' outcomes so rank 0 reports one per test for all.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


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
