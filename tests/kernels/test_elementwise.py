"""pycoll.kernels.reduce / scale / divide against numpy and ml_dtypes, bit for
bit, on every supported dtype and op, random bit patterns included (so
infinities, NaN, subnormals and ties all occur); both float16 paths, and the
parallel build, are run explicitly."""

import ml_dtypes
import numpy as np
import pytest

from pycoll import ReduceOp, kernels
from pycoll.kernels import elementwise, threads
from support import ALL_DTYPES, BF16, COMPLEX, INTS, dtype_class, ufunc

# Any size of job: the kernels reduce within a rank, as MPI's user ops at any size.
pytestmark = pytest.mark.any_size

BITWISE_TOO = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
OPS = {
    "bool": BITWISE_TOO,
    "int": BITWISE_TOO,
    "float": ["SUM", "PRODUCT", "MIN", "MAX"],
    "complex": ["SUM", "PRODUCT"],
}


def random_array(dtype, n=5003, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if dtype in INTS:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    if dtype.itemsize == 2:  # float16, bfloat16: every bit pattern is fair game
        return rng.integers(0, 1 << 16, n, dtype=np.uint16).view(dtype)
    if dtype in COMPLEX:
        parts = rng.standard_normal(2 * n) * 10.0 ** rng.integers(-30, 30, 2 * n)
        with np.errstate(over="ignore"):  # some overflow to inf, on purpose
            x = parts.astype(np.float64 if dtype.itemsize == 16 else np.float32).view(dtype)
    else:
        with np.errstate(over="ignore"):
            x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 40, n)).astype(dtype)
    x[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, np.finfo(dtype).tiny / 4]
    return x


def expected(op, a, b):
    """numpy's answer for ``op(a, b)``; complex products by the textbook formula."""
    dtype = a.dtype
    if dtype in COMPLEX and op == "PRODUCT":
        # numpy's SIMD loops fuse multiply-adds (so its array and scalar
        # products differ in the last bit); pycoll, MPI and Python use
        # (ac - bd) + (ad + bc)i, computed here in separate ufunc calls.
        with np.errstate(all="ignore"):
            re = a.real * b.real - a.imag * b.imag
            im = a.real * b.imag + a.imag * b.real
        out = np.empty_like(a)
        out.real, out.imag = re, im
        return out
    with np.errstate(all="ignore"):
        return ufunc(op, dtype)(a, b).astype(dtype)


def assert_bits_equal(got, want):
    """Equal bit patterns, except that any NaN matches any NaN (payloads are
    not specified by numpy, torch or MPI)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind not in "fcV":
        np.testing.assert_array_equal(got, want)
        return
    if got.dtype.kind == "c":  # compare the two float components
        part = np.dtype(f"f{got.dtype.itemsize // 2}")
        got, want = got.view(part), want.view(part)
    with np.errstate(invalid="ignore"):
        nan = np.isnan(want.astype(np.float64))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    words = f"u{got.dtype.itemsize}"
    bad = np.nonzero(got.view(words)[~nan] != want.view(words)[~nan])[0]
    assert bad.size == 0, f"{bad.size} differ, e.g. {got[~nan][bad[:3]]} vs {want[~nan][bad[:3]]}"


def cases():
    for dtype in ALL_DTYPES:
        for op in OPS[dtype_class(dtype)]:
            yield op, dtype


@pytest.mark.parametrize("op,dtype", list(cases()), ids=str)
def test_reduce_matches_numpy(op, dtype):
    a, b = random_array(dtype, seed=1), random_array(dtype, seed=2)
    want = expected(op, a, b)
    got = b.copy()
    kernels.reduce(op, a, got)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("f16c", [True, False], ids=["f16c", "portable"])
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
def test_both_half_paths_match_numpy(op, dtype, f16c):
    """The portable float16 path is built and checked even on a CPU with F16C."""
    a, b = random_array(dtype, 20011, seed=3), random_array(dtype, 20011, seed=4)
    want = expected(op, a, b)
    got = b.copy()
    kernel = elementwise.reduce_kernel(op, "bfloat16" if dtype == BF16 else "float16", f16c, False)
    kernel(a.view(np.uint16), got.view(np.uint16))
    assert_bits_equal(got, want)


def test_ties_round_to_even():
    """1 + 2**-11 lies exactly between float16 1 and its successor: it must
    round to the even one (1.0); 1 + 3 * 2**-11 rounds up to the even 1 + 2**-9."""
    one = np.ones(4, np.float16)
    tie = np.full(4, 2.0**-11, np.float16)
    kernels.reduce("SUM", tie, one)
    np.testing.assert_array_equal(one, np.ones(4, np.float16))
    x = np.full(4, 1 + 2.0**-10, np.float16)
    kernels.reduce("SUM", tie, x)
    np.testing.assert_array_equal(x, np.full(4, 1 + 2.0**-9, np.float16))


@pytest.mark.parametrize("dtype", ["float16", BF16, "float32", "float64", "complex64"], ids=str)
def test_scale_and_divide_match_numpy(dtype):
    dtype = np.dtype(dtype)
    x = random_array(dtype, seed=5)
    with np.errstate(all="ignore"):
        for factor in (0.1, 3.0, -2.5):
            want = (x * dtype.type(factor)).astype(dtype)
            if dtype in COMPLEX:  # a real factor scales each component
                want = (
                    (x.view(f"f{dtype.itemsize // 2}") * factor)
                    .astype(f"f{dtype.itemsize // 2}")
                    .view(dtype)
                )
            assert_bits_equal(kernels.scale(x, factor), want)
        for n in (2, 3, 7):
            want = (x / dtype.type(n)).astype(dtype)
            if dtype in COMPLEX:
                want = (
                    (x.view(f"f{dtype.itemsize // 2}") / n)
                    .astype(f"f{dtype.itemsize // 2}")
                    .view(dtype)
                )
            out = x.copy()
            kernels.divide(out, n, out=out)  # in place, as AVG uses it
            assert_bits_equal(out, want)


def test_parallel_build_matches_serial(monkeypatch):
    monkeypatch.setattr(threads, "_COUNT", 2)
    a, b = (
        random_array(np.dtype(np.float16), 1 << 20, seed=8),
        random_array(np.dtype(np.float16), 1 << 20, seed=9),
    )
    want = expected("SUM", a, b)
    got = b.copy()
    kernels.reduce("SUM", a, got)  # 2 MiB, two threads: the parallel kernel
    assert_bits_equal(got, want)
    assert elementwise._CACHE.get(
        ("reduce_SUM_float16_" + ("f16c" if kernels.f16c() else "soft"), True)
    )


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: kernels.reduce("SUM", np.ones(3), np.ones(4)), "one dtype and shape"),
        (lambda: kernels.reduce("BAND", np.ones(3), np.ones(3)), "bitwise ops apply to integers"),
        (lambda: kernels.reduce("MIN", np.ones(3, complex), np.ones(3, complex)), "no order"),
        (lambda: kernels.reduce("AVG", np.ones(3), np.ones(3)), "use pycoll.kernels.divide"),
        (
            lambda: kernels.reduce(ReduceOp.SUM, np.ones(3), np.ones(3)[::-1].copy()[:2]),
            "one dtype and shape",
        ),
        (
            lambda: kernels.reduce(
                "SUM", np.ones(3), np.ones(3).view()[::1].copy().__array__()[...].reshape(3)[::-1]
            ),
            "C-contiguous",
        ),
        (lambda: kernels.scale(np.ones(3, np.int32), 2.0), "round to an integer"),
        (lambda: kernels.scale(np.ones(3), 1j), "complex factor"),
        (lambda: kernels.reduce("SUM", [1, 2], np.ones(2)), "must be a numpy.ndarray"),
        (lambda: kernels.mpi_op("SUM", np.dtype("U3")), "cannot send"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_read_only_destination_is_refused():
    dst = np.ones(3)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.reduce("SUM", np.ones(3), dst)


def test_f16c_setting(monkeypatch):
    monkeypatch.setattr(kernels, "_F16C", None)
    monkeypatch.setenv("PYCOLL_F16C", "0")
    assert kernels.f16c() is False
    monkeypatch.setattr(kernels, "_F16C", None)
    monkeypatch.setenv("PYCOLL_F16C", "maybe")
    with pytest.raises(ValueError, match="PYCOLL_F16C='maybe'"):
        kernels.f16c()
    monkeypatch.setattr(kernels, "_F16C", None)
    monkeypatch.delenv("PYCOLL_F16C")
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    assert kernels.f16c() is False  # a generic target has no F16C to count on


def test_warmup_compiles_every_pair():
    seconds = kernels.warmup(dtypes=["float16", "int8", "bool"], mpi=False)
    assert seconds >= 0
    for name in ("reduce_SUM_float16", "reduce_BXOR_native", "reduce_MIN_bool"):
        assert any(key[0].startswith(name) for key in elementwise._CACHE), name
    with pytest.raises(ValueError, match="bitwise"):
        kernels.warmup(dtypes=["float32"], ops=["BAND"], mpi=False)


@pytest.mark.parametrize("dtype", ["float16", BF16, "float32", "float64"], ids=str)
def test_mean_of_two_is_sum_then_halve(dtype):
    """AVG on two ranks: the sum rounded to the dtype, then halved."""
    dtype = np.dtype(dtype)
    a, b = random_array(dtype, seed=11), random_array(dtype, seed=12)
    with np.errstate(all="ignore"):
        want = (expected("SUM", a, b) / dtype.type(2)).astype(dtype)
    got = b.copy()
    storage = "bfloat16" if dtype == BF16 else dtype.name
    kernel = elementwise.mean_of_two_kernel(storage, kernels.f16c(), False)
    if dtype.itemsize == 2:
        kernel(a.view(np.uint16), got.view(np.uint16))
    else:
        kernel(a, got)
    assert_bits_equal(got, want)


@pytest.mark.parametrize(
    "dtype,f16c",
    [("float16", True), ("float16", False), (BF16, False)],
    ids=["float16-f16c", "float16-portable", "bfloat16"],
)
def test_mean_of_two_at_the_edges_of_the_range(dtype, f16c):
    """Every 16-bit pattern averaged with the values where rounding the sum
    first matters: sums that round to infinity though their half would not
    (65504 + 65504 in float16), halves that fall among the subnormals, ties."""
    dtype = np.dtype(dtype)
    if f16c and not kernels.f16c():
        pytest.skip("this CPU has no F16C")
    info = ml_dtypes.finfo(dtype)
    partners = [0.0, -0.0, 1.0, -1.5, info.max, -info.max, info.max / 2, info.tiny]
    partners += [info.smallest_subnormal, 3 * info.smallest_subnormal, np.inf, np.nan]
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    storage = "bfloat16" if dtype == BF16 else "float16"
    kernel = elementwise.mean_of_two_kernel(storage, f16c, False)
    for value in partners:
        other = np.full(every.size, value, dtype)
        with np.errstate(all="ignore"):
            want = (expected("SUM", every, other) / dtype.type(2)).astype(dtype)
        got = other.copy()
        kernel(every.view(np.uint16), got.view(np.uint16))
        assert_bits_equal(got, want)
    top = np.array([info.max], dtype)
    got = top.copy()
    kernel(top.view(np.uint16), got.view(np.uint16))
    assert np.isinf(got[0]), "the sum overflows, so the average is infinite, as SUM then divide"


@pytest.mark.parametrize("dtype", ["float16", BF16, "float32", "float64"], ids=str)
def test_sum_then_divide_in_one_pass_matches_numpy(dtype):
    # An AVG's last combine: the sum rounded to the dtype, then the division
    # rounded once, exactly as numpy's add then true_divide.
    dtype = np.dtype(dtype)
    a, b = random_array(dtype, seed=7), random_array(dtype, seed=8)
    for n in (2, 3, 7):
        with np.errstate(all="ignore"):
            want = ((a + b).astype(dtype) / dtype.type(n)).astype(dtype)
        out = b.copy()
        kernels.reduce("SUM", a, out, divide_by=n)
        assert_bits_equal(out, want)


@pytest.mark.parametrize("op,dtype", [("MAX", "float32"), ("SUM", "int32"), ("SUM", "complex64")])
def test_divide_by_is_refused_where_it_has_no_meaning(op, dtype):
    x = np.ones(4, dtype)
    with pytest.raises(ValueError, match="divide_by applies to SUM of real floating arrays"):
        kernels.reduce(op, x.copy(), x, divide_by=2)


@pytest.mark.parametrize("op,dtype", list(cases()), ids=str)
def test_folder_matches_numpy(op, dtype):
    """kernels.folder: reduce's function for one op and dtype, checked once."""
    a, b = random_array(dtype, seed=11), random_array(dtype, seed=12)
    got = b.copy()
    fold = kernels.folder(op, dtype)
    fold(a, got)
    assert_bits_equal(got, expected(op, a, b))
    assert kernels.folder(op, dtype) is fold  # (made once)


@pytest.mark.parametrize("dtype", ["float16", BF16, "float32", "float64"], ids=str)
def test_folder_divides_as_reduce_does(dtype):
    dtype = np.dtype(dtype)
    a, b = random_array(dtype, seed=13), random_array(dtype, seed=14)
    for n in (2, 4):
        with np.errstate(all="ignore"):
            want = ((a + b).astype(dtype) / dtype.type(n)).astype(dtype)
        got = b.copy()
        kernels.folder(ReduceOp.SUM, dtype, n)(a, got)
        assert_bits_equal(got, want)


def test_folder_refuses_what_reduce_refuses():
    with pytest.raises(ValueError, match="bitwise ops apply to integers"):
        kernels.folder("BAND", np.dtype(np.float32))
    with pytest.raises(ValueError, match="divide_by applies to SUM of real floating arrays"):
        kernels.folder("SUM", np.dtype(np.int32), 2)
    with pytest.raises((ValueError, TypeError), match="op"):
        kernels.folder(["SUM"], np.dtype(np.float32))


@pytest.mark.parametrize("op,dtype", [c for c in cases() if c[0] in ("SUM", "PRODUCT")], ids=str)
def test_sum_and_product_give_the_same_bits_in_either_order(op, dtype):
    """What pycoll's recursive doubling (pycoll.collectives.doubling) relies
    on: the two ranks of a pair fold the same two values in opposite orders.
    (MIN and MAX of floats do not: there each pair folds in rank order.)"""
    a, b = random_array(dtype, seed=15), random_array(dtype, seed=16)
    ab, ba = b.copy(), a.copy()
    kernels.reduce(op, a, ab)
    kernels.reduce(op, b, ba)
    assert_bits_equal(ab, ba)


def test_min_of_signed_zeros_depends_on_the_order():
    """Why the doubling folds MIN and MAX of floats in rank order."""
    zero, minus = np.zeros(1, np.float32), -np.zeros(1, np.float32)
    one = zero.copy()
    kernels.reduce("MIN", minus, one)  # min(-0.0, 0.0)
    other = minus.copy()
    kernels.reduce("MIN", zero, other)  # min(0.0, -0.0)
    assert np.signbit(one[0]) != np.signbit(other[0])
