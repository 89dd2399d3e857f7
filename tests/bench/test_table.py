"""pycoll-bench's table: every collective measured like for like against raw
mpi4py and the C loop, every side checked; a deliberately broken collective is caught."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import persistent
from pycoll.bench import table

# Any size of job: the bench harness times and checks calls alike at each.
pytestmark = pytest.mark.any_size


@pytest.fixture
def comm(pg):
    c = pg.comm.Dup()
    yield c
    c.Free()


@pytest.fixture(scope="module")
def floor():
    """The C loop, where this MPI ships a compiler wrapper (the wheels do)."""
    from pycoll.bench import floor as floor_mod

    return floor_mod.load()


@pytest.mark.parametrize("collective", table.COLLECTIVES)
@pytest.mark.parametrize(
    "dtype,op",
    [("float32", "SUM"), ("float16", "AVG"), ("bfloat16", "PREMUL_SUM"), ("int32", "BXOR")],
)
def test_every_collective_is_timed_and_checked(comm, floor, world_size, collective, dtype, op):
    rows = table.measure(collective, 4096, comm, dtype, op, rounds=3, iters=3, floor=floor)
    kinds = [r["kind"] for r in rows]
    # torch's all_reduce, broadcast and reduce are in place only
    single = collective in ("all_reduce", "broadcast", "reduce")
    assert kinds == (["in-place"] if single else ["in-place", "out-of-place"])
    plain_mpi = collective not in table.REDUCING or (dtype, op) in (
        ("float32", "SUM"),
        ("int32", "BXOR"),
    )
    for r in rows:
        assert r["correct"] is True, r
        assert r["collective"] == collective and r["ranks"] == world_size
        assert r["bytes"] <= 4096 and r["count"] >= 1 and r["rounds"] == 3 and r["iters"] == 3
        sides = ["pycoll", "mpi4py"] + (["c"] if plain_mpi and floor is not None else [])
        assert [s for s in table.SIDES if r[s] is not None] == sides
        for s in sides:
            assert r[s]["wrong"] == 0 and r[s]["time_us"] > 0
            assert np.isclose(
                r[s]["busbw_GBps"], r[s]["algbw_GBps"] * table.factor(collective, world_size)
            )
        ratio = r["ratio"]
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
        assert (r["mpi4py_over_c"] is not None) == ("c" in sides)
        assert (r["redop"] is not None) == (collective in table.REDUCING)


def test_the_c_floor_is_built_here(floor):
    """The wheels this suite runs on ship mpicc, and the machine a C compiler:
    the column must not go missing unnoticed."""
    assert floor is not None


def test_bus_bandwidth_factors_are_nccl_tests():
    assert table.factor("all_reduce", 4) == 1.5
    assert table.factor("broadcast", 4) == table.factor("reduce", 4) == 1.0
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert table.factor(c, 4) == 0.75


def test_a_block_lasts_about_ten_milliseconds(comm):
    """The calibrated block is the same on every rank, and sized from the call's time."""
    from mpi4py import MPI

    def slow(iters):
        for _ in range(iters):
            comm.Barrier()
            time.sleep(0.001)  # a call of at least a millisecond

    block = table.calibrate(slow, comm)
    assert comm.allgather(block) == [block] * comm.Get_size()
    assert 1 <= block <= 10
    fast = table.calibrate(lambda iters: None, comm)
    assert fast == table.MAX_ITERS
    assert comm.allreduce(fast, op=MPI.MAX) == fast


def test_a_broken_reduction_is_reported_on_every_rank(comm, world_size):
    """MAX where SUM is asked: the check must count wrong elements."""

    def broken_all_reduce(tensor, op=pycoll.ReduceOp.SUM, **kw):
        return pycoll.all_reduce(tensor, op=pycoll.ReduceOp.MAX, **kw)

    (r,) = table.measure(
        "all_reduce", 1024, comm, rounds=1, iters=1, warmup=0, pycoll_call=broken_all_reduce
    )
    if world_size == 1:
        assert r["correct"] is True  # with one rank, MAX and SUM agree
    else:
        assert r["correct"] is False
        assert r["pycoll"]["wrong"] > 0 and r["mpi4py"]["wrong"] == 0


def test_a_broken_gather_is_reported(comm, world_size):
    def broken_gather(out, inp, **kw):
        pycoll.all_gather_into_tensor(out, inp, **kw)
        out[0] += 1

    rows = table.measure(
        "all_gather", 1024, comm, rounds=1, iters=1, warmup=0, pycoll_call=broken_gather
    )
    assert [r["correct"] for r in rows] == [False, False]
    for r in rows:
        assert r["pycoll"]["wrong"] == world_size  # one element on each rank
        assert r["mpi4py"]["wrong"] == 0


def test_the_rounds_time_the_path_the_live_trials_chose(comm, pg, world_size, monkeypatch):
    """A large call's first calls are the live trials' turns (pycoll.autotune):
    the bench makes calls until they decided, so its rounds time the path a
    job's later calls take (here 3 rounds of 3 calls, fewer than the trials)."""
    from pycoll import autotune

    if world_size == 1:
        pytest.skip("the trials decide groups of 2 or more ranks")
    monkeypatch.setattr(pg, "_live_from", autotune.LIVE_FROM)  # (any group size)
    (r,) = table.measure("all_reduce", 2 << 20, comm, "uint16", "BXOR", rounds=3, iters=3)
    assert r["correct"] is True
    key = ("all_reduce", pycoll.ReduceOp.BXOR._plans[np.dtype("uint16")].key, 22)  # (2 MiB)
    assert key in autotune.chosen(pg) and key not in autotune.pending(pg)


def test_expected_values_do_not_come_from_pycoll():
    inputs = [table.pattern(r, 6, np.dtype("float16"), "AVG") for r in range(3)]
    got = table.expected_reduction(inputs, "AVG")
    np.testing.assert_array_equal(
        got, (np.sum(np.stack(inputs).astype(float), 0) / 3).astype(np.float16)
    )


def test_group_creation_report(pg, world_size):
    from pycoll.bench import extras

    if world_size % 2:
        pytest.skip("pairs of ranks need an even number of ranks")
    c = pg.comm.Dup()
    try:
        r = extras.group_creation(8, c)
    finally:
        c.Free()
    assert r["groups"] == 8 // (world_size // 2) * (world_size // 2)
    assert r["world_sequence_unchanged_by_local"] is True
    assert r["local_us_per_new_group"] > 0 and r["global_us_per_new_group"] > 0


@pytest.fixture
def planned(pg):
    """A group of every rank with pycoll.persistent's plans on."""
    with persistent.forced():
        g = pycoll.new_group()
    yield g
    pycoll.destroy_process_group(g)


@pytest.mark.parametrize("collective", table.COLLECTIVES)
@pytest.mark.parametrize(
    "dtype,op", [("float32", "PREMUL_SUM"), ("float16", "AVG"), ("float64", "SUM")]
)
def test_every_side_computes_the_same_operation(comm, floor, planned, collective, dtype, op):
    """Like for like: raw mpi4py's call, the C loop and pycoll's call on a
    group with plans, in each kind, give numpy's answer too (checked here
    against numpy, not against pycoll)."""
    raw = table.RawOps(MPI)
    case = table.Case(collective, 1024, np.dtype(dtype), op, 0, comm, raw, floor=floor)
    case.plans_group = planned
    try:
        for kind in case.kinds:
            for side in table.SIDES:
                run = case.runner(side, kind)
                if run is None:
                    assert side == "c" and (floor is None or dtype == "float16" or op != "SUM")
                    continue
                for _ in range(persistent.PROMOTE + 1 if side == "plans" else 1):
                    case.inputs[kind]()
                    run(1)
                    np.testing.assert_array_equal(case.results[kind](), case.expected)
    finally:
        raw.free()
