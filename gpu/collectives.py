"""Collectives on device arrays: staged through pinned host memory, or handed
to a CUDA-aware MPI.

Every collective that takes arrays declares them once (pycoll.dispatch's
``@collective``, with pycoll.spec's types), and a call with CUDA arrays comes
here (:func:`call`) with its arguments and that declaration (a
:class:`pycoll.spec.Spec`). The call then runs the host collective itself, so
argument checks, sequence numbers, DETAIL fingerprints, timeouts and Work
handles are pycoll's usual ones, on one of two kinds of host array:

- **staged** (MPI is not CUDA-aware, the default for the MPI wheels): each
  device array gets a pinned host buffer from a reused pool; inputs are
  copied down, MPI runs on host memory (its own reductions included), and
  outputs are copied back up. Large all_reduce and broadcast calls go in
  chunks (:mod:`pycoll.gpu.staging`), so copies overlap MPI's transfers.
- **NCCL**, on a group whose backend is ``"cpu:mpi,cuda:nccl"``, for the
  collectives NCCL has (:mod:`pycoll.gpu.nccl`).
- **aware** (:func:`pycoll.gpu.cuda_aware`): the host collective gets an array
  over the device address (:func:`pycoll.gpu.device.host_alias`) and MPI
  reads and writes device memory itself. Only calls whose host code hands
  buffers to MPI untouched go this way: all_reduce, reduce,
  reduce_scatter_tensor with MPI's predefined ops (AVG and PREMUL_SUM add a
  device division or scaling around SUM), broadcast, all_gather_into_tensor,
  all_to_all_single and point-to-point. A synchronous all_reduce of floats
  whose op is one of pycoll's MPI user ops (float16/bfloat16 arithmetic,
  NaN-propagating MIN/MAX), which MPI runs on the host, goes through pycoll's
  own device ring instead (:mod:`pycoll.gpu.ring`). Other calls (lists of
  arrays, overlapping arrays, async reductions with such ops) are staged.

Streams: before MPI sees any data, pycoll synchronizes the stream each array
was produced on (the stream in its ``__cuda_array_interface__``, or the
``stream=`` argument, or the current stream); results are in device memory
when a synchronous call returns (or its Work's ``wait()`` does), so later
work on any stream sees them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from pycoll import _mpi, arrays
from pycoll.collectives._common import device_aliases
from pycoll.groups import STATE, ProcessGroup, get_rank, resolve
from pycoll.ops import plan
from pycoll.reduceop import ReduceOp
from pycoll.spec import IN, OUT, Spec
from pycoll.trace import timeline
from pycoll.work import AliasWork, Work

from . import kernels, nccl, ring, runtime, staging
from .aware import cuda_aware
from .device import DeviceArray, adapt, host_alias, is_device

__all__ = ["call", "stream_handle"]


def stream_handle(stream: Any) -> Optional[int]:
    """A stream argument as a handle: an int, a cupy Stream (``.ptr``) or a
    torch Stream (``.cuda_stream``); None stays None."""
    if stream is None:
        return None
    for attr in ("ptr", "cuda_stream"):
        value = getattr(stream, attr, None)
        if value is not None:
            return int(value) or runtime.LEGACY_STREAM
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream or runtime.LEGACY_STREAM
    raise TypeError(
        f"stream must be a CUDA stream (cupy.cuda.Stream, torch.cuda.Stream or a "
        f"handle), got {stream!r}"
    )


class _Slot:
    """One device array argument: where it sits in the call, and its host stand-in."""

    __slots__ = ("path", "role", "dev", "host", "buf")

    def __init__(self, path: Tuple[Any, ...], role: str, dev: DeviceArray) -> None:
        self.path = path
        self.role = role
        self.dev = dev
        self.host: Any = None  # the host array the host collective sees
        self.buf: Any = None  # the pinned pool buffer under it (staged)


def _walk(spec: Spec, args: Dict[str, Any]) -> Tuple[List[Tuple[Tuple[Any, ...], str, Any]], str]:
    """Every array argument as (path, role on this rank, value), and a
    ValueError message if numpy and CUDA arrays are mixed ('' when not)."""
    rank = get_rank() if any(a.root for a in spec.arrays) else -1
    found = [(path, spec.role(a, args, rank), x) for path, a, x in spec.found(args)]
    device = [p for p, _, x in found if is_device(x)]
    host = [p for p, _, x in found if isinstance(x, np.ndarray)]
    if device and host:
        return found, (
            f"{spec.name}: all arrays of one call must be on one device kind, but "
            f"{spec.label(device[0])} is a CUDA array and {spec.label(host[0])} is a "
            f"numpy.ndarray; move them to one device first (cupy.asarray / cupy.asnumpy)"
        )
    return found, ""


def call(spec: Spec, args: Dict[str, Any]) -> Any:
    """Run a call of collective ``spec`` whose arguments ``args`` hold CUDA
    arrays (see the module docstring)."""
    name = spec.name
    args = dict(args)
    stream_arg = stream_handle(args.pop("stream", None))
    found, mixed = _walk(spec, args)
    if mixed:
        raise ValueError(mixed)
    rt = runtime.get()
    stream = stream_arg if stream_arg is not None else rt.current_stream()
    slots = [_Slot(path, role, adapt(x, name, spec.label(path), stream)) for path, role, x in found]
    for s in slots:
        if s.role != IN and s.dev.readonly:
            raise ValueError(
                f"{name}: {spec.label(s.path)} is read-only, so the result cannot be written "
                f"into it; pass a writeable array (e.g. a copy)"
            )
    # The producers' work must be done before MPI or a copy reads the data.
    producers = {s.dev.stream for s in slots if s.dev.stream is not None}
    for p in producers - {stream}:
        rt.synchronize(p)
    group = args.get("group")
    hint = group if group is not None else STATE.default
    if isinstance(hint, ProcessGroup) and nccl.NCCL_BACKEND in hint.name():
        pg = resolve(group, name)
        if pg is None:
            return None
        devs = [s.dev for s in slots]
        if nccl.wanted(name, pg, args, devs):
            return nccl.run(spec, pg, args, devs, stream)
    if cuda_aware().aware:
        if _aware_ok(spec, args, slots):
            return _aware(spec, args, slots, rt, stream)
        if _ring_ok(name, args, slots):
            return _ring(args, slots[0].dev, rt, stream)
    if spec.chunked and staging.chunked(slots[0].dev.nbytes):
        return staging.pipelined(name, args, slots[0].dev, rt, stream)
    return _staged(spec, args, slots, rt, stream)


def _overlap(slots: List[_Slot]) -> bool:
    spans = sorted((s.dev.ptr, s.dev.ptr + s.dev.nbytes) for s in slots if s.dev.nbytes)
    return any(a_end > b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def _aware_ok(spec: Spec, args: Dict[str, Any], slots: List[_Slot]) -> bool:
    if not spec.aware or _overlap(slots):
        return False
    if not spec.reduction:
        return True
    name = spec.name

    op = args.get("op", ReduceOp.SUM)
    dtype = slots[0].dev.dtype
    if not isinstance(op, ReduceOp):
        return False  # the host call raises the TypeError
    if op.name in ("AVG", "PREMUL_SUM"):
        if name != "all_reduce" or arrays.dtype_kind(dtype) not in ("float", "complex"):
            return False
        op = ReduceOp.SUM
    try:
        how = plan(op, dtype, name)
    except ValueError:
        return False  # the host call raises it, with the same message
    return how.plain and how.mpi_op.is_predefined


def _ring_ok(name: str, args: Dict[str, Any], slots: List[_Slot]) -> bool:
    """A synchronous all_reduce of floats whose op MPI cannot run on device
    memory (a pycoll user op): pycoll's device ring (pycoll.gpu.ring), whose
    messages need MPI_Isendrecv (MPI-4.0)."""
    if name != "all_reduce" or args.get("async_op") or len(slots) != 1:
        return False
    if not _mpi.has("MPI_Isendrecv"):
        return False
    op = args.get("op", ReduceOp.SUM)
    dev = slots[0].dev
    if not isinstance(op, ReduceOp):
        return False
    if arrays.dtype_kind(dev.dtype) not in ("half", "float"):
        return False
    return op.name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")


def _ring(args: Dict[str, Any], dev: DeviceArray, rt: runtime.Runtime, stream: int) -> None:
    pg = resolve(args.get("group"), "all_reduce")
    if pg is None:
        return None
    op = args.get("op", ReduceOp.SUM)
    plan(op, dev.dtype, "all_reduce")  # the host path's checks and messages
    part = dev.size // pg.size() + 1
    ptr, owner = rt.scratch(part * dev.dtype.itemsize)
    scratch = DeviceArray(owner, ptr, (part,), dev.dtype, False, None)
    ring.all_reduce(pg, dev, op, stream, rt, scratch)
    return None


def _aware(
    spec: Spec,
    args: Dict[str, Any],
    slots: List[_Slot],
    rt: runtime.Runtime,
    stream: int,
) -> Any:
    name = spec.name
    rt.synchronize(stream)
    for s in slots:
        s.host = host_alias(s.dev)
        spec.put(args, s.path, s.host)
    op = args.get("op")
    after: Optional[Callable[[], None]] = None
    if name == "all_reduce" and op is not None and op.name in ("AVG", "PREMUL_SUM"):
        dev = slots[0].dev
        pg = resolve(args.get("group"), name)
        if pg is None:
            return None
        if op.name == "PREMUL_SUM":
            kernels.scale(dev, op._scale, stream)
            rt.synchronize(stream)
        else:
            size = pg.size()

            def after() -> None:
                kernels.divide(dev, size, stream)
                rt.synchronize(stream)

        args["op"] = ReduceOp.SUM
    # The host arrays alias device memory: no host-side path may touch them.
    with device_aliases(resolve(args.get("group"), name)):
        value = spec.host(**args)
    return _finish_call(value, slots, after)


def _staged(
    spec: Spec,
    args: Dict[str, Any],
    slots: List[_Slot],
    rt: runtime.Runtime,
    stream: int,
) -> Any:
    down = sum(s.dev.nbytes for s in slots if s.role != OUT)
    with timeline.span("copy to host", "gpu", down):  # (on the timeline: pycoll.trace)
        for s in slots:
            s.buf = rt.take(s.dev.nbytes)
            s.host = s.buf[: s.dev.nbytes].view(s.dev.dtype).reshape(s.dev.shape)
            if s.role != OUT:
                rt.to_host(s.host, s.dev.ptr, stream)
            spec.put(args, s.path, s.host)
        rt.synchronize(stream)

    def back() -> None:
        up = sum(s.dev.nbytes for s in slots if s.role != IN)
        with timeline.span("copy to device", "gpu", up):
            try:
                for s in slots:
                    if s.role != IN:
                        rt.to_device(s.dev.ptr, s.host, stream)
                rt.synchronize(stream)
            finally:
                for s in slots:
                    rt.give(s.buf)

    try:
        value = spec.host(**args)
    except BaseException:
        for s in slots:
            rt.give(s.buf)
        raise
    return _finish_call(value, slots, back)


def _finish_call(value: Any, slots: List[_Slot], after: Optional[Callable[[], None]]) -> Any:
    if isinstance(value, Work):
        return AliasWork(value, {id(s.host): s.dev.obj for s in slots}, after)
    if after is not None:
        after()
    return value
