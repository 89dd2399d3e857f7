"""pycoll-bench's table: every collective measured on both sides and checked;
a deliberately broken collective is caught."""

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll.bench import table


@pytest.fixture
def comm(pg):
    c = pg.comm.Dup()
    yield c
    c.Free()


@pytest.mark.parametrize("collective", table.COLLECTIVES)
@pytest.mark.parametrize(
    "dtype,op",
    [("float32", "SUM"), ("float16", "AVG"), ("bfloat16", "PREMUL_SUM"), ("int32", "BXOR")],
)
def test_every_collective_is_timed_and_checked(comm, world_size, collective, dtype, op):
    r = table.measure(collective, 4096, comm, dtype, op, iters=3, warmup=1)
    assert r["correct"] is True, r
    assert r["collective"] == collective and r["ranks"] == world_size
    assert r["bytes"] <= 4096 and r["count"] >= 1
    assert r["mpi4py"]["time_us"]["median"] > 0
    variants = [r[k] for k in ("out_of_place", "in_place") if r[k] is not None]
    assert variants and all(v["wrong"] == 0 for v in variants)
    for v in variants:
        t = v["time_us"]
        assert 0 < t["min"] <= t["median"] <= t["max"]
        assert np.isclose(v["busbw_GBps"], v["algbw_GBps"] * table.factor(collective, world_size))
    assert (r["redop"] is not None) == (collective in table.REDUCING)


def test_bus_bandwidth_factors_are_nccl_tests():
    assert table.factor("all_reduce", 4) == 1.5
    assert table.factor("broadcast", 4) == table.factor("reduce", 4) == 1.0
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert table.factor(c, 4) == 0.75


def test_osu_iteration_defaults():
    assert table.osu_iterations(8 << 10) == (1000, 100)
    assert table.osu_iterations((8 << 10) + 1) == (100, 10)


def test_a_broken_reduction_is_reported_on_every_rank(comm, world_size):
    """MAX where SUM is asked: the check must count wrong elements."""

    def broken_all_reduce(tensor, op=pycoll.ReduceOp.SUM, **kw):
        return pycoll.all_reduce(tensor, op=pycoll.ReduceOp.MAX, **kw)

    r = table.measure("all_reduce", 1024, comm, iters=1, warmup=0, pycoll_call=broken_all_reduce)
    if world_size == 1:
        assert r["correct"] is True  # with one rank, MAX and SUM agree
    else:
        assert r["correct"] is False
        assert r["in_place"]["wrong"] > 0


def test_a_broken_gather_is_reported(comm, world_size):
    def broken_gather(out, inp, **kw):
        pycoll.all_gather_into_tensor(out, inp, **kw)
        out[0] += 1

    r = table.measure("all_gather", 1024, comm, iters=1, warmup=0, pycoll_call=broken_gather)
    assert r["correct"] is False
    assert r["out_of_place"]["wrong"] == world_size  # one element on each rank


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


@pytest.mark.parametrize("collective", table.COLLECTIVES)
@pytest.mark.parametrize("dtype,op", [("float32", "PREMUL_SUM"), ("float16", "AVG")])
def test_the_raw_column_computes_the_same_operation(comm, collective, dtype, op):
    """Like for like: raw mpi4py's call must give numpy's answer too."""
    case = table.Case(collective, 1024, np.dtype(dtype), op, 0, comm, raw := table.RawOps(MPI))
    try:
        side = "out-of-place" if case.variants["out-of-place"] is not None else "in-place"
        case.inputs[side]()
        case.variants["mpi4py"]()
        np.testing.assert_array_equal(case.results[side](), case.expected)
    finally:
        raw.free()
