"""Bad input: a clear error on the calling rank, before anything is sent.

Every case checks the sequence number did not move (nothing was issued) and
then runs a real collective, which would hang or mismatch if any rank had
sent something."""

import numpy as np
import pytest

import pycoll


def raises(error, match, call):
    with pytest.raises(error, match=match):
        call()


def test_root_outside_the_group(unsent, world_size):
    rng = f"valid ranks are 0..{world_size - 1}"
    x = np.zeros(2)
    raises(
        ValueError,
        f"src={world_size} is not a rank of the group; {rng}",
        lambda: pycoll.broadcast(x, src=world_size),
    )
    raises(
        ValueError, f"dst=-1 is not a rank of the group; {rng}", lambda: pycoll.reduce(x, dst=-1)
    )
    raises(ValueError, rng, lambda: pycoll.gather(x, None, dst=world_size + 3))
    raises(ValueError, rng, lambda: pycoll.scatter(x, None, src=world_size))
    raises(ValueError, rng, lambda: pycoll.gather_object(1, None, dst=world_size))
    raises(ValueError, rng, lambda: pycoll.broadcast_object_list([1], src=world_size))
    raises(ValueError, rng, lambda: pycoll.send(x, dst=world_size))
    raises(ValueError, rng, lambda: pycoll.irecv(x, src=world_size))
    raises(TypeError, "src must be an int", lambda: pycoll.broadcast(x, src="0"))
    raises(TypeError, "dst must be an int", lambda: pycoll.reduce(x, dst=True))


def test_send_and_recv_to_oneself(unsent, rank):
    x = np.zeros(2)
    raises(ValueError, "own rank; a rank cannot send to itself", lambda: pycoll.send(x, rank))
    raises(
        ValueError, "own rank; a rank cannot receive from itself", lambda: pycoll.recv(x, src=rank)
    )
    raises(ValueError, "own rank", lambda: pycoll.isend(x, rank))
    raises(ValueError, "own rank", lambda: pycoll.send_object_list([1], dst=rank))
    raises(
        ValueError,
        "own rank",
        lambda: pycoll.batch_isend_irecv([pycoll.P2POp(pycoll.irecv, x, rank)]),
    )


def test_bad_tags(unsent, world_size):
    raises(
        ValueError,
        "tag must be an int in 0..32765, got -1",
        lambda: pycoll.recv(np.zeros(1), src=None, tag=-1),
    )
    raises(
        ValueError,
        "tag must be an int in 0..32765, got 32766",
        lambda: pycoll.irecv(np.zeros(1), src=None, tag=32766),
    )


def test_lists_whose_length_is_not_the_group_size(unsent, world_size, rank):
    n = world_size
    x = np.zeros(2)
    wrong = [np.zeros(2)] * (n + 1)
    msg = f"expecting {n} items, got {n + 1}"
    raises(ValueError, msg, lambda: pycoll.all_gather(wrong, x))
    raises(ValueError, msg, lambda: pycoll.reduce_scatter(x, wrong))
    raises(ValueError, msg, lambda: pycoll.all_to_all(wrong, [x] * n))
    raises(ValueError, msg, lambda: pycoll.all_to_all(wrong[:n], wrong))
    raises(ValueError, msg, lambda: pycoll.all_gather_coalesced([[x]] * (n + 1), [x]))
    raises(ValueError, msg, lambda: pycoll.all_gather_object([None] * (n + 1), 1))
    raises(
        ValueError,
        msg,
        lambda: pycoll.all_to_all_single(np.zeros(n), np.zeros(n), [1] * (n + 1), [1] * n),
    )
    raises(TypeError, "tensor_list must be a list", lambda: pycoll.all_gather(np.zeros(n), x))


def test_outputs_that_cannot_hold_the_result(unsent, world_size, rank):
    n = world_size
    raises(
        ValueError,
        f"output_tensor holds {2 * n + 1} elements but must hold {2 * n}",
        lambda: pycoll.all_gather_into_tensor(np.zeros(2 * n + 1), np.zeros(2)),
    )
    raises(
        ValueError,
        f"input holds {3 * n} elements but must hold {2 * n}",
        lambda: pycoll.reduce_scatter_tensor(np.zeros(2), np.zeros(3 * n)),
    )
    raises(
        ValueError,
        "output holds",
        lambda: pycoll.all_to_all_single(np.zeros(2 * n + 1), np.zeros(2 * n)),
    )
    raises(
        ValueError,
        r"tensor_list\[0\] has shape \(3,\) but must have the shape of tensor",
        lambda: pycoll.all_gather([np.zeros(3)] * n, np.zeros(2)),
    )
    raises(
        ValueError,
        r"input_list\[0\] has shape",
        lambda: pycoll.reduce_scatter(np.zeros(2), [np.zeros(4)] * n),
    )
    if n > 1:  # every size divides among one rank
        raises(
            ValueError,
            "which do not divide evenly among",
            lambda: pycoll.all_to_all_single(np.zeros(n * 2 + 1), np.zeros(n * 2 + 1)),
        )
    raises(
        ValueError,
        "sums to",
        lambda: pycoll.all_to_all_single(np.zeros(n), np.zeros(n), [1] * n, [2] * n),
    )
    raises(
        ValueError,
        "dimensions after the first must match",
        lambda: pycoll.all_to_all_single(np.zeros((n, 2)), np.zeros((n, 3)), [1] * n, [1] * n),
    )
    raises(
        ValueError,
        r"output_tensor_lists\[0\]\[0\] has shape",
        lambda: pycoll.all_gather_coalesced([[np.zeros(3)]] * n, [np.zeros(2)]),
    )


def test_non_contiguous_outputs(unsent, world_size, rank):
    strided = np.zeros(8)[::2]
    msg = "is not C-contiguous, so MPI cannot write the result into it"
    raises(ValueError, msg, lambda: pycoll.all_reduce(strided))
    raises(
        ValueError,
        msg,
        lambda: (
            pycoll.broadcast(strided, src=(rank + 1) % world_size)
            if world_size > 1
            else pycoll.recv(strided, src=None)
        ),
    )
    raises(ValueError, msg, lambda: pycoll.all_gather([strided] * world_size, np.zeros(4)))
    raises(ValueError, msg, lambda: pycoll.reduce_scatter_tensor(strided, np.zeros(4 * world_size)))
    raises(
        ValueError,
        msg,
        lambda: pycoll.scatter(
            strided, None if world_size > 1 else [np.zeros(4)], src=(rank + 1) % world_size
        ),
    )
    raises(ValueError, msg, lambda: pycoll.all_reduce(np.zeros((4, 4)).T))


def test_non_contiguous_inputs_are_copied(pg, rank, world_size):
    """An input that is only read may be strided: pycoll copies it for MPI."""
    base = np.arange(8.0) + rank
    out = [np.zeros(4) for _ in range(world_size)]
    pycoll.all_gather(out, base[::2])
    for r in range(world_size):
        np.testing.assert_array_equal(out[r], (np.arange(8.0) + r)[::2])


def test_read_only_outputs(unsent, world_size, rank):
    ro = np.zeros(4)
    ro.flags.writeable = False
    msg = "is read-only, so the result cannot be written into it"
    raises(ValueError, msg, lambda: pycoll.all_reduce(ro))
    raises(ValueError, msg, lambda: pycoll.reduce(ro, dst=rank))
    raises(
        ValueError,
        msg,
        lambda: pycoll.all_gather_into_tensor(
            ro, np.zeros(4 // world_size) if 4 % world_size == 0 else np.zeros(1)
        ),
    )
    raises(ValueError, msg, lambda: pycoll.all_to_all_single(ro, np.zeros(4)))
    raises(ValueError, msg, lambda: pycoll.all_reduce_coalesced([np.zeros(1), ro]))


def test_tensors_with_different_dtypes(unsent, world_size, rank):
    """The cases of torch's _test_tensor_dtype_mismatch."""
    n = world_size
    tensor = np.ones((2, 2), np.float32) * 7
    tensor_h = tensor.astype(np.float16)
    tensor_list = [np.zeros((2, 2), np.float32) for _ in range(n)]
    tensor_list_h = list(tensor_list)
    tensor_list_h[-1] = tensor_list_h[-1].astype(np.float16)
    msg = "tensors with different dtypes"
    raises(ValueError, msg, lambda: pycoll.all_gather(tensor_list_h, tensor))
    raises(ValueError, msg, lambda: pycoll.all_gather(tensor_list, tensor_h))
    raises(ValueError, msg, lambda: pycoll.all_gather_coalesced([tensor_list_h] * n, tensor_list))
    raises(ValueError, msg, lambda: pycoll.all_reduce_coalesced(tensor_list + [tensor_h]))
    raises(ValueError, msg, lambda: pycoll.reduce_scatter(tensor, tensor_list_h))
    raises(ValueError, msg, lambda: pycoll.reduce_scatter(tensor_h, tensor_list))
    raises(ValueError, msg, lambda: pycoll.all_to_all_single(tensor_h, tensor))
    raises(ValueError, msg, lambda: pycoll.all_to_all(tensor_list_h, tensor_list))
    raises(ValueError, msg, lambda: pycoll.all_to_all(tensor_list, tensor_list_h))
    raises(
        ValueError, msg, lambda: pycoll.all_gather_into_tensor(np.zeros(4 * n, np.float16), tensor)
    )
    raises(
        ValueError,
        msg,
        lambda: pycoll.reduce_scatter_tensor(np.zeros(4, np.float16), np.zeros(4 * n, np.float32)),
    )


def test_objects_that_are_not_arrays(unsent, world_size, rank):
    msg = "must be a numpy.ndarray, a torch tensor or a CUDA array .*, got list"
    raises(TypeError, msg, lambda: pycoll.all_reduce([1.0, 2.0]))
    raises(TypeError, msg, lambda: pycoll.broadcast([1.0], src=rank))
    raises(TypeError, msg, lambda: pycoll.all_gather([np.zeros(1)] * world_size, [1.0]))
    raises(TypeError, "got float", lambda: pycoll.reduce(3.0, dst=rank))
    raises(TypeError, "got int", lambda: pycoll.all_reduce_coalesced([np.zeros(1), 3]))
    raises(TypeError, "got str", lambda: pycoll.irecv("abc"))
    raises(
        TypeError,
        "object_list must be a list",
        lambda: pycoll.all_gather_object((None,) * world_size, 1),
    )


def test_unsupported_dtypes(unsent):
    raises(
        ValueError,
        "dtype object, which pycoll cannot send",
        lambda: pycoll.all_reduce(np.array([1, "a"], dtype=object)),
    )
    raises(
        ValueError,
        "dtype <U1, which pycoll cannot send",
        lambda: pycoll.broadcast(np.array(["a"]), src=0),
    )


def test_root_only_arguments(unsent, world_size, rank):
    """(A scatter_list that src refuses, or a gather_list that dst refuses, is
    not here: the root still takes part, so the group stays in step;
    tests/collectives/test_scatter.py and test_gather.py.)"""
    if world_size == 1:
        pytest.skip("needs a rank that is not the root")
    other = (rank + 1) % world_size
    raises(
        ValueError,
        "gather_list must be None on ranks other than dst",
        lambda: pycoll.gather(np.zeros(1), [np.zeros(1)] * world_size, dst=other),
    )
    raises(
        ValueError,
        "scatter_list must be None on ranks other than src",
        lambda: pycoll.scatter(np.zeros(1), [np.zeros(1)] * world_size, src=other),
    )
    raises(
        ValueError,
        "object_gather_list must be None on ranks other than dst",
        lambda: pycoll.gather_object(1, [None] * world_size, dst=other),
    )


def test_async_op_must_be_a_bool(unsent):
    x = np.ones(2)
    for bad in ("no", "yes", 1):
        raises(
            TypeError,
            f"all_reduce: async_op must be True or False, got {bad!r}",
            lambda bad=bad: pycoll.all_reduce(x, async_op=bad),
        )
    raises(
        TypeError,
        "broadcast: async_op must be True or False, got 'no'",
        lambda: pycoll.broadcast(x, src=0, async_op="no"),
    )


def test_an_op_given_as_a_string_names_the_reduce_op_meant(unsent):
    x = np.ones(2)
    raises(
        TypeError,
        r"all_reduce: op must be a pycoll.ReduceOp, one of ReduceOp.SUM, ReduceOp.AVG, .* or "
        r"make_premul_sum\(factor\), got 'sum' \(for 'sum', pass pycoll.ReduceOp.SUM\)",
        lambda: pycoll.all_reduce(x, op="sum"),
    )
    raises(TypeError, r"got 3$", lambda: pycoll.all_reduce(x, op=3))


def test_a_broadcast_view_is_named_as_read_only(unsent, world_size, rank):
    view = np.broadcast_to(np.ones(1), (4,))
    msg = r"tensor is a read-only view that repeats its elements \(as numpy.broadcast_to makes\)"
    raises(ValueError, msg, lambda: pycoll.all_reduce(view))
    if world_size > 1:
        raises(ValueError, msg, lambda: pycoll.broadcast(view, src=(rank + 1) % world_size))
