"""NCCL for CUDA arrays, on groups whose backend is ``"cpu:mpi,cuda:nccl"``.

A group made with that backend (``init_process_group``, ``new_group`` and
the other group constructors take it) sends its CUDA arrays through NCCL for
the collectives NCCL has: all_reduce (SUM, PRODUCT, MIN, MAX, AVG, and
PREMUL_SUM as a device scaling then SUM), broadcast, reduce,
all_gather_into_tensor and reduce_scatter_tensor (without PREMUL_SUM), on
the dtypes NCCL reduces (8/32/64-bit integers, float16, bfloat16, float32,
float64). Everything else on that group, and every host array, goes through
MPI as usual.

Each group gets its own NCCL communicator on first use: rank 0 of the group
makes the unique id and broadcasts it over the group's MPI communicator. An
NCCL collective is still one pycoll collective: counted, checked at DETAIL,
published on the progress board, and bounded by the group's timeout (the
wait polls a CUDA event, so a peer that never arrives gives
DistTimeoutError). The collective runs on the caller's stream; a
synchronous call returns once it is done, an ``async_op=True`` one returns a
Work whose ``wait()`` waits for it.

cupy's NCCL bindings (``cupy.cuda.nccl``) carry the calls; without them a
CUDA array on such a group is a RuntimeError saying what to install.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from pycoll import crosscheck, watch
from pycoll.arrays import BFLOAT16, check_size
from pycoll.collectives._common import group_rank, sequenced
from pycoll.ops import plan
from pycoll.spec import Spec
from pycoll.work import BaseWork, Future, to_seconds

from . import kernels, runtime
from .device import DeviceArray

__all__ = ["wanted", "run"]

NCCL_BACKEND = "cuda:nccl"
_DTYPES = {
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
    BFLOAT16: 9,
}
_OPS = {"SUM": 0, "PRODUCT": 1, "MAX": 2, "MIN": 3, "AVG": 4}


def wanted(name: str, pg: Any, args: Dict[str, Any], devs: List[DeviceArray]) -> bool:
    """Whether this call on ``pg`` goes through NCCL (see the module docstring)."""
    if NCCL_BACKEND not in pg.name() or name not in _CALLS:
        return False
    if any(d.dtype not in _DTYPES for d in devs) or len({d.dtype for d in devs}) != 1:
        return False
    op = args.get("op")
    if op is None:
        return True
    if op.name == "PREMUL_SUM":
        return name == "all_reduce" and (devs[0].dtype.kind == "f" or devs[0].dtype == BFLOAT16)
    if op.name == "AVG" and devs[0].dtype.kind in "iu":
        return False  # the host path refuses it, with its message
    return op.name in _OPS


def _module() -> Any:
    try:
        from cupy.cuda import nccl
    except ImportError:
        nccl = None
    if nccl is None or not getattr(nccl, "available", False):
        raise RuntimeError(
            "this group's backend sends CUDA arrays through NCCL, but cupy's NCCL "
            "bindings are not available; install cupy with NCCL (pip install "
            "'pycoll[gpu]' nvidia-nccl-cu12), or use backend='mpi'"
        )
    return nccl


def communicator(pg: Any) -> Any:
    """The group's NCCL communicator, made on first use (collective) and kept
    with the group (``pg.attach``) until it is destroyed."""
    comm = pg.attached("nccl")
    if comm is None:
        nccl = _module()
        import cupy

        # NCCL refuses two ranks on one GPU with a bare "invalid usage"; say
        # which ranks share one, on every rank, before NCCL is asked.
        buses = pg.comm.allgather(cupy.cuda.Device().pci_bus_id)
        shared = [pg.ranks[i] for i, bus in enumerate(buses) if buses.count(bus) > 1]
        if shared:
            raise RuntimeError(
                f"NCCL needs one GPU per rank, but ranks {shared} of group "
                f"{pg.group_desc!r} share a GPU; give each rank its own "
                f"(pycoll-run --gpus-per-rank 1, or CUDA_VISIBLE_DEVICES), or use backend='mpi'"
            )
        uid = nccl.get_unique_id() if pg.rank() == 0 else None
        uid = pg.comm.bcast(uid, root=0)
        # NCCL holds device memory per communicator: destroyed with the group
        comm = pg.attach("nccl", nccl.NcclCommunicator(pg.size(), uid, pg.rank()), _destroy)
    return comm


def _destroy(comm: Any) -> None:
    comm.destroy()


class NcclWork(BaseWork):
    """The Work of an NCCL collective: done when the caller's stream has run it,
    which ``event`` (recorded on that stream by pycoll.gpu.runtime) tells."""

    def __init__(self, pg: Any, op: str, seq: int, event: Any, result: List[Any]) -> None:
        self._pg = pg
        self.op = op
        self.seq = seq
        self._event = event
        self._result = result
        self._exc: Optional[BaseException] = None
        self._done = False
        self._future: Optional[Future] = None

    def __repr__(self) -> str:
        state = "completed" if self._done else "pending"
        return f"NcclWork(op={self.op!r}, seq={self.seq}, {state})"

    def _poll(self) -> bool:
        if not self._done and self._event.done():
            self._done = True
            self._settle_future()
        return self._done

    def wait(self, timeout: Optional[float] = None) -> bool:
        limit = self._pg.timeout.total_seconds() if timeout is None else to_seconds(timeout)
        start = time.monotonic()
        while not self._poll():
            elapsed = time.monotonic() - start
            if elapsed >= limit:
                self._exc = watch.timed_out(self._pg, self.op, self.seq, elapsed, limit, [])
                self._done = True
                self._settle_future()
                raise self._exc
            time.sleep(0 if elapsed < 0.01 else 0.001)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._poll()

    def exception(self) -> Optional[BaseException]:
        return self._exc

    def _value(self) -> List[Any]:
        return self._result


# What NCCL does for each collective it has: check the arrays as the host
# collective would, and give the element count the call check records and
# the call that issues it on a stream.
Issue = Callable[[Any, int, int, Optional[int], int], None]  # (comm, dtype, op, root, stream)


def _all_reduce(pg: Any, devs: List[DeviceArray]) -> Tuple[int, Issue]:
    d = devs[0]
    return d.size, lambda c, t, o, r, s: c.allReduce(d.ptr, d.ptr, d.size, t, o, s)


def _broadcast(pg: Any, devs: List[DeviceArray]) -> Tuple[int, Issue]:
    d = devs[0]
    return d.size, lambda c, t, o, r, s: c.bcast(d.ptr, d.size, t, r, s)


def _reduce(pg: Any, devs: List[DeviceArray]) -> Tuple[int, Issue]:
    d = devs[0]
    return d.size, lambda c, t, o, r, s: c.reduce(d.ptr, d.ptr, d.size, t, o, r, s)


def _all_gather_into_tensor(pg: Any, devs: List[DeviceArray]) -> Tuple[int, Issue]:
    out, inp = devs
    why = "input_tensor.size x group size"
    check_size("all_gather_into_tensor", "output_tensor", out, inp.size * pg.size(), why)  # type: ignore[arg-type]
    return inp.size, lambda c, t, o, r, s: c.allGather(inp.ptr, out.ptr, inp.size, t, s)


def _reduce_scatter_tensor(pg: Any, devs: List[DeviceArray]) -> Tuple[int, Issue]:
    out, inp = devs
    why = "output.size x group size"
    check_size("reduce_scatter_tensor", "input", inp, out.size * pg.size(), why)  # type: ignore[arg-type]
    return out.size, lambda c, t, o, r, s: c.reduceScatter(inp.ptr, out.ptr, out.size, t, o, s)


_CALLS: Dict[str, Callable[[Any, List[DeviceArray]], Tuple[int, Issue]]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
}


def run(spec: Spec, pg: Any, args: Dict[str, Any], devs: List[DeviceArray], stream: int) -> Any:
    """Issue a call of collective ``spec`` through NCCL on ``stream``; wait
    unless async."""
    _module()  # before anything is counted: every rank raises alike
    name = spec.name
    nccl_op = 0
    op = args.get("op")
    dev = devs[0]
    if op is not None:
        plan(op, dev.dtype, name)  # the host path's checks and messages
        nccl_op = 0 if op.name == "PREMUL_SUM" else _OPS[op.name]
    root = None
    for a in spec.arrays:
        if a.root is not None:  # a rooted collective: its src or dst
            root = group_rank(pg, args[a.root[0]], a.root[0], name)
    count, issue = _CALLS[name](pg, devs)
    dtype = _DTYPES[dev.dtype]
    shape = f"shape={dev.shape}, {dev.dtype}"
    opname = f"{op.name}, " if op is not None else ""
    call = f"{name}({opname}{shape})"
    check_key = crosscheck.key(name, dev.dtype, count, root or 0, op and op.name)
    with sequenced(pg, name, call, check_key) as seq:
        comm = communicator(pg)
        if op is not None and op.name == "PREMUL_SUM":
            kernels.scale(dev, op._scale, stream)
        issue(comm, dtype, nccl_op, root, stream)
        work = NcclWork(pg, name, seq, runtime.get().record(stream), [devs[0].obj])
        if not args.get("async_op"):
            work.wait()
    return work if args.get("async_op") else None
