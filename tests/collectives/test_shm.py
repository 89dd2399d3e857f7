"""all_reduce through the node's shared memory (pycoll.collectives.shm).

Each test makes its own group with the path's threshold lowered and tiny
chunks (so small arrays take it, in many chunks with uneven slices), and
checks every rank's result against numpy's own reduction."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, crosscheck, paths
from pycoll.collectives import reduce as reduce_mod
from pycoll.collectives import shm
from pycoll.errors import DistTimeoutError
from pycoll.ops import plan
from pycoll.paths import rule
from support import (
    LATE_TIMEOUT,
    assert_equal,
    at_detail,
    check_reduce_scatter_list_form,
    data,
    fresh_group,
    reduce_all,
    rop,
    rule_only,
    small_window,
    spy_path,
    valid_pairs,
    window_chunk,
)

PAIRS = valid_pairs()
SHAPE = (5, 7)  # 35 elements: chunks and slices cut unevenly


@pytest.fixture
def tiny(monkeypatch, world_size):
    """Every all_reduce of 16 bytes or more takes the path, in chunks of 32 bytes."""
    small_window(monkeypatch, world_size, 32, (rule, "SHM_BYTES"))


@pytest.fixture
def group(tiny):
    yield from fresh_group()


def through_shm(g) -> bool:
    return window_chunk(g) == 32


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_every_op_and_dtype(group, op, dtype, async_op, rank, world_size):
    x = data(rank, dtype, SHAPE)
    if x.nbytes < 16:
        pytest.skip("too small for the path")
    work = pycoll.all_reduce(x, op=rop(op), group=group, async_op=async_op)
    if async_op:
        assert work.wait()
    want = reduce_all(op, [data(r, dtype, SHAPE) for r in range(world_size)], world_size)
    assert_equal(x, want)
    # AVG of complex divides each part apart: MPI's SUM, then a division
    assert through_shm(group) == (not (op == "AVG" and x.dtype.kind == "c"))


def test_a_large_array_in_many_chunks_again_and_again(group, rank, world_size):
    x = np.zeros(1001, np.float64)
    for step in range(3):
        x[...] = np.arange(1001) * (rank + 1) + step
        pycoll.all_reduce(x, group=group)
        total = sum(r + 1 for r in range(world_size))
        assert_equal(x, np.arange(1001, dtype=np.float64) * total + step * world_size)


def test_calls_in_flight_take_turns(group, rank, world_size):
    """Two async calls on one group: the second finishes the first before it
    uses the window; both results are right, whichever is waited for first."""
    a = np.full(40, rank + 1, np.int64)
    b = np.full(24, 10 * (rank + 1), np.int32)
    wa = pycoll.all_reduce(a, group=group, async_op=True)
    wb = pycoll.all_reduce(b, group=group, async_op=True)
    other = np.full(3, rank, np.int64)  # something else on the group in between
    pycoll.all_reduce(other, group=group)
    assert wb.wait() and wa.wait()
    total = world_size * (world_size + 1) // 2
    assert_equal(a, np.full(40, total, np.int64))
    assert_equal(b, np.full(24, 10 * total, np.int32))
    assert_equal(other, np.full(3, sum(range(world_size)), np.int64))


def test_detail_checks_it(group, rank, world_size):
    with at_detail():
        x = np.full(9, rank + 1.0, np.float32)
        pycoll.all_reduce(x, op=ReduceOp.AVG, group=group)
        assert_equal(x, np.full(9, (world_size + 1) / 2, np.float32))


def test_below_the_threshold_no_window_is_made(group):
    x = np.ones(2, np.float32)  # 8 bytes
    pycoll.all_reduce(x, group=group)
    assert group.attached("shm.window") is None


def test_a_late_rank_is_named_by_the_timeout(tiny, rank, world_size):
    g = pycoll.new_group(timeout=timedelta(seconds=3))
    x = np.ones(10, np.float64)
    pycoll.all_reduce(x, group=g)  # every rank: the window is made
    last = world_size - 1
    if rank != last:
        with pytest.raises(DistTimeoutError) as exc:
            pycoll.all_reduce(x, group=g)
        assert f"rank {last}: has not reached it" in str(exc.value), str(exc.value)
    pycoll.barrier()
    # The late rank frees the window alone: within the group's timeout it
    # gives up waiting for the others (who will not free theirs) and goes on.
    pycoll.destroy_process_group(g)


def test_a_rank_that_never_comes_to_make_the_window_is_named(tiny, rank, world_size):
    """The window is made with MPI's blocking calls on the group's first
    eligible call: a rank that never makes that call is named by the group's
    timeout, as for any collective, instead of leaving the others in MPI."""
    g = pycoll.new_group(timeout=LATE_TIMEOUT)
    last = world_size - 1
    if rank != last:
        started = time.monotonic()
        with pytest.raises(DistTimeoutError) as exc:
            pycoll.all_reduce(np.ones(10, np.float64), group=g)
        assert time.monotonic() - started < 60  # bounded by the group's timeout
        message = str(exc.value)
        assert "all_reduce (seq 1)" in message and "timed out" in message, message
        assert f"rank {last}: has not reached it" in message, message
        assert g.attached("shm.window") is None  # not made
        started = time.monotonic()  # the group is broken: the next call raises at once
        with pytest.raises(DistTimeoutError, match="unusable"):
            pycoll.all_reduce(np.ones(10, np.float64), group=g)
        assert time.monotonic() - started < 2
    pycoll.barrier()
    pycoll.destroy_process_group(g)


@pytest.mark.parametrize("vendor", ["MPICH", "Open MPI"])
@pytest.mark.parametrize("libnbc", ["default", "chosen", "blocking"])
def test_the_thresholds_by_mpi_and_group_size(monkeypatch, vendor, libnbc):
    """From SHM_BYTES anywhere; on MPICH from SHM_BYTES_MPICH already in a
    group whose size is not a power of two (below RING_BYTES the ring has
    not taken the call first); on Open MPI from SHM_BYTES_PAIR up to
    PAIR_BELOW already in a group of two or four ranks, where libnbc's all_reduce is
    left to its own choice (its binomial tree for a call in place) and the
    wait mode is the default one; 0 turns the window off."""
    from pycoll import _mpi, watch

    monkeypatch.setattr(_mpi, "VENDOR", vendor)
    monkeypatch.setattr(_mpi, "ALL_REDUCE_CHOSEN", libnbc == "chosen")
    monkeypatch.setattr(watch, "BLOCKING", libnbc == "blocking")
    pair, low = rule.SHM_BYTES_PAIR, rule.SHM_BYTES_MPICH
    ring, high = rule.RING_BYTES, rule.SHM_BYTES
    below = rule.PAIR_BELOW
    assert pair < low < ring <= below < high
    mpich = vendor == "MPICH"
    paired = not mpich and libnbc == "default"
    assert rule.shm_least() == (low if mpich else pair if paired else high)
    assert rule.ring_from() == ring
    for ranks in (2, 3, 4, 5, 6, 7, 8, 12, 16):
        band = mpich and ranks not in (2, 4, 8, 16)
        two = paired and ranks in (2, 4)
        assert rule.takes_window(ranks, pair - 1) is False
        assert rule.takes_window(ranks, pair) is two, ranks
        assert rule.takes_window(ranks, low - 1) is two, ranks
        assert rule.takes_window(ranks, low) is (band or two), ranks
        assert rule.takes_window(ranks, ring - 1) is (band or two), ranks
        assert rule.takes_window(ranks, below - 1) is (band or two), ranks
        assert rule.takes_window(ranks, below) is band, ranks
        assert rule.takes_window(ranks, high - 1) is band, ranks
        assert rule.takes_window(ranks, high) is True
    monkeypatch.setattr(rule, "SHM_BYTES", 0)
    assert rule.shm_least() == 0
    assert rule.takes_window(3, high) is False
    assert rule.takes_window(2, high) is False


def test_an_mpi_the_ring_was_not_measured_against_keeps_its_own_call(monkeypatch):
    """The ring's thresholds hold on MPICH and Open MPI, whose all_reduce it
    was measured against; another MPI keeps its own call (and the window from
    SHM_BYTES only)."""
    from pycoll import _mpi
    from pycoll.ops import plan

    monkeypatch.setattr(_mpi, "VENDOR", "Intel(R) MPI")
    assert rule.ring_from() == 0
    kept = dict(ReduceOp.AVG._plans)  # (plan() caches its answer: put the real one back)
    try:
        assert plan(ReduceOp.AVG, np.dtype(np.float16), "t").split is False
    finally:
        ReduceOp.AVG._plans.clear()
        ReduceOp.AVG._plans.update(kept)
    assert rule.shm_least() == rule.SHM_BYTES
    assert rule.takes_window(2, rule.SHM_BYTES_PAIR) is False


def test_a_1_mib_all_reduce_takes_the_window_where_it_should(monkeypatch, rank, world_size):
    """At the default thresholds, a 1 MiB all_reduce: through the window on
    MPICH where the group's size is not a power of two, and on Open MPI in a
    group of two or four ranks where no algorithm is chosen for libnbc's all_reduce
    in the default wait mode; else MPI's own, and then no window is made;
    right either way."""
    from pycoll import _mpi, watch

    taken = []
    taken = spy_path(monkeypatch, "all_reduce", "window")
    x = np.full(1 << 18, rank + 1.0, np.float32)  # 1 MiB
    g = pycoll.new_group()
    rule_only(monkeypatch, g)
    try:
        pycoll.all_reduce(x, group=g)
        assert_equal(x, np.full(x.size, world_size * (world_size + 1) / 2, np.float32))
        uneven = world_size & (world_size - 1) != 0
        libnbc_default = os.environ.get(_mpi.ALL_REDUCE_MCA, "0").strip() in ("", "0")
        pair = world_size in (2, 4) and libnbc_default and not watch.BLOCKING
        # (one node: every rank shares it)
        want = uneven if _mpi.VENDOR == "MPICH" else pair
        assert bool(taken) == want
        assert (g.attached("shm.window") is not None) == want
    finally:
        pycoll.destroy_process_group(g)


def test_a_rank_late_to_destroy_the_group_goes_on(tiny, monkeypatch, rank, world_size):
    """A rank that reaches destroy_process_group after the others stopped
    waiting for it (the final call check's wait, then FREE_WAIT for the
    window) must not free the window alone: MPI_Win_free would wait for ranks
    that have gone on. Every rank returns (before, the late one hung there),
    and all agree on whether the window was freed: here, with the late rank
    four times the two waits behind, it was not."""
    monkeypatch.setattr(crosscheck, "FINAL_WAIT", 0.5)
    monkeypatch.setattr(shm, "FREE_WAIT", 0.5)
    g = pycoll.new_group()
    x = np.ones(10, np.float64)
    pycoll.all_reduce(x, group=g)
    assert through_shm(g)
    window = g.attached("shm.window")
    if rank == world_size - 1:
        time.sleep(4 * (crosscheck.FINAL_WAIT + shm.FREE_WAIT))  # the scenario: it comes late
    pycoll.destroy_process_group(g)
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, window.freed)
    assert everyone == [False] * world_size


def test_not_for_arrays_that_alias_device_memory(group, rank, world_size):
    """Under CUDA-aware MPI the host body gets arrays aliasing device memory
    (pycoll.gpu.collectives): the CPU must not copy them, so neither this
    path nor persistent plans run inside device_aliases; MPI's own call does."""
    from pycoll import persistent
    from pycoll.collectives._common import device_aliases

    with persistent.forced():
        g = pycoll.new_group()
    plans = g._plans
    try:
        x = np.full(12, rank + 1, np.int64)
        with device_aliases(g):
            assert g._plans is None and g._aliases
            for _ in range(persistent.PROMOTE + 1):
                x[...] = rank + 1
                pycoll.all_reduce(x, group=g)
                assert_equal(x, np.full(12, world_size * (world_size + 1) // 2, np.int64))
        assert g.attached("shm.window") is None and not plans.made
        assert g._plans is plans and not g._aliases
    finally:
        pycoll.destroy_process_group(g)


BOUND = """
import os, pycoll
from pycoll.collectives import shm
pycoll.init_process_group()
win = shm.window(pycoll.group.WORLD, "all_reduce")
everyone = [None] * pycoll.get_world_size()  # (one writer: the ranks' lines could interleave)
pycoll.all_gather_object(everyone, (len(os.sched_getaffinity(0)), win.crowded))
if pycoll.get_rank() == 0:
    print(everyone, flush=True)
pycoll.destroy_process_group()
"""


def test_ranks_bound_to_a_core_each_are_not_crowded(world_size):
    """Under ``mpiexec -bind-to core`` each rank may run on one core only,
    but the two ranks have a core each: their window is not crowded (each
    rank once compared the group's size with its own affinity alone). A
    2-rank job of its own, from the single-rank pass, on MPICH's Hydra."""
    import os
    import sys

    from pycoll import _mpi
    from pycoll.kernels import threads
    from support import job_env, run_mpiexec

    if world_size != 1:
        pytest.skip("launches its own 2-rank job; runs in the single-rank pass")
    if _mpi.VENDOR != "MPICH" or not hasattr(os, "sched_getaffinity"):
        pytest.skip("-bind-to core is Hydra's (MPICH) spelling; affinity is Linux's")
    if threads.cores() < 2:
        pytest.skip("binding two ranks to a core each needs two cores")
    proc = run_mpiexec(
        2, ["-bind-to", "core", sys.executable, "-c", BOUND], env=job_env(), timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[(1, False), (1, False)]", proc.stdout + proc.stderr


# -- reduce_scatter_tensor through the window (pycoll.collectives.shm.Blocks) ----------


@pytest.fixture
def scatter_group(monkeypatch, world_size):
    """A group whose reduce_scatter_tensor of 16 bytes or more takes the
    window, in chunks of 48 bytes of every rank's part (parts span chunks)."""
    knobs = (rule, "SCATTER_SHM_BYTES"), (rule, "SCATTER_SHM_BYTES_OPEN_MPI")
    small_window(monkeypatch, world_size, 48 * world_size, *knobs)
    yield from fresh_group()


def scattered(g) -> bool:
    return window_chunk(g) == 48 * g.size()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_every_op_and_dtype(scatter_group, op, dtype, async_op, rank, world_size):
    n = world_size
    shape = (n * 13, 2)
    x = data(rank, dtype, shape)
    before = x.copy()
    out = np.zeros((13, 2), dtype)
    work = pycoll.reduce_scatter_tensor(out, x, op=rop(op), group=scatter_group, async_op=async_op)
    if async_op:
        assert work.wait() and work.result() == [out]
    want = reduce_all(op, [data(r, dtype, shape) for r in range(n)], n)
    assert_equal(out, want[rank * 13 : (rank + 1) * 13])
    assert_equal(x, before)  # the input is read only, PREMUL_SUM's too
    # AVG of complex divides each part apart: MPI's SUM, then a division
    assert scattered(scatter_group) == (not (op == "AVG" and x.dtype.kind == "c"))


@pytest.mark.parametrize("where", ["mine", "shifted"])
def test_reduce_scatter_into_a_part_of_its_input(scatter_group, where, rank, world_size):
    """torch's in-place form (the output this rank's part of the input), and
    an output over bytes that later chunks still read (received aside,
    copied in at the end): each as if the input were read first."""
    n, k = world_size, 29
    f32 = np.dtype(np.float32)
    x = data(rank, f32, (n * k,))
    original = x.copy()
    at = slice(rank * k, (rank + 1) * k) if where == "mine" else slice(k // 2, k // 2 + k)
    pycoll.reduce_scatter_tensor(x[at], x, group=scatter_group)
    total = reduce_all("SUM", [data(r, f32, (n * k,)) for r in range(n)], n)
    original[at] = total[rank * k : (rank + 1) * k]
    assert_equal(x, original)
    assert scattered(scatter_group)


def test_reduce_scatter_below_the_threshold_and_when_turned_off(monkeypatch, world_size):
    """The default thresholds: MPI's own call below them; PYCOLL_SHM_BYTES=0
    turns the window off for reduce_scatter_tensor too. (A group of two
    ranks takes pycoll's pairwise exchange before the window, from
    PAIRWISE_BYTES(_OPEN_MPI): turned off here, tests/collectives/test_pairwise.py.)"""
    if world_size == 1:
        pytest.skip("one rank reduces nothing")
    monkeypatch.setattr(rule, "PAIRWISE_BYTES", 0)
    monkeypatch.setattr(rule, "PAIRWISE_BYTES_OPEN_MPI", 0)
    vendor = "Open MPI" if reduce_mod._mpi.VENDOR == "Open MPI" else "MPICH"
    least = rule.SCATTER_SHM_BYTES_OPEN_MPI if vendor == "Open MPI" else 64 << 20
    g = pycoll.new_group()
    rule_only(monkeypatch, g)
    x = np.ones(world_size * 1024, np.float32)  # 4 KiB a rank: below every threshold
    out = np.zeros(1024, np.float32)
    pycoll.reduce_scatter_tensor(out, x, group=g)
    assert_equal(out, np.full(1024, world_size, np.float32))
    assert g.attached("shm.window") is None
    f32, func = np.dtype(np.float32), "reduce_scatter_tensor"
    how = plan(ReduceOp.SUM, f32, func)
    chosen = paths.choose(g, paths.Call(func, "SUM", f32, least - 1, world_size, how))
    assert (chosen.name, chosen.win, chosen.trial) == ("mpi", None, None)
    with monkeypatch.context() as off:
        off.setattr(shm, "SHM_SET", 0)
        chosen = paths.choose(g, paths.Call(func, "SUM", f32, 1 << 40, world_size, how))
        assert (chosen.name, chosen.win, chosen.trial) == ("mpi", None, None)
    assert g.attached("shm.window") is None  # neither made one
    chosen = paths.choose(g, paths.Call(func, "SUM", f32, least, world_size, how))
    assert chosen.name == "window" and chosen.win is not None
    pycoll.destroy_process_group(g)


@pytest.mark.parametrize("op,dtype", [p for p in PAIRS if p[1] in (np.float32, np.int64)], ids=str)
@pytest.mark.parametrize("where", ["apart", "mine", "another's"])
def test_reduce_scatter_list_form(scatter_group, op, dtype, where, rank, world_size):
    """reduce_scatter(output, input_list) through the window, the list's
    arrays as the blocks: the output apart, the list's own entry for this
    rank (torch's in-place form), or another rank's (received aside)."""
    check_reduce_scatter_list_form(scatter_group, op, dtype, where, 13, rank, world_size)
    assert scattered(scatter_group) == (not (op == "AVG" and np.dtype(dtype).kind == "c"))
