"""pycoll.arrays: the list forms' quick check of plain arrays, and the
check that two arrays share no memory.

plain_arrays lets a list form skip its per-array checks, so it must say
True only where every one of those checks would pass; the list forms' own
tests (tests/collectives) cover what the collectives do with either answer.
apart lets all_gather_into_tensor skip its overlap handling, so it must say
True only where the arrays share no byte.
"""

import numpy as np
import pytest

from pycoll.arrays import apart, plain_arrays

F4 = np.dtype(np.float32)


def _list(k: int = 3):
    return [np.zeros((2, 2), F4) for _ in range(k)]


def test_a_list_of_plain_arrays_passes():
    assert plain_arrays(_list(), 3, F4, (2, 2), writeable=True)
    whole = np.zeros((3, 2, 2), F4)
    assert plain_arrays(list(whole), 3, F4, (2, 2), writeable=True)  # (views of one buffer)
    assert plain_arrays([], 0, F4, (2, 2), writeable=True)


def _read_only():
    xs = _list()
    xs[1].flags.writeable = False
    return xs


@pytest.mark.parametrize(
    "xs,length,dtype,shape",
    [
        (tuple(_list()), 3, F4, (2, 2)),  # a tuple: the checked path takes it
        (_list(2), 3, F4, (2, 2)),
        (_list(), 3, np.dtype(np.float64), (2, 2)),
        (_list(), 3, F4, (4,)),
        ([np.zeros((2, 4), F4)[:, ::2]] * 3, 3, F4, (2, 2)),  # not C-contiguous
        (_read_only(), 3, F4, (2, 2)),
        ([np.zeros((2, 2), F4), [0.0] * 4, np.zeros((2, 2), F4)], 3, F4, (2, 2)),
    ],
    ids=["tuple", "length", "dtype", "shape", "strided", "read-only", "not-an-array"],
)
def test_anything_else_takes_the_checks(xs, length, dtype, shape):
    assert not plain_arrays(xs, length, dtype, shape, writeable=True)


def test_inputs_may_be_read_only():
    assert plain_arrays(_read_only(), 3, F4, (2, 2), writeable=False)


def test_apart_only_where_no_byte_is_shared():
    a, b = np.zeros(4, F4), np.zeros(4, F4)
    assert apart(a, b)  # each owns its memory
    assert not apart(a, a)
    whole = np.zeros(8, F4)
    assert apart(whole[:4], whole[4:])  # views of one buffer, side by side
    assert not apart(whole[:5], whole[4:])  # one element shared
    assert not apart(whole, whole[2:3])
    assert not apart(whole[:4], whole[:4].view(np.uint8))
    # over memory numpy does not own (as pycoll.torchcompat's views of tensors)
    over = np.frombuffer(bytearray(32), F4)
    assert apart(over, a) and not apart(over, over[1:2])
