"""Threads per rank: cores / ranks on the node, or PYCOLL_NUM_THREADS."""

import os

import pytest

from pycoll.kernels import threads

# Any size of job: the kernels reduce within a rank, as MPI's user ops at any size.
pytestmark = pytest.mark.any_size


def cores():
    return len(os.sched_getaffinity(0))


def test_cores_are_shared_among_the_ranks_of_a_node(monkeypatch):
    monkeypatch.delenv("PYCOLL_NUM_THREADS", raising=False)
    assert threads.per_rank(1) == cores()
    assert threads.per_rank(cores()) == 1
    assert threads.per_rank(cores() * 4) == 1  # never zero


def test_launcher_variables_give_the_ranks_per_node(monkeypatch):
    from pycoll.groups import STATE

    monkeypatch.setattr(STATE, "local_size", None)
    monkeypatch.delenv("PYCOLL_NUM_THREADS", raising=False)
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", str(cores()))
    assert threads.per_rank() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # pycoll-run's variable comes first
    assert threads.per_rank() == cores()


def test_explicit_setting(monkeypatch):
    monkeypatch.setenv("PYCOLL_NUM_THREADS", "3")
    assert threads.per_rank(64) == 3
    monkeypatch.setenv("PYCOLL_NUM_THREADS", "zero")
    with pytest.raises(ValueError, match="PYCOLL_NUM_THREADS='zero' is not a positive integer"):
        threads.per_rank()
