"""FusedAllReduce: many arrays reduced as one MPI operation, step after step.

A training step all-reduces the same gradient arrays every time. Reducing
each one separately pays MPI's per-call latency per array (Horovod measured
this as its largest cost, and fixed it with Tensor Fusion). A FusedAllReduce
is built once for a fixed list of arrays: it checks them, records where each
lives, and allocates one fusion buffer. Each call then packs every array into
the buffer with one compiled call, reduces the buffer with one MPI
operation, and unpacks, so 1,000 arrays of 1 KiB cost about what one 1 MiB
all_reduce costs. Make one FusedAllReduce per bucket of arrays to overlap
buckets with computation, as DDP does.

Where every rank of the group shares one node and the arrays are large
enough together (``SHM_BYTES``), a call skips the fusion buffer: the arrays
are copied straight into the group's shared window, each rank reduces its
slice there, and each array is copied straight out of the ranks' reduced
slices (pycoll.collectives.shm), which also spares MPI's own copies.

Where the caller can allocate the arrays, :meth:`FusedAllReduce.empty` makes
them views into the fusion buffer (DDP's ``gradient_as_bucket_view``): then
nothing is packed or unpacked at all, and a call costs one all_reduce. Arrays
the caller already laid out back to back in one array are recognised the same
way.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import _mpi, crosscheck, kernels
from .arrays import check_list, check_output, check_same_dtype
from .collectives import shm
from .collectives._common import run
from .groups import ProcessGroup, resolve
from .ops import plan
from .reduceop import ReduceOp
from .work import Work

__all__ = ["FusedAllReduce"]

# From this many bytes in all, a call whose ranks share one node copies the
# arrays straight into the node's shared window, reduces there and copies
# straight out (pycoll.collectives.shm): it skips the fusion buffer and
# MPI's own copies. Measured against the packed path
# (docs/measurements/fused_window.py): the window wins from 256 KiB on 2 ranks
# with a core each, and from 512 KiB to 1 MiB where ranks outnumber the cores
# (3-4 ranks on 2 cores), as each chunk's three barriers wait for every rank to
# be scheduled. 0 turns it off.
SHM_BYTES = 256 << 10
SHM_BYTES_CROWDED = 768 << 10


def _window_from(win: Any) -> int:
    """The size from which calls take the shared window ``win`` (the same on
    every rank: ``win.crowded`` is agreed when the window is made)."""
    return max(SHM_BYTES, SHM_BYTES_CROWDED) if win.crowded else SHM_BYTES


class FusedAllReduce:
    """All-reduce a fixed list of arrays of one dtype in one MPI operation.

    Args:
        tensors: the arrays (C-contiguous, writeable, one dtype, any shapes).
            They are reduced in place on every call; keep the same array
            objects alive and update them in place between calls.
        op: the reduction (default SUM; AVG and PREMUL_SUM work as in all_reduce).
        group: the group (default: the world). On a rank outside it, calls do
            nothing and return None.

    Example::

        fused = pycoll.FusedAllReduce(grads, op=pycoll.ReduceOp.AVG)
        for step in range(steps):
            compute_gradients(grads)          # writes into the same arrays
            fused.all_reduce()                # or: work = fused.all_reduce(async_op=True)
    """

    def __init__(
        self,
        tensors: List[np.ndarray],
        op: ReduceOp = ReduceOp.SUM,
        group: Optional[ProcessGroup] = None,
    ) -> None:
        func = "FusedAllReduce"
        self._group = group
        self._pg = resolve(group, func)
        arrays = [
            check_output(func, f"tensors[{i}]", t)
            for i, t in enumerate(check_list(func, "tensors", tensors))
        ]
        if not arrays:
            raise ValueError(f"{func}: tensors is empty; pass at least one array")
        self.dtype = check_same_dtype(func, arrays)
        self.op = op
        self._plan = plan(op, self.dtype, func)  # raises for an undefined (op, dtype)
        self._arrays = arrays  # keeps them alive: the table below points into them
        sizes = np.array([a.nbytes for a in arrays], np.int64)
        self._sizes = sizes
        self._offsets = np.zeros(len(arrays), np.int64)
        np.cumsum(sizes[:-1], out=self._offsets[1:])
        self._addresses = np.array([a.__array_interface__["data"][0] for a in arrays], np.int64)
        # Arrays that already lie back to back in one buffer, in order (as
        # empty() makes them), need no packing: that buffer is the fusion buffer.
        shared = self._shared_buffer(arrays, int(sizes.sum()))
        self._views = shared is not None
        if shared is None:
            shared = np.empty(int(sizes.sum()) // self.dtype.itemsize, self.dtype)
        self.buffer = shared
        # Where each array lies in the fusion buffer: packing copies it there,
        # unpacking back (pycoll.kernels.copy_pieces).
        self._places = shared.__array_interface__["data"][0] + self._offsets
        self._work: Optional[Work] = None
        self._scattered: Any = None  # the copy tables into the group's shared window

    def _shared_buffer(self, arrays: List[np.ndarray], nbytes: int) -> Optional[np.ndarray]:
        base = arrays[0].base
        if not (
            isinstance(base, np.ndarray)
            and base.ndim == 1
            and base.dtype == self.dtype
            and base.flags.c_contiguous
            and base.nbytes == nbytes
            and all(a.base is base for a in arrays)
        ):
            return None
        start = base.__array_interface__["data"][0]
        return base if np.array_equal(self._addresses, start + self._offsets) else None

    @classmethod
    def empty(
        cls,
        shapes: Sequence[Tuple[int, ...]],
        dtype: Any,
        op: ReduceOp = ReduceOp.SUM,
        group: Optional[ProcessGroup] = None,
    ) -> FusedAllReduce:
        """A FusedAllReduce over new arrays of ``shapes`` that are views into its
        fusion buffer, so calls pack and unpack nothing. The arrays are
        ``.arrays``; write into them in place (``a[...] = ...``).
        """
        dtype = np.dtype(dtype)
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        flat = np.empty(sum(sizes), dtype)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        views = [flat[offsets[i] : offsets[i + 1]].reshape(shape) for i, shape in enumerate(shapes)]
        return cls(views, op, group)  # recognises the views: nothing to pack

    @property
    def arrays(self) -> List[np.ndarray]:
        """The arrays reduced by each call (for :meth:`empty`, views into the buffer)."""
        return list(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    @property
    def nbytes(self) -> int:
        """Bytes reduced per call (the fusion buffer's size)."""
        return self.buffer.nbytes

    def all_reduce(self, async_op: bool = False) -> Optional[Work]:
        """Reduce the arrays across the group, in place: packed into the
        fusion buffer for one MPI operation, or through the node's shared
        window (see the module docstring).

        Returns:
            A Work if ``async_op`` (the arrays hold the result once it is
            complete); None otherwise, and on ranks outside the group.

        Raises:
            RuntimeError: the previous call's Work has not been waited on (or
                seen complete by ``is_completed()``): its buffer may be in use.
        """
        func = "FusedAllReduce.all_reduce"
        pg = resolve(self._group, func) if self._group is not None else self._pg
        if pg is None:
            return None
        # Not is_completed(): whether it raised would then depend on timing. The
        # rule is simple instead: wait() (or see is_completed() say True) first.
        if self.busy():
            raise RuntimeError(
                f"{func}: the previous call's Work is still in flight and its fusion "
                f"buffer in use; wait() on it before the next call"
            )
        return self._run(pg, "fused_all_reduce", async_op)  # (DETAIL's description below)

    def _describe(self, name: str) -> Callable[[], str]:
        size = self.buffer.size
        return lambda: f"{name}({self.op.name}, {len(self)} arrays, {size} x {self.dtype})"

    def _key(self, name: str) -> int:
        return self._plan.key | crosscheck.OP_BITS[name] | self.buffer.size & crosscheck.COUNT

    def busy(self) -> bool:
        """Whether the last call's Work is in flight (its buffer in use)."""
        return self._work is not None and not self._work._done

    def _run(
        self,
        pg: ProcessGroup,
        name: str,
        async_op: bool,
        describe: Optional[Callable[[], str]] = None,
    ) -> Optional[Work]:
        """One call, sequenced and checked as the collective ``name`` and
        described to DETAIL's check by ``describe`` (pycoll.all_reduce_coalesced
        runs the lists it has seen before through here, described as its
        other calls are)."""
        how, n = self._plan, pg.size()
        buf, nbytes, views = self.buffer, self.buffer.nbytes, self._views
        if not views and nbytes >= SHM_BYTES > 0:
            win = shm.usable(pg, how, self.dtype, name)
            if win is not None and nbytes >= _window_from(win):
                return self._run_shm(pg, win, name, async_op, describe)
        arrays, places, sizes = self._addresses, self._places, self._sizes
        if not views:
            kernels.copy_pieces(places, arrays, sizes, nbytes)

        def finish() -> None:
            if how.average:
                kernels.divide(buf, n, out=buf)
            if not views:
                kernels.copy_pieces(arrays, places, sizes, nbytes)

        prepare = None
        if how.prescale is not None:
            scale = how.prescale

            def prepare() -> None:
                kernels.scale(buf, scale, out=buf)

        work = run(
            pg,
            name,
            nbytes,
            pg.comm.Iallreduce,
            (_mpi.IN_PLACE, [buf, how.datatype], how.mpi_op),
            async_op,
            finish,
            self._arrays,
            describe or self._describe(name),
            prepare,
            key=self._key(name),
        )
        self._work = work
        return work

    def _run_shm(
        self,
        pg: ProcessGroup,
        win: Any,
        name: str,
        async_op: bool,
        describe: Optional[Callable[[], str]],
    ) -> Optional[Work]:
        """One call through the node's shared window: the arrays are copied
        straight into it and straight out of every rank's reduced slice, so
        nothing is packed into the fusion buffer (pycoll.collectives.shm)."""
        how = self._plan
        data = self._scattered
        if data is None or data.win is not win:  # (tables into this window's memory)
            data = self._scattered = shm.Scattered(
                win, self._addresses, self._sizes, self._offsets, self.dtype, how.prescale
            )
        work = shm.all_reduce(
            pg,
            win,
            name,
            data,
            self.dtype,
            self.op,
            how,
            async_op,
            self._arrays,
            describe or self._describe(name),
            None,  # (a PREMUL_SUM scales in the window: Scattered's scale)
            self._key(name),
        )
        self._work = work
        return work
