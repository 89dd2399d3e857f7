"""pycoll's own all_reduce on device memory, for ops MPI cannot run there.

With a CUDA-aware MPI, MPI moves device buffers itself, but the reductions
pycoll adds (float16 and bfloat16 arithmetic, NaN-propagating float MIN/MAX)
are MPI user ops, which run on the host. Rather than stage the whole array,
pycoll runs a ring: a reduce-scatter (n - 1 steps, each sending one part to
the right neighbour, receiving one from the left, and combining it into this
rank's copy with :func:`pycoll.gpu.kernels.combine`) and an all-gather
(n - 1 steps passing the reduced parts on). Each rank moves 2 (n - 1) / n of
the array, as MPI's own large-message algorithms do, and every combine runs
on the GPU.

Messages go over a duplicate of the group's communicator, made on first use,
so they never match a user's point-to-point messages. The whole ring is one
collective (one sequence number, one DETAIL check), and every wait is bounded
by the group's timeout.
"""

from __future__ import annotations

from typing import Any, List

import numpy as np

from . import kernels, runtime
from .device import DeviceArray, host_alias

__all__ = ["all_reduce"]

_TAG = 0


def _part(dev: DeviceArray, start: int, count: int) -> DeviceArray:
    item = dev.dtype.itemsize
    return DeviceArray(dev.obj, dev.ptr + start * item, (count,), dev.dtype, False, None)


def all_reduce(
    pg: Any, dev: DeviceArray, op: Any, stream: int, rt: runtime.Runtime, scratch: DeviceArray
) -> None:
    """All-reduce ``dev`` in place over ``pg`` with ``op`` (a pycoll ReduceOp
    whose reduction is SUM, PRODUCT, MIN or MAX, or AVG / PREMUL_SUM around a
    SUM); ``scratch`` holds at least one part (``dev.size // n + 1`` elements)."""
    from pycoll import _mpi, watch
    from pycoll.collectives._common import sequenced

    n, me = pg.size(), pg.rank()
    name = "all_reduce"
    reduce_op = "SUM" if op.name in ("AVG", "PREMUL_SUM") else op.name
    call = f"all_reduce({op.name}, shape={dev.shape}, {dev.dtype})"
    base, extra = divmod(dev.size, n)
    counts = [base + (1 if i < extra else 0) for i in range(n)]
    starts = [base * i + min(i, extra) for i in range(n)]
    datatype = _mpi.MPI.BYTE
    item = dev.dtype.itemsize
    with sequenced(pg, name, call) as seq:
        if n > 1 and pg._ring is None:
            pg._ring = pg.comm.Dup()  # collective: every member is here
        comm = pg._ring
        if op.name == "PREMUL_SUM":
            kernels.scale(dev, op._scale, stream)
        rt.synchronize(stream)  # MPI reads what the kernels wrote
        right, left = (me + 1) % n, (me - 1) % n

        def exchange(send: int, recv: int, into: DeviceArray) -> None:
            out = host_alias(_part(dev, starts[send], counts[send])).view(np.uint8)
            got = host_alias(_part(into, 0, counts[recv])).view(np.uint8)
            requests: List[Any] = [
                comm.Irecv([got, counts[recv] * item, datatype], left, _TAG),
                comm.Isend([out, counts[send] * item, datatype], right, _TAG),
            ]
            watch.wait(pg, name, seq, requests)

        for step in range(n - 1):  # reduce-scatter: part (me + 1) % n ends reduced here
            send, recv = (me - step) % n, (me - step - 1) % n
            exchange(send, recv, scratch)
            mine = _part(dev, starts[recv], counts[recv])
            kernels.combine(mine, _part(scratch, 0, counts[recv]), reduce_op, stream)
            rt.synchronize(stream)
        for step in range(n - 1):  # all-gather the reduced parts
            send, recv = (me + 1 - step) % n, (me - step) % n
            exchange(send, recv, _part(dev, starts[recv], counts[recv]))
        if op.name == "AVG":
            kernels.divide(dev, n, stream)
            rt.synchronize(stream)
