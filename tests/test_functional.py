"""pycoll.functional: values against numpy's own answer on every rank, inputs
never written, results in flight until read (in any order, or never), and
bad arguments refused at the call on every rank."""

import copy
import pickle
import sys

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, make_premul_sum
from pycoll import functional as F
from support import ALL_DTYPES, BF16, PREMUL_SCALE, assert_equal, data, reduce_all, valid_pairs

F32 = np.dtype(np.float32)
SOME_DTYPES = [np.dtype(np.int8), np.dtype(np.uint64), np.dtype(np.float16), BF16, F32]


def rop(name):
    """The op as a user of torch's functional API writes it: a string, or
    pycoll's ReduceOp where no string exists (PREMUL_SUM)."""
    return make_premul_sum(PREMUL_SCALE) if name == "PREMUL_SUM" else name.lower()


def everyone(rank_data, world_size):
    return [rank_data(r) for r in range(world_size)]


def frozen(x):
    """``x`` made read-only: a functional collective must never need to write it."""
    x.flags.writeable = False
    return x


# -- values -------------------------------------------------------------------------


@pytest.mark.parametrize("op,dtype", valid_pairs(), ids=str)
def test_all_reduce(op, dtype, rank, world_size):
    x = frozen(data(rank, dtype, (2, 3)))
    y = F.all_reduce(x, rop(op), pycoll.group.WORLD)
    assert isinstance(y, F.AsyncArray)
    assert (y.shape, y.dtype) == ((2, 3), dtype)
    expected = reduce_all(op, [data(r, dtype, (2, 3)) for r in range(world_size)], world_size)
    assert_equal(F.wait_tensor(y), expected)
    assert_equal(x, data(rank, dtype, (2, 3)))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_all_gather_tensor(dtype, dim, rank, world_size):
    x = frozen(data(rank, dtype, (2, 3, 4)))
    y = F.all_gather_tensor(x, dim, None)
    expected = np.concatenate([data(r, dtype, (2, 3, 4)) for r in range(world_size)], axis=dim)
    assert y.shape == expected.shape
    assert_equal(F.wait_tensor(y), expected)
    assert_equal(x, data(rank, dtype, (2, 3, 4)))


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize(
    "op,dtype", [("SUM", d) for d in SOME_DTYPES] + [("AVG", F32), ("MAX", BF16)]
)
def test_reduce_scatter_tensor(op, dtype, dim, rank, world_size):
    shape = [2, 3, 2]
    shape[dim] = 2 * world_size
    x = frozen(data(rank, dtype, tuple(shape)))
    y = F.reduce_scatter_tensor(x, rop(op), dim, None)
    total = reduce_all(op, [data(r, dtype, tuple(shape)) for r in range(world_size)], world_size)
    expected = np.split(total, world_size, axis=dim)[rank]
    assert y.shape == expected.shape
    assert_equal(F.wait_tensor(y), expected)
    assert_equal(x, data(rank, dtype, tuple(shape)))


def block(src, dst, dtype, rows):
    """What rank ``src`` sends to rank ``dst``: ``rows`` rows tagged with both."""
    return data(src, dtype, (rows, 2), salt=10 * dst)


@pytest.mark.parametrize("dtype", SOME_DTYPES, ids=str)
def test_all_to_all_single_even(dtype, rank, world_size):
    x = frozen(np.concatenate([block(rank, d, dtype, 2) for d in range(world_size)]))
    y = F.all_to_all_single(x, None, None, None)
    expected = np.concatenate([block(s, rank, dtype, 2) for s in range(world_size)])
    assert_equal(F.wait_tensor(y), expected)


@pytest.mark.parametrize("dtype", SOME_DTYPES, ids=str)
def test_all_to_all_single_split_sizes(dtype, rank, world_size):
    def rows(src, dst):
        return (src + 2 * dst) % 3  # uneven, zero included

    send = [rows(rank, d) for d in range(world_size)]
    recv = [rows(s, rank) for s in range(world_size)]
    x = frozen(np.concatenate([block(rank, d, dtype, send[d]) for d in range(world_size)]))
    y = F.all_to_all_single(x, recv, send, None)
    assert y.shape == (sum(recv), 2)
    expected = np.concatenate([block(s, rank, dtype, recv[s]) for s in range(world_size)])
    assert_equal(F.wait_tensor(y), expected)


@pytest.mark.parametrize("shift", [0, 1, -1])
def test_permute_tensor(shift, rank, world_size):
    src_dst = [(m + shift) % world_size for m in range(world_size)]  # m sends to m + shift
    x = frozen(data(rank, F32, (3, 2)))
    y = F.permute_tensor(x, src_dst, None)
    assert_equal(F.wait_tensor(y), data((rank - shift) % world_size, F32, (3, 2)))


@pytest.mark.parametrize("dtype", SOME_DTYPES, ids=str)
def test_broadcast_from_the_last_group_rank(dtype, rank, world_size):
    x = frozen(data(rank, dtype, (5,)))
    y = F.broadcast(x, world_size - 1, None)
    assert_equal(F.wait_tensor(y), data(world_size - 1, dtype, (5,)))
    assert_equal(x, data(rank, dtype, (5,)))


def test_all_reduce_coalesced(rank, world_size):
    shapes = [(3,), (2, 2), (), (1, 0)]
    xs = [frozen(data(rank, F32, s, salt=i)) for i, s in enumerate(shapes)]
    ys = F.all_reduce_coalesced(xs, "max", None)
    for i, (x, y, s) in enumerate(zip(xs, ys, shapes)):
        assert y.shape == s
        expected = reduce_all("MAX", [data(r, F32, s, salt=i) for r in range(world_size)], 1)
        assert_equal(F.wait_tensor(y), expected)
        assert_equal(x, data(rank, F32, s, salt=i))


def test_all_gather_into_tensor_coalesced(rank, world_size):
    specs = [(np.dtype(np.int16), (2,)), (BF16, (1, 3)), (np.dtype(np.complex64), (4,))]
    xs = [frozen(data(rank, d, s)) for d, s in specs]
    ys = F.all_gather_into_tensor_coalesced(xs, None)
    for (d, s), y in zip(specs, ys):
        expected = np.concatenate([data(r, d, s) for r in range(world_size)])
        assert_equal(F.wait_tensor(y), expected)


def test_reduce_scatter_tensor_coalesced(rank, world_size):
    n = world_size
    shapes, dims = [(2 * n, 3), (2, 3 * n)], [0, 1]
    xs = [frozen(data(rank, F32, s, salt=i)) for i, s in enumerate(shapes)]
    ys = F.reduce_scatter_tensor_coalesced(xs, "sum", dims, None)
    for i, (y, s, d) in enumerate(zip(ys, shapes, dims)):
        total = reduce_all("SUM", [data(r, F32, s, salt=i) for r in range(n)], n)
        assert_equal(F.wait_tensor(y), np.split(total, n, axis=d)[rank])


def test_numpy_lists_take_one_operation(pg, rank, world_size):
    """A list of numpy arrays is one MPI operation (pycoll.collectives.coalesced):
    every dtype mixed in one all-gather; a reduce-scatter of one dtype along
    dimension 0 for every op and dtype; one along another dimension goes
    array by array, as before."""
    n = world_size
    shapes = [(2,), (1, 3), (3, 1), (4,)]
    specs = [(d, shapes[i % len(shapes)]) for i, d in enumerate(ALL_DTYPES)]
    xs = [frozen(data(rank, d, s, salt=i)) for i, (d, s) in enumerate(specs)]
    before = pg.sequence_number()
    ys = F.all_gather_into_tensor_coalesced(xs, None)
    assert pg.sequence_number() == before + 1
    for i, ((d, s), y) in enumerate(zip(specs, ys)):
        assert y.shape == (n * s[0],) + s[1:] and y.dtype == d
        expected = np.concatenate([data(r, d, s, salt=i) for r in range(n)])
        assert_equal(F.wait_tensor(y), expected)
    for op, dtype in valid_pairs():
        rs_shapes = [(2 * n, 3), (n,), (3 * n, 1, 2)]
        xs = [frozen(data(rank, dtype, s, salt=i)) for i, s in enumerate(rs_shapes)]
        before = pg.sequence_number()
        ys = F.reduce_scatter_tensor_coalesced(xs, rop(op), [0, 0, -3], None)
        assert pg.sequence_number() == before + 1
        for i, (y, s) in enumerate(zip(ys, rs_shapes)):
            total = reduce_all(op, [data(r, dtype, s, salt=i) for r in range(n)], n)
            assert_equal(F.wait_tensor(y), np.split(total, n)[rank])
    before = pg.sequence_number()
    ys = F.reduce_scatter_tensor_coalesced([np.ones((2, n)), np.ones(n)], "sum", [1, 0])
    assert pg.sequence_number() == before + 2
    assert_equal(F.wait_tensor(ys[0]), np.full((2, 1), float(n)))


def test_results_of_one_list_read_in_any_order_or_dropped(pg, rank, world_size):
    """The results of a list share one operation: reading any one waits for
    it; dropping some (or all) unread still completes it, on every rank."""
    n = world_size
    xs = [data(rank, F32, (k,), salt=k) for k in range(1, 9)]
    sums = [
        reduce_all("SUM", [data(r, F32, (k,), salt=k) for r in range(n)], 1) for k in range(1, 9)
    ]
    before = pg.sequence_number()
    kept = F.all_reduce_coalesced(xs, "sum")
    F.all_gather_into_tensor_coalesced(xs)  # every result dropped at once
    gathered = F.all_gather_into_tensor_coalesced(xs)
    del gathered[:-1]  # all but the last dropped unread
    assert_equal(F.wait_tensor(kept[-1]), sums[-1])  # the last read first
    del kept[2:5]
    for y, k in zip(kept, [1, 2, 6, 7, 8]):
        assert_equal(F.wait_tensor(y), sums[k - 1])
    expected = np.concatenate([data(r, F32, (8,), salt=8) for r in range(n)])
    assert_equal(F.wait_tensor(gathered[0]), expected)
    assert pg.sequence_number() == before + 3
    x = np.ones(4)
    pycoll.all_reduce(x)
    assert_equal(x, np.full(4, float(n)))


def test_non_contiguous_input(rank, world_size):
    """A strided view is gathered as its values (torch's
    test_allgather_contiguous_input)."""
    base = data(rank, F32, (4, 6))
    x = frozen(base[:, ::2])
    y = F.all_gather_tensor(x, 1, None)
    expected = np.concatenate([data(r, F32, (4, 6))[:, ::2] for r in range(world_size)], axis=1)
    assert_equal(F.wait_tensor(y), expected)


def test_torch_style_op_names(rank, world_size):
    x = np.full(2, rank + 1, np.int64)
    for name, want in [
        ("SUM", sum(range(1, world_size + 1))),
        ("Product", np.prod(range(1, world_size + 1))),
        ("min", 1),
        ("max", world_size),
        ("band", np.bitwise_and.reduce(np.arange(1, world_size + 1))),
        ("bor", np.bitwise_or.reduce(np.arange(1, world_size + 1))),
        ("bxor", np.bitwise_xor.reduce(np.arange(1, world_size + 1))),
    ]:
        assert_equal(F.wait_tensor(F.all_reduce(x, name)), np.full(2, want, np.int64))
    y = F.all_reduce(np.full(2, rank + 1.0), ReduceOp.AVG)
    assert_equal(F.wait_tensor(y), np.full(2, (world_size + 1) / 2))


# -- in flight until read -------------------------------------------------------------


def test_results_read_in_reverse_order_with_other_calls_between(rank, world_size):
    xs = [data(rank, F32, (4,), salt=i) for i in range(6)]
    ys = [F.all_reduce(x, "sum") for x in xs]
    z = np.full(3, float(rank))
    pycoll.all_reduce(z)  # the group used imperatively while they are in flight
    pycoll.barrier()
    assert_equal(z, np.full(3, float(sum(range(world_size)))))
    for i in reversed(range(6)):
        expected = reduce_all("SUM", [data(r, F32, (4,), salt=i) for r in range(world_size)], 1)
        assert_equal(F.wait_tensor(ys[i]), expected)


def test_results_never_read(pg, rank, world_size):
    """Dropped results still complete (on every rank, in order), so the group
    stays in step and nothing writes into freed memory."""
    before = pg.sequence_number()
    for i in range(20):
        F.all_reduce(np.full(1000, float(rank + i)), "sum")  # dropped at once
        F.all_gather_tensor(np.full((2, 2), rank, np.float16), 1)
    assert pg.sequence_number() == before + 40
    x = np.ones(4)
    pycoll.all_reduce(x)
    assert_equal(x, np.full(4, float(world_size)))


def test_every_way_of_reading_waits(rank, world_size):
    x = np.arange(4.0) + rank
    total = np.arange(4.0) * world_size + sum(range(world_size))

    def fresh():
        return F.all_reduce(x, "sum")

    np.testing.assert_array_equal(np.asarray(fresh()), total)
    np.testing.assert_array_equal(np.array(fresh(), copy=True), total)
    np.testing.assert_array_equal(fresh() + 1, total + 1)  # operators
    np.testing.assert_array_equal(np.sqrt(fresh()), np.sqrt(total))  # ufuncs
    np.testing.assert_array_equal(np.concatenate([fresh(), x]), np.concatenate([total, x]))
    assert fresh().sum() == total.sum()  # methods
    assert fresh()[2] == total[2] and list(fresh()) == list(total)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(fresh())), total)
    np.testing.assert_array_equal(copy.deepcopy(fresh()), total)
    assert float(F.all_reduce(np.array(1.5), "sum")) == 1.5 * world_size
    assert repr(fresh()).startswith("AsyncArray(array([")
    np.testing.assert_array_equal(x + fresh(), x + total)  # numpy array on the left
    assert x @ fresh() == x @ total and fresh() @ x == total @ x
    z = x.copy()
    z += fresh()  # in place into a numpy array
    np.testing.assert_array_equal(z, x + total)
    w = fresh()
    w += 1  # in place into the result: w is then the plain array
    assert type(w) is np.ndarray
    np.testing.assert_array_equal(w, total + 1)
    y = fresh()
    assert (y.ndim, y.size, y.nbytes, len(y)) == (1, 4, 32, 4)  # metadata
    y[0] = -1.0  # the result is the caller's to write
    assert y[0] == -1.0 and y.done()


def test_results_feed_other_collectives(rank, world_size):
    """A pending result passed to pycoll (functional or imperative) or to
    mpi4py is waited for first."""
    from mpi4py import MPI

    x = np.full(3, rank + 1.0)
    s = sum(range(1, world_size + 1))
    y = F.all_gather_tensor(F.all_reduce(x, "sum"), 0)
    np.testing.assert_array_equal(np.asarray(y), np.full(3 * world_size, float(s)))
    z = F.all_reduce(x, "sum")
    pycoll.all_reduce(z)  # in place, on the waited value
    np.testing.assert_array_equal(F.wait_tensor(z), np.full(3, float(s * world_size)))
    out = np.empty(3)
    MPI.COMM_WORLD.Allreduce(F.all_reduce(x, "sum"), out)
    np.testing.assert_array_equal(out, np.full(3, float(s * world_size)))


def test_buffer_protocol(rank, world_size):
    """Python 3.12+ gives classes the buffer protocol (waiting first); before,
    raw-buffer readers get a TypeError, never unfinished memory."""
    y = F.all_reduce(np.full(2, 1.0), "sum")
    if sys.version_info >= (3, 12):
        assert memoryview(y).tobytes() == np.full(2, float(world_size)).tobytes()
    else:
        with pytest.raises(TypeError):
            memoryview(y)
    np.testing.assert_array_equal(F.wait_tensor(y), np.full(2, float(world_size)))


def test_wait_tensor_on_a_plain_array():
    x = np.ones(2)
    assert F.wait_tensor(x) is x


# -- groups ---------------------------------------------------------------------------


def test_group_as_rank_lists(pg, rank, world_size):
    """Evens and odds run on their own groups at once (each made by its members
    only, once, and kept with the default group); a mesh of singletons gives
    every rank its own value."""
    mine = [r for r in range(world_size) if r % 2 == rank % 2]
    x = np.full(2, rank + 1, np.int64)
    for _ in range(3):
        y = F.all_reduce(x, "sum", mine[::-1])  # any order names the same group
        assert_equal(F.wait_tensor(y), np.full(2, sum(r + 1 for r in mine), np.int64))
    if len(mine) < world_size:
        made = pg.attached("functional.groups")
        assert made is not None and made[tuple(mine)].ranks == mine
    mesh = [[r] for r in range(world_size)]
    assert_equal(F.wait_tensor(F.all_reduce(x, "sum", mesh)), x)
    everyone = F.all_gather_tensor(x, 0, list(range(world_size)))
    assert_equal(
        F.wait_tensor(everyone), np.repeat(np.arange(1, world_size + 1), 2).astype(np.int64)
    )


def test_subgroup_ranks_are_group_ranks(rank, world_size):
    """broadcast's src and permute_tensor's src_dst count within the group."""
    pairs = [list(range(s, min(s + 2, world_size))) for s in range(0, world_size, 2)]
    mine = next(p for p in pairs if rank in p)
    y = F.broadcast(np.full(1, rank), len(mine) - 1, mine)
    assert_equal(F.wait_tensor(y), np.full(1, mine[-1]))


# -- errors at the call, on every rank ------------------------------------------------


def test_bad_arguments(unsent, rank, world_size):
    n = world_size
    x = np.zeros((2, 3))
    cases = [
        (ValueError, "gather_dim=2 is out of range", lambda: F.all_gather_tensor(x, 2)),
        (TypeError, "gather_dim must be an int", lambda: F.all_gather_tensor(x, 0.0)),
        (ValueError, "0-d array", lambda: F.all_gather_tensor(np.zeros(()), 0)),
        (
            ValueError,
            "scatter_dim=-3 is out of range",
            lambda: F.reduce_scatter_tensor(x, "sum", -3),
        ),
        (ValueError, "unknown reduceOp 'mean'", lambda: F.all_reduce(x, "mean")),
        (TypeError, "reduceOp must be a string or a ReduceOp", lambda: F.all_reduce(x, 1)),
        (TypeError, "must be a numpy array", lambda: F.all_reduce([1.0, 2.0], "sum")),
        (TypeError, "wrap a scalar", lambda: F.all_reduce(np.float64(1.0), "sum")),
        (ValueError, "given together", lambda: F.all_to_all_single(x, [2] + [0] * (n - 1), None)),
        (
            ValueError,
            f"must be {n} non-negative ints",
            lambda: F.all_to_all_single(x, [1] * (n + 1), [1] * (n + 1)),
        ),
        (ValueError, "add up to", lambda: F.all_to_all_single(x, [0] * n, [0] * n)),
        (ValueError, "permutation", lambda: F.permute_tensor(x, [0] * (n + 1))),
        (ValueError, f"src={n} must be a group rank", lambda: F.broadcast(x, n)),
        (
            ValueError,
            "share one dtype",
            lambda: F.all_reduce_coalesced([x, x.astype(np.int8)], "sum"),
        ),
        (ValueError, "is empty", lambda: F.all_reduce_coalesced([], "sum")),
        (TypeError, "must be a list", lambda: F.all_gather_into_tensor_coalesced(x)),
        (
            ValueError,
            "one dimension per input",
            lambda: F.reduce_scatter_tensor_coalesced([x], "sum", [0, 1]),
        ),
        (  # the item at fault is named by its index
            TypeError,
            r"self\[2\] must be a numpy array",
            lambda: F.all_gather_into_tensor_coalesced([x, x, "x"]),
        ),
        (
            ValueError,
            r"self\[1\] is a 0-d array",
            lambda: F.all_gather_into_tensor_coalesced([x, np.zeros(())]),
        ),
        (
            ValueError,
            r"scatter_dim\[1\]=5 is out of range",
            lambda: F.reduce_scatter_tensor_coalesced([np.zeros(n)] * 2, "sum", [0, 5]),
        ),
        (
            ValueError,
            r"dimension 0 of inputs\[1\] has size",
            lambda: F.reduce_scatter_tensor_coalesced(
                [np.zeros(n), np.zeros(n + 1)], "sum", [0, 0]
            ),
        )
        if n > 1
        else (ValueError, "is empty", lambda: F.all_reduce_coalesced([], "sum")),
        (ValueError, "must list distinct ranks", lambda: F.all_reduce(x, "sum", [rank, rank])),
        (ValueError, "must list distinct ranks", lambda: F.all_reduce(x, "sum", [rank, n])),
        (TypeError, "must hold global ranks", lambda: F.all_reduce(x, "sum", ["0"])),
        (TypeError, "group must be a pycoll ProcessGroup", lambda: F.all_reduce(x, "sum", "world")),
    ]
    if n > 1:
        odd = np.zeros((2 * n + 1, 2))
        cases += [
            (ValueError, "not divisible", lambda: F.reduce_scatter_tensor(odd, "sum", 0)),
            (ValueError, "not divisible", lambda: F.all_to_all_single(odd, None, None)),
            (
                ValueError,
                f"rank {rank} is not in group",
                lambda: F.all_reduce(x, "sum", [(rank + 1) % n]),
            ),
            (
                ValueError,
                "one size",
                lambda: F.all_reduce(
                    x, "sum", [[0], list(range(1, n))] if n > 2 else [[0, 1], [1]]
                ),
            ),
        ]
    for error, match, call in cases:
        with pytest.raises(error, match=match):
            call()


def test_errors_of_the_imperative_checks_reach_the_caller(unsent):
    with pytest.raises(ValueError, match="AVG"):
        F.all_reduce(np.zeros(2, np.int32), "avg")
