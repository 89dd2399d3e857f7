"""One Work protocol (pycoll.work.BaseWork), one suite over every kind of work:
MPI's on host arrays, a device collective's staged through pinned memory and
under CUDA-aware MPI (pycoll.gpu's simulator runtime), and NCCL's (on a
group whose backend is NCCL, with cupy's NCCL played by MPI: fakes.MpiNccl)."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeCAI, MpiNccl

import pycoll
from pycoll.gpu import aware, nccl
from pycoll.work import BaseWork, Future

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size

KINDS = ["host", "staged", "aware", "nccl"]


def start(kind, rank, world_size, monkeypatch, sim):
    """An async all_reduce SUM of [rank + 1] * 3 of one kind; its Work and
    what result() must hand back."""
    x = np.full(3, rank + 1.0, np.float32)
    if kind == "host":
        return pycoll.all_reduce(x, async_op=True), x
    if kind == "nccl":
        group = pycoll.new_group(list(range(world_size)), backend="cpu:mpi,cuda:nccl")
        fake = MpiNccl(pycoll.group.WORLD.comm.Dup())
        monkeypatch.setattr(nccl, "_module", lambda: None)
        monkeypatch.setattr(nccl, "communicator", lambda pg: fake)
        dev = FakeCAI(x)
        work = pycoll.all_reduce(dev, group=group, async_op=True)
        assert isinstance(work, nccl.NcclWork) and fake.calls == ["allReduce"]
        fake.comm.Free()
        return work, dev
    monkeypatch.setenv("PYCOLL_CUDA_AWARE", "1" if kind == "aware" else "0")
    aware.reset()
    dev = FakeCAI(x)
    return pycoll.all_reduce(dev, async_op=True), dev


@pytest.fixture
def kinded(request, monkeypatch, rank, world_size, sim):
    work, out = start(request.param, rank, world_size, monkeypatch, sim)
    yield request.param, work, out
    aware.reset()


@pytest.mark.parametrize("kinded", KINDS, indirect=True)
def test_every_kind_of_work_keeps_the_protocol(kinded, rank, world_size):
    kind, work, out = kinded
    assert isinstance(work, BaseWork)
    assert work.op == "all_reduce"
    future = work.get_future()
    assert isinstance(future, Future)
    assert work.wait(timeout=60) is True
    assert work.is_completed() and work.is_success() and work.exception() is None
    total = world_size * (world_size + 1) / 2
    result = work.result()
    assert len(result) == 1 and result[0] is out  # the caller's own array, device or host
    host = out if kind == "host" else out.host
    np.testing.assert_array_equal(host, np.full(3, total, np.float32))
    assert future.wait()[0] is out and future.done()
    assert work.get_future() is future
    late = work.get_future()  # asked for after completion: completed at once
    assert late.done() and late.value() == [out]
    with pytest.raises(
        RuntimeError, match="source_rank\\(\\) applies to receives, not to all_reduce"
    ):
        work.source_rank()
