"""The device-array adapter: what pycoll reads from __cuda_array_interface__
and DLPack, and the errors for arrays it cannot send (no MPI, no GPU)."""

import ml_dtypes
import numpy as np
import pytest
from fakes import FakeCAI, FakeDLPack

from pycoll import arrays
from pycoll.gpu.device import adapt, host_alias, is_device

# One process's code (no MPI): the plain pass runs it once.
pytestmark = pytest.mark.one_process

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_cai_gives_pointer_shape_dtype_stream_and_readonly():
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = adapt(FakeCAI(host, stream=0x77, readonly=True), "f", "x")
    assert d.ptr == host.ctypes.data
    assert (d.shape, d.dtype, d.size, d.nbytes) == ((3, 4), np.float32, 12, 48)
    assert d.stream == 0x77 and d.readonly is True


def test_dlpack_gives_pointer_and_asks_the_producer_for_our_stream():
    host = np.arange(5, dtype=np.int64)
    fake = FakeDLPack(host)
    d = adapt(fake, "f", "x", consumer_stream=0x42)
    assert (d.ptr, d.shape, d.dtype) == (host.ctypes.data, (5,), np.int64)
    assert fake.asked == [0x42] and d.stream == 0x42


def test_dlpack_carries_bfloat16():
    host = np.arange(4, dtype=np.float32).astype(BF16)
    d = adapt(FakeDLPack(host), "f", "x")
    assert d.dtype == BF16 and d.ptr == host.ctypes.data


def test_opaque_cai_dtype_points_to_dlpack():
    with pytest.raises(ValueError, match="opaque 2-byte dtype .* pass it through DLPack"):
        adapt(FakeCAI(np.zeros(3, BF16)), "all_reduce", "tensor")


@pytest.mark.parametrize("kind", ["cai", "dlpack"])
def test_non_contiguous_is_refused_with_the_fix(kind):
    host = np.zeros((4, 4), np.float32)[:, ::2]
    fake = FakeCAI(host) if kind == "cai" else FakeDLPack(host)
    with pytest.raises(ValueError, match="all_reduce: tensor is not C-contiguous.*contiguous"):
        adapt(fake, "all_reduce", "tensor")


def test_unsupported_dtype_is_refused():
    with pytest.raises(ValueError, match="all_reduce: tensor has dtype <U1"):
        adapt(FakeCAI(np.array(["a"])), "all_reduce", "tensor")


def test_stream_zero_is_refused():
    with pytest.raises(ValueError, match="stream 0"):
        adapt(FakeCAI(np.zeros(2), stream=0), "f", "x")


def test_what_counts_as_a_device_array():
    host = np.zeros(3)
    assert is_device(FakeCAI(host)) and is_device(FakeDLPack(host))
    assert not is_device(host)  # numpy: host memory, though it has __dlpack__
    assert not is_device([1, 2]) and not is_device(None)
    assert arrays.on_device(host, [host, FakeCAI(host)]) is True
    assert arrays.on_device(host, [host], None) is False


def test_host_alias_is_the_same_memory():
    host = np.arange(6, dtype=np.float32).astype(BF16).reshape(2, 3)
    alias = host_alias(adapt(FakeDLPack(host), "f", "x"))
    assert alias.dtype == BF16 and alias.shape == (2, 3)
    assert alias.ctypes.data == host.ctypes.data
    alias[0, 0] = 7
    assert host[0, 0] == 7


def test_an_opaque_cai_with_dlpack_goes_through_dlpack():
    # torch's bfloat16 CUDA tensors: a "<V2" typestr, and a DLPack export that names it
    class TorchLike(FakeDLPack):
        @property
        def __cuda_array_interface__(self):
            return FakeCAI(self.host.view(np.uint16).view("V2")).__cuda_array_interface__

    host = np.arange(3, dtype=np.float32).astype(BF16)
    fake = TorchLike(host)
    d = adapt(fake, "f", "x", consumer_stream=5)
    assert d.dtype == BF16 and fake.asked == [5]
