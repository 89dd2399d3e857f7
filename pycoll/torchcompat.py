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
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

import numpy as np

from .arrays import BFLOAT16
from .reduceop import ReduceOp, make_premul_sum
from .work import AliasWork, BaseWork

if TYPE_CHECKING:
    from .spec import Spec

__all__ = ["imported", "aliased", "call", "host_view", "kept_view", "lane_op", "reduce_op"]


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
    kind = op
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
    if kind is op:  # a member: known from now on (lane_op)
        _ops[op] = mine
    return mine


# torch's op kinds (RedOpType members) met so far, as pycoll's ops: reading
# an op's name through torch's binding costs microseconds per call.
_ops: Dict[Any, ReduceOp] = {}


def lane_op(op: Any) -> Optional[ReduceOp]:
    """pycoll's op for ``op`` where it is known without a look: pycoll's own
    op, or a torch op kind :func:`reduce_op` has met; else None."""
    if type(op) is ReduceOp:
        return op
    try:
        return _ops.get(op)
    except TypeError:  # (unhashable: no op kind)
        return None


class _Memory:
    """A tensor's memory as numpy's array interface describes it, and no
    more: what a kept view is made over. (A view from ``Tensor.numpy()``
    holds its tensor, so one kept in the table below would keep every
    tensor ever passed alive.)"""

    __slots__ = ("__array_interface__",)
    __array_interface__: Dict[str, Any]


# A CPU tensor's numpy view, made once and given again while the tensor
# still has the same memory (address, shape, strides, dtype): a training
# loop passes the same tensors every step, and a view that is the same
# object each call is what pycoll.native keeps a call by. On the CI VM
# ``Tensor.numpy()`` alone took 2.2 us, and an 8-byte all_reduce of a tensor
# took 10x the same call on a numpy array (docs/measurements/torch_tensors.py).
# By id: (weak reference, then the view, address, shape, strides and dtype). A
# tensor is first only seen (one made afresh for each call is never seen
# again); its second call makes the kept view, over its memory but not holding
# it: the view is handed out only while the tensor, checked alive and
# unchanged, holds that memory. Only contiguous tensors' (all a collective
# writes into). At most VIEWS entries (then the table starts over).
_views: Dict[int, Tuple[Any, ...]] = {}
VIEWS = 4096


def host_view(t: Any, func: str, label: str) -> np.ndarray:
    """A numpy array over a CPU tensor's memory (no copy): the same array
    for the same tensor while its memory is unchanged."""
    view = kept_view(t)
    return view if view is not None else _made(t, func, label)


def kept_view(t: Any) -> Optional[np.ndarray]:
    """The kept view of tensor ``t``, if it has one that still fits its
    memory; else None (also for anything not a tensor seen before)."""
    kept = _views.get(id(t))
    if (
        kept is not None
        and len(kept) > 1
        and kept[0]() is t
        and t.data_ptr() == kept[2]
        and t.shape == kept[3]
        and t.stride() == kept[4]
        and t.dtype is kept[5]
    ):
        return kept[1]
    return None


def _made(t: Any, func: str, label: str) -> np.ndarray:
    """``t``'s view made afresh, and seen or kept (``_views``)."""
    view = _fresh_view(t, func, label)
    kept = _views.get(id(t))
    if kept is None or kept[0]() is not t:  # first seen: remembered, weakly
        if len(_views) >= VIEWS:
            _views.clear()
        _views[id(t)] = (weakref.ref(t),)
    elif view.flags.c_contiguous:
        memory = _Memory()
        memory.__array_interface__ = view.__array_interface__
        mine = np.asarray(memory)
        if mine.dtype != view.dtype:  # (bfloat16: viewed as int16 first)
            mine = mine.view(view.dtype)
        _views[id(t)] = (kept[0], mine, t.data_ptr(), t.shape, t.stride(), t.dtype)
        return mine
    return view


def _fresh_view(t: Any, func: str, label: str) -> np.ndarray:
    """``host_view`` made afresh (``Tensor.numpy()``), the tensor checked."""
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


def aliased(value: Any, callers: Dict[int, Any]) -> Any:
    """A call's return on views for the caller's tensors: a Work wrapped so
    that ``result()`` and its future give the tensors (``callers`` maps
    ``id()`` of each view to its tensor); anything else (None, off the
    group) as it is."""
    return AliasWork(value, callers) if isinstance(value, BaseWork) else value


def call(spec: Spec, args: Dict[str, Any], then: Callable[[Spec, Dict[str, Any]], Any]) -> Any:
    """Run a call through ``then(spec, args)`` (the door's next step: the
    device layer for CUDA arrays, else the host body), torch's op taken as
    pycoll's and each CPU tensor replaced by a numpy view of its memory; a
    call holding nothing of torch's goes on unchanged."""
    tensor = sys.modules["torch"].Tensor
    op = args.get("op")
    mine = op if op is None or type(op) is ReduceOp else reduce_op(op, spec.name)
    tensors: Dict[int, Any] = {}
    rewritten = dict(args, op=mine) if mine is not op else None
    for path, a, x in spec.found(args):
        if type(x) is np.ndarray or not isinstance(x, tensor):
            continue
        view = kept_view(x)  # (a kept view's tensor is a contiguous CPU tensor)
        if view is None:
            if not x.is_cpu:
                continue  # a CUDA tensor is a CUDA array
            view = _made(x, spec.name, spec.label(path))
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
    return aliased(value, tensors) if tensors else value
