"""all_reduce through the node's shared memory, for large arrays on one node.

MPI's all_reduce on one node moves a large array several times through main
memory: at 64 MiB on two ranks MPICH reached 2.1 GB/s here, where one core
copies 19-40 GB/s (docs/benchmarks.md). This path works in chunks that stay
in the caches, through an MPI-3 shared window (``MPI_Win_allocate_shared``)
holding two chunk-sized halves per rank:

1. each rank copies its next chunk of the array into its half of the window;
2. (barrier) each rank reduces its 1/n slice of the chunk across every
   rank's copy, in place in its own copy, with pycoll's compiled kernels (an
   AVG divides in the same pass as its last sum);
3. (barrier) each rank copies every rank's reduced slice into its array,
   while it copies the chunk after into the other half (so a chunk costs two
   barriers).

The array itself is read once and written once; everything else happens in
the cache. The barriers are ``MPI_Ibarrier`` on a communicator of the
window's own, and each step is a stage of one Work (pycoll.work), so the
call is one collective: one sequence number, one DETAIL check, waits bounded
by the group's timeout, synchronous or async alike. Calls in flight on one
group use the window one after the other (an earlier one is finished before
the next starts), in issue order on every rank.

The window is made on a group's first eligible call, on every rank alike,
and only where every rank of the group shares one node; it is freed with the
group.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, List, Optional

import numpy as np

from .. import _mpi, kernels, progress
from .ring import parts

__all__ = ["CHUNK", "Window", "window", "ShmAllReduce"]

# Bytes of one rank's copy of a chunk: a multiple of 16, so chunks end on an
# element of any dtype. 2 MiB measured best of 0.25-4 MiB at 64 MiB on 2 ranks
# (each chunk costs two barriers and a few calls; smaller ones are dominated
# by those, larger ones fall out of the cache).
CHUNK = 2 << 20
FREE_WAIT = 10.0  # seconds destroy_process_group waits for the others to free the window
_KEY = "shm.window"


class Window:
    """A group's shared window: for each rank two halves of CHUNK bytes, and
    a communicator for the barriers."""

    def __init__(self, comm: Any, chunk: int, timeout: float) -> None:
        MPI = _mpi.MPI
        self.chunk = chunk
        self.timeout = timeout
        self.comm = comm.Dup()  # the calls' barriers
        self.leaving = comm.Dup()  # free()'s: never confused with a call's left pending
        self.win = MPI.Win.Allocate_shared(2 * chunk, 1, comm=self.comm)
        n = self.comm.Get_size()
        self.halves: List[List[np.ndarray]] = [[], []]
        for r in range(n):
            buf, _ = self.win.Shared_query(r)
            seg = np.frombuffer(buf, np.uint8, 2 * chunk)
            self.halves[0].append(seg[:chunk])
            self.halves[1].append(seg[chunk:])
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch: Sync orders the stores
        self.work: Any = None  # the call in flight using it, if any
        self.freed = False

    def free(self) -> None:
        """Free the window, once every rank is freeing it too: MPI_Win_free
        waits for all of them, and a rank whose group timed out never comes.

        Two barriers, each waited for within FREE_WAIT (or the group's
        timeout, if shorter): the first says every rank has come, the second
        that every rank saw the first complete in time. A rank that gives up
        on the first enters no second, so a rank that came later than that
        (its first barrier complete at once) gives up on the second instead
        of going on to MPI_Win_free alone, where it would wait for good. A
        rank that gives up leaves the window to the end of the job
        (``freed`` stays False)."""
        for _ in range(2):
            request = self.leaving.Ibarrier()
            deadline = time.monotonic() + min(self.timeout, FREE_WAIT)
            while not request.Test():
                if time.monotonic() > deadline:
                    progress.keep_alive([request])
                    return
                time.sleep(1e-4)
        self.win.Unlock_all()
        self.win.Free()
        self.comm.Free()
        self.leaving.Free()
        self.freed = True


def window(pg: Any) -> Optional[Window]:
    """The group's window, made on its first eligible call (every rank makes
    that call); None where the group's ranks do not all share one node."""
    made = pg.attached(_KEY)
    if made is None:
        MPI = _mpi.MPI
        node = pg.comm.Split_type(MPI.COMM_TYPE_SHARED)
        one_node = node.Get_size() == pg.size()
        node.Free()
        made = Window(pg.comm, CHUNK, pg._timeout_s) if one_node else False
        pg.attach(_KEY, made, _free)
    return made or None


def _free(made: Any) -> None:
    if made:
        made.free()


class ShmAllReduce:
    """One all_reduce through ``win``: :meth:`start` and :attr:`stages`, for
    pycoll.collectives._common.run.

    Args:
        data: the array's bytes (a uint8 view), reduced in place.
        itemsize: bytes per element (slices are cut on element boundaries).
        name: the reduction (a pycoll.kernels op name).
        average: divide the result by the group size (AVG).
    """

    def __init__(
        self, win: Window, data: np.ndarray, itemsize: int, name: str, average: bool, dtype: Any
    ) -> None:
        self.win, self.data, self.itemsize, self.name = win, data, itemsize, name
        self.average, self.dtype = average, dtype
        self.n, self.me = win.comm.Get_size(), win.comm.Get_rank()
        step = win.chunk
        self.chunks = [(lo, min(step, len(data) - lo)) for lo in range(0, len(data), step)]
        self.stages: List[Callable[[], List[Any]]] = []
        for k in range(len(self.chunks)):
            self.stages.append(functools.partial(self._reduce, k))
            self.stages.append(functools.partial(self._gather, k))

    def start(self) -> Any:
        """Copy the first chunk in; start the barrier after it."""
        self._copy_in(0)
        return self._barrier()

    def _barrier(self) -> Any:
        self.win.win.Sync()  # this rank's stores, visible before the barrier ends
        return self.win.comm.Ibarrier()

    def _copy_in(self, k: int) -> None:
        lo, size = self.chunks[k]
        self.win.halves[k % 2][self.me][:size] = self.data[lo : lo + size]

    def _slices(self, k: int) -> List[slice]:
        count = self.chunks[k][1] // self.itemsize
        counts, starts = parts(count, self.n)
        item = self.itemsize
        return [slice(s * item, (s + c) * item) for s, c in zip(starts, counts)]

    def _reduce(self, k: int) -> List[Any]:
        """Reduce this rank's slice of chunk ``k`` across every rank's copy."""
        self.win.win.Sync()
        mine = self._slices(k)[self.me]
        halves = self.win.halves[k % 2]
        dst = halves[self.me][mine].view(self.dtype)
        others = [r for r in range(self.n) if r != self.me]
        for i, r in enumerate(others):
            last = i == len(others) - 1
            divide = self.n if self.average and last else None
            if dst.size:
                kernels.reduce(self.name, halves[r][mine].view(self.dtype), dst, divide)
        return [self._barrier()]

    def _gather(self, k: int) -> List[Any]:
        """Copy every rank's reduced slice of chunk ``k`` out, and the next chunk in."""
        self.win.win.Sync()
        lo, _ = self.chunks[k]
        halves = self.win.halves[k % 2]
        for r, part in enumerate(self._slices(k)):
            self.data[lo + part.start : lo + part.stop] = halves[r][part]
        if k + 1 < len(self.chunks):
            self._copy_in(k + 1)
        return [self._barrier()]
