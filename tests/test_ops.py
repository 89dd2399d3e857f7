"""ReduceOp semantics (as torch's ReduceOpTest) and the (op, dtype) validity table."""

import copy
import pickle

import numpy as np
import pytest

import pycoll
from pycoll import ReduceOp, make_premul_sum
from support import invalid_pairs

# Any size of job: an op's plan does not depend on the group's size.
pytestmark = pytest.mark.any_size

MEMBERS = [
    ReduceOp.SUM,
    ReduceOp.AVG,
    ReduceOp.PRODUCT,
    ReduceOp.MIN,
    ReduceOp.MAX,
    ReduceOp.BAND,
    ReduceOp.BOR,
    ReduceOp.BXOR,
]
SCALES = [np.array(1.0), 2.0, np.array([3.0])]


@pytest.mark.parametrize("op", MEMBERS, ids=repr)
def test_members_are_reduceops(op):
    assert isinstance(op, ReduceOp)
    assert op.name in repr(op)


@pytest.mark.parametrize("scale", SCALES, ids=repr)
def test_premul_sum_is_a_reduceop(scale):
    op = make_premul_sum(scale)
    assert isinstance(op, ReduceOp)
    assert op.name == "PREMUL_SUM"
    assert op.scale == float(np.asarray(scale).reshape(()))


@pytest.mark.parametrize("op", MEMBERS, ids=repr)
def test_copy_deepcopy_and_copy_construct(op):
    assert copy.copy(op) == op
    assert copy.deepcopy(op) == op
    assert copy.copy(ReduceOp(op)) == op
    assert copy.deepcopy(ReduceOp(op)) == op


@pytest.mark.parametrize("op", MEMBERS, ids=repr)
def test_pickle_round_trip(op):
    assert pickle.loads(pickle.dumps(op)) == op
    orig = ReduceOp(op)
    assert pickle.loads(pickle.dumps(orig)) == orig


@pytest.mark.parametrize("scale", SCALES, ids=repr)
def test_premul_sum_copies_and_pickles(scale):
    op = make_premul_sum(scale)
    assert copy.copy(op) == op
    assert copy.deepcopy(op) == op
    assert pickle.loads(pickle.dumps(op)) == op
    assert make_premul_sum(2.0) != make_premul_sum(3.0)
    assert make_premul_sum(2.0) != ReduceOp.SUM


@pytest.mark.parametrize("op", MEMBERS, ids=repr)
def test_equality(op):
    obj = ReduceOp(op)
    assert obj == obj
    assert obj == op
    assert op == obj  # symmetric, unlike torch's RedOpType quirk
    assert (obj == "abc") is False
    assert (op == "abc") is False
    assert obj != "abc"
    assert None not in (op, obj)
    assert "abc" not in (op, obj)
    assert hash(obj) == hash(op)
    others = [m for m in MEMBERS if m is not op]
    assert all(op != m for m in others)


def test_constructing_from_an_unknown_name_fails():
    with pytest.raises(ValueError, match="unknown reduce op"):
        ReduceOp("MEDIAN")
    assert ReduceOp("sum") == ReduceOp.SUM


def test_reduceops_are_immutable():
    with pytest.raises(AttributeError):
        ReduceOp.SUM._name = "MAX"


@pytest.mark.parametrize("bad", ["2", None, True, np.zeros(2)])
def test_premul_sum_rejects_bad_scales(bad):
    with pytest.raises((TypeError, ValueError), match="scale"):
        make_premul_sum(bad)


@pytest.mark.parametrize("op,dtype", invalid_pairs(), ids=str)
def test_undefined_pairs_name_op_and_dtype(op, dtype, pg):
    rop = make_premul_sum(2.0) if op == "PREMUL_SUM" else getattr(ReduceOp, op)
    x = np.zeros(3, dtype)
    before = pg.sequence_number()
    with pytest.raises(ValueError, match=f"ReduceOp.{op} is not defined for dtype {dtype}"):
        pycoll.all_reduce(x, op=rop)
    assert pg.sequence_number() == before  # refused before anything was sent


def test_op_of_wrong_type(pg):
    with pytest.raises(TypeError, match="op must be a pycoll.ReduceOp"):
        pycoll.all_reduce(np.zeros(2), op="sum")


def test_complex_scale_on_real_dtype(pg):
    with pytest.raises(ValueError, match="complex PREMUL_SUM scale"):
        pycoll.all_reduce(np.zeros(2), op=make_premul_sum(1j))


def _fresh(code: str, settings: dict, check: bool = True):
    """``code`` run by a fresh interpreter (pycoll reads these settings at
    import) with each environment variable of ``settings`` set to its value,
    or unset where that is None; its completed process, output as text."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in settings}
    env.update({k: v for k, v in settings.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=check
    )


@pytest.mark.one_process
@pytest.mark.parametrize(
    "value,expected",
    [(None, (4 << 20, 8 << 20)), ("0", (0, 0)), ("1", (1, 1)), ("65536", (65536, 65536))],
)
def test_split_bytes_defaults_and_override(value, expected):
    # The defaults differ by rank count (measured crossovers); a value the user
    # sets applies to every rank count. Read at import: a fresh interpreter each.
    code = "from pycoll import ops; print(ops.SPLIT_BYTES, ops.SPLIT_BYTES_TWO_RANKS)"
    out = _fresh(code, {"PYCOLL_SPLIT_BYTES": value}).stdout.split()
    assert tuple(map(int, out)) == expected


@pytest.mark.one_process
@pytest.mark.parametrize("value", [None, "0", "1048576"])
def test_shm_bytes_default_and_override(value):
    """PYCOLL_SHM_BYTES, where set, is where every group's all_reduce takes the
    shared window, whatever its size and MPI (0: never); unset, the window
    waits for 32 MiB on power-of-two groups. Read at import: a fresh
    interpreter each."""
    code = (
        "from pycoll import _mpi\n"
        "from pycoll.paths import rule as r\n"
        "_mpi.VENDOR = 'MPICH'\n"
        "print(r.shm_least(), *(int(r.takes_window(n, 1 << 20)) for n in (2, 3, 4)))"
    )
    out = _fresh(code, {"PYCOLL_SHM_BYTES": value}).stdout.split()
    want = {None: [1 << 20, 0, 1, 0], "0": [0, 0, 0, 0], "1048576": [1 << 20, 1, 1, 1]}[value]
    assert list(map(int, out)) == want


@pytest.mark.one_process
def test_shm_bytes_must_be_a_number_of_bytes():
    out = _fresh("import pycoll.collectives.reduce", {"PYCOLL_SHM_BYTES": "1M"}, check=False)
    assert out.returncode != 0
    assert (
        "PYCOLL_SHM_BYTES='1M': set it to a number of bytes (0: never through the shared window)"
        in out.stderr
    )


# The size variables of pycoll's own paths (pycoll.paths.rule), each
# with what the import leaves in two of its names, unset and set:
# PAIRWISE_BYTES (MPICH, 1 MiB) and _OPEN_MPI (256 KiB); DOUBLING_BYTES (64
# KiB where Open MPI's binomial tree would run) and whether it was set (then
# on any MPI and wait mode); TO_ROOT_BYTES (MPICH, 64 KiB) and _OPEN_MPI
# (8 MiB); SCATTERED_BYTES (16 MiB where MPICH runs its reduce-scatter
# pairwise) and whether it was set (then on any MPI).
SIZE_VARIABLES = {
    "PYCOLL_PAIRWISE_BYTES": ("r.PAIRWISE_BYTES, r.PAIRWISE_BYTES_OPEN_MPI", (1 << 20, 256 << 10)),
    "PYCOLL_DOUBLING_BYTES": ("r.DOUBLING_BYTES, int(r._DOUBLING_SET is not None)", (64 << 10, 0)),
    "PYCOLL_TO_ROOT_BYTES": ("r.TO_ROOT_BYTES, r.TO_ROOT_BYTES_OPEN_MPI", (64 << 10, 8 << 20)),
    "PYCOLL_SCATTERED_BYTES": (
        "r.SCATTERED_BYTES, int(r._SCATTERED_SET is not None)",
        (16 << 20, 0),
    ),
    "PYCOLL_PAIR_BYTES": ("pair.BYTES, int(pair._SET is not None)", (64 << 10, 0)),
}


@pytest.mark.one_process
@pytest.mark.parametrize("value", [None, "0", "4096"], ids=["unset", "0", "4096"])
def test_a_path_size_default_and_override(value):
    """Each variable, where set, is its path's size on every MPI (0: never),
    the second name following it (the Open MPI size, or the flag that it was
    set); unset, the measured defaults. Read at import: one fresh interpreter
    with every variable set (or unset) the same."""
    names = ", ".join(names for names, _ in SIZE_VARIABLES.values())
    code = (
        f"from pycoll.collectives import pair\nfrom pycoll.paths import rule as r\nprint({names})"
    )
    out = _fresh(code, dict.fromkeys(SIZE_VARIABLES, value))
    got = tuple(map(int, out.stdout.split()))
    want: tuple = ()
    for names, default in SIZE_VARIABLES.values():
        if value is None:
            want += default
        else:
            want += (int(value), 1 if "_SET" in names else int(value))
    assert got == want


@pytest.mark.one_process
@pytest.mark.parametrize("name", list(SIZE_VARIABLES))
def test_a_path_size_that_is_not_a_number_of_bytes_stops_the_import(name):
    out = _fresh("import pycoll.collectives.reduce", {name: "4M"}, check=False)
    assert out.returncode != 0
    assert f"{name}='4M': set it to a number of bytes (0: never)" in out.stderr
