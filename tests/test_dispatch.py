"""The device door (pycoll.dispatch): every collective that takes arrays is
declared once, and its public front behaves as its numpy body."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import pycoll
from pycoll.dispatch import collective
from pycoll.spec import IN, INOUT, LIST, OUT, UNKNOWN, Array

# Written out by hand: the collectives whose arrays a device can hold.
DECLARED = {
    "all_reduce": {"tensor": INOUT},
    "all_reduce_coalesced": {"tensors": INOUT},
    "reduce": {"tensor": IN},
    "reduce_scatter": {"output": OUT, "input_list": IN},
    "reduce_scatter_tensor": {"output": OUT, "input": IN},
    "all_gather": {"tensor_list": OUT, "tensor": IN},
    "all_gather_into_tensor": {"output_tensor": OUT, "input_tensor": IN},
    "all_gather_coalesced": {"output_tensor_lists": OUT, "input_tensor_list": IN},
    "gather": {"tensor": IN, "gather_list": OUT},
    "scatter": {"tensor": OUT, "scatter_list": IN},
    "broadcast": {"tensor": OUT},
    "all_to_all": {"output_tensor_list": OUT, "input_tensor_list": IN},
    "all_to_all_single": {"output": OUT, "input": IN},
    "send": {"tensor": IN},
    "recv": {"tensor": OUT},
    "isend": {"tensor": IN},
    "irecv": {"tensor": OUT},
}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_each_collective_declares_its_arrays(name):
    front = getattr(pycoll, name)
    spec = front.spec
    assert spec.name == name
    assert {a.name: a.role for a in spec.arrays} == DECLARED[name]
    # The front has the body's signature, docstring and name (help() and IDEs).
    assert inspect.signature(front) == inspect.signature(spec.host)
    assert "stream" in inspect.signature(front).parameters
    assert front.__doc__ == spec.host.__doc__ and front.__doc__
    assert front.__name__ == name and front.__module__ == spec.host.__module__


def test_rooted_roles_depend_on_the_rank():
    bcast = pycoll.broadcast.spec
    (tensor,) = bcast.arrays
    assert bcast.role(tensor, {"src": 1}, 1) == IN  # src reads it
    assert bcast.role(tensor, {"src": 1}, 0) == OUT  # the others write it
    red = pycoll.reduce.spec
    (tensor,) = red.arrays
    assert red.role(tensor, {"dst": 0}, 0) == INOUT
    assert red.role(tensor, {"dst": 0}, 3) == IN


def test_arrays_of_a_call_are_found_with_their_paths():
    a, b, c = np.zeros(1), np.zeros(2), np.zeros(3)
    spec = pycoll.all_gather_coalesced.spec
    found = [
        (path, x)
        for path, _, x in spec.found(
            {"output_tensor_lists": [[a, b], [c]], "input_tensor_list": [a]}
        )
    ]
    assert [p for p, _ in found] == [
        ("output_tensor_lists", 0, 0),
        ("output_tensor_lists", 0, 1),
        ("output_tensor_lists", 1, 0),
        ("input_tensor_list", 0),
    ]
    assert [x is y for (_, x), y in zip(found, [a, b, c, a])] == [True] * 4


def test_a_declaration_naming_no_parameter_is_refused_where_it_is_written():
    with pytest.raises(TypeError, match="f has no parameter 'tensr' to declare"):

        @collective(Array("tensr", IN))
        def f(tensor, group=None):  # pragma: no cover - never called
            pass


def test_defaults_and_keywords_reach_the_body():
    calls = []

    @collective(Array("tensor", INOUT), Array("others", IN, LIST))
    def g(tensor, others=None, scale=2, group=None):
        calls.append((tensor, others, scale, group))
        return "host"

    x = np.zeros(2)
    assert g(x) == "host"
    assert g(x, [x], group="g") == "host"
    assert g(tensor=x, scale=5) == "host"
    # Not an array: the body gets it and says what is wrong (here: nothing).
    assert g("not an array") == "host"
    assert calls == [
        (x, None, 2, None),
        (x, [x], 2, "g"),
        (x, None, 5, None),
        ("not an array", None, 2, None),
    ]


def test_a_known_call_skips_the_checks_and_an_unknown_one_does_not():
    """``known`` runs first, with the body's arguments: what it returns is the
    call's result, unless it is UNKNOWN; then the usual checks and routes."""
    seen = []
    mine = [np.zeros(1)]

    def known(tensors, group=None):
        seen.append(group)
        return "shortcut" if tensors is mine else UNKNOWN

    @collective(Array("tensors", INOUT, LIST), known=known)
    def h(tensors, group=None):
        return "host"

    assert h(mine, group="g") == "shortcut"
    assert h([np.zeros(1)]) == "host"
    assert h(["not an array"]) == "host"  # the body says what is wrong
    assert seen == ["g", None, None]


def test_the_body_refuses_what_is_no_array(rank):
    with pytest.raises(
        TypeError,
        match=r"all_reduce: tensor must be a numpy.ndarray, a torch tensor or a CUDA array "
        r"\(cupy, .*\), got list",
    ):
        pycoll.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match=r"all_gather: tensor_list\[0\]"):
        pycoll.all_gather(["x"] * pycoll.get_world_size(), np.zeros(1))


def test_a_traceback_through_the_front_shows_its_line(rank):
    import traceback

    try:
        pycoll.all_reduce("not an array")
    except TypeError as exc:
        text = "".join(traceback.format_exception(exc))
    assert 'File "<pycoll.dispatch: all_reduce>", line 8, in all_reduce' in text, text
    assert "return _route(_spec, {" in text, text
