"""ReduceOp: the reduction operations, and which dtypes each is defined for.

The vocabulary every reduction speaks: the ops (``ReduceOp.SUM``... and
:func:`make_premul_sum`) and :func:`check_pair`, the ValueError naming both
op and dtype for a pair with no meaning (MIN on complex numbers, XOR on
floats). It sits below both of its users: pycoll.kernels, whose compiled
reductions take these ops, and pycoll.ops, which chooses how MPI carries
each (op, dtype) pair (and may run those kernels as MPI user ops).
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union, cast

import numpy as np

from .arrays import dtype_kind

if TYPE_CHECKING:
    from .ops import Plan

__all__ = ["ReduceOp", "make_premul_sum", "check_pair", "NAMES", "MEMBERS"]

# Every op's name; all but PREMUL_SUM (made by make_premul_sum, with its scale)
# are members of ReduceOp.
NAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


class ReduceOp:
    """A reduction operation for all_reduce, reduce and reduce_scatter.

    The members are ``ReduceOp.SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``,
    ``BAND``, ``BOR`` and ``BXOR``; a pre-multiplied sum comes from
    :func:`make_premul_sum`. ``ReduceOp(op)`` copies an op. Ops compare equal
    when they are the same operation (and, for PREMUL_SUM, the same scale),
    hash, copy and pickle; comparing with anything else is simply False.
    """

    __slots__ = ("_name", "_scale", "_plans")
    _name: str
    _scale: Optional[Union[float, complex]]
    _plans: Dict[np.dtype, Plan]  # how it runs on each dtype (filled by pycoll.ops.plan)

    SUM: ReduceOp
    AVG: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    BAND: ReduceOp
    BOR: ReduceOp
    BXOR: ReduceOp

    def __new__(cls, op: Union[ReduceOp, str]) -> ReduceOp:
        # Named ops are singletons, so each caches how it runs on each dtype.
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str) and op.upper() in MEMBERS:
            return MEMBERS[op.upper()]
        raise ValueError(
            f"unknown reduce op {op!r}; use one of ReduceOp.SUM, AVG, PRODUCT, "
            f"MIN, MAX, BAND, BOR, BXOR or make_premul_sum(scale)"
        )

    @classmethod
    def _make(cls, name: str, scale: Any) -> ReduceOp:
        op = object.__new__(cls)
        object.__setattr__(op, "_name", name)
        object.__setattr__(op, "_scale", scale)
        object.__setattr__(op, "_plans", {})
        return op

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("ReduceOp is immutable")

    @property
    def name(self) -> str:
        """The operation's name, e.g. ``"SUM"``."""
        return self._name

    @property
    def scale(self) -> Optional[Union[float, complex]]:
        """The scale of a PREMUL_SUM, None for every other op."""
        return self._scale

    def __init__(self, op: Union[ReduceOp, str]) -> None:
        pass  # all the work is in __new__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReduceOp):
            return NotImplemented
        return self._name == other._name and self._scale == other._scale

    def __hash__(self) -> int:
        return hash((self._name, self._scale))

    def __repr__(self) -> str:
        if self._name == "PREMUL_SUM":
            return f"ReduceOp.PREMUL_SUM({self._scale!r})"
        return f"ReduceOp.{self._name}"

    def __reduce__(self) -> Tuple[Callable, tuple]:
        if self._name == "PREMUL_SUM":
            return (make_premul_sum, (self._scale,))
        return (ReduceOp, (self._name,))

    def __copy__(self) -> ReduceOp:
        return self

    def __deepcopy__(self, memo: dict) -> ReduceOp:
        return self


# The named ops, by name: ReduceOp.SUM ... ReduceOp.BXOR.
MEMBERS: Dict[str, ReduceOp] = {}
for _name in NAMES[:-1]:
    MEMBERS[_name] = ReduceOp._make(_name, None)
    setattr(ReduceOp, _name, MEMBERS[_name])


def make_premul_sum(scale: Any) -> ReduceOp:
    """A SUM that multiplies each rank's input by ``scale`` first.

    Args:
        scale: a real or complex number, or an array holding exactly one.

    Returns:
        A ReduceOp whose ``name`` is ``"PREMUL_SUM"``.
    """
    if isinstance(scale, np.ndarray):
        if scale.size != 1:
            raise ValueError(
                f"make_premul_sum: scale must be a number or a one-element array, "
                f"got an array of shape {scale.shape}"
            )
        scale = scale.reshape(()).item()
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Number):
        raise TypeError(f"make_premul_sum: scale must be a number, got {type(scale).__name__}")
    value: Union[float, complex]
    if isinstance(scale, numbers.Real):
        value = float(scale)
    else:
        value = complex(cast(complex, scale))  # a numbers.Complex has __complex__
    return ReduceOp._make("PREMUL_SUM", value)


# The ops defined on each dtype kind (pycoll.arrays.dtype_kind); a pair not
# listed has no meaning. bool takes every op but AVG and PREMUL_SUM, as in
# torch: SUM and MAX are "any", PRODUCT and MIN "all".
_BITWISE = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
_REAL = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
_DEFINED = {
    "bool": _BITWISE,
    "int": _BITWISE,
    "half": _REAL,
    "float": _REAL,
    "complex": ("SUM", "PRODUCT", "AVG", "PREMUL_SUM"),
}
_WHY = {
    "bool": "AVG and PREMUL_SUM have no boolean result; cast to a floating dtype",
    "int": "AVG and PREMUL_SUM would have to round to an integer; cast to a floating dtype",
    "half": "bitwise ops apply to integers and bool only",
    "float": "bitwise ops apply to integers and bool only",
    "complex": "complex numbers have no order (MIN/MAX) and no bits to combine (BAND/BOR/BXOR)",
}


def check_pair(name: str, dtype: np.dtype, func: str) -> str:
    """Raise the ValueError for an (op name, dtype) pair with no meaning, naming
    both and why; return the dtype's kind."""
    kind = dtype_kind(dtype)
    if name not in _DEFINED[kind]:
        raise ValueError(f"{func}: ReduceOp.{name} is not defined for dtype {dtype}: {_WHY[kind]}")
    return kind
