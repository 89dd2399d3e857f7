"""functions.async_execution: the serving worker replies when the returned
Future completes, without a thread waiting, including chains through every
worker and remote()."""

from __future__ import annotations

import operator

import pytest

import pycoll.rpc as rpc
from pycoll.rpc.functions import async_execution

# Any size of job: calls go from worker to worker by name, whatever the job's size.
pytestmark = pytest.mark.any_size


@async_execution
def add_then_increment(to, a, b):
    return rpc.rpc_async(to, operator.add, args=(a, b)).then(lambda f: f.value() + 1)


@async_execution
def relay(hops, total):
    """Each worker adds its rank and passes the call on; nobody waits."""
    me = rpc.get_worker_info().id
    if hops == 0:
        future = rpc.Future()
        future.set_result(total + me)
        return future
    size = len(rpc_workers())
    return rpc.rpc_async((me + 1) % size, relay, args=(hops - 1, total + me))


def rpc_workers():
    from mpi4py import MPI

    return range(MPI.COMM_WORLD.Get_size())


@async_execution
def not_a_future():
    return 42


def test_async_execution_chains_a_future(me, peer, size):
    assert rpc.rpc_sync(peer, add_then_increment, args=((peer + 1) % size, 2, 3)) == 6


@pytest.mark.parametrize("hops", [1, 4])
def test_relay_through_every_worker(hops, me, size):
    expected = sum((me + 1 + i) % size for i in range(hops + 1))
    assert rpc.rpc_sync((me + 1) % size, relay, args=(hops, 0)) == expected


def test_async_execution_under_remote(peer, size):
    rref = rpc.remote(peer, add_then_increment, args=((peer + 1) % size, 10, 20))
    assert rref.to_here() == 31


def test_async_execution_must_return_a_future(peer):
    with pytest.raises(TypeError, match="must return a Future, not int"):
        rpc.rpc_sync(peer, not_a_future)
