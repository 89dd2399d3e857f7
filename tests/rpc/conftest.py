"""Fixtures of pycoll.rpc's tests: one agent per test module (every rank of
the job runs the same modules in the same order, so init_rpc and shutdown,
which are collective, meet)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def rpc_world():
    """RPC initialized as worker{rank} on every rank; shut down gracefully
    after the module's last test."""
    from mpi4py import MPI

    import pycoll.rpc as rpc

    comm = MPI.COMM_WORLD
    rpc.init_rpc(f"worker{comm.Get_rank()}")
    yield comm.Get_rank(), comm.Get_size()
    rpc.shutdown()


@pytest.fixture
def me(rpc_world):
    return rpc_world[0]


@pytest.fixture
def size(rpc_world):
    return rpc_world[1]


@pytest.fixture
def peer(rpc_world):
    """The next rank (this rank itself in a 1-rank job: a self-call)."""
    rank, size = rpc_world
    return (rank + 1) % size
