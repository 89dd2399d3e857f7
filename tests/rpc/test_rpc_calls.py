"""pycoll.rpc's calls: values (arguments, nested structures, numpy arrays of
every dtype and layout, 64 MiB), remote errors, timeouts, nested chains,
self-calls, many futures and many threads, on every rank of the job."""

from __future__ import annotations

import operator
import threading
import time

import numpy as np
import pytest

import pycoll.rpc as rpc
from pycoll import DistTimeoutError
from support import ALL_DTYPES, assert_equal, data

# Any size of job: calls go from worker to worker by name, whatever the job's size.
pytestmark = pytest.mark.any_size

# -- functions the callee runs (importable by name on every rank) --------------------


def describe(*args, **kwargs):
    return {"args": args, "kwargs": kwargs, "by": rpc.get_worker_info().name}


def echo(x):
    return x


def raise_value_error(text):
    raise ValueError(text)


def raise_key_error(key):
    return {}[key]


class NeedsTwo(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def raise_needs_two():
    raise NeedsTwo(1, 2)


def raise_local_class():
    class Local(Exception):
        pass

    raise Local("from a class the caller cannot import")


GATES = {}


def wait_for_gate(name, limit):
    """Blocks until release(name) is called on this worker (bounded)."""
    gate = GATES.setdefault(name, threading.Event())
    return gate.wait(limit)


def release(name):
    GATES.setdefault(name, threading.Event()).set()


def chain(hops, path):
    """Call the next worker until ``hops`` is spent; the path comes back."""
    me = rpc.get_worker_info()
    path = path + [me.id]
    if hops == 0:
        return path
    size = rpc_size()
    return rpc.rpc_sync((me.id + 1) % size, chain, args=(hops - 1, path))


def rpc_size():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


# -- values ------------------------------------------------------------------------------


def test_args_kwargs_and_nested_structures(me, peer):
    nested = {"a": [1, (2.5, None)], "b": {"c": {1, 2}}, "d": b"\x00\xff", "e": "é"}
    got = rpc.rpc_sync(f"worker{peer}", describe, args=(me, nested), kwargs={"k": [nested]})
    assert got == {"args": (me, nested), "kwargs": {"k": [nested]}, "by": f"worker{peer}"}


@pytest.mark.parametrize("how", ["name", "info", "rank"])
def test_destination_by_name_info_or_rank(how, peer):
    to = {"name": f"worker{peer}", "info": rpc.get_worker_info(f"worker{peer}"), "rank": peer}[how]
    assert rpc.rpc_sync(to, operator.add, args=(2, 3)) == 5
    assert rpc.rpc_async(to, operator.mul, args=(2, 3)).wait() == 6


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 4)], ids=["0d", "empty", "2d"])
def test_numpy_arrays_every_dtype(dtype, shape, me, peer):
    x = data(me, dtype, shape)
    y = rpc.rpc_sync(peer, echo, args=(x,))
    assert isinstance(y, np.ndarray) and y.shape == shape and y.dtype == dtype
    assert_equal(y, data(me, dtype, shape))


def test_numpy_non_contiguous_and_fortran(me, peer):
    base = np.arange(60, dtype=np.float64).reshape(6, 10) + me
    for x in (base[::2, 1::3], base.T, np.asfortranarray(base)):
        y = rpc.rpc_sync(peer, echo, args=(x,))
        np.testing.assert_array_equal(y, x)
        assert y.shape == x.shape


def test_64_mib_payload_both_ways(me, peer):
    x = np.arange(8 << 20, dtype=np.int64) * (me + 1)  # 64 MiB
    y = rpc.rpc_sync(peer, echo, args=(x,))
    assert y.nbytes == 64 << 20
    np.testing.assert_array_equal(y, x)


def test_self_call(me):
    assert rpc.rpc_sync(me, describe, args=(1,))["by"] == f"worker{me}"
    assert rpc.rpc_sync(rpc.get_worker_info(), operator.neg, args=(4,)) == -4


def test_worker_info(me, size):
    info = rpc.get_worker_info()
    assert (info.id, info.name) == (me, f"worker{me}")
    assert repr(info) == f"WorkerInfo(id={me}, name=worker{me})"
    other = rpc.get_worker_info(f"worker{size - 1}")
    assert other.id == size - 1
    assert rpc.rpc_sync(other, rpc.get_worker_info) == other


# -- errors ------------------------------------------------------------------------------


def test_remote_error_keeps_its_type_and_names_the_worker(peer):
    with pytest.raises(ValueError) as info:
        rpc.rpc_sync(peer, raise_value_error, args=("expected error",))
    text = str(info.value)
    assert text.startswith(f"On WorkerInfo(id={peer}, name=worker{peer}):\n")
    assert "ValueError('expected error')" in text
    assert "Traceback (most recent call last)" in text and "raise_value_error" in text


def test_remote_key_error_via_future(peer):
    future = rpc.rpc_async(peer, raise_key_error, args=("missing",))
    with pytest.raises(KeyError, match="missing"):
        future.wait()
    assert future.done()
    with pytest.raises(KeyError):
        future.value()


@pytest.mark.parametrize("func", [raise_needs_two, raise_local_class])
def test_remote_error_that_cannot_be_rebuilt_is_a_runtime_error(func, peer):
    with pytest.raises(RuntimeError, match=f"On WorkerInfo\\(id={peer}, name=worker{peer}\\)"):
        rpc.rpc_sync(peer, func)


def test_unknown_destination_is_refused(size):
    # RuntimeError, as torch.distributed.rpc raises: code written for torch catches that.
    with pytest.raises(
        RuntimeError, match="unknown destination worker 'nobody'; the workers are w"
    ):
        rpc.rpc_sync("nobody", len, args=((),))
    with pytest.raises(RuntimeError, match=f"unknown destination rank {size}"):
        rpc.rpc_async(size, len, args=((),))
    with pytest.raises(RuntimeError, match="not a worker of this job"):
        rpc.remote(rpc.WorkerInfo("worker0", size + 3), len)
    with pytest.raises(RuntimeError, match="unknown destination"):
        rpc.get_worker_info("nobody")


def test_bad_arguments_are_refused_at_the_call(peer):
    with pytest.raises(TypeError, match="func must be callable"):
        rpc.rpc_sync(peer, "len")
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        rpc.rpc_sync(peer, len, args="abc")
    with pytest.raises(TypeError, match="could not be pickled.*importable by name"):
        rpc.rpc_sync(peer, lambda: 1)
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        rpc.rpc_sync(peer, len, args=((),), timeout="1")
    assert rpc.debug_info()["num_pending_futures"] == 0


def test_unpicklable_result_is_reported(peer):
    with pytest.raises(TypeError, match="result could not be pickled"):
        rpc.rpc_sync(peer, threading.Lock)


# -- timeouts ----------------------------------------------------------------------------


def test_timeout_fails_the_call_within_about_the_timeout(me, peer):
    gate = f"timeout-{me}"
    start = time.monotonic()
    future = rpc.rpc_async(peer, wait_for_gate, args=(gate, 60.0), timeout=0.5)
    with pytest.raises(DistTimeoutError, match="timeout") as info:
        future.wait()
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 10, elapsed
    assert f"worker{peer}" in str(info.value) and info.value.ranks == [peer]
    rpc.rpc_sync(peer, release, args=(gate,))  # frees the callee's thread


def test_zero_timeout_means_none(me, peer):
    gate = f"none-{me}"
    future = rpc.rpc_async(peer, wait_for_gate, args=(gate, 60.0), timeout=0)
    rpc.rpc_sync(peer, release, args=(gate,))
    assert future.wait() is True


# -- chains, concurrency -----------------------------------------------------------------


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_nested_chain_and_back(hops, me, size):
    path = rpc.rpc_sync((me + 1) % size, chain, args=(hops - 1, [me]))
    assert path == [(me + i) % size for i in range(hops + 1)]


def test_thousand_concurrent_futures(me, size):
    futures = [rpc.rpc_async((me + i) % size, operator.add, args=(i, me)) for i in range(1000)]
    assert [f.wait() for f in futures] == [i + me for i in range(1000)]


def test_then_runs_after_the_value(peer):
    future = rpc.rpc_async(peer, operator.add, args=(40, 1)).then(lambda f: f.value() + 1)
    assert future.wait() == 42


def test_calls_from_many_threads(me, size):
    results = {}

    def caller(t):
        to = [(me + t + i) % size for i in range(50)]
        results[t] = [rpc.rpc_sync(to[i], operator.mul, args=(t, i)) for i in range(50)]

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {t: [t * i for i in range(50)] for t in range(8)}


def test_coexists_with_collectives(pg, me, size):
    """Collectives on the main thread while another thread makes calls: the
    agent's own communicator keeps them apart."""
    import pycoll

    results = []
    caller = threading.Thread(
        target=lambda: results.extend(
            rpc.rpc_sync((me + i) % size, operator.add, args=(i, 1)) for i in range(200)
        )
    )
    caller.start()
    for step in range(50):
        x = np.full(16, me + step, np.float64)
        pycoll.all_reduce(x)
        assert (x == sum(range(size)) + size * step).all()
    caller.join(120)
    assert results == [i + 1 for i in range(200)]


def test_a_message_come_in_part_holds_back_no_other_senders(me, size):
    """A message whose first part has come but not the rest (a partition can
    cut one in two) waits for its rest alone: rank 0 holds such a message from
    itself (a heartbeat's header, its pickle kept back) while rank 1's call to
    it is served. (mpi4py's pkl5 improbe waited for the rest in MPI_Mprobe,
    and every receive of the rank with it waited too.)"""
    import pickle

    from mpi4py import MPI

    from pycoll.rpc import agent as agent_mod
    from pycoll.rpc import current

    if size < 2:
        pytest.skip("needs a caller besides the rank holding the part")
    world = MPI.COMM_WORLD
    comm = current.AGENT.comm
    data = pickle.dumps((agent_mod.BEAT,), protocol=5)  # (what pkl5 sends: no buffers)
    header = np.array([len(data)], np.int64)  # pkl5's first part: the sizes that follow
    if me == 0:
        comm.Send([header, MPI.INT64_T], 0, agent_mod.TAG)  # (eager to itself: returns)
    world.Barrier()
    if me == 1:
        assert rpc.rpc_sync("worker0", echo, args=(7,), timeout=10) == 7
    world.Barrier()
    if me == 0:
        comm.Send([data, MPI.BYTE], 0, agent_mod.TAG)  # the rest: taken in whole, a heartbeat
        assert rpc.rpc_sync("worker0", echo, args=(8,), timeout=10) == 8  # (its own in order)
    world.Barrier()
