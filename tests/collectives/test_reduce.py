"""all_reduce, all_reduce_coalesced, reduce, reduce_scatter, reduce_scatter_tensor:
every valid (op, dtype) pair, sync and async, against numpy's own reduction."""

import os
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, _mpi, persistent
from support import ALL_DTYPES, assert_equal, data, reduce_all, rop, settle, valid_pairs

PAIRS = valid_pairs()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_all_reduce(op, dtype, async_op, rank, world_size):
    x = data(rank, dtype, (2, 3))
    settle(pycoll.all_reduce(x, op=rop(op), async_op=async_op), async_op)
    assert_equal(x, reduce_all(op, [data(r, dtype, (2, 3)) for r in range(world_size)], world_size))


@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_to_every_root(op, dtype, rank, world_size):
    for dst in range(world_size):
        x = data(rank, dtype)
        original = x.copy()
        pycoll.reduce(x, dst=dst, op=rop(op))
        if rank == dst:
            assert_equal(x, reduce_all(op, [data(r, dtype) for r in range(world_size)], world_size))
        else:
            assert_equal(x, original)  # non-root inputs are left as they were


@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_async(op, dtype, rank, world_size):
    x = data(rank, dtype)
    settle(pycoll.reduce(x, dst=0, op=rop(op), async_op=True), True)
    if rank == 0:
        assert_equal(x, reduce_all(op, [data(r, dtype) for r in range(world_size)], world_size))


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter(op, dtype, async_op, rank, world_size):
    inputs = [data(rank, dtype, (3,), salt=7 * i) for i in range(world_size)]
    out = np.zeros(3, dtype)
    settle(pycoll.reduce_scatter(out, inputs, op=rop(op), async_op=async_op), async_op)
    mine = [data(r, dtype, (3,), salt=7 * rank) for r in range(world_size)]
    assert_equal(out, reduce_all(op, mine, world_size))


def test_reduce_scatter_list_forms(rank, world_size):
    """The synchronous list form's ways in: a list of separate arrays, a
    tuple, views of one buffer, a strided input (copied), and the output one
    of the inputs (each rank's part read before it is written)."""
    k = 5
    inputs = [np.arange(k, dtype=np.int64) + 100 * rank + 10 * i for i in range(world_size)]
    want = sum(np.arange(k, dtype=np.int64) + 100 * r + 10 * rank for r in range(world_size))
    got = []
    out = np.zeros(k, np.int64)
    pycoll.reduce_scatter(out, inputs)
    got.append(out)
    whole = np.concatenate(inputs)
    out = np.zeros(k, np.int64)
    pycoll.reduce_scatter(out, tuple(whole[i * k : (i + 1) * k] for i in range(world_size)))
    got.append(out)
    strided = [np.repeat(x, 2)[::2] for x in inputs]
    out = np.zeros(k, np.int64)
    pycoll.reduce_scatter(out, strided)
    got.append(out)
    shared = [x.copy() for x in inputs]
    pycoll.reduce_scatter(shared[rank], shared)
    got.append(shared[rank])
    for out in got:
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_tensor(op, dtype, async_op, rank, world_size):
    x = data(rank, dtype, (world_size * 2, 2))
    original = x.copy()
    out = np.zeros((2, 2), dtype)
    settle(pycoll.reduce_scatter_tensor(out, x, op=rop(op), async_op=async_op), async_op)
    total = reduce_all(
        op, [data(r, dtype, (world_size * 2, 2)) for r in range(world_size)], world_size
    )
    assert_equal(out, total[2 * rank : 2 * rank + 2])
    assert_equal(x, original)  # the input is not modified, even for PREMUL_SUM


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_all_reduce_coalesced(op, dtype, async_op, rank, world_size):
    shapes = [(3,), (2, 2), (), (0,)]
    xs = [data(rank, dtype, s, salt=i) for i, s in enumerate(shapes)]
    settle(pycoll.all_reduce_coalesced(xs, op=rop(op), async_op=async_op), async_op)
    for i, (x, s) in enumerate(zip(xs, shapes)):
        assert_equal(
            x, reduce_all(op, [data(r, dtype, s, salt=i) for r in range(world_size)], world_size)
        )


@pytest.mark.parametrize("op", ["SUM", "AVG", "PREMUL_SUM", "MAX"])
def test_all_reduce_coalesced_repeated_lists(op, rank, world_size):
    """The same list again (a training step's gradients) runs through a kept
    FusedAllReduce from its second call: each call still reduces the arrays'
    current values, a list with one array replaced is a new list, and an
    async call whose previous one is still in flight still gets its result."""
    dtype = np.dtype(np.float32)
    shapes = [(3,), (2, 2), (), (5,)] * 3  # 12 arrays: enough to be kept
    xs = [np.zeros(s, dtype) for s in shapes]

    def expect(step, arrays):
        for i, (x, s) in enumerate(zip(arrays, shapes)):
            inputs = [data(r, dtype, s, salt=i + step) for r in range(world_size)]
            assert_equal(x, reduce_all(op, inputs, world_size))

    for step in range(4):
        for i, (x, s) in enumerate(zip(xs, shapes)):
            x[...] = data(rank, dtype, s, salt=i + step)
        pycoll.all_reduce_coalesced(xs, op=rop(op))
        expect(step, xs)
    kept = pycoll.group.WORLD.attached("all_reduce_coalesced.fusions")
    mine = [fused for _, _, fused in kept.kept if fused.arrays[0] is xs[0]] if kept else []
    if op == "PREMUL_SUM":  # a new op object each call: never the same call again
        assert mine == []
    else:
        assert len(mine) == 1 and all(map(lambda a, b: a is b, mine[0].arrays, xs))
    ys = list(xs)
    ys[3] = np.zeros((5,), dtype)  # one array replaced: another list
    for i, (y, s) in enumerate(zip(ys, shapes)):
        y[...] = data(rank, dtype, s, salt=i + 9)
    pycoll.all_reduce_coalesced(ys, op=rop(op))
    expect(9, ys)
    works = []
    for step in (10, 11):  # the second call finds the first still in flight
        arrays = [x.copy() for x in xs] if step == 11 else xs
        for i, (x, s) in enumerate(zip(arrays, shapes)):
            x[...] = data(rank, dtype, s, salt=i + step)
        works.append((step, arrays, pycoll.all_reduce_coalesced(arrays, op=rop(op), async_op=True)))
    for step, arrays, work in reversed(works):
        assert work.wait()
        expect(step, arrays)


def test_a_kept_list_still_refuses_bad_arguments(pg, rank, world_size):
    """From the third call a kept list skips the per-item checks
    (pycoll.dispatch's ``known``); the call's other arguments are still
    checked before anything is sent, on every rank."""
    xs = [np.full(2, 1.0) for _ in range(10)]
    for _ in range(3):
        pycoll.all_reduce_coalesced(xs)
    before = pg.sequence_number()
    with pytest.raises(TypeError, match="async_op must be True or False"):
        pycoll.all_reduce_coalesced(xs, async_op="yes")
    assert pg.sequence_number() == before
    pycoll.all_reduce_coalesced(xs)
    for x in xs:
        assert_equal(x, np.full(2, float(world_size**4)))


def test_all_reduce_coalesced_cached_on_some_ranks_only(rank, world_size):
    """Rank 0 passes the same arrays every call (its calls run through a kept
    FusedAllReduce), the others new ones (theirs do not): the calls still
    agree, for DETAIL's check and for the call check past two exchanges."""
    from pycoll import crosscheck

    kept = [np.zeros(4, np.int64) for _ in range(10)]
    for step in range(2 * crosscheck.EVERY + 2 if crosscheck.EVERY else 20):
        xs = kept if rank == 0 else [np.zeros(4, np.int64) for _ in range(10)]
        for i, x in enumerate(xs):
            x[...] = rank + i + step
        pycoll.all_reduce_coalesced(xs)
        for i, x in enumerate(xs):
            assert (x == sum(r + i + step for r in range(world_size))).all()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_tensor_in_place(op, dtype, async_op, rank, world_size):
    """torch's in-place idiom: the output is this rank's slice of the input;
    the rest of the input is left as it was."""
    x = data(rank, dtype, (world_size * 4,))
    original = x.copy()
    mine = slice(rank * 4, (rank + 1) * 4)
    settle(pycoll.reduce_scatter_tensor(x[mine], x, op=rop(op), async_op=async_op), async_op)
    total = reduce_all(
        op, [data(r, dtype, (world_size * 4,)) for r in range(world_size)], world_size
    )
    assert_equal(x[mine], total[mine])
    original[mine] = total[mine]
    assert_equal(x, original)


def _large_part(dtype) -> int:
    """Elements in a part of PAIRWISE_PART_BYTES and a few more (an odd count),
    so that on MPICH the call takes MPI's v-form, run pairwise."""
    return _mpi.PAIRWISE_PART_BYTES // np.dtype(dtype).itemsize + 3


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_tensor_large_parts(op, dtype, async_op, in_place, rank, world_size):
    """Parts past the size from which MPICH's reduce-scatter runs pairwise
    through the v-form (pycoll._mpi.reduce_scatter_v), both forms."""
    k = _large_part(dtype)
    x = data(rank, dtype, (world_size * k,))
    original = x.copy()
    mine = slice(rank * k, (rank + 1) * k)
    out = x[mine] if in_place else np.zeros(k, dtype)
    settle(pycoll.reduce_scatter_tensor(out, x, op=rop(op), async_op=async_op), async_op)
    total = reduce_all(
        op, [data(r, dtype, (world_size * k,)) for r in range(world_size)], world_size
    )
    assert_equal(out, total[mine])
    if in_place:
        original[mine] = total[mine]
    assert_equal(x, original)


@pytest.mark.parametrize("op,dtype", PAIRS, ids=str)
def test_reduce_scatter_large_parts(op, dtype, rank, world_size):
    k = _large_part(dtype)
    inputs = [data(rank, dtype, (k,), salt=7 * i) for i in range(world_size)]
    out = np.zeros(k, dtype)
    pycoll.reduce_scatter(out, inputs, op=rop(op))
    mine = [data(r, dtype, (k,), salt=7 * rank) for r in range(world_size)]
    assert_equal(out, reduce_all(op, mine, world_size))


def test_reduce_scatter_takes_the_v_form_on_mpich(pg, world_size):
    """Where pycoll starts MPI on MPICH, it asks for the pairwise v-form and
    large parts take it (the tests above then run through it); elsewhere
    nothing changes. The variable is MPICH's, read at MPI_Init."""
    if world_size > 1:
        # pycoll.testing's ranks start MPI through pycoll (in a plain one-process
        # run the test modules' own mpi4py imports start it first).
        assert _mpi.STARTED_MPI
    mpich = _mpi.VENDOR == "MPICH"
    assert _mpi.REDUCE_SCATTER_PAIRWISE == (
        mpich and os.environ.get(_mpi.REDUCE_SCATTER_CVAR) == "sched_pairwise"
    )
    assert _mpi.reduce_scatter_v(_mpi.PAIRWISE_PART_BYTES) == _mpi.REDUCE_SCATTER_PAIRWISE
    assert not _mpi.reduce_scatter_v(_mpi.PAIRWISE_PART_BYTES - 1)
    assert persistent.LIMIT < _mpi.PAIRWISE_PART_BYTES  # plans keep the block form
    if _mpi.STARTED_MPI and mpich:
        default = os.environ.get(_mpi.REDUCE_SCATTER_CVAR, "sched_pairwise") == "sched_pairwise"
        assert _mpi.REDUCE_SCATTER_PAIRWISE == default


# A fresh process that starts MPI through pycoll as a singleton (no launcher,
# whose environment would name the variable) and prints the value Open MPI
# holds for libnbc's reduce algorithm, read back through MPI_T (by ctypes on
# the libmpi mpi4py loaded: mpi4py does not wrap the tool interface).
_READ_BACK = """
import ctypes
from pycoll import _mpi
_mpi.load()
lib, c = _mpi.library(), ctypes.c_int
assert lib.MPI_T_init_thread(0, ctypes.byref(c())) == 0
index, handle, value, count = c(), ctypes.c_void_p(), c(), c()
assert lib.MPI_T_cvar_get_index(b"coll_libnbc_ireduce_algorithm", ctypes.byref(index)) == 0
assert lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) == 0
assert lib.MPI_T_cvar_read(handle, ctypes.byref(value)) == 0
print(value.value)
"""


def _singleton(code: str, name: str, value: Optional[str]) -> str:
    """What ``code`` prints, run by a fresh process that starts MPI through
    pycoll as a singleton (no launcher's environment, which would name
    libnbc's variables) with the variable ``name`` set to ``value``, or unset
    where it is None. Open MPI only."""
    if _mpi.VENDOR != "Open MPI":
        pytest.skip("a variable of Open MPI's libnbc")
    keep = ("PATH", "HOME", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("OMPI_ALLOW")}
    env["OMPI_MCA_osc"] = "^ucx"  # (scripts/mpi.env: no bogus UCX message)
    if value is not None:
        env[name] = value
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("set_to", [None, "1"], ids=["unset", "set"])
def test_reduce_takes_the_binomial_tree_on_open_mpi(pg, set_to):
    """Where pycoll starts MPI, Open MPI's nonblocking reduce takes libnbc's
    binomial tree (2): its default choice took 4.5-5.9x the blocking reduce's
    time (docs/benchmarks.md). A value the user set stays."""
    out = _singleton(_READ_BACK, _mpi.REDUCE_MCA, set_to)
    assert out.split()[-1] == (set_to or "2")


@pytest.mark.parametrize("set_to", [None, "0", "1", "3"])
def test_all_reduce_notes_an_algorithm_chosen_for_libnbc(pg, set_to):
    """pycoll leaves Open MPI's nonblocking all_reduce algorithm as it finds
    it, and notes whether one was chosen (its choice of path,
    pycoll.collectives.reduce._binomial_in_place): unset, or 0, is libnbc's
    own choice."""
    code = (
        "import os\nfrom pycoll import _mpi\n_mpi.load()\n"
        "print(_mpi.ALL_REDUCE_CHOSEN, os.environ.get(_mpi.ALL_REDUCE_MCA))"
    )
    out = _singleton(code, _mpi.ALL_REDUCE_MCA, set_to)
    assert out.split()[-2:] == [str(set_to in ("1", "3")), str(set_to)]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_zero_size(dtype, pg):
    x = np.zeros((0, 3), dtype)
    pycoll.all_reduce(x)
    pycoll.reduce(x, dst=0)
    out = np.zeros((0,), dtype)
    pycoll.reduce_scatter_tensor(out, np.zeros(0, dtype))
    assert x.shape == (0, 3) and out.shape == (0,)


def test_all_reduce_64_mib(rank, world_size):
    n = 16 * 1024 * 1024  # 64 MiB of float32
    x = np.full(n, rank + 1, np.float32)
    x[-1] = 2 * (rank + 1)
    pycoll.all_reduce(x)
    total = world_size * (world_size + 1) / 2
    assert x[0] == total and x[n // 2] == total and x[-1] == 2 * total
    assert np.count_nonzero(x != total) == 1


def test_reduce_scatter_tensor_64_mib(rank, world_size):
    n = 16 * 1024 * 1024
    x = np.arange(n, dtype=np.float32) % 1024
    part = n // world_size
    out = np.empty(part, np.float32)
    pycoll.reduce_scatter_tensor(out, x[: part * world_size])
    np.testing.assert_array_equal(
        out, world_size * (np.arange(rank * part, (rank + 1) * part, dtype=np.float32) % 1024)
    )


def test_avg_float16_rounds_like_numpy(rank, world_size):
    """AVG in float16: an exact sum, then one correctly rounded division (so
    the result is numpy's float16 division of the exact sum)."""
    base = np.array([1.0, 2.0**-10, 3.0, 2048.0], np.float16)  # sums stay exact
    x = base * np.float16(rank + 1)
    pycoll.all_reduce(x, op=ReduceOp.AVG)
    exact_sum = base * np.float16(world_size * (world_size + 1) // 2)
    np.testing.assert_array_equal(x, exact_sum / np.float16(world_size))
