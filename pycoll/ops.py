"""How each (op, dtype) pair is carried out on MPI: :class:`Plan` and :func:`plan`.

MPI reduces the types and ops it knows. The rest is built here from MPI
pieces: AVG is a SUM followed by a division, PREMUL_SUM a scaling followed
by a SUM, and float16/bfloat16 arithmetic (and NaN-propagating MIN/MAX on
floats) an MPI user-defined op running pycoll's compiled kernels
(pycoll.kernels). The ops themselves, and which pairs have a meaning, are
pycoll.reduceop's, below both this module and the kernels; the sizes from
which a reduction takes pycoll's ring are here, with the rule that chooses it.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from . import _env, _mpi, crosscheck, kernels
from .arrays import check_dtype, dtype_kind, mpi_datatype
from .reduceop import MEMBERS, NAMES, ReduceOp, check_pair

__all__ = ["Plan", "plan", "free_user_ops"]


class Plan(NamedTuple):
    """How one (op, dtype) pair is carried out.

    Attributes:
        mpi_op: the MPI op that does the reduction.
        prescale: multiply each input by this before reducing (PREMUL_SUM).
        average: divide the result by the group size (AVG).
        datatype: the MPI datatype of one element.
        plain: MPI does everything (no pre-scaling, no averaging).
        split: a large all_reduce goes faster through pycoll's ring
            (pycoll.collectives.ring: a reduce-scatter, then an all-gather,
            over point-to-point messages; from :data:`SPLIT_BYTES`, or
            :data:`SPLIT_BYTES_TWO_RANKS` on two ranks). For pycoll's user
            ops (MPICH reduces a user op by recursive doubling, every rank
            reducing the whole buffer, Open MPI's nonblocking all_reduce by
            a binomial tree, and on one node their collectives on large
            buffers measured 2-4x slower than the same bytes exchanged point
            to point) and for AVG of real floats (the division then runs on
            this rank's 1/n of the result), on the MPIs of :data:`RING_MPIS`.
            MPI's own ops take the ring too, from :data:`RING_BYTES`.
        key: the reduction's and dtype's part of a call's key for the call
            check (pycoll.crosscheck.reduction_bits).
        builtin: ``mpi_op`` is MPI's own op, not one of pycoll's user ops
            (where a tuning table keeps MPI's call, only these follow it:
            pycoll.tuning).
    """

    mpi_op: Any
    prescale: Optional[Union[float, complex]]
    average: bool
    datatype: Any
    plain: bool
    split: bool
    key: int
    builtin: bool

    def kernel_op(self, op: ReduceOp) -> str:
        """The op pycoll's own kernels fold with where they carry the call
        (the ring, the window, the pairwise exchange, the doubling, the
        reduce to a root): SUM for an AVG (divided in the last fold) and a
        PREMUL_SUM (its inputs scaled first), else ``op``'s own."""
        return "SUM" if self.average or self.prescale is not None else op.name


# MPI's op for each op pycoll.reduceop defines (check_pair says which pairs
# have a meaning). Logical ops serve bool as torch does: SUM and MAX are
# "any", PRODUCT and MIN are "all". AVG and PREMUL_SUM are a SUM with a
# division after or a scaling before.
_LOGICAL = {
    "SUM": "LOR",
    "PRODUCT": "LAND",
    "MIN": "LAND",
    "MAX": "LOR",
    "BAND": "LAND",
    "BOR": "LOR",
    "BXOR": "LXOR",
}
_ARITHMETIC = {
    "SUM": "SUM",
    "PRODUCT": "PROD",
    "MIN": "MIN",
    "MAX": "MAX",
    "BAND": "BAND",
    "BOR": "BOR",
    "BXOR": "BXOR",
    "AVG": "SUM",
    "PREMUL_SUM": "SUM",
}
# float16 / bfloat16, and MIN/MAX on floats: pycoll's compiled kernels as MPI
# user ops (pycoll.kernels). MPI has no 16-bit float arithmetic, and its own
# MIN/MAX may drop a NaN depending on the order it combines ranks in; numpy's
# (and torch's) minimum/maximum propagate it.
_KERNEL_OPS = {
    "half": ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"),
    "float": ("MIN", "MAX"),
}


def order_matters(name: str, dtype: np.dtype) -> bool:
    """Whether the op ``name`` gives different bits by its operands' order on
    ``dtype``: MIN and MAX of floats (min(0.0, -0.0) is -0.0, min(-0.0, 0.0)
    0.0). pycoll's own all_reduce paths fold those in rank order, so every
    rank ends with the same bits."""
    return name in ("MIN", "MAX") and dtype_kind(dtype) in ("float", "half")


# all_reduce calls with a Plan.split op from this many bytes go through
# pycoll's ring (measured crossovers: docs/benchmarks.md, "Which path wins
# where"). On two ranks MPI's own way (every element combined once, in one
# exchange) is as fast up to 4 MiB and the ring faster from 8 MiB; on more, the
# ring from 4 MiB. PYCOLL_SPLIT_BYTES, where set, is the size for every number
# of ranks.
_SET = _env.nbytes("PYCOLL_SPLIT_BYTES", "never split")
SPLIT_BYTES = 4 << 20 if _SET is None else _SET
SPLIT_BYTES_TWO_RANKS = 8 << 20 if _SET is None else _SET
# And MPI's own ops (float32 SUM...) from this many bytes, on any number of
# ranks: at 8-16 MiB the ring measured 0.63-0.90x MPICH's time on 2-8 ranks
# of a 16-core machine and 0.88-1.10x on the 2-core CI VM (level, within its
# noise), where above 16 MiB MPICH's all_reduce of a large buffer on one node
# falls to 0.7-3.2 GB/s and the ring keeps 3.3-11.7 (0.24-0.5x its time); at
# 4 MiB the ring was 1.0-1.15x MPICH's time on 2 ranks of the 16-core machine
# and 1.07-1.24x on 4 of the VM. On Open MPI (2-4 ranks of the VM) it took
# 0.41-0.98x the time of Open MPI's nonblocking call at 8-16 MiB and
# 0.16-0.43x at 32-64 MiB, where the shared window took 0.55-0.92x
# (docs/measurements/all_reduce_paths.py). An AVG of complex numbers, whose
# division the kernels do not do, stays with MPI. PYCOLL_SPLIT_BYTES, where
# set, is this size too.
RING_BYTES = 8 << 20 if _SET is None else _SET
# The MPIs whose own all_reduce the ring was measured against, which take it
# by these rules; others (Intel MPI, MVAPICH...) keep their own call.
RING_MPIS = ("MPICH", "Open MPI")


def plan(op: Any, dtype: np.dtype, func: str) -> Plan:
    """Return how to carry out ``op`` on ``dtype``, or raise if it has no meaning.

    Callers on a hot path look in ``op._plans`` first; this fills it.

    Raises:
        TypeError: ``op`` is not a ReduceOp.
        ValueError: the pair (op, dtype) is not defined.
    """
    if not isinstance(op, ReduceOp):
        names = ", ".join(f"ReduceOp.{name}" for name in NAMES if name != "PREMUL_SUM")
        hint = ""
        if isinstance(op, str) and op.upper() in NAMES:
            hint = f" (for {op!r}, pass pycoll.ReduceOp.{op.upper()})"
        raise TypeError(
            f"{func}: op must be a pycoll.ReduceOp, one of {names} or "
            f"make_premul_sum(factor), got {op!r}{hint}"
        )
    check_dtype(func, "tensor", dtype)
    name = op.name
    kind = check_pair(name, dtype, func)
    user_op = name in _KERNEL_OPS.get(kind, ())
    if user_op:
        mpi_op = kernels.mpi_op(name, dtype)
    else:
        mpi_op = getattr(_mpi.load(), (_LOGICAL if kind == "bool" else _ARITHMETIC)[name])
    scale = op.scale
    if scale is not None and isinstance(scale, complex) and kind != "complex":
        raise ValueError(
            f"{func}: a complex PREMUL_SUM scale ({scale}) cannot scale "
            f"dtype {dtype}; use a real scale or complex arrays"
        )
    average = name == "AVG"
    split = (
        SPLIT_BYTES > 0 and _mpi.VENDOR in RING_MPIS and (user_op or (average and kind == "float"))
    )
    key = crosscheck.reduction_bits(name, dtype)
    result = Plan(
        mpi_op,
        scale,
        average,
        mpi_datatype(dtype),
        scale is None and not average,
        split,
        key,
        not user_op,
    )
    if scale is None:  # a PREMUL_SUM scale often changes every step: do not cache it
        op._plans[dtype] = result
    return result


def free_user_ops() -> None:
    """Free the MPI user ops created so far (called when pycoll shuts down)."""
    mpiop = sys.modules.get("pycoll.kernels.mpiop")  # never import numba just to free
    if mpiop is not None:
        mpiop.free_all()
    for member in MEMBERS.values():
        member._plans.clear()
