"""Host memory dressed as CUDA arrays, to drive pycoll.gpu without a GPU.

:class:`FakeCAI` exposes ``__cuda_array_interface__`` (v3, with a stream);
:class:`FakeDLPack` exposes ``__dlpack__``/``__dlpack_device__`` reporting a
CUDA device, and records the stream its consumer asked for. Under
pycoll.gpu's simulator runtime (NUMBA_ENABLE_CUDASIM=1) "device" memory is
host memory, so MPI really moves these arrays' bytes.
"""

from __future__ import annotations

import ctypes
from typing import List, Optional

import numpy as np

BF16_CODE = 4  # DLPack's kDLBfloat


class _HostBacked:
    def __init__(self, host: np.ndarray):
        self.host = host

    @property
    def shape(self):
        return self.host.shape

    @property
    def dtype(self):
        return self.host.dtype


class FakeCAI(_HostBacked):
    def __init__(self, host: np.ndarray, stream: Optional[int] = 1, readonly: bool = False):
        super().__init__(host)
        self.stream = stream
        self.readonly = readonly
        self.strides = None if host.flags.c_contiguous else host.strides

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = self.host.dtype.str
        return {
            "shape": self.host.shape,
            "typestr": typestr,
            "data": (self.host.__array_interface__["data"][0], self.readonly),
            "strides": self.strides,
            "version": 3,
            "stream": self.stream,
        }


class FakeDLPack(_HostBacked):
    def __init__(self, host: np.ndarray):
        super().__init__(host)
        self.asked: List[Optional[int]] = []  # streams consumers passed to __dlpack__

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, stream=None):
        self.asked.append(stream)
        if self.host.dtype.str == "<V2":  # bfloat16: numpy cannot export it, so
            capsule = self.host.view(np.uint16).__dlpack__()  # export the words and
            _retype(capsule, BF16_CODE)  # relabel the dtype, as a bfloat16 producer would
            return capsule
        return self.host.__dlpack__()


def _retype(capsule, code: int) -> None:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor")
    # DLTensor: data (8), device (8), ndim (4), then dtype's code byte.
    ctypes.c_uint8.from_address(address + 20).value = code


class FakeArrayAPI(FakeCAI):
    """A CUDA array that also has an array-API namespace, as a device
    library's arrays do: pycoll.functional allocates, copies and joins
    through it. Its namespace and methods work on the host memory."""

    def __array_namespace__(self, api_version=None):
        return _FakeNamespace

    def copy(self) -> FakeArrayAPI:
        return FakeArrayAPI(self.host.copy())

    def reshape(self, shape) -> FakeArrayAPI:
        return FakeArrayAPI(self.host.reshape(shape))

    def __getitem__(self, key) -> FakeArrayAPI:
        return FakeArrayAPI(self.host[key])


class _FakeNamespace:
    @staticmethod
    def empty(shape, dtype):
        return FakeArrayAPI(np.full(shape, 99, dtype))  # garbage a result must overwrite

    @staticmethod
    def concat(parts, axis=0):
        return FakeArrayAPI(np.concatenate([p.host for p in parts], axis=axis))


def cuda_like(host: np.ndarray, kind: str = "cai", **kw):
    """``host`` as a fake CUDA array of ``kind`` 'cai' or 'dlpack'."""
    return FakeCAI(host, **kw) if kind == "cai" else FakeDLPack(host)


class MpiNccl:
    """cupy's NcclCommunicator, played by MPI on the simulator's device
    memory (host memory): lets pycoll.gpu.nccl issue real collectives with no
    GPU. It records each call's name, so a test can see NCCL was used."""

    # NCCL's dtype and op codes (pycoll.gpu.nccl) as numpy dtypes and numpy ufuncs
    DTYPES = {2: np.int32, 4: np.int64, 7: np.float32, 8: np.float64}
    OPS = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}

    def __init__(self, comm) -> None:
        self.comm = comm
        self.calls: List[str] = []

    def _at(self, ptr: int, count: int, dtype: int) -> np.ndarray:
        dt = np.dtype(self.DTYPES[dtype])
        raw = (ctypes.c_byte * (count * dt.itemsize)).from_address(ptr)
        return np.frombuffer(raw, dt, count)

    def _reduce(self, send: np.ndarray, op: int) -> np.ndarray:
        everyone = self.comm.allgather(send.copy())
        if op == 4:  # AVG
            return (np.add.reduce(everyone) / len(everyone)).astype(send.dtype)
        return self.OPS[op].reduce(everyone).astype(send.dtype)

    def allReduce(self, sptr, rptr, count, dtype, op, stream):  # noqa: N802 (cupy's names)
        self.calls.append("allReduce")
        self._at(rptr, count, dtype)[:] = self._reduce(self._at(sptr, count, dtype), op)

    def reduce(self, sptr, rptr, count, dtype, op, root, stream):
        self.calls.append("reduce")
        result = self._reduce(self._at(sptr, count, dtype), op)
        if self.comm.rank == root:
            self._at(rptr, count, dtype)[:] = result

    def bcast(self, ptr, count, dtype, root, stream):
        self.calls.append("bcast")
        buf = self._at(ptr, count, dtype)
        buf[:] = self.comm.bcast(buf.copy(), root=root)

    def allGather(self, sptr, rptr, count, dtype, stream):  # noqa: N802
        self.calls.append("allGather")
        parts = self.comm.allgather(self._at(sptr, count, dtype).copy())
        self._at(rptr, count * self.comm.size, dtype)[:] = np.concatenate(parts)

    def reduceScatter(self, sptr, rptr, count, dtype, op, stream):  # noqa: N802
        self.calls.append("reduceScatter")
        full = self._reduce(self._at(sptr, count * self.comm.size, dtype), op)
        r = self.comm.rank
        self._at(rptr, count, dtype)[:] = full[r * count : (r + 1) * count]
