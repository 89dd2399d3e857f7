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

An ``async_op=True`` call's Work (pycoll.work.AliasWork) hands back the
caller's tensors from ``result()`` and its future. torch is never imported here: a tensor can only
come from a program that has imported it, so its presence in
``sys.modules`` is the test.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict

import numpy as np

from .arrays import BFLOAT16
from .ops import ReduceOp, make_premul_sum
from .work import AliasWork, BaseWork

if TYPE_CHECKING:
    from .dispatch import Spec

__all__ = ["imported", "call"]


def imported() -> bool:
    """Whether the program has imported torch (if not, no argument is torch's)."""
    return "torch" in sys.modules


def _is_torch_op(op: Any) -> bool:
    return op is not None and type(op).__module__.startswith("torch")


def reduce_op(op: Any, func: str) -> Any:
    """torch's ReduceOp as pycoll's (anything else unchanged: the body checks it).

    Takes a member (``ReduceOp.SUM``, a ``RedOpType``) or a full
    ``torch.distributed.ReduceOp`` object, as torch's options carry and
    ``_make_nccl_premul_sum(factor)`` makes; a PREMUL_SUM keeps its factor
    (a number or a one-element tensor)."""
    if not _is_torch_op(op):
        return op
    if type(op).__name__ == "ReduceOp" and hasattr(op, "op"):  # the full object
        if op.op.name == "PREMUL_SUM":
            factor = op.factor
            if hasattr(factor, "numel"):  # a tensor
                if factor.numel() != 1:
                    raise ValueError(
                        f"{func}: a PREMUL_SUM factor must be a number or a one-element "
                        f"tensor, got a tensor of shape {tuple(factor.shape)}"
                    )
                factor = factor.item()
            return make_premul_sum(factor)
        op = op.op
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
        torch = sys.modules["torch"]
        if t.dtype is torch.bfloat16:
            return t.view(torch.int16).numpy().view(BFLOAT16)
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{func}: {label} is a torch tensor numpy cannot view: {exc}") from None


def call(spec: Spec, args: Dict[str, Any], then: Callable[[Spec, Dict[str, Any]], Any]) -> Any:
    """Run a call through ``then(spec, args)`` (the door's next step: the
    device layer for CUDA arrays, else the host body), torch's op taken as
    pycoll's and each CPU tensor replaced by a numpy view of its memory; a
    call holding nothing of torch's goes on unchanged."""
    tensor = sys.modules["torch"].Tensor
    op = args.get("op")
    mine = reduce_op(op, spec.name)
    tensors: Dict[int, Any] = {}
    rewritten = dict(args, op=mine) if mine is not op else None
    for path, a, x in spec.found(args):
        if not (isinstance(x, tensor) and x.is_cpu):
            continue  # a CUDA tensor is a CUDA array
        view = host_view(x, spec.name, spec.label(path))
        if a.role != "in" and a.root is None and not x.is_contiguous():
            raise ValueError(
                f"{spec.name}: {spec.label(path)} is not contiguous; pass "
                f"{spec.label(path)}.contiguous() and use that tensor afterwards "
                f"(the result is written into the tensor given)"
            )
        tensors[id(view)] = x
        if rewritten is None:
            rewritten = dict(args)
        spec.put(rewritten, path, view)
    if rewritten is None:
        return then(spec, args)
    value = then(spec, rewritten)
    if tensors and isinstance(value, BaseWork):
        return AliasWork(value, tensors)
    return value
