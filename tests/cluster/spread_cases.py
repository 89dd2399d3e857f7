"""Marked tests that tests/cluster/test_cluster.py runs with ``pytest
--mpi-hosts node1,node2`` on the test cluster (not collected by the suite:
the name has no test_ prefix). Each checks, on every rank, where the ranks
landed and that a collective across them is right; one fails on node2 only,
on purpose, and the outer test checks how that is reported."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import pycoll


def placed(size: int) -> list:
    pycoll.init_process_group()
    hosts: list = [None] * size
    pycoll.all_gather_object(hosts, socket.gethostname())
    x = np.full(4, pycoll.get_rank() + 1.0)
    pycoll.all_reduce(x)
    assert np.all(x == size * (size + 1) / 2), x
    return hosts


@pytest.mark.mpi(ranks=4)
def test_four_ranks_two_per_host():
    assert placed(4) == ["node1", "node1", "node2", "node2"]


@pytest.mark.mpi(ranks=3)
def test_three_ranks_fill_the_first_host_first():
    assert placed(3) == ["node1", "node1", "node2"]


@pytest.mark.mpi(ranks=2)
def test_fails_on_node2_only():
    hosts = placed(2)
    assert hosts == ["node1", "node2"]
    assert socket.gethostname() == "node1", "this rank runs on node2"
