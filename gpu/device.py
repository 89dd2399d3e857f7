"""Device arrays: what pycoll reads from a CUDA array, whoever made it.

Any object with ``__cuda_array_interface__`` (cupy, torch CUDA tensors,
numba device arrays) or ``__dlpack__`` reporting a CUDA device is a device
array. :func:`adapt` turns it into a :class:`DeviceArray`: the device
pointer, shape, dtype and the stream its producer wrote it on, which is all
the staging and CUDA-aware paths need. Nothing here touches device memory or
needs a GPU, so the adapter is tested with host-backed fakes.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

import ml_dtypes
import numpy as np

from pycoll.arrays import CUDA_DLPACK, check_dtype, is_cuda

from .runtime import LEGACY_STREAM

__all__ = ["DeviceArray", "adapt"]

# DLPack (code, bits) -> numpy dtype, for the dtypes pycoll sends.
_DL_DTYPES = {
    (0, 8): np.dtype(np.int8),
    (0, 16): np.dtype(np.int16),
    (0, 32): np.dtype(np.int32),
    (0, 64): np.dtype(np.int64),
    (1, 8): np.dtype(np.uint8),
    (1, 16): np.dtype(np.uint16),
    (1, 32): np.dtype(np.uint32),
    (1, 64): np.dtype(np.uint64),
    (2, 16): np.dtype(np.float16),
    (2, 32): np.dtype(np.float32),
    (2, 64): np.dtype(np.float64),
    (4, 16): np.dtype(ml_dtypes.bfloat16),
    (5, 64): np.dtype(np.complex64),
    (5, 128): np.dtype(np.complex128),
    (6, 8): np.dtype(np.bool_),
}


class DeviceArray:
    """A CUDA array as pycoll sees it.

    Attributes:
        obj: the caller's array (kept alive while pycoll uses its memory).
        ptr: device address of the first element.
        shape, dtype, size, nbytes: as numpy's.
        readonly: the producer marked the memory read-only.
        stream: the CUDA stream (a handle, 1 = legacy default) the producer
            asks consumers to synchronize on, or None when it needs none.
    """

    __slots__ = ("obj", "ptr", "shape", "dtype", "size", "nbytes", "readonly", "stream", "_keep")

    def __init__(
        self,
        obj: Any,
        ptr: int,
        shape: Tuple[int, ...],
        dtype: np.dtype,
        readonly: bool,
        stream: Optional[int],
        keep: Any = None,
    ) -> None:
        self.obj = obj
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        self.nbytes = self.size * dtype.itemsize
        self.readonly = readonly
        self.stream = stream
        self._keep = keep  # a DLPack capsule: the memory stays valid while it lives

    def __repr__(self) -> str:
        return f"DeviceArray(ptr={self.ptr:#x}, shape={self.shape}, dtype={self.dtype})"

    def cai(self) -> dict:
        """A ``__cuda_array_interface__`` (v3) for this memory, for kernels."""
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, self.readonly),
            "strides": None,
            "version": 3,
            "stream": None,
        }


def is_device(x: Any) -> bool:
    """True for a CUDA array (see the module docstring); never raises."""
    return not isinstance(x, np.ndarray) and is_cuda(x)


def adapt(x: Any, func: str, name: str, consumer_stream: Optional[int] = None) -> DeviceArray:
    """The :class:`DeviceArray` of ``x``; ValueError/TypeError naming ``func``
    and ``name`` if pycoll cannot send it (not C-contiguous, unknown dtype, ...).

    ``consumer_stream`` is the stream pycoll will synchronize; a DLPack
    producer is asked to order its work before it (the DLPack protocol).
    """
    try:
        cai = getattr(x, "__cuda_array_interface__", None)
    except Exception:
        cai = None  # e.g. a torch bfloat16 tensor: DLPack below carries it
    if cai is not None and not (_opaque(cai) and getattr(x, "__dlpack__", None) is not None):
        return _from_cai(x, cai, func, name)
    if getattr(x, "__dlpack__", None) is not None:
        return _from_dlpack(x, func, name, consumer_stream)
    raise TypeError(f"{func}: {name} is not a CUDA array ({type(x).__name__})")


def _opaque(cai: dict) -> bool:
    """A typestr that only says "n bytes" (torch's bfloat16): DLPack names it."""
    return str(cai.get("typestr", ""))[1:2] == "V"


def _contiguity(func: str, name: str, shape: Tuple[int, ...], strides: Any, itemsize: int) -> None:
    if strides is None:
        return
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(tuple(strides))):
        if dim != 1 and stride != expected:
            raise ValueError(
                f"{func}: {name} is not C-contiguous, so MPI cannot use it; "
                f"pass a contiguous copy (cupy.ascontiguousarray(...), tensor.contiguous())"
            )
        expected *= dim


def _from_cai(x: Any, cai: dict, func: str, name: str) -> DeviceArray:
    shape = tuple(int(n) for n in cai["shape"])
    try:
        dtype = np.dtype(cai["typestr"])
    except TypeError:
        raise ValueError(
            f"{func}: {name} has typestr {cai['typestr']!r}, which pycoll cannot read"
        ) from None
    if dtype.kind == "V":
        raise ValueError(
            f"{func}: {name} has an opaque {dtype.itemsize}-byte dtype in its "
            f"__cuda_array_interface__; pass it through DLPack, which names bfloat16"
        )
    check_dtype(func, name, dtype)
    if cai.get("mask") is not None:
        raise ValueError(f"{func}: {name} is a masked array; pycoll sends plain arrays")
    ptr, readonly = cai["data"]
    _contiguity(func, name, shape, cai.get("strides"), dtype.itemsize)
    stream = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    if stream == 0:
        raise ValueError(
            f"{func}: {name} reports stream 0 in its __cuda_array_interface__, "
            f"which the protocol forbids (1 is the legacy default stream)"
        )
    return DeviceArray(x, int(ptr or 0), shape, dtype, bool(readonly), stream)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(x: Any, func: str, name: str, consumer_stream: Optional[int]) -> DeviceArray:
    device_type, _ = x.__dlpack_device__()
    if int(device_type) not in CUDA_DLPACK:
        raise TypeError(f"{func}: {name} is a DLPack array on device type {device_type}, not CUDA")
    stream = LEGACY_STREAM if consumer_stream is None else consumer_stream
    capsule = x.__dlpack__(stream=stream)
    # An unversioned capsule (we pass no max_version): the DLManagedTensor
    # starts with its DLTensor. It is not renamed "used", so its destructor
    # frees it; ``keep`` holds it until pycoll is done.
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    lanes = tensor.dtype.lanes
    dtype = _DL_DTYPES.get((tensor.dtype.code, tensor.dtype.bits)) if lanes == 1 else None
    if dtype is None:
        raise ValueError(
            f"{func}: {name} has DLPack dtype (code {tensor.dtype.code}, "
            f"{tensor.dtype.bits} bits, {lanes} lanes), which pycoll cannot send"
        )
    check_dtype(func, name, dtype)
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    strides = None
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(tensor.ndim))
    _contiguity(func, name, shape, strides, dtype.itemsize)
    ptr = int(tensor.data or 0) + int(tensor.byte_offset)
    # DLPack has no read-only flag; the producer already ordered its work
    # before ``stream``, which pycoll synchronizes like any producer stream.
    return DeviceArray(x, ptr, shape, dtype, False, stream, keep=capsule)


class _Interface:
    def __init__(self, interface: dict) -> None:
        self.__array_interface__ = interface


def host_alias(x: DeviceArray) -> np.ndarray:
    """A numpy array over ``x``'s address, touched by nothing on the host.

    It carries a device buffer through pycoll's host code to MPI (the
    CUDA-aware path: MPI recognises device memory by its address) and lets the
    simulator's kernels reach "device" memory, which is host memory there.
    Reading it on the host with a real GPU is a crash, not an error: only
    code that merely hands the buffer on may see it.
    """
    holder = _Interface(
        {
            "shape": x.shape,
            "typestr": x.dtype.str,
            "descr": x.dtype.descr,
            "data": (x.ptr, False),
            "strides": None,
            "version": 3,
        }
    )
    alias = np.asarray(holder)
    if alias.dtype != x.dtype:  # bfloat16 reads back as void; view it again
        alias = alias.view(x.dtype)
    return alias
