"""Live tuning (pycoll.autotune): a large all_reduce's first calls of each
class try every path that can carry it, then every rank takes the path the
slowest rank timed fastest (MPI's own call within the margin), and decides
again every RECHECK calls. Every call's result is checked on every rank,
trials included; where a test needs a given timing, each rank reports the
times the test gives it in place of the clock's (the trials, the exchange
and the paths themselves run for real)."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, autotune, tuning, watch
from pycoll.arrays import BFLOAT16
from pycoll.errors import DistTimeoutError
from pycoll.paths import rule
from support import assert_equal, count_rings, data, reduce_all, window_chunk

MIB = 1 << 20
# MPI's own ops, and pycoll's kernels as MPI's user ops (Plan.plain), but
# MIN and MAX of floats: the ops the trials cover.
COVERED = [
    ("SUM", np.float32),
    ("SUM", np.float64),
    ("PRODUCT", np.float64),
    ("MAX", np.int32),
    ("BXOR", np.int64),
    ("SUM", np.float16),
    ("SUM", BFLOAT16),
    ("MIN", np.int16),
]


@pytest.fixture
def live(world_size, monkeypatch):
    """A new group of every rank whose large all_reduce the trials decide
    (the mode "live", as PYCOLL_TUNING=live makes it), with one timed round
    per path (so a class decides at its seventh call where three paths carry
    it)."""
    if world_size == 1:
        pytest.skip("the trials decide groups of 2 or more ranks")
    monkeypatch.setattr(autotune, "ROUNDS", 1)
    before = tuning.LIVE_MODE
    tuning.install_live("live")
    try:
        g = pycoll.new_group()
    finally:
        tuning.install_live(before)
    yield g
    if g._broken is None:
        pycoll.destroy_process_group(g)


@pytest.fixture
def rule_is_mpi(monkeypatch):
    """The built-in rule takes MPI's own call for every all_reduce (no size
    reaches its ring, window or doubling): what the trials' other paths must
    beat, whatever the MPI and the number of ranks."""
    for name in ("RING_BYTES", "SHM_BYTES", "SHM_BYTES_MPICH", "SHM_BYTES_PAIR"):
        monkeypatch.setattr(rule, name, 1 << 50)
    monkeypatch.setattr(rule, "DOUBLING_BYTES", 0)


def fake_times(monkeypatch, times):
    """Each timed trial reports ``times(path)`` seconds on this rank instead of
    what it took."""
    monkeypatch.setattr(
        autotune.Trials,
        "took",
        staticmethod(lambda entry, path, _: entry.times[path].append(times(path))),
    )


def paths_taken(monkeypatch):
    """The path of every call the trials' choose() returns, in order."""
    taken = []
    real = autotune.Trials.choose

    def choose(self, *args):
        path, trial = real(self, *args)
        taken.append(path)
        return path, trial

    monkeypatch.setattr(autotune.Trials, "choose", choose)
    return taken


def calls(g, n, rank, world_size, dtype=np.float32, op="SUM", nbytes=MIB, async_every=0):
    """``n`` all_reduces of ``nbytes`` on ``g``, each on new data and checked
    against numpy's reduction; every ``async_every``-th one async, its Work
    checked complete as it comes back during the trials."""
    shape = (nbytes // np.dtype(dtype).itemsize,)
    for i in range(n):
        x = data(rank, np.dtype(dtype), shape, salt=i)
        asynchronous = bool(async_every) and i % async_every == 0
        work = pycoll.all_reduce(x, op=getattr(ReduceOp, op), group=g, async_op=asynchronous)
        if asynchronous:
            assert work.wait() is True and work.result() == [x]
        else:
            assert work is None
        want = reduce_all(op, [data(r, np.dtype(dtype), shape, salt=i) for r in range(world_size)],
                          world_size)  # fmt: skip
        assert_equal(x, want)


def same_on_every_rank(value):
    everyone = [None] * pycoll.get_world_size()
    pycoll.all_gather_object(everyone, value)
    assert all(v == everyone[0] for v in everyone), everyone
    return value


@pytest.mark.parametrize("op,dtype", COVERED, ids=str)
def test_every_call_is_right_through_the_trials_and_after(live, op, dtype, monkeypatch, rank,
                                                          world_size):  # fmt: skip
    taken = paths_taken(monkeypatch)
    calls(live, 9, rank, world_size, dtype, op, async_every=2)
    decided = autotune.chosen(live)
    assert len(decided) == 1
    ((path, base, ratios),) = decided.values()
    assert set(ratios) == {"mpi", "ring", "window"} and ratios[base] == 1.0
    # One untimed round and one timed round of the three paths, then the decision.
    assert sorted(taken[:3]) == sorted(taken[3:6]) == ["mpi", "ring", "window"]
    assert taken[6:] == [path] * 3
    same_on_every_rank((taken, path))


@pytest.mark.usefixtures("rule_is_mpi")
def test_every_rank_takes_the_path_the_slowest_rank_timed_fastest(live, monkeypatch, rank,
                                                                  world_size):  # fmt: skip
    # Alone, rank 0 would choose the ring and rank 1 the window; the largest
    # ratio to MPI's call of each path over the ranks is ring 2.0, window 0.8.
    mine = {
        0: {"mpi": 1.0, "ring": 0.5, "window": 0.8},
        1: {"mpi": 2.0, "ring": 4.0, "window": 1.4},
    }
    fake_times(monkeypatch, lambda path: mine.get(rank, mine[0])[path])
    rings = count_rings(monkeypatch)
    calls(live, 7, rank, world_size)
    assert autotune.chosen(live) == {
        ("all_reduce", ReduceOp.SUM._plans[np.dtype(np.float32)].key, 21): (
            "window",
            "mpi",
            {"mpi": 1.0, "ring": 2.0, "window": 0.8},
        )
    }
    before = len(rings)
    calls(live, 2, rank, world_size)
    assert len(rings) == before and window_chunk(live) is not None


@pytest.mark.usefixtures("rule_is_mpi")
@pytest.mark.parametrize("window,wanted", [(0.97, "mpi"), (0.94, "window")])
def test_a_path_displaces_mpis_call_only_beyond_the_margin(live, window, wanted, monkeypatch,
                                                           rank, world_size):  # fmt: skip
    fake_times(monkeypatch, {"mpi": 1.0, "ring": 1.5, "window": window}.__getitem__)
    taken = paths_taken(monkeypatch)
    calls(live, 8, rank, world_size)
    assert taken[6:] == [wanted] * 2


@pytest.mark.usefixtures("rule_is_mpi")
@pytest.mark.parametrize(
    "window,wanted", [((0.5, 1.3, 0.5, 1.3), "mpi"), ((0.5, 0.9, 0.5, 0.5), "window")]
)
def test_a_path_must_beat_mpis_call_in_three_rounds_of_four(live, window, wanted, monkeypatch,
                                                            rank, world_size):  # fmt: skip
    """A median of 0.9 is not enough where the path lost half the rounds."""
    monkeypatch.setattr(autotune, "ROUNDS", 4)
    rounds = iter(window)
    fake_times(
        monkeypatch, lambda path: next(rounds) if path == "window" else (1.0, 2.0)[path == "ring"]
    )
    taken = paths_taken(monkeypatch)
    calls(live, 3 * 5 + 1, rank, world_size)
    assert taken[15] == wanted
    assert autotune.chosen(live)[next(iter(autotune.chosen(live)))][2]["window"] == (
        0.9 if wanted == "mpi" else 0.5
    )


@pytest.mark.parametrize("mpi,wanted", [(0.97, "window"), (0.8, "mpi")])
def test_the_rule_path_stays_unless_beaten_mpis_call_included(live, mpi, wanted, monkeypatch,
                                                              rank, world_size):  # fmt: skip
    """Where the built-in rule takes the window (here from 1 MiB), MPI's own
    call must beat it as any other path must: 3% is not enough, 20% is."""
    monkeypatch.setattr(rule, "SHM_BYTES", MIB)
    fake_times(monkeypatch, {"mpi": mpi, "ring": 1.5, "window": 1.0}.__getitem__)
    calls(live, 7, rank, world_size)
    ((path, base, ratios),) = autotune.chosen(live).values()
    assert (path, base) == (wanted, "window")
    assert ratios == {"window": 1.0, "mpi": mpi, "ring": 1.5}


def test_ranks_reusing_an_array_or_not_count_every_call(live, monkeypatch, rank, world_size):
    """The compiled path (pycoll.native) keeps a call made again on the same
    array and makes it without the trials' count; rank 0 gives the same
    array every time, the others a new one. No trial, and no call of a
    class MPI's call won, may be kept: every rank must count every call, so
    the recheck falls on the same call everywhere (else the ranks would
    wait in different operations)."""
    from pycoll import native

    native.attach(live)
    monkeypatch.setattr(rule, "SHM_BYTES", MIB)  # the rule's window: MPI's call 2nd
    monkeypatch.setattr(autotune, "RECHECK", 3)
    monkeypatch.setattr(autotune, "RECHECK_ROUNDS", 1)
    fake_times(monkeypatch, {"mpi": 0.5, "ring": 1.5, "window": 1.0}.__getitem__)
    taken = paths_taken(monkeypatch)
    mine = np.ones(MIB // 8, np.float64)
    for _ in range(15):
        x = mine if rank == 0 else np.ones(MIB // 8, np.float64)
        if rank == 0:
            x[:] = 1.0
        pycoll.all_reduce(x, group=live)
        assert_equal(x, np.full(x.size, float(world_size)))
    # 6 trials, the decision and 2 calls, 3 trials again, the decision and 2 calls
    assert len(taken) == 15 and taken[6:9] == ["mpi"] * 3 and taken[12:] == ["mpi"] * 3
    assert sorted(taken[9:12]) == ["mpi", "ring", "window"]
    same_on_every_rank(taken)


@pytest.mark.usefixtures("rule_is_mpi")
def test_the_class_decides_again_every_recheck_calls(live, monkeypatch, rank, world_size):
    monkeypatch.setattr(autotune, "RECHECK", 3)
    monkeypatch.setattr(autotune, "RECHECK_ROUNDS", 1)
    state = {"fast": "window"}
    fake_times(monkeypatch, lambda path: 0.5 if path == state["fast"] else 1.0)
    taken = paths_taken(monkeypatch)
    calls(live, 7, rank, world_size)  # six trials, then the decision's call
    assert taken[6] == "window"
    state["fast"] = "ring"
    calls(live, 2 + 3 + 1, rank, world_size)  # RECHECK calls in all, three trials, a decision
    assert taken[7:9] == ["window"] * 2
    assert sorted(taken[9:12]) == ["mpi", "ring", "window"]
    assert taken[12] == "ring"
    same_on_every_rank(taken)


@pytest.mark.usefixtures("rule_is_mpi")
def test_device_memory_aliased_for_mpi_keeps_mpis_call(live, monkeypatch, rank, world_size):
    """A call whose arrays alias device memory (a CUDA-aware MPI's) is MPI's
    to carry, whatever the class decided for host arrays."""
    from pycoll.collectives._common import device_aliases

    fake_times(monkeypatch, {"mpi": 1.0, "ring": 0.5, "window": 2.0}.__getitem__)
    rings = count_rings(monkeypatch)
    calls(live, 7, rank, world_size)
    assert [c.path for c in autotune.trials(live).classes.values()] == ["ring"]
    before = len(rings)
    with device_aliases(live):
        calls(live, 2, rank, world_size)
    assert len(rings) == before
    calls(live, 1, rank, world_size)
    assert len(rings) == before + 1


@pytest.mark.usefixtures("rule_is_mpi")
def test_at_info_each_decision_is_logged_with_its_figures(live, monkeypatch, caplog, rank,
                                                          world_size):  # fmt: skip
    import logging

    fake_times(monkeypatch, {"mpi": 1.0, "ring": 0.5, "window": 2.0}.__getitem__)
    before = pycoll.get_debug_level()
    pycoll.set_debug_level(pycoll.DebugLevel.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="pycoll"):
            calls(live, 7, rank, world_size)
    finally:
        pycoll.set_debug_level(before)
    said = [
        r.getMessage() for r in caplog.records if "time over the built-in rule's" in r.getMessage()
    ]
    assert said == [
        f"all_reduce group={live.group_desc} bytes>=1048576: ring "
        "(time over the built-in rule's mpi: mpi 1.00, ring 0.50, window 2.00)"
    ]


@pytest.mark.usefixtures("rule_is_mpi")
def test_classes_by_op_dtype_and_power_of_two(live, monkeypatch, rank, world_size):
    fake_times(monkeypatch, {"mpi": 1.0, "ring": 2.0, "window": 3.0}.__getitem__)
    calls(live, 7, rank, world_size, nbytes=MIB)
    calls(live, 1, rank, world_size, nbytes=MIB + MIB // 2)  # the same class: decided
    calls(live, 1, rank, world_size, nbytes=MIB - 4)  # below LIVE_FROM: none
    calls(live, 1, rank, world_size, nbytes=2 * MIB)  # a class of its own: its first trial
    calls(live, 1, rank, world_size, dtype=np.int32)  # another dtype
    calls(live, 1, rank, world_size, op="MAX", dtype=np.int32)  # another op
    calls(live, 1, rank, world_size, op="AVG")  # not covered: the built-in rule
    calls(live, 1, rank, world_size, op="MIN")  # nor MIN or MAX of floats
    calls(live, 1, rank, world_size, op="MIN", dtype=np.int32)  # but of integers
    classes = autotune.trials(live).classes
    f32 = np.dtype(np.float32)
    assert sorted((k[1], k[2]) for k in classes) == sorted([
        (ReduceOp.SUM._plans[f32].key, 21),
        (ReduceOp.SUM._plans[f32].key, 22),
        (ReduceOp.SUM._plans[np.dtype(np.int32)].key, 21),
        (ReduceOp.MAX._plans[np.dtype(np.int32)].key, 21),
        (ReduceOp.MIN._plans[np.dtype(np.int32)].key, 21),
    ])  # fmt: skip
    assert [c.path for c in classes.values()] == ["mpi", None, None, None, None]


def rs_calls(g, form, n, rank, world_size, dtype=np.float32, op="SUM", nbytes=MIB):
    """``n`` reduce-scatters of ``nbytes`` of input on ``g`` in ``form``
    ("tensor", "in place": torch's, the output this rank's part of the
    input, or "list"), each on new data, every other one async, checked
    against numpy's reduction."""
    count = -(-nbytes // np.dtype(dtype).itemsize // world_size)  # (at least nbytes in all)
    for i in range(n):
        x = data(rank, np.dtype(dtype), (world_size * count,), salt=i)
        everyone = [
            data(r, np.dtype(dtype), (world_size * count,), salt=i) for r in range(world_size)
        ]
        want = reduce_all(op, everyone, world_size)[rank * count : (rank + 1) * count]
        asynchronous = i % 2 == 1
        how = dict(op=getattr(ReduceOp, op), group=g, async_op=asynchronous)
        if form == "list":
            out = np.empty(count, dtype)
            work = pycoll.reduce_scatter(out, list(x.reshape(world_size, count)), **how)
        else:
            out = (
                x[rank * count : (rank + 1) * count]
                if form == "in place"
                else np.empty(count, dtype)
            )
            work = pycoll.reduce_scatter_tensor(out, x, **how)
        if asynchronous:
            assert work.wait() is True
        assert_equal(out, want)


@pytest.mark.parametrize("form", ["tensor", "in place", "list"])
@pytest.mark.parametrize("op,dtype", [("SUM", np.float32), ("SUM", np.float16), ("BOR", np.int64)],
                         ids=str)  # fmt: skip
def test_a_reduce_scatter_is_right_through_the_trials_and_after(live, form, op, dtype, monkeypatch,
                                                                rank, world_size):  # fmt: skip
    taken = paths_taken(monkeypatch)
    func = "reduce_scatter" if form == "list" else "reduce_scatter_tensor"
    want = ["mpi", "pairwise", "window"] if world_size == 2 else ["mpi", "window"]
    trials = 2 * len(want)
    rs_calls(live, form, trials + 3, rank, world_size, dtype, op)
    decided = autotune.chosen(live)
    assert [k[0] for k in decided] == [func]
    ((path, base, ratios),) = decided.values()
    assert sorted(ratios) == want and ratios[base] == 1.0
    assert sorted(taken[: len(want)]) == sorted(taken[len(want) : trials]) == want
    assert taken[trials:] == [path] * 3
    same_on_every_rank((taken, path))


def special(rank, dtype, n):
    """Rank ``rank``'s values for the bits test: random magnitudes (whose sums
    round), signed zeros, infinities, a NaN and, for floats, subnormals."""
    rng = np.random.default_rng(17 + rank)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-1000, 1000, n).astype(dtype)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
    info = np.finfo(np.float32 if dtype == BFLOAT16 else dtype)
    x[:6] = [-0.0, 0.0 if rank else -0.0, np.inf, -np.inf if rank else 1.0, np.nan, 1.0]
    x[6:10] = np.array([info.smallest_subnormal * (k + 1) for k in range(4)], np.float64).astype(
        dtype
    )
    return x


PATHS = {
    "all_reduce": ("mpi", "ring", "window"),
    "reduce_scatter_tensor": ("mpi", "pairwise", "window"),
}


@pytest.mark.parametrize("func", list(PATHS))
@pytest.mark.parametrize("op,dtype", COVERED, ids=str)
def test_on_two_ranks_the_bits_are_the_same_whichever_path(func, op, dtype, monkeypatch, rank,
                                                           world_size):  # fmt: skip
    """What makes the trials safe to run by default on two ranks: each path's
    result has the same bytes."""
    if world_size == 1:
        pytest.skip("two ranks")
    monkeypatch.setattr(autotune, "ROUNDS", 1)
    n = MIB // np.dtype(dtype).itemsize
    results = {}
    for fast in PATHS[func]:
        fake_times(monkeypatch, lambda path, fast=fast: 0.1 if path == fast else 1.0)
        before = tuning.LIVE_MODE
        tuning.install_live("pairs")  # (the default: PYCOLL_TUNING unset)
        g = pycoll.new_group([0, 1])
        tuning.install_live(before)
        if rank < 2:
            assert g._live_from == autotune.LIVE_FROM
            x = special(rank, dtype, n)
            for _ in range(7):
                y = x.copy()
                if func == "all_reduce":
                    pycoll.all_reduce(y, op=getattr(ReduceOp, op), group=g)
                else:
                    y = np.empty(n // 2, dtype)
                    pycoll.reduce_scatter_tensor(y, x, op=getattr(ReduceOp, op), group=g)
            assert [c.path for c in autotune.trials(g).classes.values()] == [fast]
            results[fast] = y.view(np.uint8).copy()
            pycoll.destroy_process_group(g)
    if rank < 2:
        for path in PATHS[func][1:]:
            assert results[path].tobytes() == results["mpi"].tobytes(), path


def test_a_rank_that_never_comes_to_the_decision_is_named(monkeypatch, rank, world_size):
    if world_size == 1:
        pytest.skip("two ranks or more")
    if watch.BLOCKING:
        pytest.skip("a blocking call's timeout ends the job (tests/test_hangs.py)")
    monkeypatch.setattr(autotune, "ROUNDS", 1)
    before = tuning.LIVE_MODE
    tuning.install_live("live")
    g = pycoll.new_group([0, 1], timeout=timedelta(seconds=3))
    tuning.install_live(before)
    if rank < 2:
        x = np.ones(MIB // 4, np.float32)
        for _ in range(6):  # the trials
            pycoll.all_reduce(x, group=g)
        if rank == 0:
            started = time.monotonic()
            with pytest.raises(DistTimeoutError) as caught:
                pycoll.all_reduce(x, group=g)  # the decision, which rank 1 never joins
            assert time.monotonic() - started < 60
            message = str(caught.value)
            assert "all_reduce (seq 7)" in message and "rank 1: has not reached it" in message
            started = time.monotonic()  # and the group's next call raises at once
            with pytest.raises(DistTimeoutError, match="is unusable"):
                pycoll.all_reduce(x, group=g)
            assert time.monotonic() - started < 1
    pycoll.barrier()  # (rank 0 has given up on the group by now)
    if rank < 2:
        # Rank 0's record says it gave up on the group, so rank 1's teardown
        # (the last call check, the window's free) does not wait for it: each
        # would wait out the group's timeout (3 s) otherwise.
        started = time.monotonic()
        pycoll.destroy_process_group(g)
        took = time.monotonic() - started
        assert took < 2.5, f"destroy_process_group took {took:.1f} s"


def test_the_mode_from_the_environment():
    assert tuning.read_live({}) == "pairs"
    assert tuning.read_live({"PYCOLL_TUNING": " live "}) == "live"
    assert tuning.read_live({"PYCOLL_TUNING": "off"}) == "off"
    assert tuning.read_live({"PYCOLL_TUNING": "/a/table.json"}) == "off"  # the table decides
    assert tuning.read_live({"PYCOLL_SHM_BYTES": "0"}) == "off"
    assert tuning.read_live({"PYCOLL_SPLIT_BYTES": "1048576"}) == "off"
    assert tuning.read_live({"PYCOLL_SPLIT_BYTES": "0", "PYCOLL_TUNING": "live"}) == "live"
    assert tuning.read({"PYCOLL_TUNING": "live"}) == (None, None)
    assert tuning.read({"PYCOLL_TUNING": "off"}) == (None, None)


def test_which_groups_the_mode_covers():
    before = tuning.LIVE_MODE
    try:
        for mode, sizes in (("pairs", {2}), ("live", set(range(2, 65))), ("off", set())):
            tuning.install_live(mode)
            got = {n for n in range(1, 65) if tuning.live_from(n) == autotune.LIVE_FROM}
            assert got == sizes, mode
            assert all(tuning.live_from(n) == tuning.NEVER for n in range(1, 65) if n not in sizes)
        with pytest.raises(ValueError, match="'auto' is none of pairs, live, off"):
            tuning.install_live("auto")
    finally:
        tuning.install_live(before)
