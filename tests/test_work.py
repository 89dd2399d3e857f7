"""Work and Future."""

import threading

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import DistTimeoutError, Future


def test_future_set_result_and_then():
    fut = Future()
    assert not fut.done()
    chained = fut.then(lambda f: f.value() * 2)
    fut.set_result(21)
    assert fut.done() and fut.wait() == 21 and fut.value() == 21
    assert chained.wait() == 42
    with pytest.raises(RuntimeError, match="already completed"):
        fut.set_result(1)


def test_future_exception_propagates_through_then():
    fut = Future()
    chained = fut.then(lambda f: f.value() + 1)
    fut.set_exception(KeyError("boom"))
    with pytest.raises(KeyError, match="boom"):
        fut.wait()
    with pytest.raises(KeyError, match="boom"):
        chained.wait()


def test_future_callback_error_goes_to_the_chained_future():
    fut = Future()
    chained = fut.then(lambda f: 1 / 0)
    fut.set_result(1)
    with pytest.raises(ZeroDivisionError):
        chained.value()


def test_add_done_callback_runs_once_complete():
    seen = []
    fut = Future()
    fut.add_done_callback(lambda f: seen.append(f.value()))
    assert seen == []
    fut.set_result(5)
    fut.add_done_callback(lambda f: seen.append(f.value() + 1))  # already complete: at once
    assert seen == [5, 6]


def test_future_value_before_completion():
    with pytest.raises(RuntimeError, match="before the future completed"):
        Future().value()
    with pytest.raises(TypeError, match="needs an exception"):
        Future().set_exception("not an exception")


def test_future_completed_by_another_thread():
    fut = Future()
    done = threading.Event()

    def setter():
        done.wait()
        fut.set_result("from thread")

    t = threading.Thread(target=setter)
    t.start()
    done.set()
    assert fut.wait() == "from thread"
    t.join()


def test_then_on_a_completed_future_runs_at_once():
    fut = Future()
    fut.set_result(3)
    assert fut.then(lambda f: f.value() + 1).value() == 4


def test_work_of_an_async_all_reduce(rank, world_size):
    x = np.full(3, rank + 1.0)
    work = pycoll.all_reduce(x, async_op=True)
    assert work.op == "all_reduce"
    fut = work.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert work.wait() is True
    assert work.is_completed() and work.is_success() and work.exception() is None
    total = world_size * (world_size + 1) / 2
    assert fut.done() and fut.value()[0] is x
    np.testing.assert_array_equal(x, total)
    np.testing.assert_array_equal(doubled.wait(), 2 * total)
    np.testing.assert_array_equal(work.result()[0], total)


def test_future_wait_drives_the_work(rank, world_size):
    x = np.ones(2)
    fut = pycoll.all_reduce(x, async_op=True).get_future()
    assert fut.wait()[0] is x
    np.testing.assert_array_equal(x, world_size)


@pytest.mark.parametrize("timeout", [0.2, 0])
def test_wait_timeout_names_the_late_ranks_and_breaks_the_group(
    debug_off, rank, world_size, timeout
):
    """Rank 0 starts a barrier alone on a group of every rank: wait(timeout)
    gives up, names the ranks that have not reached the barrier, and leaves
    the group unusable (timeout=0 checks once and gives up at once: it does
    not return True unchecked). Then rank 0 tells the others (by message, no
    sleeping) to join; their barrier completes with rank 0's abandoned one."""
    if world_size == 1:
        pytest.skip("needs a second rank to be late")
    group = pycoll.new_group(group_desc="late")
    signal = MPI.COMM_WORLD
    if rank == 0:
        try:
            work = pycoll.barrier(group, async_op=True)
            assert not work.is_completed()
            late = ",".join(map(str, range(1, world_size)))
            who = "rank 1 has" if world_size == 2 else f"ranks {late} have"
            with pytest.raises(
                DistTimeoutError,
                match=rf"barrier \(seq 1\) on group 'late' timed out after \d+\.\d s "
                rf"\(timeout {timeout:g} s\) on rank 0: "
                rf"{who} not reached seq 1",
            ) as info:
                work.wait(timeout=timeout)
            assert info.value.op == "barrier" and info.value.elapsed >= timeout
            assert info.value.ranks == list(range(1, world_size))
            assert isinstance(info.value, RuntimeError)
            with pytest.raises(DistTimeoutError, match="group 'late' is unusable"):
                pycoll.all_reduce(np.ones(1), group=group)
        finally:  # release the others even if an assertion failed here
            for r in range(1, world_size):
                signal.send("go", dest=r, tag=77)
    else:
        assert signal.recv(source=0, tag=77) == "go"
        assert pycoll.barrier(group, async_op=True).wait(timeout=60) is True


def test_sync_and_async_forms_match(rank, world_size):
    """Both forms are MPI's nonblocking collective, so ranks may mix them
    (not under PYCOLL_WAIT=blocking, whose synchronous form is MPI's blocking one)."""
    if pycoll.watch.BLOCKING:
        pytest.skip("PYCOLL_WAIT=blocking: the two forms are different MPI calls")
    x = np.full(3, rank + 1.0)
    if rank % 2:
        pycoll.all_reduce(x, async_op=True).wait()
    else:
        pycoll.all_reduce(x)
    np.testing.assert_array_equal(x, world_size * (world_size + 1) / 2)


def test_sync_calls_return_none(pg):
    assert pycoll.all_reduce(np.zeros(1)) is None
    assert pycoll.barrier() is None
    work = pycoll.barrier(async_op=True)
    assert isinstance(work, pycoll.Work) and "barrier" in repr(work)
    work.wait()


def test_negative_timeout(pg):
    work = pycoll.barrier(async_op=True)
    with pytest.raises(ValueError, match="must not be negative"):
        work.wait(timeout=-1)
    work.wait()


def test_an_async_collective_keeps_a_temporary_input_alive(rank, world_size):
    """Open MPI read a freed temporary input of an Ireduce_scatter_block after
    the call returned (mpi4py's request does not hold it): the Work must."""
    n = world_size
    out = np.zeros(2, np.float32)
    work = pycoll.reduce_scatter_tensor(out, np.arange(2.0 * n, dtype=np.float32), async_op=True)
    junk = [np.full(2 * n, -7.0, np.float32) for _ in range(20)]  # reuses freed memory
    work.wait()
    assert out.tolist() == [n * 2.0 * rank, n * (2.0 * rank + 1)], junk[0][0]


def test_a_work_complete_as_made_has_every_field_and_answers_as_any_work(pg):
    """Work.done sets the fields one by one, without __init__: none may be
    missed, and the Work answers every call of the protocol as a Work that
    completed through its wait does."""
    x = np.ones(2)
    fields = {s for cls in pycoll.Work.__mro__ for s in getattr(cls, "__slots__", ())}
    made = pycoll.Work.done("all_reduce", 3, [x], pg, x.nbytes, None)
    missing = [f for f in sorted(fields) if not hasattr(made, f)]
    assert not missing, f"Work.done leaves {missing} unset: set them there as __init__ does"
    assert made.wait() is True and made.wait(timeout=0) is True
    assert made.is_completed() and made.is_success() and made.exception() is None
    assert made.result() == [x] and made.get_future().wait() == [x]
    assert "completed" in repr(made) and made.seq == 3
    with pytest.raises(RuntimeError, match="applies to receives"):
        made.source_rank()
