"""Fixtures of the GPU tests: the simulator runtime, and the aware/staged switch."""

from __future__ import annotations

import pytest

from pycoll.gpu import aware, runtime
from support import REQUIRE_GPU


@pytest.fixture
def real_gpu(monkeypatch):
    """cupy, on a real GPU with pycoll.gpu's real runtime; skips without one
    (fails under PYCOLL_TEST_GPU=1)."""
    reason = None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            reason = "no CUDA device"
    except Exception as exc:  # no cupy, no driver
        reason = f"no GPU here ({type(exc).__name__}: {exc})"
    if reason is None and runtime.simulated():
        reason = "NUMBA_ENABLE_CUDASIM=1 is set (set PYCOLL_TEST_GPU=1 for real-GPU runs)"
    if reason is not None:
        if REQUIRE_GPU:
            pytest.fail(f"PYCOLL_TEST_GPU=1 but {reason}")
        pytest.skip(reason)
    monkeypatch.setattr(runtime, "_RUNTIME", None)
    aware.reset()
    yield cupy
    aware.reset()


@pytest.fixture
def sim(monkeypatch):
    """pycoll.gpu's simulator runtime (device memory is host memory), fresh."""
    if not runtime.simulated():
        pytest.skip("simulator test: run with NUMBA_ENABLE_CUDASIM=1 (the default without a GPU)")
    rt = runtime.SimRuntime()
    monkeypatch.setattr(runtime, "_RUNTIME", rt)
    return rt


@pytest.fixture(params=["staged", "aware"])
def path(request, monkeypatch, sim):
    """Run the test once staged (PYCOLL_CUDA_AWARE=0) and once CUDA-aware (=1)."""
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "1" if request.param == "aware" else "0")
    aware.reset()
    yield request.param
    aware.reset()
