"""Fixtures of the torch backend's tests: torch's default group over pycoll.

torch is needed (CI's .venv-torch and .venv-torch-openmpi have its CPU
build); where it is not installed these tests report themselves skipped.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def tdist(pg):
    """torch.distributed with its default group on the backend "pycoll"
    (rendezvous mpi://), destroyed after the test. pycoll's own default group
    (the suite's ``pg``) is the one it runs on, and outlives it."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401

    dist.init_process_group("pycoll", init_method="mpi://")
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()
