"""The package's surface: every public name resolves, and ``import pycoll``
stays light (pycoll-run and the pytest plugin import it in every process)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import pycoll

# The package's modules and names: one process's code.
pytestmark = pytest.mark.one_process


def test_every_public_name_resolves():
    for name in pycoll.__all__:
        assert hasattr(pycoll, name), name
    assert sorted(pycoll.__all__) == sorted(set(pycoll.__all__)), "a name listed twice"
    assert set(pycoll.__all__) <= set(dir(pycoll))


def test_setup_cfg_lists_every_package():
    """A package left out of setup.cfg is missing from the wheel: an
    editable install (CI's) still imports it, a user's ``pip install`` not."""
    import configparser

    root = Path(__file__).resolve().parents[1]
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    where = {
        "pycoll": root / "pycoll",
        "pycoll.gpu": root / "gpu",
        "pycoll.launch": root / "launch",
    }
    found = set()
    for name, top in where.items():
        for init in top.rglob("__init__.py"):
            parts = init.parent.relative_to(top).parts
            found.add(".".join((name, *parts)))
    assert found - listed == set(), "add these to setup.cfg's packages"
    assert listed - found == set(), "setup.cfg lists packages that do not exist"


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


def _late_imports(root: Path, package: str):
    """Every import of a pycoll module made inside a function, as
    (file, imported module)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for top in ast.walk(tree):
            if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(top):
                if isinstance(node, ast.ImportFrom):
                    name = "." * node.level + (node.module or "")
                    if node.level or name.startswith("pycoll"):
                        found.add((f"{package}/{path.relative_to(root)}", name))
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("pycoll"):
                            found.add((f"{package}/{path.relative_to(root)}", alias.name))
    return found


# Each import of pycoll's own modules inside a function, and why it is late:
# anything else goes at the top of its module (an import cycle would show
# here). pycoll/__init__.py loads its modules by name, with importlib, when a
# name is first used.
LATE = {
    # the device layer: only a call holding a CUDA array needs it
    ("pycoll/dispatch.py", "pycoll.gpu.collectives"),
    # numba compiles on first use
    ("pycoll/kernels/__init__.py", ".elementwise"),
    ("pycoll/kernels/__init__.py", "."),
    # the compiled fast path: numba only for a job that makes many calls
    ("pycoll/native.py", ".kernels"),
    # the pytest plugin is loaded by every pytest run: pycoll only when used
    ("pycoll/testing/plugin.py", "pycoll"),
    # torch's import-torch hook: inside its try, so a failure never breaks `import torch`
    ("pycoll/_torch_hook.py", "pycoll.torch"),
}


def test_pycoll_imports_its_modules_at_the_top():
    here = Path(__file__).resolve().parent.parent
    late = _late_imports(here / "pycoll", "pycoll") | _late_imports(here / "gpu", "gpu")
    late = {(f, m) for f, m in late if not f.startswith("pycoll/bench/")}  # a command
    assert late == LATE


# Where each source directory is installed (setup.cfg's package_dir).
_INSTALLED = {"pycoll": "pycoll", "gpu": "pycoll.gpu", "launch": "pycoll.launch"}


def _modules() -> dict:
    """Every module of the package, by its installed name: its source path."""
    here = Path(__file__).resolve().parent.parent
    found = {}
    for directory, package in _INSTALLED.items():
        for path in sorted((here / directory).rglob("*.py")):
            parts = list(path.relative_to(here / directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _imports(modules: dict) -> dict:
    """module -> the package's modules it imports, at its top or in a function
    (not those under ``if TYPE_CHECKING:``, which never run)."""

    def owner(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                test = getattr(child, "test", None)
                if isinstance(child, ast.If) and getattr(test, "id", "") == "TYPE_CHECKING":
                    continue
                if isinstance(child, ast.Import):
                    targets.update(a.name for a in child.names if a.name.startswith("pycoll"))
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - child.level + 1]
                        source = ".".join(base + ([child.module] if child.module else []))
                    else:
                        source = child.module or ""
                    if source.startswith("pycoll"):
                        for alias in child.names:
                            full = f"{source}.{alias.name}"
                            targets.add(full if full in modules else source)
                visit(child)

        visit(ast.parse(path.read_text()))
        graph[name] = {owner(t) for t in targets} - {name}
    return graph


def test_no_import_cycles():
    """Imports point down: no module reaches itself through the package's
    imports, late ones included (docs/design.md lists the layers)."""
    graph = _imports(_modules())
    cycles = []
    for start in sorted(graph):
        seen, stack = set(), [(start, [start])]
        while stack:
            name, path = stack.pop()
            for target in sorted(graph.get(name, ())):
                if target == start:
                    cycles.append(" -> ".join(path + [start]))
                elif target not in seen and target > start:  # each cycle once, from its least
                    seen.add(target)
                    stack.append((target, path + [target]))
    assert not cycles, cycles


# The layers below the public API that docs/design.md draws (torch/, rpc/,
# bench/, testing/ and launch/ stand on them; the command-line entries too).
_ABOVE = ("pycoll.torch", "pycoll.rpc", "pycoll.bench", "pycoll.testing", "pycoll.launch")


def _design_layers() -> dict:
    """module -> its line in docs/design.md's layer drawing (0: the top)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    block = text.split("## Layers and imports", 1)[1].split("```", 2)[1]
    lines = {}
    for number, line in enumerate(block.strip().splitlines()):
        for group in line.split(";"):
            prefix, _, names = group.rpartition(":")
            for name in names.split(","):
                name = name.strip()
                full = f"{prefix.strip()}.{name}" if prefix.strip() else name
                lines["pycoll." + full] = number
    return lines


def test_the_layers_docs_design_md_draws_are_the_imports():
    """Every module below the API is on one line of the drawing, and imports
    only modules on its own line or below."""
    graph = _imports(_modules())
    lines = _design_layers()
    drawn = {
        name
        for name in graph
        if name != "pycoll" and not name.startswith(_ABOVE) and not name.endswith("__main__")
        and name not in ("pycoll._torch_hook", "pycoll.collectives")
    }  # fmt: skip
    assert drawn - set(lines) == set(), "add these to docs/design.md's layers"
    assert set(lines) - drawn == set(), "docs/design.md's layers name modules that are not"
    up = [
        f"{name} (line {lines[name]}) imports {target} (line {lines[target]})"
        for name in sorted(drawn)
        for target in sorted(graph[name])
        if target in lines and lines[target] < lines[name]
    ]
    assert not up, up


def test_only_the_test_harness_imports_the_launcher():
    """The library does not import pycoll.launch (the launcher imports the
    library); pycoll.testing runs its jobs through it, by design."""
    graph = _imports(_modules())
    importers = {
        name
        for name, targets in graph.items()
        if any(t.startswith("pycoll.launch") for t in targets)
        and not name.startswith(("pycoll.launch", "pycoll.testing"))
    }
    assert not importers, importers
