"""Buffers a group keeps for its large calls to receive into.

Some collectives need a buffer of their own to receive into: in-place
``reduce_scatter_tensor`` (MPI's buffers must not overlap, so its result lands
beside the input and is copied into place), pycoll's ring (each received
part, before it is combined) and the list forms of all_gather, gather and
all_to_all (everything received, before it is copied out). New memory from
numpy for each call is mapped page by page on first touch, and receiving into
it is slow: MPICH's reduce-scatter of 32 MiB on 2 ranks took 24 ms into a new
16 MiB buffer and 8 ms into one used before (docs/measurements/rs_in_place.py;
the ring and the list forms: kept_buffers.py).
So a group keeps, for its calls of ``POOL_FROM`` bytes and more, the buffers
they gave back: at most ``KEEP`` of them and ``KEEP_BYTES`` in all, the largest
first, freed with the group.

A buffer is given back only when its call has completed: one whose call
failed or timed out stays with that call (MPI may still write into it).
"""

from __future__ import annotations

import operator
import threading
import weakref
from typing import Dict, List

import numpy as np

from ..groups import ProcessGroup

__all__ = ["take", "beside", "give", "POOL_FROM", "KEEP_FROM_LEAST", "KEEP", "KEEP_BYTES"]

POOL_FROM = 1 << 20  # smaller buffers come fast enough from malloc's own free lists
KEEP_FROM_LEAST = 64 << 10  # the least a caller may ask kept (take's keep_from)
KEEP = 4
KEEP_BYTES = 256 << 20

_KEY = "collectives.scratch"
_MAKING = threading.Lock()
_NBYTES = operator.attrgetter("nbytes")
_OUT_PRUNE = 64  # entries of handed-out buffers before the dead ones are dropped


class _Pool:
    """A group's kept buffers (uint8, each owning its memory), largest first.

    Plain lists and dicts, no WeakValueDictionary and no sort by a lambda: a
    take and give cost 3 us with them on the CI VM, beside calls of 50-100 us
    (an in-place all-to-all of 1-2 MiB)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: List[np.ndarray] = []
        self.bytes = 0  # the free buffers' bytes
        # The buffers handed out and not yet given back, by id, each held
        # weakly (one whose call failed is dropped with that call). Only these
        # are taken back.
        self.out: Dict[int, weakref.ref[np.ndarray]] = {}

    def take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            free = self.free
            for i in range(len(free) - 1, -1, -1):  # (the smallest first)
                if free[i].nbytes >= nbytes:
                    buf = free.pop(i)
                    self.bytes -= buf.nbytes
                    break
            else:
                buf = np.empty(nbytes, np.uint8)
            out = self.out
            if len(out) >= _OUT_PRUNE:  # (buffers of failed calls, dropped since)
                for key in [k for k, ref in out.items() if ref() is None]:
                    del out[key]
            out[id(buf)] = weakref.ref(buf)
        return buf[:nbytes]  # the smallest that fits, or a new one

    def give(self, buf: np.ndarray) -> None:
        with self.lock:
            ref = self.out.get(id(buf))
            if ref is None or ref() is not buf:
                return  # not one of this pool's, or given back already
            del self.out[id(buf)]
            free = self.free
            free.append(buf)
            self.bytes += buf.nbytes
            if len(free) > 1:
                free.sort(key=_NBYTES, reverse=True)
            while len(free) > KEEP or self.bytes > KEEP_BYTES:
                self.bytes -= free.pop().nbytes  # the smallest


def _pool(pg: ProcessGroup) -> _Pool:
    pool = pg.attached(_KEY)
    if pool is None:
        with _MAKING:
            pool = pg.attached(_KEY) or pg.attach(_KEY, _Pool())
    return pool


def take(pg: ProcessGroup, nbytes: int, dtype: np.dtype, keep_from: int = POOL_FROM) -> np.ndarray:
    """An uninitialized 1-d array of ``nbytes`` bytes of ``dtype`` to receive
    into: one the group kept, when it has one large enough, else new.
    Buffers under ``keep_from`` bytes (at least KEEP_FROM_LEAST) come from
    numpy; a caller whose buffers malloc gives back to the system between
    calls passes less (the coalesced calls: 1,000 KiB came as new pages each
    time, 0.5 ms of page faults against 40 us to copy it)."""
    if nbytes < keep_from or nbytes < KEEP_FROM_LEAST:
        return np.empty(nbytes // dtype.itemsize, dtype)
    return _pool(pg).take(nbytes).view(dtype)


def beside(pg: ProcessGroup, like: np.ndarray) -> np.ndarray:
    """An uninitialized array shaped like ``like`` to receive into, for a
    call whose output lies inside its input (:func:`take`'s rules; a small
    one straight from numpy, which is a third of take-and-reshape's cost)."""
    if like.nbytes < KEEP_FROM_LEAST:
        return np.empty(like.shape, like.dtype)
    return take(pg, like.nbytes, like.dtype).reshape(like.shape)


def give(pg: ProcessGroup, array: np.ndarray) -> None:
    """Hand back an array :func:`take` gave, once its call has completed."""
    owner = array if array.base is None else array.base
    # (A small array never came from the pool: no lookup, no lock for it.)
    if isinstance(owner, np.ndarray) and KEEP_FROM_LEAST <= owner.nbytes <= KEEP_BYTES:
        pool = pg.attached(_KEY)
        if pool is not None:
            pool.give(owner)
