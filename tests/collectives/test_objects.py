"""Object collectives: all_gather_object, gather_object, broadcast_object_list,
scatter_object_list, send_object_list, recv_object_list."""

import numpy as np
import pytest

import pycoll
from pycoll.collectives import objects as objects_module


class Foo:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        def same(a, b):
            return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b

        return type(other) is Foo and all(
            same(v, other.__dict__[k]) for k, v in self.__dict__.items()
        )


def objects(rank):
    """Objects like torch's COLLECTIVES_OBJECT_TEST_LIST, different on every rank."""
    f = Foo(10 + rank)
    f.bar = rank
    return [
        {"key1": 3, "key2": rank, "key3": {"nested": True}},
        f,
        Foo(np.arange(9.0).reshape(3, 3) * rank),
        "foo" * (rank + 1),
        [1, 2, True, "string", [4, 5, "nested", rank]],
    ]


def test_all_gather_object(rank, world_size):
    for i in range(5):
        out = [None] * world_size
        pycoll.all_gather_object(out, objects(rank)[i])
        assert out == [objects(r)[i] for r in range(world_size)]


def test_gather_object_to_every_root(rank, world_size):
    for dst in range(world_size):
        out = [None] * world_size if rank == dst else None
        pycoll.gather_object(objects(rank), out, dst=dst)
        if rank == dst:
            assert out == [objects(r) for r in range(world_size)]


def test_broadcast_object_list(rank, world_size):
    for src in range(world_size):
        lst = objects(rank) if rank == src else [None] * 5
        pycoll.broadcast_object_list(lst, src=src)
        assert lst == objects(src)


def test_scatter_object_list(rank, world_size):
    for src in range(world_size):
        out = [None]
        inputs = [objects(r) for r in range(world_size)] if rank == src else None
        pycoll.scatter_object_list(out, inputs, src=src)
        assert out == [objects(rank)]


def test_send_and_recv_object_list(rank, world_size):
    if world_size == 1:
        pytest.skip("point-to-point needs two ranks")
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    if rank % 2 == 0:
        pycoll.send_object_list(objects(rank), dst=right)
    out = [None] * 5
    assert pycoll.recv_object_list(out, src=left) == left
    if rank % 2 == 1:
        pycoll.send_object_list(objects(rank), dst=right)
    assert out == objects(left)


def test_object_collectives_count_once(pg, rank, world_size):
    before = pg.sequence_number()
    pycoll.all_gather_object([None] * world_size, rank)
    pycoll.gather_object(rank, [None] * world_size if rank == 0 else None, dst=0)
    pycoll.broadcast_object_list([rank], src=0)
    pycoll.scatter_object_list([None], list(range(world_size)) if rank == 0 else None, src=0)
    assert pg.sequence_number() == before + 4


def test_unpicklable_object_raises_on_every_rank(rank, world_size):
    obj = (lambda: 0) if rank == world_size - 1 else rank
    with pytest.raises(TypeError, match="could not be pickled") as info:
        pycoll.all_gather_object([None] * world_size, obj)
    if rank != world_size - 1:
        assert f"rank(s) [{world_size - 1}]" in str(info.value)
    # The group is still usable: nothing was left half-sent.
    out = [None] * world_size
    pycoll.all_gather_object(out, rank)
    assert out == list(range(world_size))


def test_unpicklable_broadcast_raises_everywhere(rank):
    lst = [lambda: 0] if rank == 0 else [None]
    with pytest.raises(TypeError, match="could not be pickled"):
        pycoll.broadcast_object_list(lst, src=0)


@pytest.mark.parametrize(
    "which, bad, problem",
    [
        (
            "gather_object",
            lambda n: [None] * (n + 1),
            "object_gather_list must hold one entry per rank of the group: expecting {n} items",
        ),
        ("gather_object", lambda n: "slots", "object_gather_list must be a list"),
        (
            "scatter_object_list",
            lambda n: [1] * (n + 1),
            "input_list must hold one entry per rank of the group: expecting {n} items",
        ),
        ("scatter_object_list", lambda n: None, "scatter_object_input_list must be a list"),
    ],
    ids=["gather length", "gather type", "scatter length", "scatter missing"],
)
def test_a_list_only_the_root_can_refuse_makes_every_rank_raise(
    rank, world_size, which, bad, problem
):
    """The root still takes part and says it refused, so every rank raises and
    the next collective pairs with the next one."""
    out = ["untouched"]
    mine = bad(world_size) if rank == 0 else None
    with pytest.raises((ValueError, TypeError)) as caught:
        if which == "gather_object":
            pycoll.gather_object(rank, mine, dst=0)
        else:
            pycoll.scatter_object_list(out, mine, src=0)
    if rank == 0:
        assert problem.format(n=world_size) in str(caught.value), caught.value
    else:
        assert str(caught.value).startswith(f"{which}: "), caught.value
        assert "(rank 0) refused its" in str(caught.value), caught.value
        assert "nothing was exchanged" in str(caught.value)
    assert out == ["untouched"]
    x = np.ones(2) * (rank + 1)
    pycoll.all_reduce(x)
    assert (x == world_size * (world_size + 1) / 2).all()


def test_broadcast_length_mismatch(debug_off, rank, world_size):
    if world_size == 1:
        pytest.skip("needs a receiving rank")
    lst = [1, 2, 3] if rank == 0 else [None]
    if rank == 0:
        pycoll.broadcast_object_list(lst, src=0)
    else:
        with pytest.raises(ValueError, match="1 entries on this rank but 3 on src"):
            pycoll.broadcast_object_list(lst, src=0)


LARGE = (1 << 31) + 4099  # past MPI's int count limit, and not whole 1 MiB blocks
MARKS = [0, 1 << 30, (1 << 31) - 1, 1 << 31, LARGE - 1]


@pytest.fixture
def two_ranks(world_size):
    if world_size != 2:
        pytest.skip("the >2 GiB object tests run at 2 ranks (memory)")


def big(seed):
    """A 2 GiB+ object with known bytes either side of the 2**31 boundary."""
    b = bytearray(LARGE)
    for i, m in enumerate(MARKS):
        b[m] = seed + i
    return b


def check_big(obj, seed):
    assert len(obj) == LARGE
    assert [obj[m] for m in MARKS] == [seed + i for i in range(len(MARKS))]


def test_objects_over_2_gib(two_ranks, rank):
    """A real 2 GiB+ payload through MPI, by collective (Bcast) and by Send/Recv."""
    lst = [big(7)] if rank == 0 else [None]
    pycoll.broadcast_object_list(lst, src=0)
    check_big(lst[0], 7)
    del lst
    if rank == 1:
        pycoll.send_object_list([big(20)], dst=0)
    else:
        out = [None]
        assert pycoll.recv_object_list(out, src=1) == 1
        check_big(out[0], 20)


SMALL_LIMIT = (2 << 20) + 3  # stands in for MPI's int limit below


def sized(seed, nbytes=(5 << 20) + 7):
    b = bytearray(nbytes)
    b[0], b[nbytes // 2], b[-1] = seed % 256, (seed + 1) % 256, (seed + 2) % 256
    return b


def test_every_function_takes_the_large_path(monkeypatch, rank, world_size):
    """With the count limit lowered, every object function moves its payloads
    as whole blocks plus a tail; the results must be the same."""
    monkeypatch.setattr(objects_module, "_INT_MAX", SMALL_LIMIT)
    monkeypatch.setattr(objects_module, "_chunk_type", None)
    out = [None] * world_size
    pycoll.all_gather_object(out, sized(rank))
    assert out == [sized(r) for r in range(world_size)]
    out = [None] * world_size if rank == 0 else None
    pycoll.gather_object(sized(rank + 10), out, dst=0)
    if rank == 0:
        assert out == [sized(r + 10) for r in range(world_size)]
    lst = [sized(30)] if rank == 0 else [None]
    pycoll.broadcast_object_list(lst, src=0)
    assert lst == [sized(30)]
    out = [None]
    pycoll.scatter_object_list(
        out, [sized(r + 40) for r in range(world_size)] if rank == 0 else None, src=0
    )
    assert out == [sized(rank + 40)]
    if world_size > 1:
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        if rank % 2 == 0:
            pycoll.send_object_list([sized(rank + 50)], dst=right)
        got = [None]
        assert pycoll.recv_object_list(got, src=left) == left
        if rank % 2 == 1:
            pycoll.send_object_list([sized(rank + 50)], dst=right)
        assert got == [sized(left + 50)]
