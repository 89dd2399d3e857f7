"""The package's surface: every public name resolves, and ``import pycoll``
stays light (pycoll-run and the pytest plugin import it in every process)."""

from __future__ import annotations

import subprocess
import sys

import pycoll


def test_every_public_name_resolves():
    for name in pycoll.__all__:
        assert hasattr(pycoll, name), name
    assert sorted(pycoll.__all__) == sorted(set(pycoll.__all__)), "a name listed twice"
    assert set(pycoll.__all__) <= set(dir(pycoll))


def test_unknown_name_is_an_attribute_error():
    try:
        pycoll.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "module 'pycoll' has no attribute 'no_such_thing'" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_import_loads_neither_numpy_nor_mpi():
    heavy = ("numpy", "mpi4py.MPI", "pycoll.collectives")
    code = (
        "import sys, pycoll, pycoll.launch.cli, pycoll.testing.plugin; "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dir_shows_the_api_not_the_modules_own_helpers():
    shown = set(dir(pycoll))
    for helper in ("Any", "List", "TYPE_CHECKING", "importlib", "_EXPORTS", "_importlib"):
        assert helper not in shown, helper
    assert not [n for n in shown if n.startswith("_") and not n.endswith("__")]
    assert "__version__" in shown and "all_reduce" in shown
