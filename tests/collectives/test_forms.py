"""Every rank makes the same MPI call, whatever its own arrays look like.

How a rank's arrays are laid out (owning their memory, views into a larger
buffer, a numpy subclass) and whether its call is in place are that rank's
own business, as in torch. MPI matches no blocking collective with a
nonblocking one, and takes MPI_IN_PLACE only from every rank or none: so
which path a synchronous call takes, and which form of MPI's call it makes,
must not depend on them (under PYCOLL_WAIT=blocking, a rank that chose
differently waited for the others until the timeout). Here rank 0 passes
views into larger buffers, or a numpy subclass, and the others plain
arrays, twice over (the second call on the same arrays, which the compiled
path may keep)."""

import numpy as np
import pytest

import pycoll
from support import assert_equal


class _Tagged(np.ndarray):
    """A numpy subclass: pycoll checks it by its longer path."""


def _odd(x: np.ndarray, rank: int, how: str) -> np.ndarray:
    """``x`` as rank 0 passes it (a view into a larger buffer, or a subclass),
    as it is on the other ranks."""
    if rank != 0:
        return x
    if how == "subclass":
        return x.view(_Tagged)
    whole = np.zeros(x.size + 2, x.dtype)
    view = whole[1:-1].reshape(x.shape)
    view[...] = x
    return view


HOW = pytest.mark.parametrize("how", ["view", "subclass"])


@HOW
def test_all_reduce(how, rank, world_size):
    for i in range(2):
        x = _odd(np.full(3, rank + i, np.int64), rank, how)
        pycoll.all_reduce(x)
        assert_equal(np.asarray(x), np.full(3, sum(r + i for r in range(world_size)), np.int64))


@HOW
def test_broadcast(how, rank, world_size):
    for src in range(world_size):
        x = _odd(np.full(5, rank, np.int32), rank, how)
        pycoll.broadcast(x, src=src)
        assert_equal(np.asarray(x), np.full(5, src, np.int32))


@HOW
def test_reduce(how, rank, world_size):
    for i in range(2):
        x = _odd(np.full(3, rank + i, np.int64), rank, how)
        pycoll.reduce(x, dst=world_size - 1)
        total = sum(r + i for r in range(world_size)) if rank == world_size - 1 else rank + i
        assert_equal(np.asarray(x), np.full(3, total, np.int64))


@HOW
def test_all_gather_into_tensor(how, rank, world_size):
    for i in range(2):
        out = _odd(np.zeros(3 * world_size, np.int64), rank, how)
        mine = _odd(np.arange(3, dtype=np.int64) + 10 * rank + i, rank, how)
        pycoll.all_gather_into_tensor(out, mine)
        want = np.concatenate([np.arange(3) + 10 * r + i for r in range(world_size)])
        assert_equal(np.asarray(out), want.astype(np.int64))


@HOW
def test_reduce_scatter_tensor(how, rank, world_size):
    for i in range(2):
        inp = _odd(np.arange(2 * world_size, dtype=np.int64) + rank + i, rank, how)
        out = _odd(np.zeros(2, np.int64), rank, how)
        pycoll.reduce_scatter_tensor(out, inp)
        total = sum(np.arange(2 * world_size) + r + i for r in range(world_size))
        assert_equal(np.asarray(out), total[2 * rank : 2 * rank + 2].astype(np.int64))


@HOW
def test_all_to_all_single(how, rank, world_size):
    for i in range(2):
        inp = _odd(np.arange(world_size, dtype=np.int64) + 100 * rank + i, rank, how)
        out = _odd(np.zeros(world_size, np.int64), rank, how)
        pycoll.all_to_all_single(out, inp)
        want = np.array([rank + 100 * s + i for s in range(world_size)], np.int64)
        assert_equal(np.asarray(out), want)
