"""Large staged all_reduce and broadcast: chunked, so copies overlap MPI.

A message over ``PYCOLL_STAGE_CHUNK`` bytes (default 4 MiB: against 1 MiB
chunks 1.15x as fast at 64-256 MiB on an H200 machine and 1.0-1.3x on an
H100, 2 ranks, float32; docs/measurements/gpu_machine.sh) goes in chunks
through a ring of three chunk-sized pinned slots, so the pinned memory a call
holds does not grow with the message. While MPI reduces (or broadcasts) chunk
i, chunk i+1 is being copied down on the caller's stream and chunk i-1 copied
up on a second stream; a slot is refilled only after its last chunk has gone up
(a wait on the GPU, not on the host). It is one collective (one sequence
number, one DETAIL check, one timeout, one Work): each chunk is a stage of the
Work (see pycoll.work).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import numpy as np

from pycoll import _mpi, crosscheck, kernels
from pycoll._env import nbytes
from pycoll.arrays import mpi_datatype
from pycoll.collectives._common import group_rank, run
from pycoll.groups import resolve
from pycoll.ops import plan
from pycoll.reduceop import ReduceOp

from . import runtime
from .device import DeviceArray

__all__ = ["chunk_bytes", "chunked", "pipelined"]


def chunk_bytes() -> int:
    """The chunk size (``PYCOLL_STAGE_CHUNK`` bytes; 0 turns chunking off)."""
    value = nbytes("PYCOLL_STAGE_CHUNK", "the whole array at once")
    return DEFAULT_CHUNK if value is None else value


def chunked(nbytes: int) -> bool:
    """Whether a message of ``nbytes`` goes in chunks."""
    chunk = chunk_bytes()
    return 0 < chunk < nbytes


def pipelined(
    name: str, args: Dict[str, Any], dev: DeviceArray, rt: runtime.Runtime, stream: int
) -> Any:
    """all_reduce or broadcast of one device array, in chunks (module docstring)."""
    pg = resolve(args.get("group"), name)
    if pg is None:
        return None
    n = dev.size
    item = dev.dtype.itemsize
    per = max(1, chunk_bytes() // item)
    bounds = [(a, min(a + per, n)) for a in range(0, n, per)]
    shape = f"shape={dev.shape}, {dev.dtype}"
    comm = pg.comm
    if name == "all_reduce":
        op = args.get("op", ReduceOp.SUM)
        how = plan(op, dev.dtype, name)
        datatype = how.datatype
        reading = writing = True
        call = f"all_reduce({op.name}, {shape})"
        key = crosscheck.key(name, dev.dtype, n, 0, op.name)
    else:
        src = args["src"]
        root = group_rank(pg, src, "src", name)
        datatype = mpi_datatype(dev.dtype)
        reading = root == pg.rank()
        writing = not reading
        call = f"broadcast(src={src}, {shape})"
        key = crosscheck.key(name, dev.dtype, n, root)
    nchunks = len(bounds)
    slots = min(SLOTS, nchunks)
    buf = rt.take(slots * per * item)  # a few chunks of pinned memory, whatever the size
    down: List[Any] = [None] * nchunks  # event: chunk i is in its slot
    up: List[Any] = [None] * nchunks  # event: chunk i is back in device memory
    out = rt.side_stream()
    size = pg.size()

    def slot(i: int) -> np.ndarray:
        a, b = bounds[i]
        base = (i % slots) * per * item
        return buf[base : base + (b - a) * item].view(dev.dtype)

    def fetch(i: int) -> None:
        """Queue chunk i's copy down, once its slot's last chunk has gone up."""
        if not reading or i >= nchunks:
            return
        if writing and i >= slots:
            rt.wait(stream, up[i - slots])  # on the GPU: the host does not block
        rt.to_host(slot(i), dev.ptr + bounds[i][0] * item, stream)
        down[i] = rt.record(stream)

    def start(i: int) -> Any:
        part = slot(i)
        if reading:
            down[i].synchronize()
        elif i >= slots:
            up[i - slots].synchronize()  # the slot's last chunk has left it
        if name == "all_reduce":
            if how.prescale is not None:
                kernels.scale(part, how.prescale, out=part)
            return comm.Iallreduce(_mpi.MPI.IN_PLACE, [part, datatype], how.mpi_op)
        return comm.Ibcast([part, datatype], root)

    def land(i: int) -> None:
        part = slot(i)
        if name == "all_reduce" and how.average:
            kernels.divide(part, size, out=part)
        if writing:
            rt.to_device(dev.ptr + bounds[i][0] * item, part, out)
            up[i] = rt.record(out)
        fetch(i + slots)

    def stage(i: int) -> Callable[[], List[Any]]:
        def go() -> List[Any]:
            land(i - 1)
            return [start(i)]

        return go

    def finish() -> None:
        land(nchunks - 1)
        rt.synchronize(out)
        rt.synchronize(stream)
        rt.give(buf)

    for i in range(slots):
        fetch(i)
    return run(
        pg,
        name,
        dev.nbytes,
        start,
        (0,),
        bool(args.get("async_op")),
        finish,
        [dev.obj],
        call,
        None,
        [stage(i) for i in range(1, len(bounds))],
        key,
    )


SLOTS = 3  # chunks of pinned memory in flight: one going down, one in MPI, one going up
DEFAULT_CHUNK = 4 << 20
