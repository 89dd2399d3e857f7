"""The elementwise kernels: reduce one array into another, scale, divide.

One numba kernel per (operation, storage): storage is a native numpy dtype,
or "float16"/"bfloat16" (uint16 words converted through float32, see
pycoll.kernels.convert). The same Python loop compiles twice: serial, for use
inside MPI's reduction (MPI hands it a chunk at a time, on whatever thread is
in the MPI call) and parallel (numba prange) for large local work. Compiled
code is cached on disk (numba's cache=True), so a process pays for
compilation once per machine, not once per run.
"""

from __future__ import annotations

import hashlib
import types as pytypes
from typing import Any, Callable, Dict, Tuple

import numpy as np
from numba import njit, prange

from . import convert

__all__ = [
    "combine_fn",
    "load_store",
    "reduce_kernel",
    "mean_of_two_kernel",
    "sum_divide_kernel",
    "scale_kernel",
    "divide_kernel",
]

HALF = ("float16", "bfloat16")

# --- how one pair of elements combines, per op ---------------------------


@njit(inline="always")
def _sum(x, y):
    return x + y


@njit(inline="always")
def _prod(x, y):
    return x * y


@njit(inline="always")
def _min(x, y):
    # numpy.minimum: a nan on either side wins.
    return x if (x < y or x != x) else y


@njit(inline="always")
def _max(x, y):
    return x if (x > y or x != x) else y


@njit(inline="always")
def _band(x, y):
    return x & y


@njit(inline="always")
def _bor(x, y):
    return x | y


@njit(inline="always")
def _bxor(x, y):
    return x ^ y


_COMBINE = {
    "SUM": _sum,
    "PRODUCT": _prod,
    "MIN": _min,
    "MAX": _max,
    "BAND": _band,
    "BOR": _bor,
    "BXOR": _bxor,
}
# bool follows torch: SUM and MAX are "any", PRODUCT and MIN are "all".
_BOOL = {"SUM": _bor, "MAX": _bor, "PRODUCT": _band, "MIN": _band}


@njit(inline="always")
def _same(x):
    return x


def combine_fn(op: str, storage: str) -> Any:
    """The jitted ``f(x, y)`` for ``op`` on elements of ``storage``."""
    if storage == "bool":
        return _BOOL.get(op, _COMBINE[op])
    return _COMBINE[op]


def load_store(storage: str, f16c: bool) -> Tuple[Any, Any]:
    """The jitted (load, store) pair: element to arithmetic type and back."""
    if storage == "float16":
        if f16c:
            return convert.f16_to_f32_hw, convert.f32_to_f16_hw
        return convert.f16_to_f32_soft, convert.f32_to_f16_soft
    if storage == "bfloat16":
        return convert.bf16_to_f32, convert.f32_to_bf16
    return _same, _same


# --- the kernels ------------------------------------------------------------
#
# Each kernel is a template below, compiled once per variant with its own
# globals (``load``, ``combine``, ``store``) and a qualified name that spells
# the variant out: numba keys its disk cache on that name, and a closure over
# jitted functions would give a key that changes every run. The salt (a hash
# of this file and convert.py) retires cached code when either changes,
# which numba alone would notice only for this file.

load = store = _same
combine = _sum


def _reduce(a, b):
    for i in prange(a.size):
        b[i] = store(combine(load(a[i]), load(b[i])))


def _scale(x, s, out):
    for i in prange(x.size):
        out[i] = store(load(x[i]) * s)


def _divide(x, d, out):
    for i in prange(x.size):
        out[i] = store(load(x[i]) / d)


ONE_HALF = np.float32(0.5)


# Where the sum rounds to infinity in the storage type: float16's 65520
# (65504 plus half a step, a tie rounded up to the even infinity) and
# bfloat16's float32 equivalent (bits 0x7F7F8000); never, for the others.
OVERFLOW = {
    "float16": np.float32(65520.0),
    "bfloat16": np.uint32(0x7F7F8000).view(np.float32),
    "native": np.float32(np.inf),
}
overflow = OVERFLOW["native"]


def _mean_of_two(a, b):
    # AVG over exactly two contributions, as SUM-then-divide gives it: the sum
    # rounded to the storage type, then halved. One rounding does the same:
    # halving is exact in float32 and commutes with rounding wherever the
    # half stays normal, and a sum small enough for its half not to (below
    # float16's 2**-13, bfloat16's 2**-125) is a multiple of the smallest
    # subnormal that the storage type holds exactly. The exception is a sum
    # that rounds to infinity when its half would not: kept whole, it does.
    # (A second rounding cost as much as the sum here.)
    for i in prange(a.size):
        x = load(a[i]) + load(b[i])
        b[i] = store(x if abs(x) >= overflow else x * ONE_HALF)


def _sum_divide(a, b, d):
    # The last step of an AVG whose other steps were SUMs: the sum rounded to
    # the storage type, then divided, as SUM and then a division would give.
    for i in prange(a.size):
        b[i] = store(load(store(load(a[i]) + load(b[i]))) / d)


# In place, the same loops over one array: given x twice, LLVM cannot rule out
# overlap and falls back to scalar code (4x slower here).


def _scale_inplace(x, s):
    for i in prange(x.size):
        x[i] = store(load(x[i]) * s)


def _divide_inplace(x, d):
    for i in prange(x.size):
        x[i] = store(load(x[i]) / d)


def _salt() -> str:
    digest = hashlib.sha1()
    for module in (__file__, convert.__file__):
        with open(module, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:10]


_SALT = _salt()
_CACHE: Dict[tuple, Callable] = {}


def _variant(template: Callable, parallel: bool, name: str, **bindings: Any) -> Callable:
    key = (name, parallel)
    kernel = _CACHE.get(key)
    if kernel is None:
        scope = dict(template.__globals__)
        scope.update(bindings)
        fn = pytypes.FunctionType(template.__code__, scope, template.__name__)
        fn.__qualname__ = f"{name}_{'parallel' if parallel else 'serial'}_{_SALT}"
        kernel = _CACHE[key] = njit(parallel=parallel, cache=True, nogil=True, error_model="numpy")(
            fn
        )
    return kernel


def storage_tag(storage: str, f16c: bool) -> str:
    """The storage's part of a variant's name: float16's two conversions differ."""
    if storage == "float16":
        return f"{storage}_{'f16c' if f16c else 'soft'}"
    return storage


def _name(what: str, storage: str, f16c: bool) -> str:
    """A variant's name: numeric dtypes share one kernel, which numba compiles
    per dtype; the half types and bool (logical ops) have their own."""
    kind = storage if storage in HALF or storage == "bool" else "native"
    return f"{what}_{storage_tag(kind, f16c)}"


def _build(
    what: str, template: Callable, storage: str, f16c: bool, parallel: bool, **bindings: Any
) -> Callable:
    ld, st = load_store(storage, f16c)
    name = _name(what, storage, f16c)
    return _variant(template, parallel, name, load=ld, store=st, **bindings)


def reduce_kernel(op: str, storage: str, f16c: bool, parallel: bool) -> Callable:
    """``k(a, b)``: ``b[i] = op(a[i], b[i])`` for 1-d arrays of equal length.

    This is MPI's user-function contract (invec, inoutvec); the half types are
    passed as their uint16 views. bool has kernels of its own (its ops are
    logical).
    """
    combine = combine_fn(op, storage)
    return _build(f"reduce_{op}", _reduce, storage, f16c, parallel, combine=combine)


def mean_of_two_kernel(storage: str, f16c: bool, parallel: bool) -> Callable:
    """``k(a, b)``: ``b[i] = (a[i] + b[i]) / 2`` with the sum rounded to the
    storage type first; AVG on a group of two ranks, as one MPI user op."""
    limit = OVERFLOW.get(storage, OVERFLOW["native"])
    return _build("mean2", _mean_of_two, storage, f16c, parallel, overflow=limit)


def sum_divide_kernel(storage: str, f16c: bool, parallel: bool) -> Callable:
    """``k(a, b, d)``: ``b[i] = (a[i] + b[i]) / d`` with the sum rounded to the
    storage type first (``d`` in the arithmetic type); an AVG's last combine."""
    return _build("sum_divide", _sum_divide, storage, f16c, parallel)


def scale_kernel(storage: str, f16c: bool, parallel: bool, inplace: bool = False) -> Callable:
    """``k(x, s, out)``: ``out[i] = x[i] * s``, rounded once to the storage type
    (``k(x, s)`` in place).

    ``s`` comes in the arithmetic type (float32 for the half types, already
    rounded to the array's dtype, which is how numpy and torch scale them).
    """
    if inplace:
        return _build("scale_inplace", _scale_inplace, storage, f16c, parallel)
    return _build("scale", _scale, storage, f16c, parallel)


def divide_kernel(storage: str, f16c: bool, parallel: bool, inplace: bool = False) -> Callable:
    """``k(x, d, out)``: ``out[i] = x[i] / d`` (``k(x, d)`` in place); AVG's last
    step, a true division rather than a multiplication by 1/d, so results match
    numpy's and torch's."""
    if inplace:
        return _build("divide_inplace", _divide_inplace, storage, f16c, parallel)
    return _build("divide", _divide, storage, f16c, parallel)
