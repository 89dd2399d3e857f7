"""pycoll.paths: the registry, the built-in rule at the measured sizes on
each MPI, and ``python -m pycoll.paths``. The paths' own results are the
tests of each path (tests/collectives); here, which one a call takes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pycoll import _mpi, paths, watch
from pycoll.collectives import reduce  # noqa: F401 (its paths register themselves)
from pycoll.ops import plan
from pycoll.reduceop import MEMBERS

pytestmark = pytest.mark.one_process

KiB, MiB = 1 << 10, 1 << 20


def test_every_path_is_registered_for_its_collectives():
    want = {
        "all_reduce": {"ring", "window", "doubling", "pair"},
        "reduce": {"to_root", "scattered", "pair"},
        "reduce_scatter": {"pairwise", "window", "pair"},
        "reduce_scatter_tensor": {"pairwise", "window", "pair"},
    }
    for func, names in want.items():
        assert set(paths.registered(func)) == names, func


def test_a_second_path_of_one_name_is_refused():
    ring = paths.path("all_reduce", "ring")
    with pytest.raises(RuntimeError, match="a second 'ring' path for all_reduce"):
        paths.register(ring)


# (MPI, collective, op, dtype, bytes, ranks) -> the rule's path, from the
# sizes pycoll.paths.rule documents: the ring from 8 MiB (its split ops from
# 4 MiB, 8 on two ranks); MPICH's window from 1 MiB where the group is not a
# power of two; Open MPI's window from 256 KiB below 8 MiB on two or four
# ranks and its doubling from 64 KiB on two; the pairwise exchange from 1 MiB
# (MPICH) or 256 KiB (Open MPI) on two; the scatter window from 64 MiB (MPICH)
# or 1 MiB (Open MPI); the reduce to a root from 64 KiB (MPICH) or 8 MiB
# (Open MPI) on two; the scattered reduce from 16 MiB on MPICH on three or more.
CASES = [
    ("MPICH", "all_reduce", "SUM", "float32", 16 * MiB, 4, "ring"),
    ("MPICH", "all_reduce", "SUM", "int32", 64 * MiB, 2, "ring"),
    ("MPICH", "all_reduce", "SUM", "float32", 1 * MiB, 3, "window"),
    ("MPICH", "all_reduce", "SUM", "float32", 1 * MiB, 4, "mpi"),
    ("MPICH", "all_reduce", "SUM", "float32", 512 * KiB, 3, "mpi"),
    ("MPICH", "all_reduce", "SUM", "float16", 4 * MiB, 4, "ring"),
    ("MPICH", "all_reduce", "SUM", "float16", 4 * MiB, 2, "mpi"),
    ("MPICH", "all_reduce", "SUM", "float32", 128 * KiB, 2, "mpi"),
    ("Open MPI", "all_reduce", "SUM", "float32", 1 * MiB, 2, "window"),
    ("Open MPI", "all_reduce", "SUM", "float32", 1 * MiB, 3, "mpi"),
    ("Open MPI", "all_reduce", "SUM", "float32", 128 * KiB, 2, "doubling"),
    ("Open MPI", "all_reduce", "SUM", "float32", 32 * KiB, 2, "mpi"),
    ("Open MPI", "all_reduce", "SUM", "float32", 16 * MiB, 4, "ring"),
    ("MPICH", "reduce_scatter_tensor", "SUM", "float32", 4 * MiB, 2, "pairwise"),
    ("MPICH", "reduce_scatter_tensor", "SUM", "float32", 512 * KiB, 2, "mpi"),
    ("MPICH", "reduce_scatter", "SUM", "float32", 64 * MiB, 4, "window"),
    ("MPICH", "reduce_scatter", "SUM", "float32", 32 * MiB, 4, "mpi"),
    ("Open MPI", "reduce_scatter_tensor", "SUM", "float32", 256 * KiB, 2, "pairwise"),
    ("Open MPI", "reduce_scatter_tensor", "SUM", "float32", 2 * MiB, 4, "window"),
    ("Open MPI", "reduce_scatter_tensor", "SUM", "float32", 512 * KiB, 4, "mpi"),
    ("MPICH", "reduce", "SUM", "float32", 128 * KiB, 2, "to_root"),
    ("MPICH", "reduce", "SUM", "float32", 32 * MiB, 4, "scattered"),
    ("MPICH", "reduce", "SUM", "float32", 8 * MiB, 4, "mpi"),
    ("Open MPI", "reduce", "SUM", "float32", 4 * MiB, 2, "mpi"),
    ("Open MPI", "reduce", "SUM", "float32", 8 * MiB, 2, "to_root"),
    ("Open MPI", "reduce", "SUM", "float32", 32 * MiB, 4, "mpi"),
]


@pytest.mark.parametrize("vendor,func,op,dtype,nbytes,ranks,want", CASES, ids=str)
def test_the_rule_at_the_measured_sizes(monkeypatch, vendor, func, op, dtype, nbytes, ranks, want):
    """As each MPI starts by default under pycoll (MPICH's v-form
    reduce-scatter pairwise, libnbc's all_reduce left to its choice) in the
    default wait mode."""
    if not _mpi.has("MPI_Isendrecv"):
        pytest.skip("pycoll's own paths need MPI_Isendrecv (MPI-4.0)")
    monkeypatch.setattr(_mpi, "VENDOR", vendor)
    monkeypatch.setattr(_mpi, "REDUCE_SCATTER_PAIRWISE", vendor == "MPICH")
    monkeypatch.setattr(_mpi, "ALL_REDUCE_CHOSEN", False)
    monkeypatch.setattr(watch, "BLOCKING", False)
    dt = np.dtype(dtype)
    call = paths.Call(func, op, dt, nbytes, ranks, plan(MEMBERS[op], dt, func))
    name, why = paths.by_rule(call)
    assert name == want, why


def test_what_cannot_carry_a_call_is_passed_over(monkeypatch):
    """An AVG of float64 MPI carries whole takes the ring (its split op);
    device memory, which only MPI's call carries, does not; nor does a group
    of one."""
    monkeypatch.setattr(_mpi, "VENDOR", "MPICH")
    f64 = np.dtype(np.float64)
    how = plan(MEMBERS["AVG"], f64, "all_reduce")
    host = paths.Call("all_reduce", "AVG", f64, 16 * MiB, 4, how)
    assert paths.by_rule(host)[0] == ("ring" if _mpi.has("MPI_Isendrecv") else "mpi")
    assert paths.by_rule(host._replace(device=True))[0] == "mpi"
    assert paths.by_rule(host._replace(ranks=1))[0] == "mpi"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    return subprocess.run(
        [sys.executable, "-m", "pycoll.paths", *args], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_the_tool_says_which_path_and_why():
    out = _cli("all_reduce", "float32", "16MiB", "--ranks", "4")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("all_reduce(SUM, float32, 16 MiB) on 4 ranks, ")
    if _mpi.has("MPI_Isendrecv"):
        assert lines[-1].startswith("  -> ring: 16 MiB >= RING_BYTES (8 MiB) on ")
    else:
        assert lines[-1] == "  -> mpi: MPI's own call"


def test_the_tool_passes_the_window_over_across_nodes():
    """3 ranks, 1 MiB: MPICH's window on one node; on two nodes, none."""
    one = _cli("all_reduce", "float32", "1M", "--ranks", "3")
    two = _cli("all_reduce", "float32", "1M", "--ranks", "3", "--nodes", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert two.stdout.splitlines()[-1] == "  -> mpi: MPI's own call"
    if "MPICH" in one.stdout.splitlines()[0]:
        assert one.stdout.splitlines()[-1].startswith("  -> window: 1 MiB >= SHM_BYTES_MPICH")
        assert "but the ranks do not share a node" in two.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (("all_reduce", "float32", "1M", "--ranks", "0"), "--ranks must be 1 or more"),
        (("all_reduce", "float32", "1M", "--ranks", "2", "--op", "XOR"), "--op XOR: not a"),
        (("all_reduce", "int32", "1M", "--ranks", "2", "--op", "AVG"), "cast to a floating"),
        (("all_reduce", "float32", "lots", "--ranks", "2"), "'lots' is not a size"),
        (("all_reduce", "float33", "1M", "--ranks", "2"), "invalid choice: 'float33'"),
    ],
    ids=["ranks", "op", "avg-of-ints", "size", "dtype"],
)
def test_the_tool_names_what_is_wrong(args, message):
    out = _cli(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
