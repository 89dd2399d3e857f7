"""Bit-level conversions between 16-bit floats and float32, for numba kernels.

numba cannot type float16 or ml_dtypes.bfloat16 arrays, so pycoll's kernels
see them as uint16 words and do their arithmetic in float32. float32 has more
than twice the precision of either type plus two bits, so an add, multiply or
divide done in float32 and rounded once back to 16 bits (round to nearest,
ties to even) is the correctly rounded 16-bit result: exactly what numpy and
ml_dtypes compute.

float16 has two implementations. Where the CPU has F16C, LLVM's own
``half`` conversions compile to ``vcvtph2ps``/``vcvtps2ph`` and vectorize. Without
it LLVM would call a compiler-runtime helper (``__extendhfsf2``) that numba's
JIT cannot always resolve, so there the kernels use the portable bit
manipulation below instead. bfloat16 is the top half of a float32 and needs
no hardware help.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = [
    "f16_to_f32_hw",
    "f32_to_f16_hw",
    "f16_to_f32_soft",
    "f32_to_f16_soft",
    "bf16_to_f32",
    "f32_to_bf16",
]


@intrinsic
def _u32_as_f32(typingctx, bits):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _f32_as_u32(typingctx, value):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _half_to_float(typingctx, bits):
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _float_to_half(typingctx, value):
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@njit(inline="always")
def f16_to_f32_hw(h):
    """float16 bits to float32 with the CPU's conversion (F16C)."""
    return _half_to_float(h)


@njit(inline="always")
def f32_to_f16_hw(x):
    """float32 to float16 bits, rounding to nearest even, with F16C."""
    return _float_to_half(x)


# 2**-24, the value of float16's smallest subnormal: a subnormal's mantissa
# times this is its value, exactly, in float32.
_SUBNORMAL_UNIT = np.float32(2.0**-24)
# float32 0.5: adding it to a value below 2**-14 leaves that value's float16
# subnormal mantissa in the low bits, rounded by the FPU (to nearest even).
_DENORM_MAGIC = np.uint32(126 << 23)


@njit(inline="always")
def f16_to_f32_soft(h):
    """float16 bits to float32, in integer arithmetic (no F16C needed)."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    man = h & np.uint32(0x3FF)
    if exp == np.uint32(0x1F):  # inf, nan (payload kept)
        return _u32_as_f32(sign | np.uint32(0x7F800000) | (man << np.uint32(13)))
    if exp == np.uint32(0):  # zero, subnormal
        mag = np.float32(man) * _SUBNORMAL_UNIT
        return -mag if sign else mag
    return _u32_as_f32(sign | ((exp + np.uint32(112)) << np.uint32(23)) | (man << np.uint32(13)))


@njit(inline="always")
def f32_to_f16_soft(x):
    """float32 to float16 bits, rounding to nearest even, in integer arithmetic."""
    bits = _f32_as_u32(x)
    sign = np.uint16((bits >> np.uint32(16)) & np.uint32(0x8000))
    mag = bits & np.uint32(0x7FFFFFFF)
    if mag >= np.uint32(0x47800000):  # 2**16 and above: inf; or nan
        if mag > np.uint32(0x7F800000):
            return sign | np.uint16(0x7E00)
        return sign | np.uint16(0x7C00)
    if mag < np.uint32(0x38800000):  # below float16's smallest normal
        f = _u32_as_f32(mag) + _u32_as_f32(_DENORM_MAGIC)
        return sign | np.uint16(_f32_as_u32(f) - _DENORM_MAGIC)
    odd = (mag >> np.uint32(13)) & np.uint32(1)
    # Re-bias the exponent (127 -> 15) and round: a carry out of the mantissa
    # moves into the exponent, up to infinity for 65520 and above.
    mag = mag - np.uint32(112 << 23) + np.uint32(0xFFF) + odd
    return sign | np.uint16(mag >> np.uint32(13))


@njit(inline="always")
def bf16_to_f32(h):
    """bfloat16 bits to float32 (exact: bfloat16 is float32's top half)."""
    return _u32_as_f32(np.uint32(h) << np.uint32(16))


@intrinsic
def _float_to_bf16(typingctx, value):
    # In LLVM IR rather than Python: numba widens integer arithmetic to 64 bits,
    # which halves the vector width of this loop; here every step stays 32-bit.
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        high = builder.lshr(bits, ir.Constant(i32, 16))
        odd = builder.and_(high, ir.Constant(i32, 1))
        rounded = builder.lshr(
            builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)), odd), ir.Constant(i32, 16)
        )
        quiet = builder.or_(high, ir.Constant(i32, 0x40))
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))

    return types.uint16(types.float32), codegen


@njit(inline="always")
def f32_to_bf16(x):
    """float32 to bfloat16 bits, rounding to nearest even; nan stays a quiet nan."""
    return _float_to_bf16(x)
