"""Distributed autograd over pycoll.rpc (CI's torch venvs, 1 to 4 ranks):
gradients through one, two and three hops of rpc_sync, rpc_async and
remote/to_here (and calls to itself) equal torch's own local autograd of
the same computation; contexts are unique, released everywhere, and
refused where torch refuses them; errors in a remote part of the backward
name the worker; a worker that stops answering is named within the
timeout; DistributedOptimizer trains a model split across workers to the
parameters of the same training done locally. Every rank is a caller."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

import pycoll.rpc as rpc

torch = pytest.importorskip("torch")
dist_autograd = pytest.importorskip("pycoll.rpc.autograd")
from pycoll.rpc.optim import DistributedOptimizer  # noqa: E402

MODES = ["rpc_sync", "rpc_async", "remote"]


def call(mode, to, func, *args):
    """``func(*args)`` on ``to``, the way ``mode`` says; its value here."""
    if mode == "rpc_sync":
        return rpc.rpc_sync(to, func, args=args)
    if mode == "rpc_async":
        return rpc.rpc_async(to, func, args=args).wait()
    return rpc.remote(to, func, args=args).to_here()


# -- what the workers run (importable by name on every rank) ------------------------


def step(x, w):
    """One stage of the chain: the same op on every worker and locally."""
    return torch.tanh(x * w + x)


def hop(mode, x, w, route):
    """``step`` here, then the rest of ``route`` by ``mode``."""
    y = step(x, w)
    if not route:
        return y
    return call(mode, route[0], hop, mode, y, w, route[1:])


def local_chain(x, w, hops):
    for _ in range(hops):
        x = step(x, w)
    return x


def route_from(me, size, hops):
    return [(me + i) % size for i in range(1, hops + 1)]


def has_context(context_id):
    try:
        dist_autograd.retrieve_context(context_id)
    except RuntimeError:
        return False
    return True


def context_summary(context_id):
    ctx = dist_autograd.retrieve_context(context_id)
    return len(ctx.send_functions()), len(ctx.recv_functions())


class SimulateBackwardError(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise Exception("Simulate error on backward pass")  # noqa: TRY002 (torch's test)


def add_with_backward_error(a, b):
    return SimulateBackwardError.apply(a + b)


GATES = {}


def gate(key):
    return GATES.setdefault(key, threading.Event())


def open_gate(key):
    gate(key).set()


class Stall(torch.autograd.Function):
    """Its backward blocks until the gate named in forward opens (at most 60 s)."""

    @staticmethod
    def forward(ctx, x, key):
        ctx.key = key
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        gate(ctx.key).wait(60)
        return grad, None


def stalled_mul(a, b, key):
    return Stall.apply(a * b, key)


def make_leaf(seed):
    g = torch.Generator().manual_seed(seed)  # (the global seed is shared by threads)
    return torch.rand(3, 3, generator=g).requires_grad_(True)


def add_to_owned(rref, t):
    return rref.local_value() + t * 2


def owner_gradient(context_id, rref):
    return dist_autograd.get_gradients(context_id).get(rref.local_value())


# -- contexts -----------------------------------------------------------------------


def test_context_without_rpc_is_refused():
    """First in the module: its agent starts with the first test that asks for it."""
    assert not rpc.is_initialized()
    with pytest.raises(RuntimeError, match="RPC has not been initialized"):
        with dist_autograd.context():
            pass


def test_context_ids_are_unique_in_the_job_and_released(me, size):
    from mpi4py import MPI

    ids = []
    for _ in range(200):
        with dist_autograd.context() as context_id:
            assert dist_autograd.retrieve_context(context_id).context_id() == context_id
            assert dist_autograd.current_context().context_id() == context_id
            assert context_id >> 48 == me
            ids.append(context_id)
    assert len(set(ids)) == 200
    everyone = MPI.COMM_WORLD.allgather(ids)
    assert len({i for ids_ in everyone for i in ids_}) == 200 * size
    for context_id in ids:
        with pytest.raises(
            RuntimeError, match=f"Could not find autograd context with id: {context_id}"
        ):
            dist_autograd.retrieve_context(context_id)
        with pytest.raises(RuntimeError, match="Could not find autograd context"):
            dist_autograd.get_gradients(context_id)


def test_nested_context_is_refused(rpc_world):
    with dist_autograd.context():
        with pytest.raises(
            RuntimeError, match="Already have an autograd context id for this thread"
        ):
            with dist_autograd.context():
                pass
    with pytest.raises(RuntimeError, match="doesn't have a valid autograd context"):
        dist_autograd.current_context()


def test_the_callee_runs_in_the_callers_context(me, peer):
    with dist_autograd.context() as context_id:
        assert rpc.rpc_sync(peer, has_context, args=(context_id,))
        # without tensors that require grad, nothing is recorded for backward
        a = torch.ones(2)
        rpc.rpc_sync(peer, torch.add, args=(a, a))
        assert dist_autograd.current_context().send_functions() == {}
        assert dist_autograd.current_context().recv_functions() == {}
        # with them: one message out (two tensors), one tensor back
        t1, t2 = torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)
        rpc.rpc_sync(peer, torch.add, args=(t1, t2))
        ctx = dist_autograd.current_context()
        sent = list(ctx.send_functions().values())
        assert sent[0][0] is t1 and sent[0][1] is t2
        if peer != me:  # the peer sent one tensor back and received two
            assert len(sent) == 1 and len(ctx.recv_functions()) == 1
            assert ctx.known_worker_ids() == {peer}
            assert rpc.rpc_sync(peer, context_summary, args=(context_id,)) == (1, 2)
        else:  # a call to itself: this worker is both ends
            assert [len(s) for s in sent] == [2, 1] and len(ctx.recv_functions()) == 3
            assert ctx.known_worker_ids() == set()


# -- gradients against local autograd -----------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hops", [1, 2, 3])
def test_gradients_equal_local_autograd(mode, hops, me, size):
    x = make_leaf(me)
    w = make_leaf(me + 100)
    expected = torch.autograd.grad((local_chain(x, w, hops) * w).sum(), [x, w])
    route = route_from(me, size, hops)
    with dist_autograd.context() as context_id:
        y = call(mode, route[0], hop, mode, x, w, route[1:])
        loss = (y * w).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)
    assert set(map(id, grads)) == {id(x), id(w)}
    torch.testing.assert_close(grads[x], expected[0])
    torch.testing.assert_close(grads[w], expected[1])
    assert x.grad is None and w.grad is None  # distributed autograd leaves .grad alone


@pytest.mark.parametrize("mode", MODES)
def test_calls_to_itself(mode, me):
    x, w = make_leaf(me), make_leaf(me + 1)
    expected = torch.autograd.grad(local_chain(x, w, 2).sum(), [x, w])
    with dist_autograd.context() as context_id:
        y = call(mode, me, hop, mode, x, w, [me])
        dist_autograd.backward(context_id, [y.sum()])
        grads = dist_autograd.get_gradients(context_id)
    torch.testing.assert_close(grads[x], expected[0])
    torch.testing.assert_close(grads[w], expected[1])


def test_a_long_chain_of_round_trips(me, size):
    """Thirty calls in a row, each through the next worker: the backward
    pass goes sixty hops deep (no worker thread waits meanwhile)."""
    t = torch.ones(3, requires_grad=True)
    with dist_autograd.context() as context_id:
        x = t
        for i in range(30):
            x = rpc.rpc_sync((me + 1 + i) % size, torch.add, args=(x, x))
        dist_autograd.backward(context_id, [x.sum()])
        grads = dist_autograd.get_gradients(context_id)
    torch.testing.assert_close(grads[t], torch.full((3,), 2.0**30))


def test_multiple_roots_unused_tensors_and_dtypes(me, peer):
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    t3 = make_leaf(me + 2).double().detach().requires_grad_(True)
    unused = make_leaf(me + 3)
    roots_local = [
        torch.add(t1, t2).sum(),
        torch.mul(t1, t2).sum(),
        torch.cos(t1).sum(),
        torch.mul(t1, t3).sum(),
    ]
    expected = torch.autograd.grad(roots_local, [t1, t2, t3])
    with dist_autograd.context() as context_id:
        r1 = rpc.rpc_sync(peer, torch.add, args=(t1, t2)).sum()
        r2 = rpc.rpc_sync(peer, torch.mul, args=(t1, t2)).sum()
        r3 = rpc.rpc_sync(peer, torch.cos, args=(t1,)).sum()
        r4 = rpc.rpc_sync(peer, torch.mul, args=(t1, t3)).sum()
        rpc.rpc_sync(peer, torch.neg, args=(unused,))
        dist_autograd.backward(context_id, [r1, r2, r3, r4])
        grads = dist_autograd.get_gradients(context_id)
    assert len(grads) == 3 and unused not in grads
    for t, e in zip([t1, t2, t3], expected):
        assert grads[t].dtype == t.dtype
        torch.testing.assert_close(grads[t], e)


def test_gradients_accumulate_over_backward_calls(me, peer):
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    m = torch.matmul(t1, t2)
    loss = (m * m).sum()
    torch.autograd.backward([loss], retain_graph=True)
    torch.autograd.backward([loss])  # .grad: twice the gradient, torch's own reference
    with dist_autograd.context() as context_id:
        m = rpc.rpc_sync(peer, torch.matmul, args=(t1, t2))
        remote_loss = (m * m).sum()
        dist_autograd.backward(context_id, [remote_loss], retain_graph=True)
        dist_autograd.backward(context_id, [remote_loss])
        grads = dist_autograd.get_gradients(context_id)
        torch.testing.assert_close(grads[t1], t1.grad)
        torch.testing.assert_close(grads[t2], t2.grad)
        # this worker's graph was freed by the second call: a third fails as torch does
        with pytest.raises(RuntimeError, match="second time"):
            dist_autograd.backward(context_id, [remote_loss])


def test_hooks_on_leaves_apply(me, peer):
    t1 = torch.ones(3, 3, requires_grad=True)
    t1.register_hook(lambda grad: grad * 2)
    t2 = make_leaf(me)
    (t1 * t2).sum().backward()
    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync(peer, torch.mul, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)
    torch.testing.assert_close(grads[t1], t1.grad)
    torch.testing.assert_close(grads[t1], t2.detach() * 2)


def test_backward_without_rpc(rpc_world):
    t1, t2 = torch.rand(3, 3, requires_grad=True), torch.rand(3, 3, requires_grad=True)
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [torch.add(t1, t2).sum()])
        grads = dist_autograd.get_gradients(context_id)
    assert len(grads) == 2
    torch.testing.assert_close(grads[t1], torch.ones(3, 3))
    torch.testing.assert_close(grads[t2], torch.ones(3, 3))


def test_gradients_of_an_rrefs_value_reach_its_owner(me, peer):
    """The parameter-server pattern: the tensor lives on the owner; its
    gradient is in the owner's context."""
    rref = rpc.remote(peer, make_leaf, args=(7,))
    t = make_leaf(me)
    with dist_autograd.context() as context_id:
        out = rpc.rpc_sync(peer, add_to_owned, args=(rref, t))
        dist_autograd.backward(context_id, [(out * out).sum()])
        owned = rref.to_here()
        expected = 2 * (owned.detach() + t.detach() * 2)
        torch.testing.assert_close(
            rpc.rpc_sync(peer, owner_gradient, args=(context_id, rref)), expected
        )
        torch.testing.assert_close(dist_autograd.get_gradients(context_id)[t], 2 * expected)


def test_contexts_in_threads_are_their_own(me, size):
    """Eight threads, each with its own contexts, backward at once."""
    failures = []

    def work(i):
        try:
            for _ in range(5):
                x, w = make_leaf(me * 10 + i), make_leaf(i)
                expected = torch.autograd.grad(local_chain(x, w, 2).sum(), [x, w])
                with dist_autograd.context() as context_id:
                    y = call("rpc_sync", (me + 1) % size, hop, "rpc_sync", x, w, [(me + 2) % size])
                    dist_autograd.backward(context_id, [y.sum()])
                    grads = dist_autograd.get_gradients(context_id)
                torch.testing.assert_close(grads[x], expected[0])
                torch.testing.assert_close(grads[w], expected[1])
        except BaseException as exc:  # reported below, on this rank
            failures.append(f"thread {i}: {exc!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not [t for t in threads if t.is_alive()], "a thread did not finish in 120 s"
    assert failures == []


def test_released_contexts_are_released_on_every_worker(me, size):
    """A -> B -> C: leaving the context on A releases it on B and C too."""
    route = route_from(me, size, 2)
    x, w = make_leaf(me), make_leaf(me + 1)
    with dist_autograd.context() as context_id:
        call("rpc_sync", route[0], hop, "rpc_sync", x, w, route[1:])
        assert all(rpc.rpc_sync(r, has_context, args=(context_id,)) for r in route)
    deadline = time.monotonic() + 60  # the releases are messages: wait for them, bounded
    while time.monotonic() < deadline:
        left = [r for r in route if rpc.rpc_sync(r, has_context, args=(context_id,))]
        if not left:
            break
        time.sleep(0.01)
    assert left == [], f"context {context_id} still held on ranks {left}"


RETURNED = {}


def ret_requires_grad():
    """A tensor that requires grad, made and kept on the callee."""
    t = RETURNED.setdefault("t", torch.ones(3, 3, requires_grad=True))
    return t * 1  # (a result computed from it, as a function would return)


def gradient_of_returned(context_id):
    return dist_autograd.get_gradients(context_id).get(RETURNED["t"])


@pytest.mark.parametrize("mode", ["rpc_sync", "remote"])
def test_gradients_of_a_tensor_made_by_the_callee_stay_there(mode, me, peer):
    """Only the result requires grad: its gradient reaches the callee's leaf."""
    with dist_autograd.context() as context_id:
        ret = call(mode, peer, ret_requires_grad)
        dist_autograd.backward(context_id, [ret.sum()])
        at_callee = rpc.rpc_sync(peer, gradient_of_returned, args=(context_id,))
        torch.testing.assert_close(at_callee, torch.ones(3, 3))
        if peer != me:
            assert dist_autograd.get_gradients(context_id) == {}


def test_several_results_and_mixed_requires_grad(me, peer):
    """A call returning a tuple of tensors, one argument that requires grad
    and one that does not (torch's split and multi_dot, as its test)."""
    t = make_leaf(me).repeat(4, 1)[:10, :2].detach().requires_grad_(True)  # 10 x 2
    fixed = make_leaf(me + 1)[:2, :2].detach()
    parts = torch.split(t, 2)
    expected = torch.autograd.grad(
        torch.linalg.multi_dot((parts[0], parts[2] + fixed, parts[4])).sum(), [t]
    )[0]
    with dist_autograd.context() as context_id:
        parts = rpc.rpc_sync(peer, torch.split, args=(t, 2))
        assert isinstance(parts, tuple) and len(parts) == 5
        middle = rpc.rpc_sync(peer, torch.add, args=(parts[2], fixed))
        val = rpc.rpc_sync(peer, torch.linalg.multi_dot, args=((parts[0], middle, parts[4]),))
        dist_autograd.backward(context_id, [val.sum()])
        grads = dist_autograd.get_gradients(context_id)
    assert len(grads) == 1
    torch.testing.assert_close(grads[t], expected)


def test_an_unused_result_does_not_hold_up_the_backward(me, peer):
    """torch's engine waits forever here (its test asserts the hang); this one
    completes, with the gradients of what the loss used."""
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    with dist_autograd.context() as context_id:
        rpc.rpc_sync(peer, torch.add, args=(t1, t2))  # result unused
        dist_autograd.backward(context_id, [torch.mul(t1, t2).sum()])
        grads = dist_autograd.get_gradients(context_id)
    torch.testing.assert_close(grads[t1], t2.detach())
    torch.testing.assert_close(grads[t2], t1.detach())


def test_every_worker_called_is_recorded(me, size):
    others = {r for r in range(size) if r != me}
    with dist_autograd.context() as context_id:
        plain = torch.ones(2)
        for r in sorted(others):
            rpc.rpc_sync(r, torch.add, args=(plain, plain))  # no tensor requires grad
        assert dist_autograd.current_context().known_worker_ids() == others
        assert all(rpc.rpc_sync(r, has_context, args=(context_id,)) for r in others)


# -- errors ---------------------------------------------------------------------------


def test_bad_arguments_are_refused(me, peer):
    with dist_autograd.context() as context_id:
        with pytest.raises(TypeError, match="roots must be a list of tensors"):
            dist_autograd.backward(context_id, None)
        with pytest.raises(TypeError, match="context_id must be the int"):
            dist_autograd.backward(None, [])
        with pytest.raises(RuntimeError, match="No tensors provided for gradient computation"):
            dist_autograd.backward(context_id, [])
        with pytest.raises(RuntimeError, match="requires_grad not set on"):
            dist_autograd.backward(context_id, [torch.rand(1)])
        with pytest.raises(RuntimeError, match="is not a scalar, all roots need to be scalar"):
            dist_autograd.backward(context_id, [torch.rand(3, 3, requires_grad=True) * 2])
        with pytest.raises(RuntimeError, match="does not have a valid gradient function"):
            dist_autograd.backward(context_id, [torch.rand(1, requires_grad=True)])
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    with pytest.raises(
        RuntimeError, match=f"Could not find autograd context with id: {context_id}"
    ):
        dist_autograd.backward(context_id, [torch.add(t1, t2).sum()])  # released
    with dist_autograd.context():
        res = rpc.rpc_sync(peer, torch.add, args=(t1, t2))
        with pytest.raises(RuntimeError, match="Could not find autograd context with id: 100"):
            dist_autograd.backward(100, [res.sum()])


def test_plain_torch_backward_through_received_tensors_is_refused(me, peer):
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    with dist_autograd.context():
        res = rpc.rpc_sync(peer, torch.add, args=(t1, t2))
        with pytest.raises(
            RuntimeError, match=r"pycoll.rpc.autograd.backward\(context_id, roots\)"
        ):
            res.sum().backward()


def test_error_in_a_remote_backward_names_the_node(me, peer):
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync(peer, add_with_backward_error, args=(t1, t2)).sum()
        with pytest.raises(
            RuntimeError, match=f"Error on Node {peer}: Simulate error on backward pass"
        ):
            dist_autograd.backward(context_id, [loss], retain_graph=True)


def test_error_deep_in_a_chain_reaches_the_root(me, size):
    """The failing op is on this worker, reached back through four hops."""
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    with dist_autograd.context() as context_id:
        t3 = SimulateBackwardError.apply((t1 + t2) * (t1 + t2))
        val = rpc.rpc_sync((me + 1) % size, torch.add, args=(t2, t3))
        val = rpc.rpc_sync((me + 2) % size, torch.mul, args=(val, t2))
        val = rpc.rpc_sync((me + 3) % size, torch.matmul, args=(val, t2))
        val = rpc.rpc_sync((me + 4) % size, torch.div, args=(val, t2))
        with pytest.raises(
            RuntimeError, match=f"Error on Node {me}: Simulate error on backward pass"
        ):
            dist_autograd.backward(context_id, [val.sum()])


def test_a_worker_that_stops_answering_is_named_within_the_timeout(me, peer):
    t1, t2 = make_leaf(me), make_leaf(me + 1)
    name = f"worker{peer}"
    with dist_autograd.context() as context_id:
        key = f"stall-{context_id}"
        loss = rpc.rpc_sync(peer, stalled_mul, args=(t1, t2, key)).sum()
        start = time.monotonic()
        try:
            with pytest.raises(RuntimeError, match=f"Error on Node {peer}: .*{name}.*timeout"):
                dist_autograd.backward(context_id, [loss], timeout=1.0)
            took = time.monotonic() - start
        finally:
            rpc.rpc_sync(peer, open_gate, args=(key,))
    assert took < 30, f"the stalled worker was reported after {took:.1f} s (timeout 1 s)"


# -- the distributed optimizer --------------------------------------------------------


class Stage(torch.nn.Module):
    def __init__(self, seed, n_in, n_out):
        super().__init__()
        self.linear = torch.nn.Linear(n_in, n_out)
        # from a generator of its own: torch's global seed is shared by the
        # threads of a worker, and its pool builds other ranks' stages at once
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.linear.parameters():
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)

    def forward(self, x):
        return torch.tanh(self.linear(x))

    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def state(self):
        return {k: v.detach().clone() for k, v in self.state_dict().items()}


def _batches(me):
    g = torch.Generator().manual_seed(1000 + me)
    xs = torch.randn(4, 16, 4, generator=g).repeat(6, 1, 1)  # 24 steps: 4 batches, 6 times
    ys = xs.sum(dim=2, keepdim=True) * 0.3
    return xs, ys


def test_distributed_optimizer_trains_a_split_model_like_a_local_one(me, peer):
    """Stage 1 lives on the next worker (an RRef), stage 2 here; both step
    through DistributedOptimizer. The same model trained locally with
    torch.optim.SGD is the reference: the loss falls and the parameters agree."""
    xs, ys = _batches(me)
    stage1 = rpc.remote(peer, Stage, args=(me, 4, 8))
    stage2 = Stage(me + 1, 8, 1)
    opt = DistributedOptimizer(
        torch.optim.SGD,
        stage1.rpc_sync().param_rrefs() + stage2.param_rrefs(),
        lr=0.05,
        momentum=0.5,
    )
    local1, local2 = Stage(me, 4, 8), Stage(me + 1, 8, 1)
    local_opt = torch.optim.SGD(
        list(local1.parameters()) + list(local2.parameters()), lr=0.05, momentum=0.5
    )
    losses = []
    for x, y in zip(xs, ys):
        with dist_autograd.context() as context_id:
            hidden = stage1.rpc_sync().forward(x)
            loss = ((stage2(hidden) - y) ** 2).mean()
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
        local_opt.zero_grad()
        local_loss = ((local2(local1(x)) - y) ** 2).mean()
        local_loss.backward()
        local_opt.step()
        assert abs(local_loss.item() - losses[-1]) <= 1e-5 * max(1.0, abs(losses[-1]))
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4]), losses  # the same four batches
    remote_state = stage1.rpc_sync().state()
    for k, v in local1.state_dict().items():
        torch.testing.assert_close(remote_state[k], v)
    for k, v in local2.state_dict().items():
        torch.testing.assert_close(stage2.state_dict()[k], v)


def test_distributed_optimizer_refuses_what_is_not_rrefs(rpc_world):
    with pytest.raises(TypeError, match="params_rref must be a list of RRefs"):
        DistributedOptimizer(torch.optim.SGD, [torch.zeros(1, requires_grad=True)], lr=0.1)


def test_import_says_torch_is_needed():
    """Where torch is missing (simulated), the import says how to get it; and
    ``import pycoll.rpc`` never imports torch."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pycoll.rpc\n"
        "try:\n    import pycoll.rpc.autograd\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert re.search(
        r"pycoll.rpc.autograd needs torch: .*pip install 'pycoll-mpi\[torch\]'", out.stdout
    )
    code = "import sys, pycoll.rpc; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
