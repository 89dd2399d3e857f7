"""The kernels as MPI user ops, through the MPI this suite runs on (MPICH and
Open MPI passes): registration, use by MPI's own algorithms, freeing."""

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import pycoll
from pycoll import kernels
from pycoll.kernels import mpiop

# Any size of job: the kernels reduce within a rank, as MPI's user ops at any size.
pytestmark = pytest.mark.any_size


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=str)
def test_user_op_reduces_through_mpi(pg, rank, world_size, dtype):
    op = kernels.mpi_op("SUM", dtype)
    assert isinstance(op, MPI.Op) and op != MPI.OP_NULL and op.Is_commutative()
    assert kernels.mpi_op(pycoll.ReduceOp.SUM, dtype) is op  # created once
    # 100003 elements: MPI splits it into chunks and calls the kernel on each.
    x = ((np.arange(100_003) + rank) % 7).astype(dtype)
    words = x.view(np.uint16) if x.itemsize == 2 else x
    pg.comm.Allreduce(MPI.IN_PLACE, words, op)
    want = sum(((np.arange(100_003) + r) % 7) for r in range(world_size)).astype(dtype)
    np.testing.assert_array_equal(x.astype(np.float32), want.astype(np.float32))


def test_float_min_max_propagate_nan_on_every_rank(pg, rank, world_size):
    """MPI's builtin MIN may drop a NaN depending on the order it combines
    ranks in; pycoll's (numpy's) minimum/maximum never do."""
    for op in (pycoll.ReduceOp.MIN, pycoll.ReduceOp.MAX):
        x = np.array([float(rank), 1.0, -1.0], np.float32)
        if rank == world_size - 1:
            x[1] = np.nan
        pycoll.all_reduce(x, op=op)
        assert np.isnan(x[1])
        low, high = 0.0, float(world_size - 1)
        assert x[0] == (low if op == pycoll.ReduceOp.MIN else high)
        assert x[2] == -1.0


def test_ops_are_freed_by_destroy_process_group(uninitialized):
    pycoll.init_process_group()
    try:
        kernels.mpi_op("MAX", np.float16)
        kernels.mpi_op("PRODUCT", ml_dtypes.bfloat16)
        assert mpiop.created() >= 2
        made = list(mpiop._ops.values())
    finally:
        pycoll.destroy_process_group()
    assert mpiop.created() == 0
    assert all(op == MPI.OP_NULL for op in made)  # MPI_Op_free set each handle to null


def test_mpi_op_maps_avg_and_premul_to_sum(pg):
    assert kernels.mpi_op("AVG", np.float16) is kernels.mpi_op("SUM", np.float16)
    assert kernels.mpi_op("PREMUL_SUM", np.float16) is kernels.mpi_op("SUM", np.float16)
    with pytest.raises(ValueError, match="bitwise ops apply to integers"):
        kernels.mpi_op("BXOR", np.float16)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=str)
@pytest.mark.parametrize("size", [5, 300_001], ids=["small", "large"])
def test_avg_on_two_ranks_is_sum_then_halve(pg, rank, world_size, dtype, size):
    """On two ranks AVG is one user op; its result must still be SUM then /2,
    on both ranks, for values whose sums round."""
    if world_size != 2:
        pytest.skip("the two-rank AVG path")
    inputs = [
        np.random.default_rng(r).standard_normal(size).astype(np.float32).astype(dtype)
        for r in range(2)
    ]
    x = inputs[rank].copy()
    pycoll.all_reduce(x, op=pycoll.ReduceOp.AVG)
    total = (inputs[0].astype(np.float64) + inputs[1].astype(np.float64)).astype(dtype)
    if np.dtype(dtype).itemsize > 2:  # float32/64: the sum is rounded in the dtype itself
        total = inputs[0] + inputs[1]
    want = (total / np.dtype(dtype).type(2)).astype(dtype)
    np.testing.assert_array_equal(x.astype(np.float64), want.astype(np.float64))
