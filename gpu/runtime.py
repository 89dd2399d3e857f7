"""The few CUDA runtime calls pycoll makes: streams, copies, pinned memory.

Two implementations of one interface:

- :class:`CupyRuntime`, on a real GPU (cupy is imported on first use only).
- :class:`SimRuntime`, when ``NUMBA_ENABLE_CUDASIM=1``: as in numba's CUDA
  simulator, "device memory" is host memory, so copies are memmoves and
  streams are recorded rather than waited on. Tests drive the staging and
  CUDA-aware paths through real MPI with it, and check which streams pycoll
  synchronized.

Streams are plain integer handles, as in ``__cuda_array_interface__``:
1 is the legacy default stream.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Runtime", "CupyRuntime", "SimRuntime", "get", "reset"]

LEGACY_STREAM = 1
_MEMCPY_H2D, _MEMCPY_D2H = 1, 2


class Runtime:
    """What pycoll needs of CUDA. Copies are asynchronous on ``stream``."""

    _side: Optional[int]  # pycoll's own stream, once made

    def current_stream(self) -> int:
        raise NotImplementedError

    def synchronize(self, stream: int) -> None:
        raise NotImplementedError

    def to_host(self, host: np.ndarray, ptr: int, stream: int) -> None:
        raise NotImplementedError

    def to_device(self, ptr: int, host: np.ndarray, stream: int) -> None:
        raise NotImplementedError

    def _new_stream(self) -> int:
        raise NotImplementedError

    def side_stream(self) -> int:
        """pycoll's own stream (copies back up run on it), made on first use."""
        if self._side is None:
            self._side = self._new_stream()
        return self._side

    def scratch(self, nbytes: int) -> Tuple[int, Any]:
        """Device memory of ``nbytes`` for pycoll's own use: (address, the
        object that owns it, to keep while the memory is used)."""
        raise NotImplementedError

    def wait(self, stream: int, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event`` (on the GPU)."""
        raise NotImplementedError

    def record(self, stream: int) -> Any:
        """An event marking the work queued on ``stream`` so far; ``.synchronize()`` waits."""
        raise NotImplementedError

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        raise NotImplementedError

    # Pinned host buffers, kept for reuse: allocating page-locked memory costs
    # far more than the copies it speeds up. Sizes are rounded up to a power
    # of two (at least 64 KiB) so buffers fit many later requests.
    def __init__(self) -> None:
        self._free: Dict[int, List[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.pinned_allocations = 0
        self.pinned_bytes = 0  # held by the pool, in use or free
        self._side = None

    def take(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 buffer of at least ``nbytes`` from the pool."""
        size = max(1 << 16, 1 << max(0, int(nbytes) - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        self.pinned_allocations += 1
        self.pinned_bytes += size
        return self._alloc_pinned(size)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer from :meth:`take` to the pool."""
        with self._lock:
            self._free.setdefault(buf.nbytes, []).append(buf)


class _SimEvent:
    """The simulator's event: the simulated stream has always run everything."""

    def synchronize(self) -> None:
        pass

    def done(self) -> bool:
        return True


class SimRuntime(Runtime):
    """Device memory is host memory (numba's CUDA simulator's model)."""

    def __init__(self) -> None:
        super().__init__()
        self.synchronized: List[int] = []  # every stream synchronized, in order
        self.current = LEGACY_STREAM  # what current_stream() answers; tests set it

    def current_stream(self) -> int:
        return self.current

    def synchronize(self, stream: int) -> None:
        self.synchronized.append(stream)

    def to_host(self, host: np.ndarray, ptr: int, stream: int) -> None:
        ctypes.memmove(host.ctypes.data, ptr, host.nbytes)

    def to_device(self, ptr: int, host: np.ndarray, stream: int) -> None:
        ctypes.memmove(ptr, host.ctypes.data, host.nbytes)

    def _new_stream(self) -> int:
        return 0x5001  # any handle other than the caller's: streams are only recorded

    def record(self, stream: int) -> Any:
        return _SimEvent()

    def wait(self, stream: int, event: Any) -> None:
        pass  # copies are done when they return

    def scratch(self, nbytes: int) -> Tuple[int, Any]:
        owner = np.empty(max(nbytes, 1), np.uint8)
        return owner.ctypes.data, owner

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)


class CupyRuntime(Runtime):
    """A real GPU, through cupy's runtime bindings."""

    def __init__(self) -> None:
        super().__init__()
        import cupy

        self._cp = cupy
        self._rt = cupy.cuda.runtime

    def current_stream(self) -> int:
        ptr = self._cp.cuda.get_current_stream().ptr
        return ptr or LEGACY_STREAM

    def synchronize(self, stream: int) -> None:
        # cudaStreamLegacy is the handle 1 in the runtime API too.
        self._rt.streamSynchronize(stream)

    def to_host(self, host: np.ndarray, ptr: int, stream: int) -> None:
        self._rt.memcpyAsync(host.ctypes.data, ptr, host.nbytes, _MEMCPY_D2H, stream)

    def to_device(self, ptr: int, host: np.ndarray, stream: int) -> None:
        self._rt.memcpyAsync(ptr, host.ctypes.data, host.nbytes, _MEMCPY_H2D, stream)

    def _new_stream(self) -> int:
        self._side_owner = self._cp.cuda.Stream(non_blocking=True)  # lives with the runtime
        return self._side_owner.ptr

    def record(self, stream: int) -> Any:
        return _CudaEvent(self._rt, stream)

    def wait(self, stream: int, event: Any) -> None:
        self._rt.streamWaitEvent(stream, event._event, 0)

    def scratch(self, nbytes: int) -> Tuple[int, Any]:
        owner = self._cp.empty(max(nbytes, 1), self._cp.uint8)
        return owner.data.ptr, owner

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        memory = self._cp.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(memory, np.uint8, nbytes)  # keeps ``memory`` alive


_NOT_READY = 600  # cudaErrorNotReady


class _CudaEvent:
    """A CUDA event recorded on a stream (the runtime API's, no timing)."""

    _DISABLE_TIMING = 2

    def __init__(self, rt: Any, stream: int) -> None:
        self._rt = rt
        self._event = rt.eventCreateWithFlags(self._DISABLE_TIMING)
        rt.eventRecord(self._event, stream)

    def synchronize(self) -> None:
        self._rt.eventSynchronize(self._event)

    def done(self) -> bool:
        """Whether the stream has run everything before the event (never blocks)."""
        try:
            return self._rt.eventQuery(self._event) != _NOT_READY
        except self._rt.CUDARuntimeError as exc:
            if getattr(exc, "status", None) != _NOT_READY:
                raise
            return False

    def __del__(self) -> None:
        try:
            self._rt.eventDestroy(self._event)
        except Exception:  # interpreter shutdown: the context is gone anyway
            pass


_RUNTIME: Optional[Runtime] = None


def simulated() -> bool:
    """Whether pycoll runs CUDA code in numba's simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "") == "1"


def get() -> Runtime:
    """The process's runtime, chosen on first use."""
    global _RUNTIME
    if _RUNTIME is None:
        if simulated():
            _RUNTIME = SimRuntime()
        else:
            try:
                _RUNTIME = CupyRuntime()
            except ImportError:
                raise RuntimeError(
                    "pycoll got a CUDA array but cannot reach CUDA: cupy is not "
                    "installed; install it with pip install 'pycoll[gpu]'"
                ) from None
    return _RUNTIME


def reset() -> None:
    """Forget the runtime (tests)."""
    global _RUNTIME
    _RUNTIME = None
