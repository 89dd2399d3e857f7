"""pycoll.bench.gpu's staged all_reduce table, run on host arrays (--arrays
cpu: the bench's own logic without a GPU): every case runs, is checked, and
rank 0 prints one row per dtype and size; a wrong result stops it on every
rank, naming the case. gloo is left out: it would start torch.distributed's
default group inside the suite's job."""

import pytest
from mpi4py import MPI

import pycoll
from pycoll.bench import gpu

# Any size of job: the bench harness times and checks calls alike at each.
pytestmark = pytest.mark.any_size

ARGS = ["--arrays", "cpu", "--no-gloo", "-b", "1M", "-e", "2M", "-f", "2", "-R", "2", "-w", "1"]


def test_the_table_runs_and_checks_every_case(uninitialized, capsys):
    args = gpu._parser().parse_args(ARGS + ["-d", "float32", "bfloat16", "--chunks", "1M", "0"])
    gpu.allreduce_table(args)
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.Get_rank() != 0:
        assert out == ""
        return
    rows = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(rows) == 4, out  # two dtypes, two sizes
    for row in rows:
        for case in ("staged 4 MiB", "staged 1 MiB", "staged whole", "host pycoll", "host mpi4py"):
            assert f"| {case}: " in row, row
        assert "host mpi4py: " in row and "[1.00 (1.00-1.00)]" in row  # the reference
    assert rows[0].split()[:3] == ["float32", "1", "MiB"]
    assert rows[3].split()[:3] == ["bfloat16", "2", "MiB"]


def test_a_wrong_result_stops_it_naming_the_case(uninitialized, monkeypatch):
    pycoll.init_process_group()
    real = pycoll.all_reduce

    def zeros(x, **kw):  # a call on the cases' arrays (1 MiB + 4 bytes) writes zeros
        if x.nbytes != (1 << 20) + 4:
            return real(x, **kw)
        x[...] = 0

    monkeypatch.setattr(pycoll, "all_reduce", zeros)
    args = gpu._parser().parse_args(ARGS + ["-d", "float32", "--chunks"])
    args.min_bytes = args.max_bytes = (1 << 20) + 4
    with pytest.raises(SystemExit, match=r"staged 4 MiB: wrong result on ranks \[0"):
        gpu.allreduce_table(args)
