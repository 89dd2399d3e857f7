"""torch tensors and torch's ReduceOps in pycoll's own API, without importing torch.

Every collective that takes arrays takes torch tensors too (through the
device door, pycoll.dispatch):

- a CPU tensor is worked on in place through a numpy view of its memory (no
  copy; bfloat16 as ml_dtypes' bfloat16, bool, integers, floats and complex as
  themselves), so what the collective writes is in the tensor;
- a CUDA tensor is a CUDA array (``__cuda_array_interface__``) and goes
  through pycoll.gpu like cupy's, on torch's current stream unless
  ``stream=`` says otherwise;
- ``torch.distributed.ReduceOp`` values (``ReduceOp.SUM``, ``ReduceOp.AVG``...)
  are taken for pycoll's ReduceOp of the same name.

An ``async_op=True`` call's Work hands back the caller's tensors from
``result()`` and its future. torch is never imported here: a tensor can only
come from a program that has imported it, so its presence in
``sys.modules`` is the test.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import numpy as np

from .arrays import BFLOAT16
from .ops import ReduceOp
from .work import BaseWork

if TYPE_CHECKING:
    from .dispatch import Spec

__all__ = ["holds_torch", "call"]


def _torch() -> Any:
    return sys.modules.get("torch")


def holds_torch(spec: Spec, args: Dict[str, Any]) -> bool:
    """Whether a call's arrays or op come from torch (torch imported, one of
    them a ``torch.Tensor`` or a torch ReduceOp)."""
    torch = _torch()
    if torch is None:
        return False
    if _is_torch_op(args.get("op")):
        return True
    tensor = torch.Tensor
    for _, _, x in spec.found(args):
        if isinstance(x, tensor):
            return True
    return False


def _is_torch_op(op: Any) -> bool:
    return op is not None and type(op).__module__.startswith("torch")


def reduce_op(op: Any, func: str) -> Any:
    """torch's ReduceOp as pycoll's (anything else unchanged: the body checks it)."""
    if not _is_torch_op(op):
        return op
    if type(op).__name__ == "ReduceOp" and hasattr(op, "op"):  # a premul-sum, say
        raise TypeError(
            f"{func}: torch's PREMUL_SUM ops cannot be read back from torch; use "
            f"pycoll.make_premul_sum(factor) for pycoll's collectives"
        )
    name = getattr(op, "name", None)
    mine = getattr(ReduceOp, name, None) if isinstance(name, str) else None
    if not isinstance(mine, ReduceOp):
        raise TypeError(f"{func}: op {op!r} has no counterpart among pycoll.ReduceOp's")
    return mine


def host_view(t: Any, func: str, label: str) -> np.ndarray:
    """A numpy array over a CPU tensor's memory (no copy)."""
    if not t.is_cpu:
        raise ValueError(
            f"{func}: {label} is a torch tensor on {t.device}, which pycoll cannot reach; "
            f"pass a CPU or CUDA tensor"
        )
    if t.requires_grad:
        t = t.detach()  # the same memory, outside autograd (as torch.distributed's own)
    try:
        if t.dtype is _torch().bfloat16:
            return t.view(_torch().int16).numpy().view(BFLOAT16)
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{func}: {label} is a torch tensor numpy cannot view: {exc}") from None


def call(spec: Spec, args: Dict[str, Any], then: Callable[[Spec, Dict[str, Any]], Any]) -> Any:
    """Run a call holding torch tensors or a torch ReduceOp: the op as
    pycoll's, CPU tensors as numpy views, then ``then(spec, args)`` (the
    door's next step: the device layer for CUDA tensors, else the host body)."""
    torch = _torch()
    args = dict(args)
    if "op" in args:
        args["op"] = reduce_op(args["op"], spec.name)
    tensors: Dict[int, Any] = {}
    for path, a, x in spec.found(args):
        if isinstance(x, torch.Tensor) and x.is_cpu:
            view = host_view(x, spec.name, spec.label(path))
            if a.role != "in" and a.root is None and not x.is_contiguous():
                raise ValueError(
                    f"{spec.name}: {spec.label(path)} is not contiguous; pass "
                    f"{spec.label(path)}.contiguous() and use that tensor afterwards "
                    f"(the result is written into the tensor given)"
                )
            tensors[id(view)] = x
            spec.put(args, path, view)
    value = then(spec, args)
    if isinstance(value, BaseWork) and tensors:
        return TensorWork(value, tensors)
    return value


class TensorWork(BaseWork):
    """The Work of a call on CPU tensors: the host Work, whose ``result()``
    (and future) hand back the caller's tensors instead of their numpy views."""

    __slots__ = ("_work", "_tensors")

    def __init__(self, work: BaseWork, tensors: Dict[int, Any]) -> None:
        self._work = work
        self._tensors = tensors
        self._future = None
        self.op = work.op
        self.seq = work.seq

    def __repr__(self) -> str:
        return f"TensorWork({self._work!r})"

    def wait(self, timeout: Optional[float] = None) -> bool:
        try:
            return self._work.wait(timeout)
        finally:
            if self._work.is_completed():
                self._settle_future()

    def is_completed(self) -> bool:
        done = self._work.is_completed()
        if done:
            self._settle_future()
        return done

    def exception(self) -> Optional[BaseException]:
        return self._work.exception()

    def _value(self) -> List[Any]:
        return [self._tensors.get(id(x), x) for x in self._work.result()]

    def source_rank(self) -> int:
        return self._work.source_rank()
