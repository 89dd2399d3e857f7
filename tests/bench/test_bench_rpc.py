"""pycoll.bench.rpc runs and checks its own results (a wrong result raises);
rank 0 prints the tables. It needs a peer: at 1 rank it refuses, saying so."""

import pytest
from mpi4py import MPI

from pycoll.bench import rpc as bench

# Any size of job: the bench harness times and checks calls alike at each.
pytestmark = pytest.mark.any_size


def test_rpc_bench_runs(uninitialized, capsys):
    if MPI.COMM_WORLD.Get_size() == 1:
        with pytest.raises(SystemExit, match="needs at least 2 ranks"):
            bench.main(["--rounds", "1", "--no-torch"])
        return
    code = bench.main(["--rounds", "2", "--iters", "20", "--sizes", "4096,300000", "--no-torch"])
    out = capsys.readouterr().out
    assert code == 0
    if MPI.COMM_WORLD.Get_rank() == 0:
        for row in ("pycoll.rpc/mpi4py.futures", "1,000 outstanding from every rank", "send/recv"):
            assert row in out, out
    else:
        assert out == ""
