"""torch's own functional collectives over the pycoll backend: eager, under
torch.compile (aot_eager and inductor on CPU), under autograd, and dynamo's
rewrite of ``dist.*`` calls inside a compiled function.

Adapted from torch's test_inductor_collectives (../shared/seeds/001): the
multi-process cases on CPU tensors instead of CUDA ones, the single-process
tracing cases on the real pycoll group instead of a fake one. Every rank
checks its values against answers computed here from every rank's input.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed._functional_collectives as fc  # noqa: E402
from torch_tensors import TORCH  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's renames


@pytest.fixture
def dynamo():
    """A fresh dynamo cache for the test (compiled functions of earlier tests
    would count against its recompile limit)."""
    torch._dynamo.reset()
    yield torch._dynamo
    torch._dynamo.reset()


def same(a, b, tol=1e-4):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def mine(rank, shape=(4,), scale=1.0):
    """Rank ``rank``'s input: known to every rank."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32).reshape(shape) + 10 * rank) * scale


# -- eager ------------------------------------------------------------------------------


def test_eager_values(tdist, rank, world_size):
    n, g = world_size, tdist.group.WORLD
    x = mine(rank, (2 * n, 2))
    keep = x.clone()
    everyone = [mine(r, (2 * n, 2)) for r in range(n)]
    total = sum(everyone)
    same(fc.wait_tensor(fc.all_reduce(x, "sum", g)), total)
    same(fc.wait_tensor(fc.all_reduce(x, "max", g)), everyone[-1])
    same(fc.wait_tensor(fc.all_gather_tensor(x, 0, g)), torch.cat(everyone, 0))
    same(fc.wait_tensor(fc.all_gather_tensor(x, 1, g)), torch.cat(everyone, 1))
    same(fc.wait_tensor(fc.reduce_scatter_tensor(x, "sum", 0, g)), total.chunk(n, 0)[rank])
    same(fc.wait_tensor(fc.broadcast(x, n - 1, g)), everyone[-1])
    a2a = fc.wait_tensor(fc.all_to_all_single(x, None, None, g))
    same(a2a, torch.cat([e.chunk(n, 0)[rank] for e in everyone]))
    shift = [(m + 1) % n for m in range(n)]  # torch's permute_tensor splits by numel: 1-D only
    got = fc.wait_tensor(fc.permute_tensor(x.reshape(-1), shift, g))
    same(got, everyone[(rank - 1) % n].reshape(-1))
    outs = fc.all_reduce_coalesced([x, 2 * x], "sum", g)
    same(fc.wait_tensor(outs[0]), total)
    same(fc.wait_tensor(outs[1]), 2 * total)
    gathered = fc.all_gather_into_tensor_coalesced([x, x[0]], g)
    same(fc.wait_tensor(gathered[1]), torch.cat([e[0] for e in everyone]))
    scattered = fc.reduce_scatter_tensor_coalesced([x, x], "sum", [0, 0], g)
    same(fc.wait_tensor(scattered[1]), total.chunk(n, 0)[rank])
    assert torch.equal(x, keep)  # never written


def test_eager_split_sizes(tdist, rank, world_size):
    """all_to_all_single with uneven splits: rank s sends s + d + 1 rows to d."""
    n = world_size
    send = [rank + d + 1 for d in range(n)]
    recv = [s + rank + 1 for s in range(n)]

    def rows(s, d):
        return torch.full((s + d + 1, 3), float(100 * s + d))

    x = torch.cat([rows(rank, d) for d in range(n)])
    y = fc.wait_tensor(fc.all_to_all_single(x, recv, send, tdist.group.WORLD))
    same(y, torch.cat([rows(s, rank) for s in range(n)]))


def test_group_forms(tdist, rank, world_size):
    """A group as torch's group, its name, a rank list, and a subgroup."""
    x = torch.full((3,), float(rank + 1))
    total = float(sum(range(1, world_size + 1)))
    g = tdist.group.WORLD
    for group in (g, g.group_name, list(range(world_size))):
        same(fc.wait_tensor(fc.all_reduce(x, "sum", group)), torch.full((3,), total))
    evens = tdist.new_group([r for r in range(world_size) if r % 2 == 0])
    if rank % 2 == 0:
        got = fc.wait_tensor(fc.all_reduce(x, "sum", evens))
        same(got, torch.full((3,), float(sum(r + 1 for r in range(0, world_size, 2)))))
        got = fc.wait_tensor(fc.all_gather_tensor(x, 0, evens))
        same(got, torch.cat([torch.full((3,), r + 1.0) for r in range(0, world_size, 2)]))


# -- torch.compile ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_allreduce_matmul_cat(backend, dynamo, tdist, rank):
    """The matmul/cat/all_reduce pattern inductor aims to optimize."""
    group_name = tdist.group.WORLD.group_name

    def matmul_cat_col(a, b, c, d, e, f):
        z = torch.cat((torch.matmul(a, b), torch.matmul(c, d)))
        ar = torch.ops._c10d_functional.all_reduce(z, "sum", group_name)
        g = torch.matmul(e, f)
        ar = torch.ops._c10d_functional.wait_tensor(ar)
        return torch.add(ar, g.repeat(2, 1))

    torch.manual_seed(1234)
    t = torch.randn(4, 4)
    inputs = (t if rank == 0 else torch.zeros(4, 4),) * 6
    eager = matmul_cat_col(*inputs)
    compiled = torch.compile(matmul_cat_col, backend=backend, fullgraph=True)(*inputs)
    same(eager, compiled, tol=1e-3)
    z = torch.cat((t @ t, t @ t))  # only rank 0 contributes
    same(compiled, z + (t @ t if rank == 0 else torch.zeros(4, 4)).repeat(2, 1), tol=1e-3)


def test_eager_allreduce_then_compiled_wait(dynamo, tdist, rank, world_size):
    """A result started eagerly and consumed inside a compiled function, and
    one started inside and consumed eagerly."""
    g = tdist.group.WORLD
    x = torch.ones(4, 4) + rank
    total = float(sum(range(1, world_size + 1)))

    def use(y):
        return torch.matmul(y, y) + 1

    pending = fc.all_reduce(x, "sum", g)
    got = torch.compile(use, backend="inductor")(pending)
    same(got, torch.full((4, 4), 4 * total * total + 1))

    def start(a):
        return fc.all_reduce(torch.relu(a), "sum", g)

    out = torch.compile(start, backend="inductor")(x)
    same(fc.wait_tensor(out) * 2, torch.full((4, 4), 2 * total))  # eager code waits, as torch's


def test_allreduce_input_buffer_reuse(dynamo, tdist, rank, world_size):
    g = tdist.group.WORLD

    def func(a):
        ar = fc.all_reduce(a, "sum", g)
        c = torch.relu(a)
        d = torch.matmul(c, c)
        return d + ar

    x = torch.ones(4, 4) + rank
    keep = x.clone()
    with torch._inductor.config.patch(allow_buffer_reuse=True):
        out = torch.compile(func, backend="inductor")(x)
    same(out, func(x))
    total = float(sum(range(1, world_size + 1)))
    same(out, torch.full((4, 4), 4.0 * (rank + 1) ** 2 + total))
    assert torch.equal(x, keep)


def test_inductor_doesnt_mutate_shared(dynamo, tdist, rank, world_size):
    """An input also used after the collective is neither written by it nor
    by inductor's reuse of buffers."""
    g = tdist.group.WORLD

    def func(inp):
        x = inp + 1
        ar = fc.all_reduce(x, "sum", g)
        y = x + 2
        return ar, y, x

    inp = torch.ones(4, 4) * (rank + 1)
    keep = inp.clone()
    ar, y, x = torch.compile(func, backend="inductor")(inp)
    total = float(sum(r + 2 for r in range(world_size)))
    same(ar, torch.full((4, 4), total))
    same(y, keep + 3)
    same(x, keep + 1)
    assert torch.equal(inp, keep)


def test_permute_tensor_compiled(dynamo, tdist, rank, world_size):
    g = tdist.group.WORLD
    shift = [(m + 1) % world_size for m in range(world_size)]

    def func(t):
        return fc.permute_tensor(t, shift, g)

    x = torch.arange(2, dtype=torch.float32) + 2 * rank
    out = torch.compile(func, backend="inductor")(x)
    expected = torch.arange(2, dtype=torch.float32) + 2 * ((rank - 1) % world_size)
    same(out, expected)
    same(func(x), expected)


@pytest.mark.parametrize("transpose", [False, True], ids=["reuse", "contiguous_input"])
def test_allgather_in_a_module(transpose, dynamo, tdist, rank, world_size):
    """torch's test_allgather_output_buffer_reuse and _contiguous_input: an
    embedding's output gathered, then joined along the last dimension."""
    g = tdist.group.WORLD

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(4, 4)

        def forward(self, x):
            y = self.emb(x)
            if transpose:
                y = y.transpose(0, y.dim() - 1).contiguous()
            res = fc.all_gather_tensor(y, 0, g)
            return torch.cat(torch.chunk(res, world_size, dim=0), dim=y.dim() - 1)

    torch.manual_seed(7)  # the same weights on every rank
    model = Model()
    inp = torch.tensor([[2, 1, 3, 0]], dtype=torch.long)
    with torch._inductor.config.patch(allow_buffer_reuse=True):
        out = torch.compile(model, backend="inductor")(inp)
    correct = model(inp)
    same(out, correct)
    y = model.emb(inp).detach()
    if transpose:
        y = y.transpose(0, y.dim() - 1)
    same(out, torch.cat([y] * world_size, dim=y.dim() - 1))


def test_allgather_and_reduce_scatter_compiled(dynamo, tdist, rank, world_size):
    g = tdist.group.WORLD
    n = world_size

    def func(a, b):
        gathered = fc.all_gather_tensor(torch.matmul(a, b), 0, g)
        scattered = fc.reduce_scatter_tensor(gathered * 2, "sum", 0, g)
        return gathered, scattered

    a = torch.ones(2, 3) * (rank + 1)
    b = torch.ones(3, 2)
    gathered, scattered = torch.compile(func, backend="inductor", fullgraph=True)(a, b)
    every = [torch.full((2, 2), 3.0 * (r + 1)) for r in range(n)]
    same(gathered, torch.cat(every))
    same(scattered, 2 * n * every[rank])


def test_all_to_all_single_dynamic_split_sizes(dynamo, tdist, rank, world_size):
    """Split sizes read from tensors inside the compiled function (unbacked
    symbols), as torch's test_all_to_all_single_inductor."""
    n, g = world_size, tdist.group.WORLD

    def example(inp, input_split_sizes_tensor, output_split_sizes_tensor):
        input_split_sizes = input_split_sizes_tensor.tolist()
        output_split_sizes = output_split_sizes_tensor.tolist()
        for s in input_split_sizes + output_split_sizes:
            torch._check_is_size(s)
        a2a = fc.all_to_all_single(inp, output_split_sizes, input_split_sizes, g)
        return a2a / a2a.sum(dim=0)

    send = [(d + 1) * (rank + 1) for d in range(n)]
    recv = [(rank + 1) * (s + 1) for s in range(n)]
    inp = torch.ones(sum(send), 5) * (rank + 1)
    args = (inp, torch.tensor(send), torch.tensor(recv))
    with dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        compiled = torch.compile(example, backend="aot_eager", fullgraph=True, dynamic=True)
        out = compiled(*args)
    eager = example(*args)
    same(out, eager, tol=1e-3)
    rows = torch.cat([torch.full((recv[s], 5), float(s + 1)) for s in range(n)])
    same(out, rows / rows.sum(dim=0), tol=1e-3)


def test_all_to_all_single_split_sizes_none_compiled(dynamo, tdist, rank, world_size):
    g = tdist.group.WORLD

    def example(inp):
        a2a = fc.all_to_all_single(inp, None, None, g)
        return a2a / a2a.sum(dim=0)

    inp = torch.ones(world_size, world_size) * (rank + 1)
    out = torch.compile(example, backend="inductor", fullgraph=True, dynamic=True)(inp)
    same(out, example(inp), tol=1e-3)


def test_coalesced_compiled(dynamo, tdist, rank, world_size):
    g = tdist.group.WORLD
    n = world_size

    def func(a, b):
        ar = fc.all_reduce_coalesced([a, b], "sum", g)
        ag = fc.all_gather_into_tensor_coalesced([a, b], g)
        rs = fc.reduce_scatter_tensor_coalesced([ag[0], ag[1]], "sum", [0, 0], g)
        return ar[0] + 1, ar[1], ag[0], rs[1]

    a = torch.full((2, 2), rank + 1.0)
    b = torch.full((3,), 10.0 * (rank + 1))
    got = torch.compile(func, backend="aot_eager", fullgraph=True)(a, b)
    total = float(sum(range(1, n + 1)))
    same(got[0], torch.full((2, 2), total + 1))
    same(got[1], torch.full((3,), 10 * total))
    same(got[2], torch.cat([torch.full((2, 2), r + 1.0) for r in range(n)]))
    every_b = torch.cat([torch.full((3,), 10.0 * (r + 1)) for r in range(n)])
    same(got[3], (n * every_b).chunk(n)[rank])


# -- dynamo's rewrite of dist.* ---------------------------------------------------------


@pytest.mark.parametrize("op", ["SUM", "AVG", "PRODUCT", "MIN", "MAX"])
def test_dynamo_rewrite_dist_allreduce(op, dynamo, tdist, rank, world_size):
    def func(x):
        y = x * 1
        tdist.all_reduce(y, op=getattr(tdist.ReduceOp, op))
        return y + 0

    x = torch.full((4,), rank + 1.0)
    out = torch.compile(func, backend="aot_eager", fullgraph=True)(x)
    every = [r + 1.0 for r in range(world_size)]
    want = {
        "SUM": sum(every),
        "AVG": sum(every) / world_size,
        "PRODUCT": float(torch.tensor(every).prod()),
        "MIN": min(every),
        "MAX": max(every),
    }[op]
    same(out, torch.full((4,), want))


def test_dynamo_rewrite_dist_collectives(dynamo, tdist, rank, world_size):
    """all_gather_into_tensor, all_gather into a list, reduce_scatter_tensor and
    all_to_all_single called as dist.* inside a fullgraph compile."""
    n = world_size

    def func(x):
        out = torch.empty(n * 2)
        tdist.all_gather_into_tensor(out, x)
        parts = [torch.empty(2) for _ in range(n)]
        tdist.all_gather(parts, x)
        rs = torch.empty(2)
        tdist.reduce_scatter_tensor(rs, out)
        a2a = torch.empty(n * 2)
        tdist.all_to_all_single(a2a, out)
        return out, torch.cat(parts), rs, a2a

    x = torch.tensor([rank, rank + 0.5])
    out, parts, rs, a2a = torch.compile(func, backend="aot_eager", fullgraph=True)(x)
    every = torch.cat([torch.tensor([r, r + 0.5]) for r in range(n)])
    same(out, every)
    same(parts, every)
    same(rs, n * every[2 * rank : 2 * rank + 2])
    same(a2a, every.reshape(n, 2)[rank].repeat(n))


def test_dynamo_world_group_and_sync_flag(dynamo, tdist, rank, world_size):
    """dist.group.WORLD inside the compiled function, and async_op=False
    traced; async_op=True, and dist calls dynamo does not rewrite, break the
    graph (refused under fullgraph) and run pycoll's methods eagerly."""

    def func(x):
        tdist.all_reduce(x, group=tdist.group.WORLD, async_op=False)
        return x * 2

    x = torch.ones(3)
    out = torch.compile(func, backend="aot_eager", fullgraph=True)(x)
    same(out, torch.full((3,), 2.0 * world_size))

    def asynchronous(x):
        work = tdist.all_reduce(x, async_op=True)
        work.wait()
        tdist.broadcast(x, 0)  # not rewritten by dynamo: a graph break, run eagerly
        return x * 2

    with pytest.raises(Exception, match="async_op|graph break|Unsupported"):
        torch.compile(asynchronous, backend="aot_eager", fullgraph=True)(torch.ones(3))
    torch._dynamo.reset()
    y = torch.ones(3)
    same(torch.compile(asynchronous, backend="aot_eager")(y), torch.full((3,), 2.0 * world_size))


@pytest.mark.parametrize("source", ["GroupMember.WORLD", "group.WORLD", "_get_default_group"])
def test_dynamo_get_world_group(source, dynamo, tdist, world_size):
    """However the default group is named inside the compiled function, the
    graph holds one functional all_reduce, and it runs over pycoll."""
    seen = []

    def func(tensor):
        if source == "GroupMember.WORLD":
            group = tdist.GroupMember.WORLD
        elif source == "group.WORLD":
            group = tdist.group.WORLD
        else:
            group = tdist.distributed_c10d._get_default_group()
        tdist.all_reduce(tensor, group=group)
        return tensor * 1

    ops = (torch.ops._c10d_functional.all_reduce, torch.ops.c10d_functional.all_reduce)
    targets = {*ops, *(op.default for op in ops)}

    def verify(gm, _):
        seen.extend(n for n in gm.graph.nodes if n.target in targets)
        return gm.forward

    out = torch.compile(func, backend=verify, fullgraph=True)(torch.ones(2))
    assert len(seen) == 1
    same(out, torch.full((2,), float(world_size)))


def test_dynamo_rewrite_all_gather_keyword_arguments(dynamo, tdist, rank, world_size):
    """dist.all_gather_into_tensor called with keywords, the group passed in:
    one frame, and the eager answer."""
    from torch._dynamo.testing import CompileCounter

    def func(inp, out, *, pg):
        tdist.all_gather_into_tensor(output_tensor=out, input_tensor=inp, group=pg, async_op=False)

    counter = CompileCounter()
    inp = torch.full((2, 2), float(rank))
    out, correct = torch.empty(2 * world_size, 2), torch.empty(2 * world_size, 2)
    torch.compile(func, backend=counter, fullgraph=True)(inp, out, pg=tdist.group.WORLD)
    func(inp, correct, pg=tdist.group.WORLD)
    assert counter.frame_count == 1
    same(out, correct)
    same(out, torch.cat([torch.full((2, 2), float(r)) for r in range(world_size)]))


def test_dynamo_pg_var(dynamo, tdist, rank, world_size):
    """The group's rank() and size() read inside a fullgraph compile."""
    from torch._dynamo.testing import CompileCounter

    def func(inp, *, pg):
        return inp + (pg.rank() + 1) % pg.size()

    counter = CompileCounter()
    out = torch.compile(func, backend=counter, fullgraph=True)(torch.ones(3), pg=tdist.group.WORLD)
    assert counter.frame_count == 1
    same(out, torch.ones(3) + (rank + 1) % world_size)


def test_meta(tdist):
    """On meta tensors the functional op only computes the shape."""
    x = torch.rand((2, 3, 4), device="meta")
    out = torch.ops._c10d_functional.all_reduce(x, "sum", tdist.group.WORLD.group_name)
    assert out.size() == x.size() and out.device.type == "meta"


# -- autograd -----------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_backwards(compiled, dynamo, tdist, rank, world_size):
    """Gradients through all_reduce, all_gather_tensor, reduce_scatter_tensor
    and all_to_all_single, against the chain rule worked out by hand: each
    rank weights its output by w_r = r + 1 and sums, so d(loss)/dx is the
    collective's adjoint applied to every rank's weights."""
    n, g = world_size, tdist.group.WORLD
    w = float(rank + 1)
    wsum = float(sum(range(1, n + 1)))

    def loss(x):
        ar = fc.all_reduce(x, "sum", g)  # grad: sum of every rank's w
        ag = fc.all_gather_tensor(x, 0, g)  # grad: every rank's w at my rows
        rs = fc.reduce_scatter_tensor(x, "sum", 0, g)  # grad: rank r's w on block r
        a2a = fc.all_to_all_single(x, None, None, g)  # grad: rank r's w on block r
        return w * (ar.sum() + ag.sum() + rs.sum() + a2a.sum())

    fn = torch.compile(loss, backend="aot_eager") if compiled else loss
    x = torch.ones(2 * n, 2, requires_grad=True)
    fn(x).backward()
    block = torch.cat([torch.full((2, 2), r + 1.0) for r in range(n)])
    same(x.grad, torch.full((2 * n, 2), 2 * wsum) + 2 * block)


def test_backward_refuses_a_reduction_it_cannot_differentiate(tdist):
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="only supports 'sum'"):
        fc.all_reduce(x, "max", tdist.group.WORLD).sum().backward()


def test_compiled_training_step_matches_one_process(dynamo, tdist, rank, world_size):
    """A data-parallel step, gradients averaged by functional all_reduce in
    an inductor-compiled function, equals full-batch SGD done locally."""
    n, g = world_size, tdist.group.WORLD

    def batch(r):
        gen = torch.Generator().manual_seed(100 + r)
        return torch.randn(8, 3, generator=gen), torch.randn(8, 1, generator=gen)

    @torch.compile(backend="inductor", fullgraph=True)
    def average(grads):
        return [fc.all_reduce(gr, "avg", g) for gr in grads]

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    xs, ys = batch(rank)
    all_x = torch.cat([batch(r)[0] for r in range(n)])
    all_y = torch.cat([batch(r)[1] for r in range(n)])
    for _ in range(3):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        params = list(model.parameters())
        for p, avg in zip(params, average([p.grad for p in params])):
            p.data -= 0.1 * avg
        reference.zero_grad()
        torch.nn.functional.mse_loss(reference(all_x), all_y).backward()
        for p in reference.parameters():
            p.data -= 0.1 * p.grad
    for p, q in zip(model.parameters(), reference.parameters()):
        same(p.detach(), q.detach())


def test_dtypes_through_the_backend(tdist, rank, world_size):
    """Every dtype torch and pycoll share, through the functional path."""
    for name, dtype in TORCH.items():
        if dtype in (torch.bool,) or dtype.is_complex:
            continue
        x = torch.full((4,), rank + 1).to(dtype)
        got = fc.wait_tensor(fc.all_reduce(x, "max", tdist.group.WORLD))
        assert got.dtype == dtype, name
        assert torch.equal(got, torch.full((4,), world_size).to(dtype)), name


def test_pycoll_functional_points_tensors_to_torchs_own(tdist):
    """pycoll.functional is for arrays; a tensor gets an error naming the way."""
    from pycoll import functional as F

    with pytest.raises(TypeError, match="torch.distributed._functional_collectives"):
        F.all_reduce(torch.ones(2), "sum")
    with pytest.raises(TypeError, match="torch.distributed._functional_collectives"):
        F.all_gather_tensor(torch.ones(2), 0, tdist.group.WORLD)
