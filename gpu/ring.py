"""pycoll's own all_reduce on device memory, for ops MPI cannot run there.

With a CUDA-aware MPI, MPI moves device buffers itself, but the reductions
pycoll adds (float16 and bfloat16 arithmetic, NaN-propagating float MIN/MAX)
are MPI user ops, which run on the host. Rather than stage the whole array,
pycoll runs its ring (pycoll.collectives.ring: a reduce-scatter, then an
all-gather, over point-to-point messages) on the device buffers, combining
each received part with :func:`pycoll.gpu.kernels.combine` on the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pycoll import crosscheck
from pycoll.collectives._common import run
from pycoll.collectives.ring import Ring

from . import kernels, runtime
from .device import DeviceArray, host_alias

__all__ = ["all_reduce"]


def _part(dev: DeviceArray, start: int, count: int) -> DeviceArray:
    item = dev.dtype.itemsize
    return DeviceArray(dev.obj, dev.ptr + start * item, (count,), dev.dtype, False, None)


def all_reduce(
    pg: Any, dev: DeviceArray, op: Any, stream: int, rt: runtime.Runtime, scratch: DeviceArray
) -> None:
    """All-reduce ``dev`` in place over ``pg`` with ``op`` (a pycoll ReduceOp
    whose reduction is SUM, PRODUCT, MIN or MAX, or AVG / PREMUL_SUM around a
    SUM); ``scratch`` holds at least one part (``dev.size // n + 1`` elements)."""
    reduce_op = "SUM" if op.name in ("AVG", "PREMUL_SUM") else op.name

    def prepare() -> None:
        if op.name == "PREMUL_SUM":
            kernels.scale(dev, op._scale, stream)
        rt.synchronize(stream)  # MPI reads what the kernels wrote

    def combine(start: int, count: int) -> None:
        kernels.combine(_part(dev, start, count), _part(scratch, 0, count), reduce_op, stream)
        rt.synchronize(stream)

    def reduced(start: int, count: int) -> None:
        kernels.divide(_part(dev, start, count), pg.size(), stream)
        rt.synchronize(stream)

    ring = Ring(
        pg,
        host_alias(_part(dev, 0, dev.size)).view(np.uint8),
        host_alias(scratch).view(np.uint8),
        dev.dtype.itemsize,
        combine,
        reduced if op.name == "AVG" else None,
    )
    run(
        pg,
        "all_reduce",
        dev.nbytes,
        ring.start,
        (),
        False,
        None,
        None,
        f"all_reduce({op.name}, shape={dev.shape}, {dev.dtype})",
        prepare,
        ring.stages,
        crosscheck.key("all_reduce", dev.dtype, dev.size, 0, op.name),
    )
