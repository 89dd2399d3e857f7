"""Fixtures of the GPU tests: the simulator runtime, and the aware/staged switch."""

from __future__ import annotations

import os

import pytest

from pycoll.gpu import aware, runtime

# Real-GPU tests skip without a GPU; PYCOLL_TEST_GPU=1 makes that a failure.
REQUIRE_GPU = os.environ.get("PYCOLL_TEST_GPU", "") == "1"


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
