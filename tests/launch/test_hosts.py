"""Host lists, the three hostfile dialects, and scheduler allocations."""

from __future__ import annotations

import shutil

import pytest

from pycoll.launch.hosts import (
    Host,
    HostError,
    allocation,
    merge,
    parse_host_list,
    parse_hostfile,
)


def write(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_host_list():
    assert parse_host_list("h1:4,h2:2") == [Host("h1", 4), Host("h2", 2)]
    assert parse_host_list("h1, h2") == [Host("h1", 1), Host("h2", 1)]


@pytest.mark.parametrize(
    "text, problem",
    [("h1:4,,h2", "empty host name"), ("h1:0", "slot count '0' is not a positive integer")],
)
def test_bad_host_list(text, problem):
    with pytest.raises(HostError, match=problem):
        parse_host_list(text)


def test_mpich_hostfile(tmp_path):
    path = write(tmp_path, "# nodes\nnode1:4\n\nnode2:2  # the small one\nnode3\n")
    assert parse_hostfile(path) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


def test_open_mpi_hostfile(tmp_path):
    path = write(tmp_path, "node1 slots=4 max_slots=8\nnode2 slots=2\nnode3\n")
    assert parse_hostfile(path) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


def test_deepspeed_hostfile(tmp_path):
    path = write(tmp_path, "worker-0 slots=8\nworker-1 slots=8\n")
    assert parse_hostfile(path) == [Host("worker-0", 8), Host("worker-1", 8)]


@pytest.mark.parametrize(
    "line, problem",
    [
        ("node2 slots=four", "slot count 'four' is not a positive integer"),
        ("node2:x", "slot count 'x' is not a positive integer"),
        ("node2 4", "'4' is not key=value"),
        ("node2 gpus=4", "unknown key 'gpus'"),
        ("node2:4 slots=4", "expected 'host:slots' alone"),
        ("slots=4", "expected 'host', 'host:slots'"),
        (":4", "expected 'host:slots' alone"),
    ],
)
def test_malformed_line_is_named(tmp_path, line, problem):
    path = write(tmp_path, f"node1 slots=2\n{line}\n")
    with pytest.raises(HostError) as info:
        parse_hostfile(path)
    assert str(info.value).startswith(f"hostfile {path}, line 2 ({line!r}): ")
    assert problem in str(info.value)


def test_missing_and_empty_hostfile(tmp_path):
    with pytest.raises(HostError, match="No such file"):
        parse_hostfile(str(tmp_path / "nope"))
    with pytest.raises(HostError, match="no hosts in it"):
        parse_hostfile(write(tmp_path, "# nothing\n"))


def test_merge_adds_slots_of_repeated_hosts():
    assert merge([Host("a", 1), Host("b", 2), Host("a", 3)]) == [Host("a", 4), Host("b", 2)]


def test_slurm_allocation():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1,n2,n3",
        "SLURM_TASKS_PER_NODE": "4(x2),2",
        "SLURM_NTASKS": "10",
    }
    alloc = allocation(env)
    assert alloc is not None and alloc.scheduler == "slurm" and alloc.ntasks == 10
    assert alloc.hosts == [Host("n1", 4), Host("n2", 4), Host("n3", 2)]


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs Slurm's scontrol")
def test_slurm_nodelist_ranges_expand_through_scontrol():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[01-02],m5",
        "SLURM_TASKS_PER_NODE": "2(x3)",
    }
    alloc = allocation(env)
    assert alloc is not None and alloc.ntasks == 6
    assert [h.name for h in alloc.hosts] == ["n01", "n02", "m5"]


def test_pbs_allocation(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\na\nb\nb\n")
    alloc = allocation({"PBS_JOBID": "1.server", "PBS_NODEFILE": str(nodefile)})
    assert alloc is not None and alloc.scheduler == "pbs" and alloc.ntasks == 4
    assert alloc.hosts == [Host("a", 2), Host("b", 2)]


def test_no_allocation():
    assert allocation({}) is None
