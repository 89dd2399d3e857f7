"""pycoll-bench: both sides measured, results checked, JSON output."""

import json

import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import bench


def test_measure_times_both_sides_and_checks_the_result(pg):
    comm = pg.comm.Dup()
    try:
        for op in bench.OPS:
            r = bench.measure(op, 64, comm, iters=3, blocks=2, warmup=1)
            assert r["correct"] is True, r
            assert r["op"] == op and r["bytes"] == 64 and r["ranks"] == pg.size()
            assert r["pycoll_us"] > 0 and r["mpi4py_us"] > 0
            assert np.isclose(r["time_ratio"], r["pycoll_us"] / r["mpi4py_us"])
    finally:
        comm.Free()


def test_a_wrong_result_is_reported(pg, monkeypatch):
    """A broken all_reduce (one that writes a wrong answer) must not pass the check."""
    monkeypatch.setattr(pycoll, "all_reduce", lambda tensor, *a, **k: tensor.fill(-1))
    comm = pg.comm.Dup()
    try:
        r = bench.measure("all_reduce", 64, comm, iters=1, blocks=1, warmup=0)
    finally:
        comm.Free()
    assert r["correct"] is False


def test_main_writes_json(uninitialized, capsys):
    rank, world_size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    code = bench.main(
        [
            "--ops",
            "all_reduce,all_gather",
            "-b",
            "8",
            "-e",
            "32",
            "-f",
            "4",
            "--iters",
            "2",
            "--blocks",
            "1",
            "--json",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    if rank == 0:
        doc = json.loads(out)
        assert doc["ranks"] == world_size
        assert [(r["op"], r["bytes"]) for r in doc["results"]] == [
            ("all_reduce", 8),
            ("all_reduce", 32),
            ("all_gather", 8),
            ("all_gather", 32),
        ]
        assert all(r["correct"] for r in doc["results"])
    else:
        assert out == ""
    assert not pycoll.is_initialized()


def test_size_parsing():
    assert bench._parse_size("64M") == 64 << 20
    assert bench._parse_size("1K") == 1024
    assert bench._parse_size("8") == 8
    assert bench._sizes(8, 64, 2) == [8, 16, 32, 64]


def test_group_creation_report(pg, world_size):
    if world_size % 2:
        pytest.skip("pairs of ranks need an even number of ranks")
    comm = pg.comm.Dup()
    try:
        r = bench.group_creation(8, comm)
    finally:
        comm.Free()
    assert r["groups"] == 8 // (world_size // 2) * (world_size // 2)
    assert r["world_sequence_unchanged_by_local"] is True
    assert r["local_us_per_new_group"] > 0 and r["global_us_per_new_group"] > 0
