"""pycoll.bench.functional runs and checks its own results (a wrong result
raises); rank 0 prints the three tables."""

import pytest
from mpi4py import MPI

from pycoll.bench import functional

# Any size of job: the bench harness times and checks calls alike at each.
pytestmark = pytest.mark.any_size


def test_functional_bench_runs(uninitialized, capsys):
    code = functional.main(["--rounds", "2", "--iters", "20", "--size", str(1 << 16)])
    out = capsys.readouterr().out
    assert code == 0
    if MPI.COMM_WORLD.Get_rank() == 0:
        for row in ("mpi4py", "imperative", "async", "functional/async", "hidden"):
            assert row in out, out
    else:
        assert out == ""
