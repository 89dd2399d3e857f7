"""barrier."""

import os
import tempfile

import pytest
from mpi4py import MPI

import pycoll


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_nobody_leaves_before_everyone_arrived(rank, world_size, async_op):
    """Ranks other than 0 write a file only after rank 0 has started; rank 0
    then passes the barrier and must find every file written."""
    world = MPI.COMM_WORLD
    folder = world.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)
    if rank == 0:
        for r in range(1, world_size):
            world.send("go", dest=r, tag=78)
    else:
        assert world.recv(source=0, tag=78) == "go"
    with open(os.path.join(folder, f"arrived.{rank}"), "w") as f:
        f.write("here")
    work = pycoll.barrier(async_op=async_op)
    if async_op:
        work.wait()
    assert sorted(os.listdir(folder)) == sorted(f"arrived.{r}" for r in range(world_size))
    pycoll.barrier()
    os.remove(os.path.join(folder, f"arrived.{rank}"))
    pycoll.barrier()
    if rank == 0:
        os.rmdir(folder)
