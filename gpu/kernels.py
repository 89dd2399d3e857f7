"""Device reduction kernels (numba.cuda) for what runs on the GPU itself.

pycoll reduces on the device where it does not go through MPI's host-side
reductions: AVG's division and PREMUL_SUM's scaling around a CUDA-aware
all_reduce, and the combine step of pycoll's own ring all_reduce for ops MPI
cannot run on device memory (float16/bfloat16 arithmetic, NaN-propagating
MIN/MAX). Each kernel computes what the host kernels compute
(:mod:`pycoll.kernels`), bit for bit: float16 and bfloat16 in float32,
rounded once to nearest-even.

The same source runs in numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``),
which is how CI checks it without a GPU. bfloat16 is carried as uint16
words; the one operation numba.cuda has no spelling for, reinterpreting a
float32's bits, is an LLVM bitcast on the GPU and a numpy view in the
simulator.

numba.cuda is imported on first use.

Why numba.cuda and not cupy ElementwiseKernels: both were written and
measured on an H100 (docs/benchmarks.md, "GPU"). cupy's ran float32 faster, but
cupy compiles every kernel with flush-to-zero (``-ftz=true``, which its users
cannot turn off), so float32 and bfloat16 subnormals come out as zero: not the
host's answer. numba.cuda keeps IEEE subnormals, matched cupy on
float16/bfloat16, and is the same source the simulator runs in CI.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Dict, Tuple, Union

import numpy as np

from pycoll.arrays import BFLOAT16, check_dtype, dtype_kind
from pycoll.reduceop import check_pair

from . import runtime
from .device import DeviceArray, host_alias

__all__ = ["combine", "scale", "divide", "OPS"]

OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
_CODE = {name: i for i, name in enumerate(OPS)}
_THREADS = 256
_MAX_BLOCKS = 4096  # grid-stride loops beyond this (measured faster than a thread per element)
_SIM_BLOCKS, _SIM_THREADS = 2, 32  # the CUDA simulator's grid (tests without a GPU)

_KERNELS: Dict[Tuple[str, str], Any] = {}
cuda: Any = None  # numba.cuda, imported by _build


def _bit_helpers() -> Tuple[Any, Any]:
    """(float32 from uint32 bits, uint32 bits of a float32), for device code."""
    if runtime.simulated():

        def from_bits(bits: Any) -> Any:
            return np.uint32(bits).view(np.float32)

        def to_bits(value: Any) -> Any:
            return np.float32(value).view(np.uint32)

        return cuda.jit(device=True)(from_bits), cuda.jit(device=True)(to_bits)
    from llvmlite import ir
    from numba import types

    try:
        intrinsic: Any = importlib.import_module("numba.cuda.extending").intrinsic
    except (ImportError, AttributeError):  # numba's own CUDA target
        intrinsic = importlib.import_module("numba.extending").intrinsic

    @intrinsic
    def from_bits_ir(typingctx: Any, bits: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.FloatType())

        return types.float32(types.uint32), codegen

    @intrinsic
    def to_bits_ir(typingctx: Any, value: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.IntType(32))

        return types.uint32(types.float32), codegen

    return from_bits_ir, to_bits_ir


def numpy_for_numba_cuda() -> None:
    """Let numba-cuda's numpy support load on numpy 2.5.

    numba-cuda (0.30.4, the newest) registers an overload of ``numpy.row_stack``
    whenever numpy is 2.x, and numpy 2.5 removed that alias of ``numpy.vstack``:
    importing numba.cuda's numpy support then fails, and no device kernel
    loads. Where the name is missing, numpy gets a ``row_stack`` of its own (a
    function of its own calling vstack, so vstack's overload stays as it is),
    before numba.cuda is imported. Harmless where numba-cuda is fixed."""
    if not hasattr(np, "row_stack"):

        def row_stack(tup: Any, *, dtype: Any = None, casting: Any = "same_kind") -> Any:
            return np.vstack(tup, dtype=dtype, casting=casting)

        np.__dict__["row_stack"] = row_stack  # the name numpy 2.5 removed


def _build(kind: str) -> Any:
    """Compile (once) the kernels for a storage kind: 'bf16' (uint16 words),
    'f16' (float16, numba's own type), 'float', 'int', 'bool' or 'complex'."""
    numpy_for_numba_cuda()
    # Kernels must see ``cuda`` as a module global: the simulator swaps it there.
    globals()["cuda"] = importlib.import_module("numba.cuda")

    if kind == "bf16":
        from_bits, to_bits = _bit_helpers()

        @cuda.jit(device=True)
        def load(h: Any) -> Any:
            return from_bits(np.uint32(h) << np.uint32(16))

        @cuda.jit(device=True)
        def store(x: Any) -> Any:
            if x != x:  # NaN stays a quiet NaN with its sign
                return np.uint16((to_bits(x) >> np.uint32(16)) | np.uint32(0x40))
            bits = to_bits(x)
            odd = (bits >> np.uint32(16)) & np.uint32(1)
            return np.uint16((bits + np.uint32(0x7FFF) + odd) >> np.uint32(16))

    elif kind == "f16":

        @cuda.jit(device=True)
        def load(h: Any) -> Any:
            return np.float32(h)

        @cuda.jit(device=True)
        def store(x: Any) -> Any:
            return x  # assigning float32 to a float16 element rounds to nearest even

    else:

        @cuda.jit(device=True)
        def load(h: Any) -> Any:
            return h

        @cuda.jit(device=True)
        def store(x: Any) -> Any:
            return x

    @cuda.jit(device=True)
    def ordered(code: Any, a: Any, b: Any) -> Any:  # SUM, PRODUCT, MIN, MAX
        if code == 0:
            return a + b
        if code == 1:
            return a * b
        if code == 2:
            return a if a <= b else b
        return a if a >= b else b

    if kind in ("bf16", "f16", "float"):

        @cuda.jit(device=True)
        def op2(code: Any, a: Any, b: Any) -> Any:
            # MIN/MAX propagate NaN, as numpy.minimum/maximum do
            if code >= 2:
                if a != a:
                    return a
                if b != b:
                    return b
            return ordered(code, a, b)

    elif kind == "complex":

        @cuda.jit(device=True)
        def op2(code: Any, a: Any, b: Any) -> Any:
            return a + b if code == 0 else a * b

    else:  # int and bool

        @cuda.jit(device=True)
        def op2(code: Any, a: Any, b: Any) -> Any:
            if code == 4:
                return a & b
            if code == 5:
                return a | b
            if code == 6:
                return a ^ b
            return ordered(code, a, b)

    @cuda.jit
    def combine_kernel(out: Any, other: Any, code: Any) -> None:
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < out.size:
            out[i] = store(op2(code, load(out[i]), load(other[i])))
            i += step

    if kind == "complex":

        @cuda.jit
        def scale_kernel(out: Any, factor: Any, divide: Any) -> None:
            # A real factor scales each component once (no inf * 0 from a zero
            # imaginary part), as the host kernels do.
            i = cuda.grid(1)
            step = cuda.gridsize(1)
            while i < out.size:
                v = out[i]
                if divide:
                    out[i] = complex(v.real / factor, v.imag / factor)
                else:
                    out[i] = complex(v.real * factor, v.imag * factor)
                i += step

    else:

        @cuda.jit
        def scale_kernel(out: Any, factor: Any, divide: Any) -> None:
            i = cuda.grid(1)
            step = cuda.gridsize(1)
            while i < out.size:
                if divide:
                    out[i] = store(load(out[i]) / factor)
                else:
                    out[i] = store(load(out[i]) * factor)
                i += step

    return combine_kernel, scale_kernel


def _storage(dtype: np.dtype) -> Tuple[str, np.dtype]:
    """The kernel kind of ``dtype`` and the dtype the kernel sees."""
    if dtype == BFLOAT16:
        return "bf16", np.dtype(np.uint16)
    if dtype == np.float16:
        return "f16", dtype
    return dtype_kind(dtype), dtype


def _kernels(dtype: np.dtype) -> Tuple[Any, Any]:
    kind, _ = _storage(dtype)
    key = (kind, "sim" if runtime.simulated() else "gpu")
    if key not in _KERNELS:
        _KERNELS[key] = _build(kind)
    return _KERNELS[key]


def _view(x: DeviceArray) -> Any:
    """``x`` as a flat array numba.cuda kernels take, in its storage dtype."""
    from numba import cuda

    _, storage = _storage(x.dtype)
    if runtime.simulated():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(host_alias(x).reshape(-1).view(storage))
    desc = x.cai()
    desc["shape"] = (x.size,)
    desc["typestr"] = storage.str
    return cuda.from_cuda_array_interface(desc, owner=x.obj, sync=False)


def _launch(kernel: Any, x: DeviceArray, stream: int, *args: Any) -> None:
    if x.size == 0:
        return
    blocks = min(_MAX_BLOCKS, (x.size + _THREADS - 1) // _THREADS)
    if runtime.simulated():
        # numba's simulator runs each thread as a Python thread: a grid of
        # _SIM_BLOCKS x _SIM_THREADS, each thread striding over many elements
        # (the loop the GPU takes past _MAX_BLOCKS), costs it a fraction.
        kernel[min(blocks, _SIM_BLOCKS), _SIM_THREADS](*args)
        return
    from numba import cuda

    kernel[blocks, _THREADS, cuda.external_stream(stream)](*args)


def combine(out: DeviceArray, other: DeviceArray, op: str, stream: int) -> None:
    """``out = op(out, other)`` elementwise, queued on ``stream``."""
    check_dtype("pycoll.gpu.kernels.combine", "out", out.dtype)
    if other.dtype != out.dtype or other.size != out.size:
        raise ValueError(
            f"pycoll.gpu.kernels.combine: other is {other.size} x {other.dtype}, "
            f"out is {out.size} x {out.dtype}; they must match"
        )
    kind = check_pair(op, out.dtype, "pycoll.gpu.kernels.combine")
    if kind == "bool":  # as the host: SUM and MAX are "any", PRODUCT and MIN "all"
        op = {"SUM": "BOR", "MAX": "BOR", "PRODUCT": "BAND", "MIN": "BAND"}.get(op, op)
    kernel, _ = _kernels(out.dtype)
    _launch(kernel, out, stream, _view(out), _view(other), _CODE[op])


def _factor(x: DeviceArray, factor: Union[int, float, complex], func: str) -> Any:
    kind = dtype_kind(x.dtype)
    if kind not in ("float", "half", "complex"):
        raise ValueError(f"{func}: {x.dtype} is not a floating dtype; cast to one first")
    if kind == "complex":
        return np.finfo(x.dtype).dtype.type(complex(factor).real)
    if kind == "half":  # rounded to the array's dtype first, as numpy and torch do
        return np.float32(x.dtype.type(factor))
    return x.dtype.type(factor)


def scale(x: DeviceArray, factor: Union[float, complex], stream: int) -> None:
    """``x *= factor`` in place (PREMUL_SUM's step), queued on ``stream``."""
    if isinstance(factor, complex) and factor.imag:
        raise ValueError("pycoll.gpu.kernels.scale: a complex factor is not supported on device")
    _scale(x, _factor(x, factor, "pycoll.gpu.kernels.scale"), False, stream)


def divide(x: DeviceArray, divisor: Union[int, float], stream: int) -> None:
    """``x /= divisor`` in place (AVG's step), a true division rounded once."""
    value = _factor(x, divisor, "pycoll.gpu.kernels.divide")
    if math.isnan(float(np.real(value))):
        raise ValueError("pycoll.gpu.kernels.divide: the divisor is NaN")
    _scale(x, value, True, stream)


def _scale(x: DeviceArray, value: Any, divide: bool, stream: int) -> None:
    _, kernel = _kernels(x.dtype)
    _launch(kernel, x, stream, _view(x), value, divide)
