"""pycoll.launch.boot's traceback for an uncaught exception: the user's frames."""

from __future__ import annotations

import pytest

from pycoll.errors import DistTimeoutError
from pycoll.launch.boot import user_frames


def _names(tb):
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def _raise_through_pycoll(error):
    """Raise ``error`` from a function that lives in a module named like pycoll's."""
    inner = {"__name__": "pycoll.collectives.fake"}
    exec("def wait(error):\n    raise error\n\ndef all_reduce(error):\n    wait(error)\n", inner)

    def users_step():
        inner["all_reduce"](error)

    try:
        users_step()
    except BaseException as exc:  # what an excepthook is handed
        return exc
    raise AssertionError("nothing raised")


def test_a_pycoll_error_ends_at_the_users_call():
    exc = _raise_through_pycoll(DistTimeoutError("late"))
    assert _names(exc.__traceback__)[-2:] == ["all_reduce", "wait"]
    assert _names(user_frames(exc.__traceback__, exc)) == [
        "_raise_through_pycoll",
        "users_step",
    ]


@pytest.mark.parametrize("error", [ValueError("bad"), RuntimeError("bug")])
def test_other_errors_keep_every_frame(error):
    """An argument error, or a bug inside pycoll, keeps pycoll's frames."""
    exc = _raise_through_pycoll(error)
    assert _names(user_frames(exc.__traceback__, exc)) == [
        "_raise_through_pycoll",
        "users_step",
        "all_reduce",
        "wait",
    ]
