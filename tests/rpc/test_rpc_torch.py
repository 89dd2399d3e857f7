"""torch tensors through pycoll.rpc (CI's torch venvs): every dtype, 0-d,
empty and non-contiguous tensors, requires_grad, tensors inside structures
and RRefs, and a function marked with torch's own async_execution returning
a torch Future."""

from __future__ import annotations

import operator

import pytest

import pycoll.rpc as rpc

# Any size of job: calls go from worker to worker by name, whatever the job's size.
pytestmark = pytest.mark.any_size

torch = pytest.importorskip("torch")

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def echo(x):
    return x


def make(rank, dtype, shape):
    """Rank ``rank``'s tensor: small integers, exact in every dtype."""
    n = 1
    for d in shape:
        n *= d
    values = (torch.arange(n, dtype=torch.int64) + rank) % 7
    return values.reshape(shape).to(dtype)


def double(t):
    return t * 2


@torch.distributed.rpc.functions.async_execution
def add_async(to, a, b):
    """torch's own decorator, a torch Future: pycoll.rpc serves it too."""
    future = torch.futures.Future()
    rpc.rpc_async(to, operator.add, args=(a, b)).add_done_callback(
        lambda f: future.set_result(f.value())
    )
    return future


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 5)], ids=["0d", "empty", "2d"])
def test_tensors_every_dtype(dtype, shape, me, peer):
    x = make(me, dtype, shape)
    y = rpc.rpc_sync(peer, echo, args=(x,))
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and tuple(y.shape) == shape
    assert torch.equal(y, make(me, dtype, shape))


def test_non_contiguous_and_requires_grad(me, peer):
    base = make(me, torch.float32, (6, 8))
    for x in (base.t(), base[::2, 1::3], base.expand(2, 6, 8)):
        y = rpc.rpc_sync(peer, echo, args=(x,))
        assert torch.equal(y, x)
    leaf = base.clone().requires_grad_()
    y = rpc.rpc_sync(peer, echo, args=(leaf,))
    assert y.requires_grad and y.is_leaf and torch.equal(y.detach(), base)
    assert torch.equal(rpc.rpc_sync(peer, double, args=(leaf.detach(),)), base * 2)


def test_tensors_in_structures_and_rrefs(me, peer):
    payload = {"w": [make(me, torch.float32, (4,)), (make(me, torch.int64, (2, 2)),)]}
    got = rpc.rpc_sync(peer, echo, args=(payload,))
    assert torch.equal(got["w"][0], payload["w"][0]) and torch.equal(
        got["w"][1][0], payload["w"][1][0]
    )
    rref = rpc.remote(peer, double, args=(make(me, torch.float64, (3,)),))
    assert torch.equal(rref.to_here(), make(me, torch.float64, (3,)) * 2)


def test_torch_async_execution_and_torch_future(me, peer, size):
    to = (peer + 1) % size
    result = rpc.rpc_sync(peer, add_async, args=(to, make(me, torch.float32, (3,)), 1))
    assert torch.equal(result, make(me, torch.float32, (3,)) + 1)
