"""A collective's declaration: its array parameters and the role each plays.

Each collective that takes arrays names them once, with :class:`Array` (its
parameter, and whether the array is read (:data:`IN`), written
(:data:`OUT`) or both (:data:`INOUT`), alone or in a list). The declaration
gathered from those (:class:`Spec`) is all that the code around a collective
knows of it: pycoll.dispatch makes the public front from it, and the device
layer (pycoll.gpu.collectives, pycoll.gpu.nccl) reads it to find, copy and
put back a call's device arrays. It lives below both, so neither imports the
other for it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple

__all__ = ["IN", "OUT", "INOUT", "ONE", "LIST", "LISTS", "UNKNOWN", "Array", "Spec"]

IN, OUT, INOUT = "in", "out", "inout"  # read, written, or both
ONE, LIST, LISTS = "one", "list", "lists"  # an array, a list of them, a list of lists

# What a collective's ``known`` shortcut returns for a call it does not know.
UNKNOWN: Any = object()


class Array(NamedTuple):
    """One array parameter of a collective.

    ``root`` names the parameter (``"src"``/``"dst"``) of a rooted collective
    and the role the array plays on that rank, where it differs from
    ``role`` (a broadcast's tensor is read on src and written elsewhere).
    """

    name: str
    role: str
    form: str = ONE
    root: Optional[Tuple[str, str]] = None


class Spec:
    """What the device layer knows of a collective, all read from its
    declaration: its name, its host body, its arrays, and

    - ``aware``: its host body only hands the buffers to MPI, so a CUDA-aware
      MPI can be given device memory directly;
    - ``chunked``: a large staged call is pipelined in chunks
      (pycoll.gpu.staging);
    - ``reduction``: it takes a ReduceOp (it has an ``op`` parameter);
    - ``known``: a shortcut tried before the type checks, with the host
      body's parameters: it runs a call it recognises (one whose arrays it
      has seen, and so knows to be numpy: all_reduce_coalesced's kept lists)
      and returns its result, or returns :data:`UNKNOWN`. A list of a
      thousand gradients then is not type-checked on every call;
    - ``synchronous``: it has no ``async_op`` and never returns a Work
      (send, recv), so a call on tensors seen before takes the front's
      tensor lane as a synchronous collective does.
    """

    __slots__ = ("name", "host", "arrays", "aware", "chunked", "reduction", "known", "synchronous")

    def __init__(
        self,
        host: Callable[..., Any],
        arrays: Tuple[Array, ...],
        aware: bool,
        chunked: bool,
        known: Optional[Callable[..., Any]] = None,
        synchronous: bool = False,
    ) -> None:
        params = inspect.signature(host).parameters
        for a in arrays:
            if a.name not in params:
                raise TypeError(f"{host.__name__} has no parameter {a.name!r} to declare")
        self.name: str = host.__name__
        self.host = host
        self.arrays = arrays
        self.aware = aware
        self.chunked = chunked
        self.reduction = "op" in params
        self.known = known
        self.synchronous = synchronous

    def __repr__(self) -> str:
        return f"Spec({self.name}: {', '.join(f'{a.name} {a.role}' for a in self.arrays)})"

    def found(self, args: Dict[str, Any]) -> Iterator[Tuple[Tuple[Any, ...], Array, Any]]:
        """Every array of a call, as (path, declaration, value): the path is
        the parameter name then the list indices, e.g. ``("tensor_list", 2)``."""
        for a in self.arrays:
            value = args.get(a.name)
            if value is None:
                continue
            if a.form == ONE:
                yield (a.name,), a, value
            elif isinstance(value, (list, tuple)):
                for i, x in enumerate(value):
                    if a.form == LIST:
                        yield (a.name, i), a, x
                    elif isinstance(x, (list, tuple)):
                        for j, y in enumerate(x):
                            yield (a.name, i, j), a, y

    @staticmethod
    def put(args: Dict[str, Any], path: Tuple[Any, ...], value: Any) -> None:
        """Replace the array at ``path`` (from :meth:`found`) in ``args``; the
        caller's lists are copied, never changed."""
        if len(path) == 1:
            args[path[0]] = value
            return
        container = args[path[0]] = list(args[path[0]])
        for i in path[1:-1]:
            container[i] = list(container[i])
            container = container[i]
        container[path[-1]] = value

    @staticmethod
    def label(path: Tuple[Any, ...]) -> str:
        """A path as the user wrote it: ``tensor_list[2]``."""
        return str(path[0]) + "".join(f"[{i}]" for i in path[1:])

    def role(self, a: Array, args: Dict[str, Any], rank: int) -> str:
        """The role array ``a`` plays in this call on global rank ``rank``."""
        if a.root is not None and args.get(a.root[0]) == rank:
            return a.root[1]
        return a.role
