"""pycoll.kernels: compiled elementwise reductions for what MPI lacks.

MPI reduces only the types it knows, and float16/bfloat16 are not among
them; numpy adds float16 at about 1 GB/s. These numba kernels view 16-bit
floats as uint16 words and compute in float32 (with F16C where the CPU has
it), so every supported dtype reduces at memory speed, bit-exact with numpy
and ml_dtypes. pycoll registers them with MPI_Op_create (see
:mod:`pycoll.kernels.mpiop`) so MPI's own algorithms do the communication.

Public functions:

- :func:`reduce` reduces one array into another, locally.
- :func:`scale` and :func:`divide` are PREMUL_SUM's and AVG's elementwise steps.
- :func:`mpi_op` gives the MPI op pycoll uses for a (ReduceOp, dtype) pair.
- :func:`warmup` compiles (or loads from numba's disk cache) ahead of time, so
  the first training step does not pay for compilation.

numba is imported on first use, not by ``import pycoll.kernels``.

Settings: ``PYCOLL_NUM_THREADS`` (threads per rank for large local work;
default cores / ranks on the node) and ``PYCOLL_F16C=0|1`` (force the
portable or the F16C float16 conversion; default: what the CPU has).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import numpy as np

from ..arrays import (
    BFLOAT16,
    SUPPORTED_DTYPES,
    check_contiguous,
    check_dtype,
    check_output,
    dtype_kind,
)
from ..reduceop import ReduceOp, check_pair
from . import threads

__all__ = [
    "reduce", "folder", "scale", "divide", "divides", "mpi_op", "warmup", "f16c", "num_threads",
]  # fmt: skip

_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
_F16C: Optional[bool] = None


def f16c() -> bool:
    """Whether float16 kernels use the CPU's F16C conversions (else the portable
    integer code). ``PYCOLL_F16C=0|1`` overrides the detection."""
    global _F16C
    if _F16C is None:
        forced = os.environ.get("PYCOLL_F16C", "").strip()
        if forced in ("0", "1"):
            _F16C = forced == "1"
        elif forced:
            raise ValueError(f"PYCOLL_F16C={forced!r}: set it to 0 or 1, or leave it unset")
        else:
            _F16C = _cpu_has_f16c()
    return _F16C


def _cpu_has_f16c() -> bool:
    # numba compiles for NUMBA_CPU_NAME / NUMBA_CPU_FEATURES when set (e.g. for a
    # portable cache); the conversion must exist on that target, not just here.
    features = os.environ.get("NUMBA_CPU_FEATURES")
    if features is not None:
        return "+f16c" in features.split(",")
    if os.environ.get("NUMBA_CPU_NAME", "host") != "host":
        return False
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get("f16c", False))


def num_threads() -> int:
    """Threads this rank's parallel kernels use (see pycoll.kernels.threads)."""
    return threads.count()


def divides(dtype: np.dtype) -> bool:
    """Whether :func:`reduce`'s ``divide_by`` applies to ``dtype`` (real
    floats and the half types): where an AVG can divide in its last sum, as
    pycoll's ring and shared window do."""
    return dtype_kind(dtype) in ("float", "half")


def _storage(dtype: np.dtype) -> str:
    if dtype == BFLOAT16:
        return "bfloat16"
    return dtype.name


def _words(x: np.ndarray) -> np.ndarray:
    """The 1-d view a kernel takes: uint16 words for the half types."""
    flat = x.reshape(-1)
    return flat.view(np.uint16) if dtype_kind(x.dtype) == "half" else flat


def _op_name(op: Any, func: str) -> str:
    if isinstance(op, str):
        if op.upper() == "PREMUL_SUM":
            return "PREMUL_SUM"
        op = ReduceOp(op)
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{func}: op must be a pycoll.ReduceOp or its name, got {op!r}")
    return op.name


def _check_pair(name: str, dtype: np.dtype, func: str) -> None:
    """reduceop.check_pair, and AVG/PREMUL_SUM refused: a kernel reduces pairwise,
    and their division or scaling is a separate step."""
    if name in ("AVG", "PREMUL_SUM"):
        raise ValueError(
            f"{func}: ReduceOp.{name} is a SUM plus a division or a scaling; reduce with "
            f"ReduceOp.SUM and use pycoll.kernels.divide or scale"
        )
    check_pair(name, dtype, func)


def reduce(
    op: Any, src: np.ndarray, dst: np.ndarray, divide_by: Optional[Union[int, float]] = None
) -> None:
    """``dst = op(src, dst)`` elementwise, in place, as MPI's reduction step does.

    Args:
        op: a ReduceOp (or its name): SUM, PRODUCT, MIN, MAX, BAND, BOR or BXOR.
            MIN/MAX propagate NaN as numpy.minimum/maximum do; on bool, SUM and
            MAX are "any", PRODUCT and MIN "all", as in torch.
        src, dst: C-contiguous arrays of one supported dtype and one shape.
        divide_by: SUM of floating arrays only: ``dst = (src + dst) / divide_by``,
            the sum rounded to the dtype first, in one pass (an AVG's last
            combine: what SUM, then :func:`divide`, gives).
    """
    func = "pycoll.kernels.reduce"
    name = _op_name(op, func)
    check_contiguous(func, "src", src)
    check_output(func, "dst", dst)
    if src.dtype != dst.dtype or src.shape != dst.shape:
        raise ValueError(
            f"{func}: src and dst must have one dtype and shape, got {src.dtype}{src.shape} "
            f"and {dst.dtype}{dst.shape}"
        )
    folder(name, dst.dtype, divide_by)(src, dst)


_FOLDERS: Dict[Tuple[Any, Any, Any], Callable[[np.ndarray, np.ndarray], None]] = {}


def folder(
    op: Any, dtype: Any, divide_by: Optional[Union[int, float]] = None
) -> Callable[[np.ndarray, np.ndarray], None]:
    """:func:`reduce` for one op, dtype and ``divide_by``, with their checks
    made once: ``fold(src, dst)`` on arrays the caller has checked (both
    C-contiguous, of ``dtype`` and one shape, ``dst`` writeable).

    For paths that fold small arrays on every call (pycoll.collectives.
    doubling): each fold goes straight to the compiled kernel, serial below
    threads.PARALLEL_BYTES, where :func:`reduce`'s checks and lookups cost
    several microseconds a call.
    """
    key = (op, dtype, divide_by)  # (as the caller names them)
    try:
        made = _FOLDERS.get(key)
        hashable = True
    except TypeError:  # (something unhashable: refused below)
        made, hashable = None, False
    if made is not None:
        return made
    func = "pycoll.kernels.reduce"
    name = _op_name(op, func)
    _check_pair(name, np.dtype(dtype), func)
    made = _fold(name, np.dtype(dtype), divide_by)
    if hashable:
        _FOLDERS[key] = made
    return made


def _fold(
    name: str, dtype: np.dtype, divide_by: Optional[Union[int, float]]
) -> Callable[[np.ndarray, np.ndarray], None]:
    """:func:`folder`'s function, made."""
    func = "pycoll.kernels.reduce"
    from .elementwise import mean_of_two_kernel, reduce_kernel, sum_divide_kernel

    storage, hw = _storage(dtype), f16c()
    extra: Tuple[Any, ...] = ()
    build: Callable[[bool], Callable]
    if divide_by is None:
        build = lambda p: reduce_kernel(name, storage, hw, p)  # noqa: E731
    elif name != "SUM" or not divides(dtype):
        raise ValueError(
            f"{func}: divide_by applies to SUM of real floating arrays, got "
            f"ReduceOp.{name} on {dtype}"
        )
    elif (divisor := _factor(divide_by, dtype, func)) == 2:
        # Two ranks: the mean of two rounds once, not twice, to the same result
        # (elementwise._mean_of_two), 20-30% faster for the 16-bit types.
        build = lambda p: mean_of_two_kernel(storage, hw, p)  # noqa: E731
    else:
        build = lambda p: sum_divide_kernel(storage, hw, p)  # noqa: E731
        extra = (divisor,)
    serial = build(False)
    words = np.uint16 if dtype_kind(dtype) == "half" else dtype

    def fold(src: np.ndarray, dst: np.ndarray) -> None:
        a, b = src.reshape(-1).view(words), dst.reshape(-1).view(words)
        if b.nbytes < threads.PARALLEL_BYTES:
            serial(a, b, *extra)
        else:
            threads.run(build, b.nbytes, a, b, *extra)

    return fold


def _factor(value: Any, dtype: np.dtype, func: str) -> Any:
    """A scale or divisor, rounded to ``dtype`` first (as numpy and torch do)
    and given in the kernel's arithmetic type."""
    kind = dtype_kind(dtype)
    if kind in ("int", "bool"):
        raise ValueError(
            f"{func}: dtype {dtype} would have to round to an integer; cast to a floating dtype"
        )
    if isinstance(value, complex) and kind != "complex":
        raise ValueError(f"{func}: a complex factor ({value}) cannot scale dtype {dtype}")
    if kind == "half":
        return np.float32(dtype.type(value))
    return dtype.type(value)


def _elementwise(
    func: str, which: Any, x: np.ndarray, value: Any, out: Optional[np.ndarray]
) -> np.ndarray:
    check_contiguous(func, "x", x)
    if out is None:
        out = np.empty_like(x)
    check_output(func, "out", out)
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ValueError(f"{func}: out must have x's dtype and shape, {x.dtype}{x.shape}")
    factor = _factor(value, x.dtype, func)
    src, dst, dtype = _words(x), _words(out), x.dtype
    if dtype_kind(dtype) == "complex" and factor.imag == 0:
        # A real factor applies to each component: one rounding each, and no
        # inf * 0 = nan from a zero imaginary part.
        dtype = np.dtype(f"f{dtype.itemsize // 2}")
        src, dst, factor = src.view(dtype), dst.view(dtype), dtype.type(factor.real)
    storage, hw = _storage(dtype), f16c()
    if out is x:
        threads.run(lambda p: which(storage, hw, p, True), x.nbytes, src, factor)
    else:
        threads.run(lambda p: which(storage, hw, p), x.nbytes, src, factor, dst)
    return out


def scale(
    x: np.ndarray, factor: Union[float, complex], out: Optional[np.ndarray] = None
) -> np.ndarray:
    """``out = x * factor`` for floating and complex arrays (PREMUL_SUM's step).

    The factor is first rounded to ``x``'s dtype, as numpy and torch do.
    ``out`` may be ``x`` itself; a new array is returned when it is None.
    """
    from .elementwise import scale_kernel

    return _elementwise("pycoll.kernels.scale", scale_kernel, x, factor, out)


def divide(
    x: np.ndarray, divisor: Union[int, float], out: Optional[np.ndarray] = None
) -> np.ndarray:
    """``out = x / divisor`` (AVG's last step), a true division rounded once."""
    from .elementwise import divide_kernel

    return _elementwise("pycoll.kernels.divide", divide_kernel, x, divisor, out)


def copy_pieces(targets: np.ndarray, sources: np.ndarray, sizes: np.ndarray, nbytes: int) -> None:
    """Copy ``sizes[k]`` bytes from address ``sources[k]`` to address
    ``targets[k]`` for every k (int64 arrays), in one compiled call: in
    parallel over the pieces where the rank has threads to spare and the
    ``nbytes`` in all are many (pycoll.kernels.threads)."""
    from . import pack

    threads.run(pack.copy_kernel, nbytes, targets, sources, sizes)


def mpi_op(op: Any, dtype: Any) -> Any:
    """The MPI user op (``mpi4py.MPI.Op``) running pycoll's kernel for ``op`` on
    ``dtype``; AVG and PREMUL_SUM reduce as SUM (their extra steps run around
    the MPI call). Created once per process; freed by destroy_process_group."""
    from . import mpiop

    func = "pycoll.kernels.mpi_op"
    name = _op_name(op, func)
    dtype = np.dtype(dtype)
    check_dtype(func, "dtype", dtype)
    if name in ("AVG", "PREMUL_SUM"):
        name = "SUM"
    _check_pair(name, dtype, func)
    return mpiop.user_op(name, dtype, _storage(dtype), f16c())


def mean_of_two_op(dtype: Any) -> Any:
    """The MPI user op that averages two contributions (``(a + b) / 2``, the sum
    rounded first): AVG in one MPI call on a group of exactly two ranks, where
    every element is combined exactly once whatever algorithm MPI picks."""
    from . import mpiop

    dtype = np.dtype(dtype)
    if dtype_kind(dtype) not in ("float", "half"):
        raise ValueError(f"pycoll.kernels.mean_of_two_op: dtype {dtype} is not a real float")
    return mpiop.user_op("MEAN2", dtype, _storage(dtype), f16c())


def warmup(
    dtypes: Optional[Iterable[Any]] = None, ops: Optional[Iterable[Any]] = None, mpi: bool = True
) -> float:
    """Compile (or load from numba's disk cache) the kernels for ``dtypes`` x
    ``ops`` now, rather than inside the first collective that needs them.

    Args:
        dtypes: default: every supported dtype.
        ops: default: every op defined for each dtype.
        mpi: also build the MPI user ops (requires init_process_group first).

    Returns:
        The seconds it took (near zero once the disk cache is warm).
    """
    t0 = time.perf_counter()
    chosen = [np.dtype(d) for d in (dtypes if dtypes is not None else SUPPORTED_DTYPES)]
    names = None if ops is None else [_op_name(o, "pycoll.kernels.warmup") for o in ops]
    for dtype in chosen:
        check_dtype("pycoll.kernels.warmup", "dtypes", dtype)
        x = np.ones(4, dtype)
        for name in names or _OPS:
            try:
                _check_pair(name, dtype, "warmup")
            except ValueError:
                if names is not None:
                    raise
                continue
            reduce(name, x, x.copy())
            if mpi:
                mpi_op(name, dtype)
        if dtype_kind(dtype) not in ("int", "bool"):
            scale(x, 1.0)
            divide(x, 1)
    return time.perf_counter() - t0
