"""pycoll-bench's command line: valid JSON, the extra measurements, bad options."""

import json

import pytest
from mpi4py import MPI

import pycoll
from pycoll import bench

# Any size of job: the bench harness times and checks calls alike at each.
pytestmark = pytest.mark.any_size


def run_json(capsys, args):
    code = bench.main(args + ["--json"])
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.Get_rank() != 0:
        assert out == ""
        return code, None
    return code, json.loads(out)


def test_table_as_json(uninitialized, capsys):
    world_size = MPI.COMM_WORLD.Get_size()
    code, doc = run_json(
        capsys,
        [
            "--collectives",
            "all_reduce,all_to_all",
            "-b",
            "64",
            "-e",
            "1K",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "-R",
            "3",
            "-d",
            "float16",
            "-o",
            "avg",
        ],
    )
    assert code == 0
    assert not pycoll.is_initialized()
    if doc is not None:
        assert doc["ranks"] == world_size and doc["datatype"] == "float16" and doc["op"] == "AVG"
        sizes = [64, 256, 1024]
        rows = doc["results"]  # all_reduce in place; all_to_all in place, then out of place
        assert [r["collective"] for r in rows] == ["all_reduce"] * 3 + ["all_to_all"] * 6
        assert [r["kind"] for r in rows[3:5]] == ["in-place", "out-of-place"]
        assert [r["bytes"] for r in rows[:3]] == sizes
        assert all(r["correct"] is True and r["iters"] == 2 for r in rows)
        assert doc["rounds"] == 3 and all(r["rounds"] == 3 for r in rows)
        # float16 AVG is no MPI op: the C loop times the all_to_all only
        assert [r["c"] is None for r in rows] == [True] * 3 + [not doc["c_floor"]] * 6


def test_plans_column(uninitialized, capsys):
    code, doc = run_json(
        capsys, ["--collectives", "broadcast", "-b", "8", "-e", "8", "-R", "2", "--plans"]
    )
    assert code == 0
    if doc is not None:
        assert doc["plans"] is True
        (row,) = doc["results"]
        assert row["plans"]["wrong"] == 0 and row["plans"]["time_us"] > 0
        ratio = row["plans_ratio"]
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]


@pytest.mark.parametrize(
    "flag,keys",
    [
        (["--kernels"], {"copy_GBps", "rows", "f16c", "threads_per_rank"}),
        # 300 KiB in all: FusedAllReduce's shared-window path (from 256 KiB)
        (["--fusion", "300"], {"fused_us", "fused_packed_mpi_us", "coalesced_over_one_call"}),
        (["--overlap"], {"all_reduce_ms", "compute_ms", "pair_ms", "ratio"}),
    ],
)
def test_extra_measurements_as_json(uninitialized, capsys, monkeypatch, flag, keys):
    from pycoll.bench import extras

    # Small sizes: CI measures that these run and report, not how fast.
    small = {"kernels": dict(nbytes=1 << 16, repeats=2), "overlap": dict(nbytes=1 << 16, repeats=2)}
    for name, kw in small.items():
        original = getattr(extras, name)
        monkeypatch.setattr(
            extras, name, lambda comm, _f=original, _kw=kw, **more: _f(comm, **_kw, **more)
        )
    code, doc = run_json(capsys, flag)
    assert code == 0
    if doc is not None:
        assert keys <= set(doc)
        assert doc.get("wrong", 0) == 0
        if "rows" in doc:
            assert {r["dtype"] for r in doc["rows"]} == {
                "float16",
                "bfloat16",
                "float32",
                "float64",
            }
            assert all(r["pycoll_GBps"] > 0 and r["numpy_GBps"] > 0 for r in doc["rows"])


def test_crosscheck_cost_as_json(uninitialized, capsys):
    """--crosscheck: the three workloads, each variant timed and checked."""
    code, doc = run_json(capsys, ["--crosscheck", "2", "-n", "20"])
    assert code == 0
    if doc is not None:
        assert doc["wrong"] == 0 and doc["every"] == 128 and doc["bookkeeping_ns"] > 0
        assert [r["workload"] for r in doc["rows"]] == [
            "all_reduce 8 B",
            "all_reduce 64 KiB",
            "training step",
        ]
        for row in doc["rows"]:
            assert row["check on us"] > 0 and row["check off us"] > 0 and row["mpi4py us"] > 0
            assert len(row["check cost rounds"]) == 2
            assert row["check cost q1"] <= row["check cost"] <= row["check cost q3"]


def test_targets_as_json(uninitialized, capsys):
    """--targets: every case at every size, each ratio's median inside its
    own spread over rounds, and the verdict the same as the ratio's."""
    code, doc = run_json(capsys, ["--targets", "3", "-b", "64K", "-e", "128K", "-n", "2"])
    assert code == 0
    assert not pycoll.is_initialized()
    if doc is not None:
        assert doc["wrong"] == 0 and doc["rounds"] == 3 and doc["iters"] == 2
        assert [row["bytes"] for row in doc["rows"]] == [64 << 10, 128 << 10]
        assert set(doc["targets"]) == {
            "f16/f32 SUM",
            "bf16/f32 SUM",
            "f32 AVG/SUM",
            "f16 AVG/SUM",
            "bf16 AVG/SUM",
        }
        for row in doc["rows"]:
            for dtype in ("float32", "float16", "bfloat16"):
                assert row[f"{dtype} SUM GB/s"] > 0 and row[f"{dtype} AVG GB/s"] > 0
            for name, least in doc["targets"].items():
                assert row[name + " min"] <= row[name] <= row[name + " max"]
                assert row[name + " min"] <= row[name + " q1"] <= row[name + " q3"]
                assert len(row[name + " rounds"]) == 3
                assert row[name + " met"] == (row[name] >= least)
        assert doc["all_met"] == all(
            row[name + " met"] for row in doc["rows"] for name in doc["targets"]
        )


def test_targets_count_a_wrong_result(pg, world_size):
    """A reduction that answers MAX where SUM or AVG is asked is counted as
    wrong on every rank, before anything is timed."""
    from pycoll.bench import extras

    def broken(tensor, op=pycoll.ReduceOp.SUM, **kw):
        return pycoll.all_reduce(tensor, op=pycoll.ReduceOp.MAX, **kw)

    comm = pg.comm.Dup()
    try:
        report = extras.targets(comm, [1024], rounds=1, iters=1, warmup=0, pycoll_call=broken)
    finally:
        comm.Free()
    if world_size == 1:
        assert report["wrong"] == 0  # one rank: MAX, SUM and AVG agree
    else:
        assert report["wrong"] > 0


def _report(ranks, rounds_by_size):
    """A --targets report by hand: every ratio's rounds as given, per size."""
    from pycoll.bench import extras

    least = {name: bound for name, _, _, bound in extras.TARGETS}
    rows = []
    for nbytes, rounds in rounds_by_size.items():
        row = {"bytes": nbytes, "float32 SUM GB/s": 1.0}
        for name in least:
            row[name + " rounds"] = rounds
        rows.append(row)
    return dict(ranks=ranks, rounds=2, iters=10, wrong=0, targets=least, rows=rows)


def test_pooled_targets_take_the_median_of_every_round():
    from pycoll.bench import extras

    pooled = extras.pool_targets([_report(2, {1024: [1.0, 0.5]}), _report(2, {1024: [0.7, 0.85]})])
    row = pooled["rows"][0]
    assert pooled["rounds"] == 4
    assert row["f16/f32 SUM"] == pytest.approx(0.775)  # median of 0.5, 0.7, 0.85, 1.0
    assert row["f16/f32 SUM met"] is False and row["f32 AVG/SUM met"] is False
    assert (row["f16/f32 SUM min"], row["f16/f32 SUM max"]) == (0.5, 1.0)
    assert pooled["all_met"] is False
    assert extras.pool_targets([_report(2, {1024: [0.95, 1.2]})])["all_met"] is True
    with pytest.raises(ValueError, match="pool like with like"):
        extras.pool_targets([_report(2, {1024: [1.0]}), _report(4, {1024: [1.0]})])


def test_size_parsing():
    assert bench.parse_size("64M") == 64 << 20
    assert bench.parse_size("1K") == 1024
    assert bench.parse_size("8") == 8
    assert bench.sizes(8, 64, 2) == [8, 16, 32, 64]
    with pytest.raises(Exception, match="not a size"):
        bench.parse_size("lots")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--collectives", "allreduce"], "unknown collective 'allreduce'"),
        (["-d", "float8"], "unknown datatype 'float8'"),
        (["-o", "band", "-d", "float32"], "bitwise ops apply to integers"),
        (["-f", "1"], "at least 2"),
        (["--targets", "0"], "ROUNDS must be at least 1"),
        (["-R", "0"], "-R/--rounds must be at least 1"),
    ],
)
def test_bad_options_are_refused(uninitialized, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        bench.main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not pycoll.is_initialized()


def test_pool_reads_targets_runs_and_prints_one_table(tmp_path, capsys):
    """python -m pycoll.bench.pool: two runs' rounds pooled (no MPI needed)."""
    from pycoll.bench import pool

    files = []
    for i, rounds in enumerate(({1024: [1.0, 0.5]}, {1024: [0.7, 0.85]})):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(_report(2, rounds)))
        files.append(str(path))
    assert pool.main(files + ["--json"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    assert pooled["rounds"] == 4 and pooled["wrong"] == 0
    assert pool.main([]) == 2
    assert "Pool several" in capsys.readouterr().err
