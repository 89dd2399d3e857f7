"""Device kernels, bit-exact against numpy/ml_dtypes on the same inputs.

Without a GPU they run in numba's CUDA simulator on host-backed fake arrays;
with PYCOLL_TEST_GPU=1 on a GPU machine, the same checks run the compiled
kernels on cupy arrays."""

import importlib.util
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from fakes import FakeDLPack

from pycoll.gpu import kernels, runtime
from pycoll.gpu.device import adapt
from support import REQUIRE_GPU, ufunc

# One process's code (no MPI): the plain pass runs it once.
pytestmark = pytest.mark.one_process

BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = [np.dtype(np.float16), BF16]
FLOATS = HALVES + [np.dtype(np.float32), np.dtype(np.float64)]


@pytest.fixture
def on_device():
    """Returns (to_device, to_host) for the kernels' arrays."""
    if runtime.simulated():
        runtime.reset()
        return (lambda a: adapt(FakeDLPack(a), "t", "x")), (lambda d: d.obj.host)
    cupy = pytest.importorskip("cupy")
    if not REQUIRE_GPU:
        pytest.skip("real-GPU kernel test: set PYCOLL_TEST_GPU=1 on a GPU machine")

    def up(a):
        if a.dtype == BF16:
            raw = cupy.asarray(a.view(np.uint16))
            d = adapt(raw, "t", "x")
            d.dtype = BF16
            return d
        return adapt(cupy.asarray(a), "t", "x")

    def down(d):
        host = cupy.asnumpy(d.obj)
        return host.view(BF16) if d.dtype == BF16 else host

    return up, down


def nasty(dtype, n=None, seed=0):
    """Random values plus infinities, NaN, signed zeros, subnormals and ties."""
    rng = np.random.default_rng(seed)
    n = n or (1024 if runtime.simulated() else 1 << 20)  # the simulator runs Python
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    if dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        if info is None:
            return rng.integers(0, 2, n).astype(bool)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dtype)
    if dtype in HALVES:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        return bits.view(dtype)  # every class of value, NaN and subnormals included
    x = rng.standard_normal(n).astype(dtype) * dtype.type(1e3)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, np.finfo(dtype).tiny / 4], dtype)
    x[: special.size] = special
    return x


def same(actual, expected):
    a = actual.astype(np.float64) if actual.dtype == BF16 else actual
    e = expected.astype(np.float64) if expected.dtype == BF16 else expected
    if a.dtype.kind in "fc":
        both_nan = np.isnan(a) & np.isnan(e)
        assert np.array_equal(a[~both_nan], e[~both_nan]), np.flatnonzero(a != e)[:5]
        assert np.array_equal(np.isnan(a), np.isnan(e))
        if a.dtype.kind == "f":  # signed zeros too
            assert np.array_equal(np.signbit(a[~both_nan]), np.signbit(e[~both_nan]))
    else:
        assert np.array_equal(a, e)


CASES = [(op, dt) for dt in FLOATS for op in ("SUM", "PRODUCT", "MIN", "MAX")]
CASES += [(op, np.dtype(dt)) for dt in (np.int32, np.uint8, np.int64) for op in kernels.OPS]
CASES += [(op, np.dtype(np.bool_)) for op in ("SUM", "PRODUCT", "MIN", "MAX", "BXOR")]
CASES += [(op, np.dtype(dt)) for dt in (np.complex64, np.complex128) for op in ("SUM", "PRODUCT")]


# The inputs hold inf, nan and values that overflow, on purpose; the CUDA
# simulator runs each kernel's threads in Python threads, outside a test's
# np.errstate, so numpy's warnings of them are filtered instead.
NASTY = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@NASTY
@pytest.mark.parametrize("op,dtype", CASES, ids=str)
def test_combine_is_bit_exact(op, dtype, on_device):
    up, down = on_device
    a, b = nasty(dtype, seed=1), nasty(dtype, seed=2)
    with np.errstate(all="ignore"):
        if dtype in HALVES:  # numpy/ml_dtypes: computed in float32, rounded once
            want = ufunc(op, dtype)(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
        elif op == "PRODUCT" and dtype.kind == "c":
            # The textbook product. Compilers may fuse its multiply-adds (numpy's
            # SIMD loop and NVVM both do), which changes the last bit: complex
            # products are compared to within 2 units in the last place.
            want = np.empty_like(a)
            want.real = a.real * b.real - a.imag * b.imag
            want.imag = a.real * b.imag + a.imag * b.real
            out = up(a.copy())
            kernels.combine(out, up(b), op, runtime.get().current_stream())
            runtime.get().synchronize(runtime.get().current_stream())
            eps = np.finfo(dtype).eps
            got = down(out)
            for part in ("real", "imag"):
                g, w = getattr(got, part), getattr(want, part)
                np.testing.assert_allclose(g, w, rtol=2 * eps, atol=4 * eps)
            return
        else:
            want = ufunc(op, dtype)(a, b).astype(dtype)
    out = up(a.copy())
    kernels.combine(out, up(b), op, runtime.get().current_stream())
    runtime.get().synchronize(runtime.get().current_stream())
    same(down(out), want)


@NASTY
def test_half_rounding_ties_go_to_even(on_device):
    up, down = on_device
    # 1 + 2**-11 lies halfway between float16's 1 and 1 + 2**-10: even is 1.
    a = np.array([1.0, 1.0 + 2**-10, 2048.0, 65504.0], np.float16)
    b = np.array([2**-11, 2**-11, 1.0, 16.0], np.float16)
    out = up(a.copy())
    kernels.combine(out, up(b), "SUM", 1)
    runtime.get().synchronize(1)
    same(down(out), (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16))
    assert down(out)[0] == 1.0 and down(out)[3] == np.inf


@NASTY
@pytest.mark.parametrize("dtype", FLOATS + [np.dtype(np.complex64)], ids=str)
def test_scale_and_divide(dtype, on_device):
    up, down = on_device
    x = nasty(dtype, seed=3)
    for step, factor in (("scale", 0.3), ("divide", 3)):
        d = up(x.copy())
        getattr(kernels, step)(d, factor, 1)
        runtime.get().synchronize(1)
        with np.errstate(all="ignore"):
            if dtype in HALVES:
                f = np.float32(dtype.type(factor))
                wide = x.astype(np.float32)
                want = (wide * f if step == "scale" else wide / f).astype(dtype)
            elif dtype.kind == "c":
                f = np.finfo(dtype).dtype.type(factor)
                parts = (x.real * f, x.imag * f) if step == "scale" else (x.real / f, x.imag / f)
                want = (parts[0] + 1j * parts[1]).astype(dtype)
                want.real, want.imag = parts
            else:
                f = dtype.type(factor)
                want = x * f if step == "scale" else x / f
        same(down(d), want)


def test_integer_division_is_refused(on_device):
    up, _ = on_device
    with pytest.raises(ValueError, match="int32 is not a floating dtype"):
        kernels.divide(up(np.arange(4, dtype=np.int32)), 2, 1)


NUMPY_2_5 = """
import importlib.util
import numpy as np
if hasattr(np, "row_stack"):
    del np.row_stack  # as numpy 2.5 has it
{before}
import numba.cuda
if importlib.util.find_spec("numba.cuda.np") is None:
    print("no numba.cuda.np")  # a numba-cuda that keeps its numpy support elsewhere
else:
    import numba.cuda.np.arrayobj  # numba-cuda's numpy support
    x = np.row_stack((np.ones(2), np.zeros(2)))
    assert x.shape == (2, 2) and x[0, 0] == 1 and x[1, 0] == 0
    print("loaded")
"""


def test_numba_cuda_loads_where_numpy_has_no_row_stack():
    """numba-cuda 0.30.4 overloads numpy.row_stack, which numpy 2.5 removed:
    without pycoll's alias its numpy support fails to import (on an H100 52 of
    53 device-kernel tests failed so). With the alias numba.cuda loads under
    such a numpy whatever its version; without it, the one failure seen is
    that defect. Runs where
    numba-cuda is installed (with cuda-bindings, cuda-core); it needs no GPU
    to import."""
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed (a GPU machine's image has it)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    fixed = subprocess.run(
        [sys.executable, "-c", NUMPY_2_5.format(before=ALIAS)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert fixed.stdout.strip() in ("loaded", "no numba.cuda.np"), fixed.stderr
    if fixed.stdout.strip() == "loaded":
        bare = subprocess.run(
            [sys.executable, "-c", NUMPY_2_5.format(before="")],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        if bare.returncode != 0:  # (a numba-cuda that overloads row_stack: 0.30.4)
            assert "has no attribute 'row_stack'" in bare.stderr, bare.stderr  # the defect


ALIAS = "from pycoll.gpu.kernels import numpy_for_numba_cuda; numpy_for_numba_cuda()"


def test_the_row_stack_alias_stacks_rows_and_leaves_vstack_alone(monkeypatch):
    import numpy as np

    from pycoll.gpu.kernels import numpy_for_numba_cuda

    vstack = np.vstack
    monkeypatch.delattr(np, "row_stack", raising=False)
    numpy_for_numba_cuda()
    out = np.row_stack((np.arange(3), np.arange(3) * 2), dtype=np.float32)
    assert out.dtype == np.float32 and out.tolist() == [[0, 1, 2], [0, 2, 4]]
    assert np.row_stack is not vstack and np.vstack is vstack
    alias = np.row_stack
    numpy_for_numba_cuda()  # where the name exists, it is left as it is
    assert np.row_stack is alias
