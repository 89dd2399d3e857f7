"""pycoll.tuning: the table read, checked and looked up; the tool's choice
(pycoll.bench.tune); and, in jobs of their own, PYCOLL_TUNING at
init_process_group (rank 0's table on every rank, a bad one raising on
every rank)."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import warnings

import pytest

from pycoll import tuning
from pycoll.bench import tune
from support import job_env, run_mpiexec

# Any size of job: a table is read and applied alike at every size.
pytestmark = pytest.mark.any_size

GOOD = {"pycoll_tuning": 1, "all_reduce": {"2": [[1024, "window"], [8192, "ring"]],
        "4": [[0, "mpi"]]}, "reduce_scatter": {"2": [[4096, "window"]]},
        "measured": {"2": {"anything": "kept"}}}  # fmt: skip


def test_a_table_is_read_into_sizes_and_paths():
    table = tuning.parse(json.dumps(GOOD), "t.json")
    assert table == {
        "all_reduce": {2: ([1024, 8192], ["window", "ring"]), 4: ([0], ["mpi"])},
        "reduce_scatter": {2: ([4096], ["window"])},
    }
    empty = tuning.parse('{"pycoll_tuning": 1}', "t.json")
    assert empty == {"all_reduce": {}, "reduce_scatter": {}}


@pytest.mark.parametrize(
    "doc,problem",
    [
        ("{not json", "not JSON"),
        ({"all_reduce": {}}, 'no "pycoll_tuning": 1'),
        ({"pycoll_tuning": 2, "all_reduce": {}}, 'no "pycoll_tuning": 1'),
        ({"pycoll_tuning": 1, "all_reduce": []}, "must map a number of ranks"),
        ({"pycoll_tuning": 1, "all_reduce": {"1": [[0, "mpi"]]}}, "'1' is not a number of ranks"),
        ({"pycoll_tuning": 1, "all_reduce": {"two": [[0, "mpi"]]}}, "'two' is not a number"),
        ({"pycoll_tuning": 1, "all_reduce": {"2": []}}, "non-empty list"),
        ({"pycoll_tuning": 1, "all_reduce": {"2": [[0, "nccl"]]}}, "[0, 'nccl']"),
        ({"pycoll_tuning": 1, "all_reduce": {"2": [[-1, "mpi"]]}}, "bytes >= 0"),
        ({"pycoll_tuning": 1, "all_reduce": {"2": [[1.5, "mpi"]]}}, "[1.5, 'mpi']"),
        ({"pycoll_tuning": 1, "all_reduce": {"2": [[True, "mpi"]]}}, "[True, 'mpi']"),
        ({"pycoll_tuning": 1, "all_reduce": {"2": [[8, "ring"], [8, "mpi"]]}}, "must increase"),
        ({"pycoll_tuning": 1, "reduce_scatter": {"2": [[0, "ring"]]}}, "one of mpi, window"),
        ({"pycoll_tuning": 1, "allreduce": {}}, "'allreduce' is none of 'all_reduce'"),
    ],
)
def test_a_table_that_cannot_be_used_is_named_with_the_fix(doc, problem):
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(ValueError) as info:
        tuning.parse(text, "t.json")
    message = str(info.value)
    assert problem in message
    assert message.startswith("PYCOLL_TUNING=t.json: ")
    assert "python -m pycoll.bench.tune -o t.json" in message and "unset PYCOLL_TUNING" in message


def test_read_from_the_environment(tmp_path):
    assert tuning.read({}) == (None, None)
    assert tuning.read({"PYCOLL_TUNING": " "}) == (None, None)
    missing = tmp_path / "none.json"
    table, error = tuning.read({"PYCOLL_TUNING": str(missing)})
    assert table is None and f"PYCOLL_TUNING={missing}: cannot be read" in error
    binary = tmp_path / "table.bin"
    binary.write_bytes(b"\xff\xfe\x00table")
    table, error = tuning.read({"PYCOLL_TUNING": str(binary)})
    assert table is None and f"PYCOLL_TUNING={binary}: cannot be read (not text)" in error
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000)
    table, error = tuning.read({"PYCOLL_TUNING": str(deep)})
    assert table is None and "not JSON" in error
    good = tmp_path / "t.json"
    good.write_text(json.dumps(GOOD))
    assert tuning.read({"PYCOLL_TUNING": str(good)}) == (tuning.parse(json.dumps(GOOD), ""), None)


def test_the_last_entry_at_or_below_a_size_decides():
    entries = ([1024, 8192], ["window", "ring"])
    assert [tuning.path(entries, b) for b in (1024, 8191, 8192, 1 << 40)] == [
        "window", "window", "ring", "ring",
    ]  # fmt: skip


def test_a_merged_table_keeps_the_other_rank_counts_and_collectives():
    text = tuning.merged(json.dumps(GOOD), 2, {"all_reduce": [[0, "ring"]]}, {"new": 1})
    doc = json.loads(text)
    assert doc["all_reduce"] == {"2": [[0, "ring"]], "4": [[0, "mpi"]]}
    assert doc["reduce_scatter"] == {"2": [[4096, "window"]]}
    assert doc["measured"] == {"2": {"new": 1}}
    assert tuning.parse(text, "t.json")["all_reduce"][2] == ([0], ["ring"])
    fresh = json.loads(tuning.merged(None, 3, {"reduce_scatter": [[512, "window"]]}, {}))
    assert fresh["pycoll_tuning"] == 1 and fresh["reduce_scatter"] == {"3": [[512, "window"]]}


def test_the_tool_chooses_a_way_only_where_it_is_surely_faster():
    faster = [0.70, 0.72, 0.69, 0.71, 0.75]
    assert tune.choose({"ring": [0.9] * 5, "window": faster}, 0.95) == "window"
    assert tune.choose({"ring": [0.96] * 5, "window": [1.2] * 5}, 0.95) == "mpi"  # not by 5%
    # A median under the margin, but slower than MPI in a quarter of the rounds or more.
    assert tune.choose({"ring": [0.5, 0.6, 0.7, 1.1, 1.2]}, 0.95) == "mpi"
    # Level medians: the one whose slower rounds are faster.
    assert tune.choose({"ring": [0.5, 0.6, 0.6, 0.99], "window": [0.5, 0.6, 0.6, 0.7]}, 0.95) == (
        "window"
    )
    assert tune.entries([1, 2, 4, 8], ["mpi", "window", "window", "mpi"]) == [
        [1, "mpi"], [2, "window"], [8, "mpi"],
    ]  # fmt: skip


SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if rank == 1:  # only rank 0 reads the table: another rank's setting is not used
        os.environ["PYCOLL_TUNING"] = "/nonexistent/table.json"
    import pycoll
    try:
        pycoll.init_process_group()
    except ValueError as exc:
        sys.stdout.write(f"RAISED {rank} {exc}\\n")  # one write: ranks' lines stay whole
        sys.exit(0)
    x = np.full(1000, rank + 1.0, np.float32)
    pycoll.all_reduce(x)  # 4000 bytes: the table's window
    y = np.full(100, rank + 1.0, np.float32)
    pycoll.all_reduce(y)  # 400 bytes: under the table's first size
    window = bool(pycoll.group.WORLD.attached("shm.window"))
    sys.stdout.write(f"DONE {rank} {window} {x[0]} {y[0]}\\n")
    pycoll.destroy_process_group()
""")


def _job(tmp_path, table_text):
    table = tmp_path / "table.json"
    table.write_text(table_text)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**job_env(), "PYCOLL_TUNING": str(table), "PYCOLL_TIMEOUT": "60"}
    proc = run_mpiexec(2, [sys.executable, str(script)], env=env, timeout=120)
    return proc, proc.stdout + proc.stderr


@pytest.fixture
def one_rank(world_size):
    if world_size != 1:
        pytest.skip("starts its own 2-rank jobs; runs in the single-rank pass")


def test_rank_zeros_table_is_every_ranks(one_rank, tmp_path):
    doc = {"pycoll_tuning": 1, "all_reduce": {"2": [[4000, "window"]]}}
    proc, out = _job(tmp_path, json.dumps(doc))
    assert proc.returncode == 0, out
    assert sorted(re.findall(r"DONE \d \w+ [\d.]+ [\d.]+", proc.stdout)) == [
        "DONE 0 True 3.0 3.0", "DONE 1 True 3.0 3.0",
    ], out  # fmt: skip


def test_a_bad_table_raises_on_every_rank_at_init(one_rank, tmp_path):
    proc, out = _job(tmp_path, '{"pycoll_tuning": 1, "all_reduce": {"2": [[0, "fast"]]}}')
    assert proc.returncode == 0, out
    raised = sorted(
        re.findall(
            r"RAISED (\d) (init_process_group: PYCOLL_TUNING=\S+: .*?fast.*?PYCOLL_TUNING)",
            proc.stdout,
        )
    )
    assert [rank for rank, _ in raised] == ["0", "1"], out
    for _, message in raised:
        assert "[0, 'fast']" in message and "python -m pycoll.bench.tune" in message, message


def test_a_job_over_several_nodes_warns_once_and_keeps_the_built_in_rule():
    table = tuning.parse(json.dumps(GOOD), "t.json")
    assert tuning.for_job(table, one_node=True, warn=True) is table
    assert tuning.for_job(None, one_node=False, warn=True) is None
    with pytest.warns(UserWarning, match="PYCOLL_TUNING: the table is ignored: .* several nodes"):
        assert tuning.for_job(table, one_node=False, warn=True) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rank 0 warns; the others say nothing
        assert tuning.for_job(table, one_node=False, warn=False) is None


def test_the_tool_writes_a_table_init_can_use(one_rank, tmp_path):
    """python -m pycoll.bench.tune, end to end on 2 ranks (two small sizes,
    two rounds: what it chooses is the machine's business, that the file is
    a table with both collectives' entries for 2 ranks, kept beside another
    rank count's, is the tool's)."""
    out = tmp_path / "t.json"
    out.write_text(tuning.merged(None, 4, {"all_reduce": [[0, "ring"]]}, {"by": "hand"}))
    argv = [sys.executable, "-m", "pycoll.bench.tune", "-o", str(out), "-b", "64K", "-e", "128K",
            "-R", "2"]  # fmt: skip
    proc = run_mpiexec(2, argv, env={**job_env(), "PYCOLL_TIMEOUT": "60"}, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrong results: 0" in proc.stdout
    table = tuning.parse(out.read_text(), str(out))
    assert table["all_reduce"][4] == ([0], ["ring"])
    for name in ("all_reduce", "reduce_scatter"):
        starts, paths = table[name][2]
        assert starts[0] == 64 << 10 and set(paths) <= set(tuning.COLLECTIVES[name]), table
    assert json.loads(out.read_text())["measured"]["2"]["sizes"] == [64 << 10, 128 << 10]


def test_the_tool_leaves_a_file_that_is_not_a_table_alone(one_rank, tmp_path):
    out = tmp_path / "notes.json"
    out.write_text("my notes\n")
    argv = [sys.executable, "-m", "pycoll.bench.tune", "-o", str(out), "-b", "64K", "-e", "64K"]
    proc = run_mpiexec(2, argv, env=job_env(), timeout=240)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "left as it is: name another file with -o" in proc.stderr
    assert out.read_text() == "my notes\n"
