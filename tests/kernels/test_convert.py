"""16-bit float conversions, both float16 implementations, against numpy and
ml_dtypes: every float16 bit pattern one way, and float32 values chosen to
round at the ties, overflow, underflow and land on subnormals the other way."""

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from pycoll.kernels import convert

# Any size of job: the kernels reduce within a rank, as MPI's user ops at any size.
pytestmark = pytest.mark.any_size

BF16 = np.dtype(ml_dtypes.bfloat16)


def _vectorize(fn, out_dtype):
    @njit
    def apply(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])

    def run(x):
        out = np.empty(x.size, out_dtype)
        apply(x, out)
        return out

    return run


def _same_bits_or_both_nan(got_bits, want_bits, dtype):
    got, want = got_bits.view(dtype), want_bits.view(dtype)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan])


def _f32_cases():
    """float32 values that exercise every branch of a 16-bit rounding."""
    rng = np.random.default_rng(7)
    halves = np.arange(1 << 16, dtype=np.uint16)
    # Exact 16-bit values, and the midpoints and near-midpoints between
    # neighbours (ties to even both ways), as float32 bit patterns.
    exact = halves.view(np.float16).astype(np.float32)
    finite = exact[np.isfinite(exact)]
    nxt = np.nextafter(finite, np.float32(np.inf), dtype=np.float32)
    bits = finite.view(np.uint32).astype(np.int64)
    mids = []
    for delta in (0x1000 - 1, 0x1000, 0x1000 + 1):  # float16 spacing is 2**13 float32 ulps
        mids.append((bits + delta).astype(np.uint32).view(np.float32))
    random = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            65504,
            65519.99,
            65520,
            65536,
            1e10,
            2**-24,
            2**-25,
            2**-25 * 1.0000001,
            2**-26,
            2**-14,
            2**-14 * (1 - 2**-11),
            1e-45,
        ],
        np.float32,
    )
    return np.concatenate([finite, nxt, *mids, random, specials, -specials])


@pytest.mark.parametrize("impl", ["hw", "soft"])
def test_every_float16_widens_like_numpy(impl):
    widen = _vectorize(getattr(convert, f"f16_to_f32_{impl}"), np.float32)
    halves = np.arange(1 << 16, dtype=np.uint16)
    want = halves.view(np.float16).astype(np.float32)
    got = widen(halves)
    _same_bits_or_both_nan(got.view(np.uint32), want.view(np.uint32), np.float32)


@pytest.mark.parametrize("impl", ["hw", "soft"])
def test_float32_rounds_to_float16_like_numpy(impl):
    narrow = _vectorize(getattr(convert, f"f32_to_f16_{impl}"), np.uint16)
    values = _f32_cases()
    with np.errstate(over="ignore"):
        want = values.astype(np.float16).view(np.uint16)
    _same_bits_or_both_nan(narrow(values), want, np.float16)


def test_every_bfloat16_widens_exactly():
    widen = _vectorize(convert.bf16_to_f32, np.float32)
    bits = np.arange(1 << 16, dtype=np.uint16)
    want = bits.view(BF16).astype(np.float32)
    _same_bits_or_both_nan(widen(bits).view(np.uint32), want.view(np.uint32), np.float32)


def test_float32_rounds_to_bfloat16_like_ml_dtypes():
    narrow = _vectorize(convert.f32_to_bf16, np.uint16)
    values = _f32_cases()
    # bfloat16 ties sit 2**15 float32 ulps apart: add those midpoints too.
    bits = values[np.isfinite(values)].view(np.uint32).astype(np.int64) & ~0xFFFF
    ties = (bits + 0x8000).astype(np.uint32).view(np.float32)
    values = np.concatenate([values, ties])
    with np.errstate(invalid="ignore"):
        want = values.astype(BF16).view(np.uint16)
    _same_bits_or_both_nan(narrow(values), want, BF16)


def test_nan_stays_nan_and_keeps_its_sign():
    narrow16 = _vectorize(convert.f32_to_f16_soft, np.uint16)
    narrow_bf = _vectorize(convert.f32_to_bf16, np.uint16)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    for bits, dtype in ((narrow16(nans), np.float16), (narrow_bf(nans), BF16)):
        assert np.isnan(bits.view(dtype).astype(np.float32)).all()
        np.testing.assert_array_equal(bits >> 15, [0, 1, 0, 1])
