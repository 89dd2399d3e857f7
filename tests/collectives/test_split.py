"""Large all_reduce with one of pycoll's user ops on MPICH and 3 ranks or more:
a reduce-scatter, an AVG's division of this rank's part, an all-gather. Same
answers as numpy's, on every rank, for sizes that do not divide by the number
of ranks (on 1 or 2 ranks, and on Open MPI, the same tests check the usual path)."""

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, make_premul_sum
from pycoll.collectives import reduce as reduce_module
from support import BF16, assert_equal, data, reduce_all

CASES = [
    ("SUM", np.dtype(np.float16)),
    ("AVG", BF16),
    ("PREMUL_SUM", np.dtype(np.float16)),
    ("MAX", np.dtype(np.float32)),
    ("PRODUCT", BF16),
]


def rop(name):
    return make_premul_sum(0.5) if name == "PREMUL_SUM" else getattr(ReduceOp, name)


@pytest.fixture(params=["large", "forced"])
def threshold(request, monkeypatch):
    """'large': past the real threshold; 'forced': a tiny threshold, so small
    arrays (and counts smaller than the number of ranks) take the path too."""
    if request.param == "forced":
        monkeypatch.setattr(reduce_module, "SPLIT_BYTES", 1)
        return 1
    return reduce_module.SPLIT_BYTES


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", CASES, ids=str)
def test_split_all_reduce_matches_numpy(op, dtype, async_op, threshold, rank, world_size):
    count = (threshold // dtype.itemsize + 7) if threshold > 1 else 3
    x = data(rank, dtype, (count,))
    work = pycoll.all_reduce(x, op=rop(op), async_op=async_op)
    if async_op:
        assert work.wait() is True
    else:
        assert work is None
    expected = reduce_all(op, [data(r, dtype, (count,)) for r in range(world_size)], world_size)
    assert_equal(x, expected)


def test_the_path_is_taken_where_it_should_be(pg):
    from pycoll import _mpi
    from pycoll.ops import plan

    half = plan(ReduceOp.AVG, np.dtype(np.float16), "t")
    nan_max = plan(ReduceOp.MAX, np.dtype(np.float32), "t")
    mpich = _mpi.VENDOR == "MPICH"
    assert half.split == mpich and nan_max.split == mpich
    # MPI's builtin ops already get Rabenseifner's algorithm (AVG included: measured)
    assert plan(ReduceOp.SUM, np.dtype(np.float32), "t").split is False
    assert plan(ReduceOp.AVG, np.dtype(np.float32), "t").split is False
