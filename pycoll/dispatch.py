"""The one door for devices: each collective declares its arrays once.

A collective is written for numpy arrays and declared with :func:`collective`,
which names the role each array argument plays (:class:`pycoll.spec.Array`)::

    @collective(Array("tensor", INOUT), aware=True)
    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, stream=None):
        ...  # numpy only: no branch on the device

The decorator returns the public function. A call whose arrays are all
numpy goes straight to the host body; any other call goes through
:func:`route`, which sends CUDA arrays to the device layer
(:func:`pycoll.gpu.collectives.call`: NCCL, CUDA-aware MPI, or staged
through pinned memory), reading what it needs from the declaration
(:class:`pycoll.spec.Spec`), and hands everything else to the host body,
which raises the usual TypeError for what is no array at all. A new
collective is one declaration, and no table elsewhere repeats its
parameters. The declaration's types are pycoll.spec's, a module below both
this door and the device layer, which the door loads only for a call that
holds a CUDA array.

Why the front is generated code rather than a ``*args, **kwargs`` wrapper:
the 8-byte synchronous all_reduce, the call training loops make thousands of
times a step, then pays one plain Python call and one type check, not
argument binding (measured with docs/measurements/ab_versions.py).
"""

from __future__ import annotations

import functools
import inspect
import linecache
import sys
from typing import Any, Callable, Dict, List, Optional, TypeVar

import numpy as np

from . import torchcompat
from .arrays import on_device
from .spec import ONE, UNKNOWN, Array, Spec

__all__ = ["collective", "route"]

F = TypeVar("F", bound=Callable[..., Any])


def collective(
    *arrays: Array,
    aware: bool = False,
    chunked: bool = False,
    known: Optional[Callable[..., Any]] = None,
    synchronous: bool = False,
) -> Callable[[F], F]:
    """Declare a collective's array parameters (see the module docstring and
    :class:`Spec`); the decorated function is its numpy body, the result its
    public front."""

    def declare(host: F) -> F:
        spec = Spec(host, arrays, aware, chunked, known, synchronous)
        return _front(spec)  # type: ignore[return-value]

    return declare


def route(spec: Spec, args: Dict[str, Any]) -> Any:
    """Run a call whose arrays are not all numpy: torch's tensors and ops are
    taken as pycoll's (pycoll.torchcompat), CUDA arrays go to the device
    layer, and anything else goes to the host body, which checks it.
    A pending result of pycoll.functional is waited for first."""
    functional = sys.modules.get("pycoll.functional")
    if functional is not None:
        pending = [
            (path, x) for path, _, x in spec.found(args) if isinstance(x, functional.AsyncArray)
        ]
        for path, x in pending:
            spec.put(args, path, x.wait())
        if pending and _numpy_only(*(args[a.name] for a in spec.arrays)):
            return spec.host(**args)
    if torchcompat.imported():
        return torchcompat.call(spec, args, _route)
    return _route(spec, args)


def _route(spec: Spec, args: Dict[str, Any]) -> Any:
    if on_device(*(args[a.name] for a in spec.arrays)):
        from pycoll.gpu.collectives import call  # lazily: keeps `import pycoll` cheap

        return call(spec, args)
    return spec.host(**args)


_PLAIN = frozenset((np.ndarray, type(None)))
_NESTED = frozenset((list, tuple))


def _numpy_only(*values: Any) -> bool:
    """Whether list arguments hold numpy arrays (or None) only, at any depth.
    (A list's item types are gathered in C first: a thousand gradients are
    checked in microseconds.)"""
    for x in values:
        if isinstance(x, (list, tuple)):
            kinds = set(map(type, x))
            if kinds <= _PLAIN:
                continue
            if not kinds & _NESTED or not _numpy_only(*x):
                return False
        elif x is not None and type(x) is not np.ndarray:
            return False
    return True


def _tensor_lane(spec: Spec, params: Any, lists: List[str]) -> str:
    """The front's lane for a call on CPU tensors pycoll has seen before
    (pycoll.torchcompat.kept_view: each one's numpy view, kept while the
    tensor holds the same memory) and pycoll's or torch's plain op: straight
    to the host body with the views, as a numpy call goes; with
    ``async_op``, its Work wrapped so that ``result()`` and the future give
    the tensors (torchcompat.aliased). A collective without ``async_op``
    takes it only if it never returns a Work (``Spec.synchronous``: send,
    recv). Anything else (a tensor seen once, CUDA, list arguments) takes
    :func:`route`. On the CI VM, an 8-byte all_reduce of a tensor took 14.7
    us through route with its view kept, and 35.6 us before views were kept;
    a numpy array's 3.4 (docs/measurements/torch_tensors.py); with
    ``async_op=True`` and ``wait()``, 21.0 us through route, where a numpy
    array's took 6.9."""
    if lists or ("async_op" not in params and not spec.synchronous):
        return ""
    ones = [a.name for a in spec.arrays]
    conds = [
        f"(_{n} := {n} if type({n}) is _ndarray else _kept_view({n})) is not None" for n in ones
    ]
    given = {n: f"_{n}" for n in ones}
    if "op" in params:
        conds.append("(_op := _lane_op(op)) is not None")
        given["op"] = "_op"
    host = f"_host({', '.join(given.get(n, n) for n in params)})"
    if "async_op" not in params:
        return f"    if {' and '.join(conds)}:\n        return {host}\n"
    callers = ", ".join(f"id(_{n}): {n}" for n in ones)
    return (
        f"    if {' and '.join(conds)}:\n"
        f"        if not async_op:\n"
        f"            return {host}\n"
        f"        return _aliased({host}, {{{callers}}})\n"
    )


def _front(spec: Spec) -> Callable[..., Any]:
    """The public function: the host body's signature, a type check of each
    array parameter (each item of the list ones), then the host body or
    :func:`route`."""
    params = inspect.signature(spec.host).parameters
    heads: List[str] = []
    defaults: Dict[str, Any] = {}
    for p in params.values():
        if p.kind is not p.POSITIONAL_OR_KEYWORD:
            raise TypeError(f"{spec.name}: collective() takes plain parameters, not {p}")
        if p.default is p.empty:
            heads.append(p.name)
        else:
            defaults[p.name] = p.default
            heads.append(f"{p.name}=_defaults[{p.name!r}]")
    checks = [f"type({a.name}) is _ndarray" for a in spec.arrays if a.form == ONE]
    lists = [a.name for a in spec.arrays if a.form != ONE]
    if lists:
        checks.append(f"_numpy_only({', '.join(lists)})")
    names = ", ".join(params)
    shortcut = (
        f"    done = _known({names})\n    if done is not _UNKNOWN:\n        return done\n"
        if spec.known is not None
        else ""
    )
    source = (
        f"def {spec.name}({', '.join(heads)}):\n"
        f"{shortcut}"
        f"    if {' and '.join(checks)}:\n"
        f"        return _host({names})\n"
        f"{_tensor_lane(spec, params, lists)}"
        f"    return _route(_spec, {{{', '.join(f'{n!r}: {n}' for n in params)}}})\n"
    )
    scope = {
        "__name__": spec.host.__module__,  # its frames are pycoll's (pycoll.errors.user_frames)
        "_defaults": defaults,
        "_ndarray": np.ndarray,
        "_numpy_only": _numpy_only,
        "_host": spec.host,
        "_route": route,
        "_spec": spec,
        "_known": spec.known,
        "_UNKNOWN": UNKNOWN,
        "_kept_view": torchcompat.kept_view,
        "_lane_op": torchcompat.lane_op,
        "_aliased": torchcompat.aliased,
    }
    filename = f"<pycoll.dispatch: {spec.name}>"
    # Tracebacks through the front show its lines (as attrs does for its methods).
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), scope)
    generated: Callable[..., Any] = scope[spec.name]
    front = functools.update_wrapper(generated, spec.host)
    front.spec = spec  # type: ignore[attr-defined]
    return front
