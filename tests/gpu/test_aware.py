"""CUDA-awareness detection: the setting, the MPI-4.1 info key, the vendor's
query on the real MPI of this pass (the PyPI wheels are built without CUDA)."""

import logging

import pytest

from pycoll import _mpi
from pycoll.gpu import aware

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("PYCOLL_CUDA_AWARE", raising=False)
    aware.reset()
    yield
    aware.reset()


def test_the_wheels_are_not_cuda_aware_and_say_why(pg):
    answer = aware.cuda_aware()
    assert answer.aware is False
    if _mpi.VENDOR == "MPICH":
        assert answer.reason == "MPICH's MPIX_GPU_query_support(CUDA) = 0"
    elif _mpi.VENDOR == "Open MPI":
        assert answer.reason == "Open MPI's MPIX_Query_cuda_support() = 0"
    else:
        pytest.fail(f"this suite runs on the MPICH and Open MPI wheels, not {_mpi.VENDOR}")


def test_the_answer_is_cached_and_logged(pg, caplog):
    with caplog.at_level(logging.INFO, logger="pycoll"):
        first = aware.cuda_aware()
        second = aware.cuda_aware()
    assert first is second
    logged = [r.getMessage() for r in caplog.records if "CUDA-aware" in r.getMessage()]
    assert logged == [f"pycoll.gpu: MPI is not CUDA-aware ({first.reason})"]


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False)])
def test_the_setting_wins(monkeypatch, value, expected):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", value)
    assert aware.cuda_aware() == (expected, f"PYCOLL_CUDA_AWARE={value}")
    # Its truth is the answer, so `if pycoll.gpu.cuda_aware():` means what it says.
    assert bool(aware.cuda_aware()) is expected
    assert (expected if aware.cuda_aware() else not expected) is True


def test_a_bad_setting_is_refused(monkeypatch):
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "yes")
    with pytest.raises(ValueError, match="PYCOLL_CUDA_AWARE='yes'"):
        aware.cuda_aware()


def test_an_alloc_kind_naming_cuda_means_aware(pg, monkeypatch):
    # No CUDA-aware MPI can be installed here, so its info value is supplied.
    monkeypatch.setattr(aware, "_alloc_kinds", lambda MPI: "mpi,system,cuda:device")
    answer = aware.cuda_aware()
    assert answer.aware is True
    assert "lists cuda" in answer.reason
    aware.reset()
    monkeypatch.setattr(aware, "_alloc_kinds", lambda MPI: "mpi,system,rocm:device")
    assert aware.cuda_aware().aware is False
