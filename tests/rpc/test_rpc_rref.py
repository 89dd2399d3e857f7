"""pycoll.rpc's RRefs: creation, to_here, the proxies, passing to a third
worker and back to the owner, and the owner freeing the value once every
reference is gone (forks included), on every rank of the job."""

from __future__ import annotations

import pickle
import time
import weakref

import pytest

import pycoll.rpc as rpc

# Any size of job: calls go from worker to worker by name, whatever the job's size.
pytestmark = pytest.mark.any_size

# -- run on the owner ---------------------------------------------------------------------


class Counter:
    def __init__(self, start=0):
        self.count = start

    def add(self, n):
        self.count += n
        return self.count

    def value(self):
        return self.count


class Tracked:
    """A value whose life the test watches on its owner."""

    def __init__(self, tag):
        self.tag = tag


ALIVE = {}  # tag -> weakref to the Tracked value
HELD = {}  # tag -> an RRef this worker keeps for the test


def make_tracked(tag):
    value = Tracked(tag)
    ALIVE[tag] = weakref.ref(value)
    return value


def alive(tag):
    ref = ALIVE.get(tag)
    return ref is not None and ref() is not None


def hold(tag, rref):
    HELD[tag] = rref
    return rref.to_here().tag, rref.is_owner()


def drop(tag):
    HELD.pop(tag)


def owns(rref):
    return rref.is_owner(), rref.local_value().tag


def fetch(rref):
    return rref.to_here().tag, rref.is_owner(), rref.owner_name()


def local_rref(tag):
    return rpc.RRef(make_tracked(tag))


def failing(text):
    raise KeyError(text)


def until(condition, what, limit=30.0):
    """Wait (bounded) for a condition that the other workers make true."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"not within {limit} s: {what}"
        time.sleep(0.01)


# -- tests ----------------------------------------------------------------------------------


def test_remote_to_here_and_owner(me, peer):
    rref = rpc.remote(peer, Counter, args=(7,))
    assert rref.to_here().count == 7
    assert rref.owner() == rpc.get_worker_info(f"worker{peer}")
    assert rref.owner_name() == f"worker{peer}"
    assert rref.is_owner() == (peer == me)
    until(rref.confirmed_by_owner, "the owner confirms remote()'s RRef")


def test_local_value_on_a_non_owner_raises(me, peer, size):
    if size == 1:
        pytest.skip("needs a second worker: in a 1-rank job every RRef is owned here")
    rref = rpc.remote(peer, Counter)
    mine = f"name=worker{me}\\), which does not own this RRef.*to_here"
    with pytest.raises(RuntimeError, match=mine):
        rref.local_value()


def test_local_rref():
    rref = rpc.RRef([1, 2])
    assert rref.is_owner() and rref.confirmed_by_owner()
    assert rref.local_value() == [1, 2] and rref.to_here() == [1, 2]
    assert rref.owner() == rpc.get_worker_info()


def test_proxies_run_methods_on_the_owner(peer):
    rref = rpc.remote(peer, Counter)
    assert rref.rpc_sync().add(3) == 3
    assert rref.rpc_async().add(2).wait() == 5
    result = rref.remote().value()
    assert isinstance(result, rpc.RRef) and result.owner_name() == f"worker{peer}"
    assert result.to_here() == 5
    assert rref.rpc_sync(timeout=10).value() == 5


def test_error_of_remote_function_is_raised_by_to_here(peer):
    rref = rpc.remote(peer, failing, args=("absent",))
    with pytest.raises(KeyError, match=f"On WorkerInfo\\(id={peer}, name=worker{peer}\\)"):
        rref.to_here()


def test_passed_to_a_third_worker_and_back_to_the_owner(me, size):
    owner, third = (me + 1) % size, (me + 2) % size
    tag = f"third-{me}"
    rref = rpc.remote(owner, make_tracked, args=(tag,))
    assert rpc.rpc_sync(third, fetch, args=(rref,)) == (tag, third == owner, f"worker{owner}")
    assert rpc.rpc_sync(owner, owns, args=(rref,)) == (True, tag)


def test_owner_frees_the_value_when_every_reference_is_gone(me, size):
    owner, third = (me + 1) % size, (me + 2) % size
    tag = f"freed-{me}"
    rref = rpc.remote(owner, make_tracked, args=(tag,))
    assert rpc.rpc_sync(third, hold, args=(tag, rref)) == (tag, third == owner)
    until(lambda: rpc.rpc_sync(owner, alive, args=(tag,)), "the value exists")
    del rref  # the third worker's fork still holds it
    assert rpc.rpc_sync(owner, alive, args=(tag,))
    rpc.rpc_sync(third, drop, args=(tag,))
    until(lambda: not rpc.rpc_sync(owner, alive, args=(tag,)), "the owner frees the value")


def test_rref_returned_by_its_owner(me, peer):
    tag = f"returned-{me}"
    rref = rpc.rpc_sync(peer, local_rref, args=(tag,))
    assert rref.confirmed_by_owner()  # forked by the owner itself
    assert rref.to_here().tag == tag and rref.owner_name() == f"worker{peer}"
    del rref
    until(lambda: not rpc.rpc_sync(peer, alive, args=(tag,)), "the owner frees the value")


def test_remote_on_itself(me):
    rref = rpc.remote(me, Counter, args=(3,))
    assert rref.is_owner() and rref.local_value().count == 3
    assert rref.rpc_sync().add(1) == 4


def test_rref_cannot_be_pickled_outside_rpc():
    with pytest.raises(RuntimeError, match="only be sent as .* a pycoll.rpc call"):
        pickle.dumps(rpc.RRef(1))


def test_no_owner_entries_left_behind(me, size):
    """Once every test's references are gone, no worker keeps an entry for a
    user (a barrier of calls first: every worker has finished the tests)."""
    for other in range(size):
        rpc.rpc_sync(other, len, args=((),))
    until(lambda: rpc.debug_info()["num_owner_rrefs"] == 0, "owners release their entries")
