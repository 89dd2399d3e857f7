"""Reductions: all_reduce, all_reduce_coalesced, reduce, reduce_scatter,
reduce_scatter_tensor.

Each applies a ReduceOp across the group's ranks; how the op is carried out
for the dtype (MPI op, pre-scaling, averaging) comes from pycoll.ops.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _mpi, autotune, crosscheck, debug, kernels, native, persistent, tuning, watch
from ..arrays import (
    MPI_TYPES,
    check_input,
    check_list,
    check_output,
    check_same_dtype,
    check_same_shape,
    check_size,
    dtype_kind,
    may_alias,
    own_part,
    plain_arrays,
)
from ..crosscheck import COUNT, OP_BITS
from ..dispatch import collective
from ..fusion import FusedAllReduce
from ..groups import STATE, ProcessGroup, resolve
from ..ops import (
    RING_BYTES,
    RING_MPIS,
    SPLIT_BYTES,
    SPLIT_BYTES_TWO_RANKS,
    Plan,
    env_bytes,
    plan,
)
from ..persistent import LIMIT as PLAN_LIMIT
from ..reduceop import ReduceOp
from ..spec import IN, INOUT, LIST, OUT, UNKNOWN, Array
from ..work import Work
from . import pair, scratch, shm
from ._common import lean, plain, root_of, run, sig
from .doubling import Doubling
from .pairwise import Pairwise
from .ring import Ring
from .ring import parts as ring_parts
from .to_root import ToRoot

__all__ = [
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
]


def _plan(op: ReduceOp, dtype: np.dtype, func: str) -> Plan:
    try:
        return op._plans[dtype]
    except (AttributeError, KeyError):
        return plan(op, dtype, func)


_ALL_REDUCE = OP_BITS["all_reduce"]  # the call check's key (pycoll.crosscheck)
_REDUCE_SCATTER_TENSOR = OP_BITS["reduce_scatter_tensor"]

# Up to this size a two-rank AVG of float32/float64 runs as one user op; above
# it MPI's builtin SUM (Rabenseifner: each rank reduces half the buffer, where
# a user op gets recursive doubling and reduces all of it) plus a division
# measured faster. float16/bfloat16 are user ops anyway: always. A large
# AVG takes pycoll's ring before this applies.
MEAN_OF_TWO_BYTES = 32 << 20


def _split_from(ranks: int) -> int:
    """The size from which an all_reduce with a Plan.split op is split."""
    return SPLIT_BYTES if ranks > 2 else SPLIT_BYTES_TWO_RANKS


def _ring_from() -> int:
    """The size from which an all_reduce with one of MPI's own ops takes
    pycoll's ring: on the MPIs it was measured against (0: never)."""
    return RING_BYTES if _mpi.VENDOR in RING_MPIS else 0


def _mean_of_two(x: np.ndarray) -> bool:
    if x.dtype.kind == "c":
        return False  # complex: AVG stays a SUM plus a per-component division
    return x.dtype.itemsize == 2 or x.nbytes < MEAN_OF_TWO_BYTES


def _scaled(x: np.ndarray, scale: complex) -> np.ndarray:
    """A scaled copy of an input that must not be modified."""
    return kernels.scale(x, scale)


def _prescaler(x: np.ndarray, scale: Optional[complex]) -> Optional[Callable[[], None]]:
    """Scale an in-place buffer once the call is known to go ahead."""
    if scale is None:
        return None

    def prepare() -> None:
        kernels.scale(x, scale, out=x)

    return prepare


def _averager(out: np.ndarray, n: int) -> Callable[[], None]:
    def finish() -> None:
        kernels.divide(out, n, out=out)

    return finish


@collective(Array("tensor", INOUT), aware=True, chunked=True)
def all_reduce(
    tensor: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``tensor`` across the group, in place, so every rank holds the result.

    Args:
        tensor: input and output; C-contiguous and writeable.
        op: the reduction (default SUM).
        group: the group (default: the world).
        async_op: return a Work instead of waiting.

    Returns:
        A Work if ``async_op``; None otherwise, and on ranks outside ``group``.

    Example (2 ranks)::

        >>> t = np.array([1.0, 2.0]) * (rank + 1)   # rank 0: [1, 2]; rank 1: [2, 4]
        >>> pycoll.all_reduce(t)
        >>> t                                         # both ranks: [3, 6]
    """
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, "all_reduce")  # raises before init; None for a non-member
        if pg is None:
            return None
    # The common case (a plain writeable contiguous array, a cached plan, a
    # synchronous call, debug off) is checked inline and goes straight to
    # MPI: this is the call training loops make thousands of times a step.
    if type(tensor) is not np.ndarray or not ((f := tensor.flags).c_contiguous and f.writeable):
        tensor = check_output("all_reduce", "tensor", tensor)
    # The same call as before on this array? Compiled (pycoll.native). Else
    # ``kept`` is False where native.call may keep it below (None: an array
    # first seen now, as one made afresh for each call, is not offered).
    kept = None
    if pg._native is not None and debug.PLAIN:
        if not async_op:
            if kept := native.again(pg, "all_reduce", tensor, _mpi.IN_PLACE, op):
                return None
        elif async_op is True and (
            kept := native.again(pg, "all_reduce", tensor, _mpi.IN_PLACE, op, work=True)
        ):
            return kept  # (a Work: started by the compiled code, waited for in Python)
    try:
        how = op._plans[tensor.dtype]
    except (AttributeError, KeyError):
        how = plan(op, tensor.dtype, "all_reduce")
    key = how.key | _ALL_REDUCE | tensor.size & COUNT
    plans = pg._plans
    if plans is not None and how.plain:  # a repeated small call: pycoll.persistent
        made = plans.made.get(key)
        if made is None and tensor.nbytes <= PLAN_LIMIT:
            made = persistent.for_all_reduce(pg, key, tensor, how.datatype, how.mpi_op)
        if made is not None:
            if (
                not async_op
                and debug.PLAIN
                and native.call_plan(
                    pg, "all_reduce", made, tensor, _mpi.IN_PLACE, op, tensor, tensor
                )
            ):
                return None
            desc = _desc(op, tensor) if async_op or not debug.PLAIN else None
            return made.call(pg, "all_reduce", tensor, tensor, async_op, desc)
    # Large calls: the path this machine's tuning table chose, where one is
    # installed (pycoll.tuning); else, on MPICH, pycoll's ring, where it
    # measured faster than MPI's own and than the shared-memory path; then the
    # shared-memory path. The sizes are compared first, so small calls (the
    # hot path) make no calls.
    nbytes = tensor.nbytes
    if nbytes >= pg._tuned_from:
        # The table's ring or window serves any op it can carry (where it beat
        # MPI's own float32 SUM, it beats MPI's user ops and AVG the more); where
        # it keeps MPI's call, MPI's own ops follow it and the others the rule.
        chosen = tuning.path(pg._tuned, nbytes)
        if chosen == "ring" and _ring_carries(pg, how, tensor.dtype):
            return _all_reduce_ring(pg, tensor, op, how, async_op, key)
        if chosen == "window":
            win = shm.usable(pg, how, tensor.dtype, "all_reduce")
            if win is not None:
                return _all_reduce_shm(pg, win, tensor, op, how, async_op, key)
        if how.plain and how.builtin:
            nbytes = 0  # MPI's own call, as the table says: no size below is reached
    elif nbytes >= pg._live_from and _tried(pg, how, op.name, tensor.dtype):
        # The path this class of calls measured fastest in its first calls,
        # or the next of those trials (pycoll.autotune).
        done = _all_reduce_live(pg, tensor, op, how, async_op, key)
        if done is not _BY_MPI:
            return done
        nbytes = 0  # MPI's own call: no size below is reached
    if (  # (the sizes first: small calls, the hot path, make no call)
        how.split
        or nbytes >= RING_BYTES
        or nbytes >= SHM_BYTES_PAIR
        or nbytes >= SHM_BYTES_MPICH
        or nbytes >= SHM_BYTES
        or 0 < DOUBLING_BYTES <= nbytes
    ):
        way, win = _rule_path(pg, how, tensor.dtype, nbytes)
        if way == "ring":
            return _all_reduce_ring(pg, tensor, op, how, async_op, key)
        if way == "window":
            return _all_reduce_shm(pg, win, tensor, op, how, async_op, key)
        if way == "doubling":
            return _all_reduce_doubling(pg, tensor, op, how, async_op, key)
    mpi_op, plainly, average = how.mpi_op, how.plain, how.average
    if average and pg._size == 2 and _mean_of_two(tensor):
        # Two ranks: each element is combined exactly once, so AVG is one user
        # op, (a + b) / 2, and no second pass over the result.
        mpi_op, plainly, average = kernels.mean_of_two_op(tensor.dtype), True, False
    if (
        plainly
        and nbytes == tensor.nbytes
        and pair.applies("all_reduce", pg._size, nbytes)
        and not pg._aliases
    ):
        ordered = _order_matters(op.name, tensor.dtype)
        return pair.all_reduce(
            pg, tensor, mpi_op, how.datatype, ordered, async_op, key, _desc(op, tensor), op, kept
        )
    comm = pg.comm
    # (The compiled path keeps no call of the live trials' sizes: a kept call
    # would skip its class's count on one rank, and the ranks' rechecks
    # would fall on different calls: pycoll.autotune.)
    if kept is False and tensor.nbytes >= pg._live_from:
        kept = None
    if plainly and not async_op and debug.PLAIN:
        if kept is False and native.call(
            pg, "all_reduce", key, native.ALL_REDUCE, _mpi.IN_PLACE, tensor, tensor.size,
            how.datatype, mpi_op, 0, tensor, _mpi.IN_PLACE, op,
        ):  # fmt: skip
            return None
        plain(
            pg,
            "all_reduce",
            key,
            comm.Iallreduce,
            comm.Allreduce,
            _mpi.IN_PLACE,
            [tensor, how.datatype],
            mpi_op,
        )
        return None
    if plainly and async_op is True and debug.PLAIN:  # (run's own first step, taken here)
        work = kept is False and native.call(
            pg, "all_reduce", key, native.ALL_REDUCE, _mpi.IN_PLACE, tensor, tensor.size,
            how.datatype, mpi_op, 0, tensor, _mpi.IN_PLACE, op, work=True,
        )  # fmt: skip
        if work:  # kept, and started by the compiled code
            return work
        return lean(
            pg, "all_reduce", tensor.nbytes, comm.Iallreduce,
            (_mpi.IN_PLACE, [tensor, how.datatype], mpi_op), True, None, [tensor], key,
        )  # fmt: skip
    return run(
        pg,
        "all_reduce",
        tensor.nbytes,
        comm.Iallreduce,
        (_mpi.IN_PLACE, [tensor, how.datatype], mpi_op),
        async_op,
        _averager(tensor, pg._size) if average else None,
        [tensor],
        _desc(op, tensor),
        _prescaler(tensor, how.prescale),
        key=key,
    )


# From this size an all_reduce whose ranks share one node goes through the
# node's shared memory (pycoll.collectives.shm): on 2-4 ranks it measured
# 2.2-3.5x MPICH's own from 32 MiB, where MPICH's falls to 0.5-2 GB/s, and
# 0.7-1.3x below. pycoll's ring comes first (from RING_BYTES, or SPLIT_BYTES
# for its ops), faster still. 0 turns the window off. PYCOLL_SHM_BYTES, where
# set, is this size and SHM_BYTES_MPICH, for any number of ranks and any MPI.
_SHM_SET = shm.SHM_SET
SHM_BYTES = 32 << 20 if _SHM_SET is None else _SHM_SET
# On MPICH the window is taken from this size already, up to where the ring
# takes over, in groups whose size is not a power of two: there MPICH adds
# steps for the ranks past a power of two, and the window measured 0.34-0.71x
# its time on 3, 5 and 6 ranks (docs/measurements/all_reduce_paths.py). On a
# power of two the window was faster on one machine and slower on another (2
# ranks: 0.68-0.92x MPICH's time at 1-8 MiB on the 2-core CI VM, 1.15-1.98x on
# a 16-core Xeon whatever its chunk size), so MPICH's own call stays. Open
# MPI's nonblocking barriers, which the window waits on, made it slower there
# at 16 MiB: Open MPI keeps SHM_BYTES.
SHM_BYTES_MPICH = 1 << 20 if _SHM_SET is None else _SHM_SET
# On Open MPI a group of two or four ranks takes the window from SHM_BYTES_PAIR up
# to PAIR_BELOW already, where libnbc's nonblocking all_reduce is left to its
# default choice (_mpi.ALL_REDUCE_CHOSEN) and the wait mode is the default
# one: libnbc then takes its binomial tree for every call in place, about
# twice Open MPI's blocking all_reduce's time from 32 KiB on 2 ranks of the CI
# VM, where the window took 0.58-0.68x the binomial tree's time at 256 KiB-4
# MiB, level with the blocking call; 0.67-0.88x at 64-128 KiB, and 0.81-0.93x
# at 8 MiB and 1.16-1.39x at 16 MiB (docs/measurements/all_reduce_paths.py). An
# algorithm chosen for libnbc (pycoll-run's ring: about the blocking call's
# time) keeps MPI's call, and so does blocking mode, whose call is Open MPI's
# blocking one. On 4 ranks (sharing the VM's 2 cores) it took 0.51-0.86x the
# tree's time at 256 KiB-4 MiB in four runs, 1.06-1.43x at 8 MiB; on 3 ranks
# 0.74-1.96x at 128 KiB-4 MiB, so a group of three keeps MPI's call.
SHM_BYTES_PAIR = 256 << 10 if _SHM_SET is None else _SHM_SET
PAIR_BELOW = 8 << 20


# From this size an all_reduce on a group of two ranks that neither the ring
# nor the window took goes by pycoll's recursive doubling (pycoll.collectives.
# doubling: one exchange, each rank folding the other's copy in) where MPI's
# nonblocking all_reduce in place is Open MPI's binomial tree
# (_binomial_in_place). On 2 ranks of the CI VM it took 0.78x the tree's time
# or less at 128-512 KiB in every run (the window, which takes over at
# SHM_BYTES_PAIR, 0.51-0.68x at 256-512 KiB); at 64 KiB 0.67-0.70x in the
# VM's slower state and 0.91-1.02x in its faster, at 32 KiB 0.76-0.78x and
# 1.04-1.07x, so it starts at 64 KiB; below, its steps in Python cost more
# than the tree's second message. On 4 ranks sharing 2 cores it took 1.2-2.6x
# the tree's time at 8-128 KiB and 0.83-1.44x at 256 KiB-4 MiB, where the
# window was faster (docs/measurements/all_reduce_paths.py), so larger groups
# keep MPI's call. PYCOLL_DOUBLING_BYTES, where set, is this size on every MPI
# and in either wait mode (0: never).
_DOUBLING_SET = env_bytes("PYCOLL_DOUBLING_BYTES", "never")
DOUBLING_BYTES = 64 << 10 if _DOUBLING_SET is None else _DOUBLING_SET


def _doubles(ranks: int) -> bool:
    """Whether an all_reduce on a group of ``ranks`` takes pycoll's recursive
    doubling from DOUBLING_BYTES (where neither the ring nor the window did)."""
    return ranks == 2 and (_DOUBLING_SET is not None or _binomial_in_place())


def _shm_least() -> int:
    """The least size at which an all_reduce may take the window (its group's
    window is made, or found, from this size)."""
    if _mpi.VENDOR == "MPICH":
        return min(SHM_BYTES, SHM_BYTES_MPICH)
    return min(SHM_BYTES, SHM_BYTES_PAIR) if _binomial_in_place() else SHM_BYTES


def _binomial_in_place() -> bool:
    """Whether MPI's nonblocking all_reduce, in place, is Open MPI's binomial
    tree (libnbc's default choice, none made for it) and the calls that
    would take the window are nonblocking ones (the default wait mode)."""
    return _mpi.VENDOR == "Open MPI" and not _mpi.ALL_REDUCE_CHOSEN and not watch.BLOCKING


def _takes_window(ranks: int, nbytes: int) -> bool:
    """Whether an all_reduce of ``nbytes`` on a group of ``ranks`` goes
    through the group's shared window, where it can have one."""
    if not 0 < _shm_least() <= nbytes:
        return False
    if nbytes >= SHM_BYTES:
        return True
    if _mpi.VENDOR == "MPICH":
        return SHM_BYTES_MPICH <= nbytes and ranks & (ranks - 1) != 0
    return ranks in (2, 4) and SHM_BYTES_PAIR <= nbytes < PAIR_BELOW and _binomial_in_place()


# From this many bytes of input a reduce_scatter_tensor whose ranks share one
# node goes through the node's shared window (pycoll.collectives.shm.Block):
# each rank copies its input in, reduces its own part across
# every rank's copy there and copies it out. Against MPI's own call on the CI
# VM (docs/measurements/scatter_window.py and pycoll-bench): Open MPI's
# reduce-scatter falls to 0.5-1.5 GB/s of input from 16-32 MiB, where the
# window took 0.16-0.21x its time on 2-4 ranks, and 0.43-0.69x at 1-16 MiB on 2
# (at 256 KiB 1.6-2.7x on 3-4 ranks). MPICH's keeps 4-8 GB/s up to 32 MiB,
# where the window took 0.83-2.05x its time, and falls from 64 MiB, where it
# took 0.25-0.31x on 2 ranks and 0.36-0.91x on 3-4. PYCOLL_SHM_BYTES=0 turns it
# off (no window at all).
SCATTER_SHM_BYTES = 64 << 20
SCATTER_SHM_BYTES_OPEN_MPI = 1 << 20
# From this many bytes of input a reduce_scatter_tensor or reduce_scatter on
# a group of two ranks goes by pycoll's pairwise exchange
# (pycoll.collectives.pairwise), before the window. On 2 ranks of the CI VM
# (docs/measurements/rs_paths.py) it took 0.58-0.76x mpi4py's time at 2-16 MiB
# on MPICH, 0.97-1.04x at 1 MiB where pycoll's MPI call took 1.07-1.16x
# (1.10-1.22x on a 16-core machine, against 0.97-1.04x), and 0.07-0.68x at 2-64
# MiB on Open MPI, where the window took 0.19-0.95x. On Open MPI it starts at
# 256 KiB: there it took 0.26-0.86x mpi4py's time at 256 KiB and 0.14-0.64x at
# 512 KiB-1 MiB, both forms, where Open MPI's call took 0.74-1.03x and the
# window 0.42-1.12x (at 128 KiB 0.79-1.91x, and Open MPI's call 1.23-1.59x). On
# 4 ranks it was no faster than MPI's call or the window, so larger groups keep
# the rule above. PYCOLL_PAIRWISE_BYTES, where set, is this size on every MPI
# (0: never).
_PAIRWISE_SET = env_bytes("PYCOLL_PAIRWISE_BYTES", "never")
PAIRWISE_BYTES = 1 << 20 if _PAIRWISE_SET is None else _PAIRWISE_SET
PAIRWISE_BYTES_OPEN_MPI = 256 << 10 if _PAIRWISE_SET is None else _PAIRWISE_SET


def _pairwise_from() -> int:
    """The least bytes of input from which a two-rank reduce-scatter takes the
    pairwise exchange by the built-in rule (0: never)."""
    return PAIRWISE_BYTES_OPEN_MPI if _mpi.VENDOR == "Open MPI" else PAIRWISE_BYTES


def _rule_path(pg: ProcessGroup, how: Plan, dtype: np.dtype, nbytes: int) -> Tuple[str, Any]:
    """The built-in rule's path for an all_reduce of ``nbytes`` that neither
    a tuning table nor the live trials decided: ``("ring", None)``,
    ``("window", win)`` (the group's window, made on its first call),
    ``("doubling", None)`` or ``("mpi", None)``, MPI's own call (or, below
    these sizes, the two-rank exchange)."""
    if (
        (how.split and nbytes >= _split_from(pg._size))
        or (nbytes >= RING_BYTES and not how.average and _ring_from() > 0)
    ) and _ring_carries(pg, how, dtype):
        return "ring", None
    if (
        nbytes >= SHM_BYTES_PAIR or nbytes >= SHM_BYTES_MPICH or nbytes >= SHM_BYTES
    ) and _takes_window(pg._size, nbytes):
        win = shm.usable(pg, how, dtype, "all_reduce")  # (made on its first call)
        if win is not None:
            return "window", win
    if 0 < DOUBLING_BYTES <= nbytes and _doubles(pg._size) and _ring_carries(pg, how, dtype):
        return "doubling", None
    return "mpi", None


def _tried(pg: ProcessGroup, how: Plan, name: str, dtype: np.dtype) -> bool:
    """Whether a call of the live trials' sizes (pycoll.autotune) is theirs
    to decide: an op MPI carries whole, but MIN or MAX of floats, whose bits
    the paths' orders of folding change, and arrays that alias device memory
    for a CUDA-aware MPI, which only MPI's call carries."""
    return how.plain and not _order_matters(name, dtype) and not pg._aliases


_BY_MPI: Any = object()  # _all_reduce_live's answer where MPI's own call takes the call


def _all_reduce_live(
    pg: ProcessGroup, tensor: np.ndarray, op: ReduceOp, how: Plan, async_op: bool, key: int
) -> Any:
    """all_reduce by the path its class measured fastest in its first calls,
    or its next trial, timed (pycoll.autotune): the call's result, or
    _BY_MPI where the class chose MPI's own call (the caller's path to it
    follows). (A function of its own: the closures below would make the
    caller's variables cells, 0.2 us on every small call.)"""
    nbytes = tensor.nbytes
    path, trial = autotune.trials(pg).choose(
        pg,
        "all_reduce",
        ("all_reduce", how.key, nbytes.bit_length()),
        lambda: _live_paths(pg, how, tensor.dtype, nbytes),
    )
    win = shm.usable(pg, how, tensor.dtype, "all_reduce") if path == "window" else None
    if path == "ring":
        step = lambda: _all_reduce_ring(pg, tensor, op, how, async_op, key)  # noqa: E731
    elif win is not None:
        step = lambda: _all_reduce_shm(pg, win, tensor, op, how, async_op, key)  # noqa: E731
    elif path == "doubling":
        step = lambda: _all_reduce_doubling(pg, tensor, op, how, async_op, key)  # noqa: E731
    elif trial is not None:  # MPI's own call, a trial's: its general path
        step = lambda: run(  # noqa: E731
            pg, "all_reduce", nbytes, pg.comm.Iallreduce,
            (_mpi.IN_PLACE, [tensor, how.datatype], how.mpi_op), async_op,
            None, [tensor], _desc(op, tensor), key=key,
        )  # fmt: skip
    else:
        return _BY_MPI
    return autotune.timed(pg, "all_reduce", trial, path, step)


def _live_paths(pg: ProcessGroup, how: Plan, dtype: np.dtype, nbytes: int) -> List[str]:
    """The paths a large all_reduce's trials compare (pycoll.autotune): the
    built-in rule's first (what the others must beat), then MPI's own call,
    pycoll's ring and the node's shared window where they can carry it (the
    window is made here, on every rank alike)."""
    paths = [_rule_path(pg, how, dtype, nbytes)[0], "mpi"]
    if _ring_carries(pg, how, dtype):
        paths.append("ring")
    if shm.usable(pg, how, dtype, "all_reduce") is not None:
        paths.append("window")
    return list(dict.fromkeys(paths))


def _ring_carries(pg: ProcessGroup, how: Plan, dtype: np.dtype) -> bool:
    """Whether pycoll's own paths (the ring, the doubling, the pairwise
    exchange, the reduce to a root) can carry this call: more than one rank,
    an AVG's division in the kernels' last sum (real floats only), host
    memory (not device memory aliased for a CUDA-aware MPI), and an MPI with
    MPI_Isendrecv (MPI-4.0), their messages' call."""
    return (
        pg._size > 1
        and not pg._aliases
        and (not how.average or kernels.divides(dtype))
        and _mpi.has("MPI_Isendrecv")
    )


def _scatter_way(
    pg: ProcessGroup, how: Plan, dtype: np.dtype, func: str, nbytes: int, name: str
) -> Tuple[str, Any, Any]:
    """How a reduce_scatter_tensor (or reduce_scatter) of ``nbytes`` of input
    with the op ``name`` goes: ``("window", win)`` through the group's shared
    window (one node, an op the kernels reduce, a window at all:
    shm.for_scatter), ``("pairwise", None)`` by pycoll's pairwise exchange, or
    ``("mpi", None)``, MPI's own call; and, where the call is one of the live
    trials, what pycoll.autotune.timed takes of it (else None). From its first size
    the group's tuning table (pycoll.tuning) decides; else, for the ops MPI
    carries whole from the trials' first size, the path its class measured
    fastest (or its next trial); else the built-in rule (:func:`_scatter_rule`)."""
    trial = None
    if nbytes >= pg._tuned_rs_from:
        wanted = tuning.path(pg._tuned_rs, nbytes)
    elif nbytes >= pg._live_from and _tried(pg, how, name, dtype):
        wanted, trial = autotune.trials(pg).choose(
            pg, func, (func, how.key, nbytes.bit_length()),
            lambda: _scatter_paths(pg, how, dtype, func, nbytes),
        )  # fmt: skip
    else:
        wanted = _scatter_rule(pg, how, dtype, func, nbytes)
    if wanted == "window":
        win = shm.for_scatter(pg, how, dtype, func)
        if win is not None:
            return wanted, win, trial
    if wanted == "pairwise" and _ring_carries(pg, how, dtype):
        return wanted, None, trial
    return "mpi", None, trial


def _scatter_rule(pg: ProcessGroup, how: Plan, dtype: np.dtype, func: str, nbytes: int) -> str:
    """The built-in rule's way for a reduce-scatter of ``nbytes`` of input:
    on two ranks pycoll's pairwise exchange from its size, on more the
    window from its size, else MPI's own call (a way that cannot carry the
    call: MPI's call)."""
    if pg._size == 2 and 0 < _pairwise_from() <= nbytes:
        return "pairwise" if _ring_carries(pg, how, dtype) else "mpi"
    least = SCATTER_SHM_BYTES_OPEN_MPI if _mpi.VENDOR == "Open MPI" else SCATTER_SHM_BYTES
    if 0 < least <= nbytes and shm.for_scatter(pg, how, dtype, func) is not None:
        return "window"
    return "mpi"


def _scatter_paths(
    pg: ProcessGroup, how: Plan, dtype: np.dtype, func: str, nbytes: int
) -> List[str]:
    """The paths a large reduce-scatter's trials compare (pycoll.autotune):
    the built-in rule's first (what the others must beat), then MPI's own
    call, pycoll's pairwise exchange (two ranks) and the node's shared window
    where they can carry it (the window is made here, on every rank alike)."""
    paths = [_scatter_rule(pg, how, dtype, func, nbytes), "mpi"]
    if pg._size == 2 and _ring_carries(pg, how, dtype):
        paths.append("pairwise")
    if shm.for_scatter(pg, how, dtype, func) is not None:
        paths.append("window")
    return list(dict.fromkeys(paths))


def _scatter_along(
    pg: ProcessGroup,
    func: str,
    way: str,
    win: Any,
    trial: Any,
    output: np.ndarray,
    parts: List[np.ndarray],
    whole: Optional[np.ndarray],
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    desc: Callable[[], str],
) -> Optional[Work]:
    """A reduce-scatter of ``parts`` (``whole``: the input they are parts
    of, reduce_scatter_tensor's; None for the list form) into ``output`` by
    the path ``way`` that :func:`_scatter_way` chose: the window, pycoll's
    pairwise exchange, or MPI's own call where it is a live trial's (its
    general path; else the caller's own paths to MPI's call serve it), timed
    where ``trial`` says it is a timed trial (pycoll.autotune)."""
    if way == "window":
        step = lambda: _reduce_scatter_shm(  # noqa: E731
            pg, win, func, output, parts, op, how, async_op, desc
        )
    elif way == "pairwise":
        step = lambda: _reduce_scatter_pairwise(  # noqa: E731
            pg, func, output, parts, op, how, async_op, desc
        )
    else:
        send = np.concatenate([x.reshape(-1) for x in parts]) if whole is None else whole
        into = (
            scratch.beside(pg, output) if whole is not None and may_alias(whole, output) else None
        )
        step = lambda: _reduce_scatter_block(  # noqa: E731
            pg, func, send, output, how, async_op, desc, into
        )
    return autotune.timed(pg, func, trial, way, step)


def _aside(
    pg: ProcessGroup, output: np.ndarray, parts: List[np.ndarray]
) -> Tuple[bool, Optional[np.ndarray], Optional[Callable[[], None]]]:
    """Whether a reduce-scatter's ``output`` is this rank's part itself
    (torch's in-place form); and where it overlaps the ``parts`` otherwise,
    an array shaped like it to receive into and what copies that in once
    the call is done (else None, None)."""
    me = pg._rank
    mine = parts[me].ctypes.data == output.ctypes.data
    if not any(may_alias(part, output) for d, part in enumerate(parts) if not (mine and d == me)):
        return mine, None, None
    aside = scratch.beside(pg, output)

    def then() -> None:
        output[...] = aside
        scratch.give(pg, aside)

    return mine, aside, then


def _reduce_scatter_shm(
    pg: ProcessGroup,
    win: Any,
    func: str,
    output: np.ndarray,
    parts: List[np.ndarray],
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    desc: Callable[[], str],
) -> Optional[Work]:
    """``parts`` (one array shaped like ``output`` per rank: the parts of
    reduce_scatter_tensor's input, or reduce_scatter's list) reduce-scattered
    into ``output`` through ``win`` (:class:`pycoll.collectives.shm.Block`).
    The output is written chunk by chunk: where it is this rank's part
    itself (torch's in-place form) it is taken as it is, since only the
    chunk being written reads those bytes; an output that overlaps the
    parts otherwise receives aside and is copied in at the end."""
    _, into, then = _aside(pg, output, parts)
    flat = lambda x: x.reshape(-1).view(np.uint8)  # noqa: E731
    data = shm.Block(win, [flat(part) for part in parts], flat(output), output.dtype, how.prescale)
    key = how.key | OP_BITS[func] | output.size & COUNT
    return shm.reduce_scatter(
        pg, win, func, data, op, how, into, async_op, [output], desc, key, then
    )


def _reduce_scatter_pairwise(
    pg: ProcessGroup,
    func: str,
    output: np.ndarray,
    parts: List[np.ndarray],
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    desc: Callable[[], str],
) -> Optional[Work]:
    """``parts`` (one array shaped like ``output`` per rank) reduce-scattered
    into ``output`` by pycoll's pairwise exchange (pycoll.collectives.
    pairwise), folding with pycoll's kernels (an AVG's division in each
    element's last fold). An output that is this rank's part itself (torch's
    in-place form) is reduced where it is; one overlapping the parts
    otherwise receives aside and is copied in at the end. A PREMUL_SUM's
    parts are scaled into a copy first: the input is left as it is."""
    n = pg._size
    dtype = output.dtype
    flats = [part.reshape(-1) for part in parts]
    if how.prescale is not None:
        send = np.concatenate(flats)
        kernels.scale(send, how.prescale, out=send)
        count = output.size
        flats = [send[d * count : (d + 1) * count] for d in range(n)]
    mine, aside, then = _aside(pg, output, flats)
    into = (output if aside is None else aside).reshape(-1)
    in_place = mine and aside is None
    name = how.kernel_op(op)
    divisor = n if how.average else None

    def fold(src: np.ndarray, dst: np.ndarray, last: bool) -> None:
        kernels.reduce(name, src, dst, divisor if last else None)

    need = Pairwise.needs(n, in_place, into)
    room = scratch.take(pg, need * dtype.itemsize, dtype) if need else None
    steps = Pairwise(pg, func, flats, into, in_place, room, fold)

    def finish() -> None:
        steps.finish()
        if room is not None:
            scratch.give(pg, room)
        if then is not None:
            then()

    return run(
        pg,
        func,
        output.nbytes * n,
        steps.start,
        (),
        async_op,
        finish,
        [output],
        desc,
        None,
        steps.stages,
        how.key | OP_BITS[func] | output.size & COUNT,
    )


def _all_reduce_shm(
    pg: ProcessGroup,
    win: Any,
    tensor: np.ndarray,
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    key: int,
) -> Optional[Work]:
    """all_reduce of one array through the node's shared window."""
    return shm.all_reduce(
        pg,
        win,
        "all_reduce",
        shm.Contiguous(tensor.reshape(-1).view(np.uint8)),
        tensor.dtype,
        op,
        how,
        async_op,
        [tensor],
        _desc(op, tensor),
        _prescaler(tensor, how.prescale),
        key,
    )


def _all_reduce_doubling(
    pg: ProcessGroup, tensor: np.ndarray, op: ReduceOp, how: Plan, async_op: bool, key: int
) -> Optional[Work]:
    """all_reduce by pycoll's recursive doubling (pycoll.collectives.
    doubling), folding with pycoll's kernels (an AVG dividing in the last
    fold)."""
    flat = tensor.reshape(-1)
    n = pg._size
    name = how.kernel_op(op)
    peer = scratch.take(pg, tensor.nbytes, tensor.dtype, scratch.KEEP_FROM_LEAST)
    fold_in = kernels.folder(name, tensor.dtype)
    average = kernels.folder(name, tensor.dtype, n) if how.average else fold_in

    def fold(src: np.ndarray, dst: np.ndarray, last: bool) -> None:
        (average if last else fold_in)(src, dst)

    steps = Doubling(pg, flat, peer, fold, _order_matters(name, tensor.dtype))

    def finish() -> None:
        try:
            steps.finish()
        finally:
            scratch.give(pg, peer)

    return run(
        pg,
        "all_reduce",
        tensor.nbytes,
        steps.start,
        (),
        async_op,
        finish,
        [tensor],
        _desc(op, tensor),
        _prescaler(tensor, how.prescale),
        steps.stages or None,  # (two ranks: one step, run's lean path)
        key,
    )


def _desc(op: ReduceOp, tensor: np.ndarray) -> Callable[[], str]:
    """all_reduce's description for DETAIL's check, whichever way it runs."""
    return lambda: f"all_reduce({op.name}, {sig(tensor)})"


def _order_matters(name: str, dtype: np.dtype) -> bool:
    """Whether the op ``name`` gives different bits by its operands' order on
    ``dtype``: MIN and MAX of floats (min(0.0, -0.0) is -0.0, min(-0.0, 0.0)
    0.0). pycoll's own all_reduce paths fold those in rank order, so every
    rank ends with the same bits."""
    return name in ("MIN", "MAX") and dtype_kind(dtype) in ("float", "half")


def _all_reduce_ring(
    pg: ProcessGroup, tensor: np.ndarray, op: ReduceOp, how: Plan, async_op: bool, key: int
) -> Optional[Work]:
    """all_reduce in pycoll's ring (pycoll.collectives.ring): a reduce-scatter
    whose steps combine with pycoll's kernels (an AVG's last one dividing too,
    so its division covers this rank's 1/n of the data, in the same pass),
    then an all-gather."""
    flat = tensor.reshape(-1)
    n = pg._size
    name = how.kernel_op(op)
    part = scratch.take(pg, (flat.size // n + 1) * tensor.dtype.itemsize, tensor.dtype)

    def combine(start: int, count: int) -> None:
        # The last reduce-scatter step receives this rank's own part: an AVG
        # divides there, in the same pass as its last sum.
        last = how.average and start == ring.starts[ring.own]
        kernels.reduce(name, part[:count], flat[start : start + count], n if last else None)

    ring = Ring(pg, flat.view(np.uint8), part.view(np.uint8), tensor.dtype.itemsize, combine)
    return run(
        pg,
        "all_reduce",
        tensor.nbytes,
        ring.start,
        (),
        async_op,
        lambda: scratch.give(pg, part),
        [tensor],
        _desc(op, tensor),
        _prescaler(tensor, how.prescale),
        ring.stages,
        key,
    )


def _kept_list(
    tensors: Any,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Any:
    """all_reduce_coalesced's shortcut (pycoll.spec.Spec.known): a list
    whose FusedAllReduce the group keeps (the very same array objects, so
    numpy arrays all) runs through it at once, without the type check of
    every item; any other call is pycoll.spec.UNKNOWN."""
    pg = resolve(group, "all_reduce_coalesced")
    fusions = pg.attached(_FUSIONS) if pg is not None else None
    fused = fusions.find(tensors, op) if fusions is not None else None
    if fused is None or fused.busy():
        return UNKNOWN
    assert pg is not None
    return fused._run(pg, "all_reduce_coalesced", async_op, _coalesced(op, tensors, fused.dtype))


def _coalesced(op: ReduceOp, tensors: List[np.ndarray], dtype: np.dtype) -> Callable[[], str]:
    """all_reduce_coalesced's description for DETAIL's check, whichever way it runs."""
    return lambda: f"all_reduce_coalesced({op.name}, shapes={[t.shape for t in tensors]}, {dtype})"


@collective(Array("tensors", INOUT, LIST), known=_kept_list)
def all_reduce_coalesced(
    tensors: List[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """All-reduce several arrays of one dtype in a single MPI operation, in place.

    The arrays are packed into one buffer, reduced together and unpacked, so
    many small arrays cost about as much as one array of their total size.
    """
    func = "all_reduce_coalesced"
    pg = resolve(group, func)
    if pg is None:
        return None
    fusions = pg.attached(_FUSIONS)
    fused = fusions.find(tensors, op) if fusions is not None else None
    if fused is None:
        tensors = [
            check_output(func, f"tensors[{i}]", t)
            for i, t in enumerate(check_list(func, "tensors", tensors))
        ]
        if not tensors:
            raise ValueError(f"{func}: tensors is empty; pass at least one array")
        dtype = check_same_dtype(func, tensors)
        how = _plan(op, dtype, func)
        if len(tensors) >= FUSE_FROM and sum(t.nbytes for t in tensors) <= FUSE_BYTES:
            if fusions is None:
                fusions = pg.attach(_FUSIONS, _Fusions())
            if fusions.seen_before(tensors, op):
                fused = fusions.add(FusedAllReduce(tensors, op, group), op)
    else:
        dtype = fused.dtype

    desc = _coalesced(op, tensors, dtype)
    if fused is not None and not fused.busy():
        return fused._run(pg, func, async_op, desc)
    how = _plan(op, dtype, func)
    flat = np.concatenate([t.reshape(-1) for t in tensors])
    if how.prescale is not None:
        kernels.scale(flat, how.prescale, out=flat)
    n = pg._size

    def finish() -> None:
        if how.average:
            kernels.divide(flat, n, out=flat)
        offset = 0
        for t in tensors:
            t.reshape(-1)[...] = flat[offset : offset + t.size]
            offset += t.size

    comm = pg.comm
    return run(
        pg,
        func,
        flat.nbytes,
        comm.Iallreduce,
        (_mpi.MPI.IN_PLACE, [flat, how.datatype], how.mpi_op),
        async_op,
        finish,
        tensors,
        desc,
        key=how.key | OP_BITS[func] | flat.size & COUNT,
    )


# A list all_reduce_coalesced has seen before (the same arrays, in the same
# order: a training step's gradients) runs, from its second call, through a
# FusedAllReduce kept for it: one compiled pack, one MPI call, one compiled
# unpack, and no per-array checks, which cost about 2 us an array. Lists of
# at least FUSE_FROM arrays and at most FUSE_BYTES in all; the group keeps
# the last FUSIONS of them (and so their arrays, and a buffer their size).
_FUSIONS = "all_reduce_coalesced.fusions"
FUSE_FROM = 8
FUSE_BYTES = 16 << 20
FUSIONS = 4


class _Fusions:
    """A group's FusedAllReduce for each of its last FUSIONS lists, newest first."""

    def __init__(self) -> None:
        self.kept: List[Any] = []  # [(arrays as a tuple, op, FusedAllReduce)]
        self.last: Any = None  # (arrays, op) of the last list without one

    def seen_before(self, tensors: List[np.ndarray], op: ReduceOp) -> bool:
        """Whether the last list without a FusedAllReduce was this one (then
        it gets one); else remember this one."""
        last = self.last
        if last is not None and last[1] is op and _same(last[0], tensors):
            self.last = None
            return True
        self.last = (tuple(tensors), op)
        return False

    def find(self, tensors: Any, op: ReduceOp) -> Optional[FusedAllReduce]:
        """The FusedAllReduce for exactly these array objects and this op, or None."""
        if type(tensors) not in (list, tuple):
            return None
        for i, (arrays, kept_op, fused) in enumerate(self.kept):
            if kept_op is op and _same(arrays, tensors):
                if i:
                    self.kept.insert(0, self.kept.pop(i))
                return fused
        return None

    def add(self, fused: FusedAllReduce, op: ReduceOp) -> FusedAllReduce:
        """Keep ``fused`` for its list, dropping the oldest beyond FUSIONS."""
        self.kept.insert(0, (tuple(fused._arrays), op, fused))
        del self.kept[FUSIONS:]
        return fused


@collective(Array("tensor", IN, root=("dst", INOUT)), aware=True)
def reduce(
    tensor: np.ndarray,
    dst: int,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``tensor`` across the group into ``tensor`` on rank ``dst`` only.

    Args:
        tensor: input on every rank; on ``dst`` also the output (so it must
            be writeable there). Other ranks' arrays are left unchanged.
        dst: global rank that receives the result.
    """
    func = "reduce"
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, func)  # raises before init; None for a non-member
        if pg is None:
            return None
    looked = False  # for the same call as before on this array, known by the global dst
    kept = None  # False where native.call may keep the call (see all_reduce)
    if (
        pg._native is not None
        and not async_op
        and type(dst) is int
        and type(tensor) is np.ndarray
        and (f := tensor.flags).c_contiguous
        and (f.writeable or dst != pg._ranks[pg._rank])
        and debug.PLAIN
    ):
        looked = True
        into = _mpi.IN_PLACE if dst == pg._ranks[pg._rank] else None
        if kept := native.again(pg, func, tensor, into, (op, dst)):  # (a dst kept: a group rank)
            return None
    root = root_of(pg, dst, "dst", func)
    is_root = root == pg._rank
    if type(tensor) is not np.ndarray or not (
        (f := tensor.flags).c_contiguous and (f.writeable or not is_root)
    ):
        check = check_output if is_root else check_input  # only dst writes
        tensor = check(func, "tensor", tensor)
    into = _mpi.IN_PLACE if is_root else None  # (where the result goes, besides the input)
    if (  # the same call as before on this array: compiled (pycoll.native)
        not looked  # (dst given as another integer type)
        and pg._native is not None
        and not async_op
        and debug.PLAIN
        and (kept := native.again(pg, func, tensor, into, (op, dst)))
    ):
        return None
    how = _plan(op, tensor.dtype, func)
    mpitype = how.datatype
    comm = pg.comm
    key = crosscheck.key(func, tensor.dtype, tensor.size, root, op.name)
    if (
        pg._size == 2
        and 0 < _to_root_from() <= tensor.nbytes
        and _ring_carries(pg, how, tensor.dtype)
    ):
        return _reduce_to_root(pg, tensor, dst, root, op, how, async_op, key)
    if pg._size > 2 and 0 < _scattered_from() <= tensor.nbytes and not pg._aliases:
        return _reduce_scattered(pg, tensor, dst, root, op, how, async_op, key)
    if pg._plans is not None and how.plain and tensor.nbytes <= PLAN_LIMIT:  # repeated?
        made = persistent.for_reduce(pg, key, tensor, mpitype, how.mpi_op, root)
        if made is not None:
            out = tensor if is_root else None  # (only dst's array is written)
            if (  # kept as the lanes above look for it
                not async_op
                and debug.PLAIN
                and native.call_plan(pg, func, made, tensor, into, (op, dst), tensor, out)
            ):
                return None
            return made.call(pg, func, tensor, out, async_op, lambda: _reduce_desc(op, dst, tensor))
    if how.plain and pair.applies("reduce", pg._size, tensor.nbytes) and not pg._aliases:
        return pair.reduce(pg, func, tensor, root, how.mpi_op, mpitype, async_op, key,
                           lambda: _reduce_desc(op, dst, tensor), (op, dst), kept)  # fmt: skip
    if how.plain and not async_op and debug.PLAIN:  # the common case, straight to MPI
        if kept is False and native.call(
            pg, func, key, native.REDUCE, tensor if into is None else into,
            tensor if is_root else None, tensor.size, mpitype, how.mpi_op, root,
            tensor, into, (op, dst),
        ):  # fmt: skip
            return None
        if is_root:
            plain(pg, func, key, comm.Ireduce, comm.Reduce, _mpi.IN_PLACE, [tensor, mpitype],
                  how.mpi_op, root)  # fmt: skip
        else:
            plain(pg, func, key, comm.Ireduce, comm.Reduce, [tensor, mpitype], None, how.mpi_op,
                  root)  # fmt: skip
        return None
    args: tuple
    prepare = None
    if is_root:
        prepare = _prescaler(tensor, how.prescale)
        args = (_mpi.IN_PLACE, [tensor, mpitype], how.mpi_op, root)
        finish = _averager(tensor, pg._size) if how.average else None
    else:
        send = tensor if how.prescale is None else _scaled(tensor, how.prescale)
        args = ([send, mpitype], None, how.mpi_op, root)
        finish = None
    return run(
        pg,
        func,
        tensor.nbytes,
        comm.Ireduce,
        args,
        async_op,
        finish,
        [tensor],
        lambda: _reduce_desc(op, dst, tensor),
        prepare,
        key=key,
    )


# From this size a reduce on a group of two ranks goes by pycoll's own path
# (pycoll.collectives.to_root: the other rank sends its array in pieces, the
# root folds each in with pycoll's kernels). On 2 ranks of the CI VM
# (docs/measurements/reduce_paths.py), float32 SUM against mpi4py's blocking
# reduce: on MPICH 0.80-0.86x its time at 64 KiB, 0.56-0.73x at 128 KiB-8 MiB,
# 0.43x at 16 MiB and 0.12-0.16x at 32-64 MiB, where MPICH's falls to 1-1.4
# GB/s (1.0-1.6x at 16-32 KiB, where pycoll's MPI call took 1.03-1.12x); on
# Open MPI, whose own reduce is faster below 8 MiB (there the path took
# 1.15-3.7x its time in the VM's faster state), 0.65-0.97x at 8 MiB, where
# pycoll's MPI call took 0.85-1.06x, and 0.17x at 64 MiB. Larger groups keep
# MPI's call (not measured); other MPIs too, the path was not measured against
# them. PYCOLL_TO_ROOT_BYTES, where set, is this size on every MPI (0: never).
_TO_ROOT_SET = env_bytes("PYCOLL_TO_ROOT_BYTES", "never")
TO_ROOT_BYTES = 64 << 10 if _TO_ROOT_SET is None else _TO_ROOT_SET
TO_ROOT_BYTES_OPEN_MPI = 8 << 20 if _TO_ROOT_SET is None else _TO_ROOT_SET


def _to_root_from() -> int:
    """The least bytes from which a reduce on two ranks takes pycoll's own
    path (0: never)."""
    if _mpi.VENDOR == "Open MPI":
        return TO_ROOT_BYTES_OPEN_MPI
    if _mpi.VENDOR == "MPICH" or _TO_ROOT_SET is not None:
        return TO_ROOT_BYTES
    return 0


def _reduce_to_root(
    pg: ProcessGroup,
    tensor: np.ndarray,
    dst: int,
    root: int,
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    key: int,
) -> Optional[Work]:
    """reduce on two ranks by pycoll's own path (pycoll.collectives.
    to_root). The root's array is scaled first for a PREMUL_SUM (once the
    call check has passed) and each piece is folded into it (an AVG's
    division in the same pass: each element is folded once); the other
    rank sends its array, or a PREMUL_SUM's scaled copy, and keeps it."""
    flat = tensor.reshape(-1)
    if root == pg._rank:
        fold = kernels.folder(how.kernel_op(op), tensor.dtype, 2 if how.average else None)
        room = scratch.take(pg, ToRoot.needs(flat) * tensor.dtype.itemsize, tensor.dtype)
        steps = ToRoot(pg, flat, root, room, fold)
        prepare = _prescaler(tensor, how.prescale)

        def finish() -> None:
            steps.finish()
            scratch.give(pg, room)

    else:
        send = flat if how.prescale is None else _scaled(flat, how.prescale)
        steps = ToRoot(pg, send, root, None, None)  # (it only sends: nothing to fold)
        prepare, finish = None, steps.finish
    return run(
        pg,
        "reduce",
        tensor.nbytes,
        steps.start,
        (),
        async_op,
        finish,
        [tensor],
        lambda: _reduce_desc(op, dst, tensor),
        prepare,
        steps.stages or None,
        key,
    )


# From this size a reduce on a group of three ranks or more goes, on MPICH
# running its nonblocking v-form reduce-scatter pairwise (what pycoll asks
# of it when pycoll starts MPI: _mpi.REDUCE_SCATTER_PAIRWISE), as that
# reduce-scatter and then a gather of the parts to the root. On 3-4 ranks of
# the CI VM it took 0.22-0.79x mpi4py's time at 16-32 MiB in every run, where
# MPICH's reduce falls to 0.5-1.3 GB/s; below, its figure moved with the VM's
# state: 0.59-1.16x at 2-8 MiB (most runs faster than MPICH's call, some not),
# 0.57-0.91x at 256 KiB-1 MiB in the slower state and 1.10-1.57x in the
# faster (docs/measurements/reduce_paths.py). On Open MPI the same two calls
# took 1.0-1.7x its reduce's time, so it keeps its own. PYCOLL_SCATTERED_BYTES,
# where set, is this size on every MPI (0: never).
_SCATTERED_SET = env_bytes("PYCOLL_SCATTERED_BYTES", "never")
SCATTERED_BYTES = 16 << 20 if _SCATTERED_SET is None else _SCATTERED_SET


def _scattered_from() -> int:
    """The least bytes from which a reduce on three ranks or more is a
    reduce-scatter, then a gather (0: never)."""
    if _SCATTERED_SET is not None:
        return _SCATTERED_SET
    return SCATTERED_BYTES if _mpi.REDUCE_SCATTER_PAIRWISE else 0


def _reduce_scattered(
    pg: ProcessGroup,
    tensor: np.ndarray,
    dst: int,
    root: int,
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    key: int,
) -> Optional[Work]:
    """reduce as MPI's reduce-scatter into a part of pycoll's scratch on
    every rank (counts as even as the size allows), then MPI's gather of the
    parts into the root's array. The root's array is scaled first for a
    PREMUL_SUM and divided at the end for an AVG, as MPI's own reduce's; the
    other ranks send their arrays, or a PREMUL_SUM's scaled copy, and keep
    them."""
    flat = tensor.reshape(-1)
    n, me, dtype = pg._size, pg._rank, tensor.dtype
    counts, starts = ring_parts(flat.size, n)
    part = scratch.take(pg, counts[me] * dtype.itemsize, dtype)
    is_root = root == me
    send = flat if is_root or how.prescale is None else _scaled(flat, how.prescale)
    comm, datatype = pg.comm, how.datatype

    def gather() -> List[Any]:
        into = [flat, counts, starts, datatype] if is_root else None
        return [comm.Igatherv([part, datatype], into, root)]

    average = _averager(tensor, n) if is_root and how.average else None

    def finish() -> None:
        scratch.give(pg, part)
        if average is not None:
            average()

    return run(
        pg,
        "reduce",
        tensor.nbytes,
        comm.Ireduce_scatter,
        ([send, datatype], [part, datatype], counts, how.mpi_op),
        async_op,
        finish,
        [tensor],
        lambda: _reduce_desc(op, dst, tensor),
        _prescaler(tensor, how.prescale) if is_root else None,
        [gather],
        key,
    )


def _reduce_desc(op: ReduceOp, dst: int, tensor: np.ndarray) -> str:
    """reduce's description for DETAIL's check, whichever way it runs."""
    return f"reduce({op.name}, dst={dst}, {sig(tensor)})"


def _mpi_reduce_scatter(
    comm: Any, n: int, how: Plan, send: np.ndarray, recv: np.ndarray
) -> Tuple[Callable[..., Any], Callable[..., Any], tuple]:
    """MPI's nonblocking and blocking reduce-scatter of ``send`` into ``recv``
    (this rank's part), and their arguments: the v-form with equal counts
    where MPICH runs it pairwise (pycoll._mpi.reduce_scatter_v), else the
    block form."""
    send_spec, recv_spec = [send, how.datatype], [recv, how.datatype]
    if _mpi.reduce_scatter_v(recv.nbytes):
        args: tuple = (send_spec, recv_spec, [recv.size] * n, how.mpi_op)
        return comm.Ireduce_scatter, comm.Reduce_scatter, args
    args = (send_spec, recv_spec, how.mpi_op)
    return comm.Ireduce_scatter_block, comm.Reduce_scatter_block, args


def _reduce_scatter_block(
    pg: ProcessGroup,
    func: str,
    send: np.ndarray,
    output: np.ndarray,
    how: Plan,
    async_op: bool,
    call: Callable[[], str],
    into: Optional[np.ndarray] = None,
    then: Optional[Callable[[], None]] = None,
) -> Optional[Work]:
    """Reduce ``send`` (group size x output.size elements, already scaled if
    need be) and leave this rank's part in ``output``; through ``into`` (an
    array shaped like ``output``, copied into it at the end) where ``output``
    is part of ``send``, since MPI's buffers must not overlap. ``then`` runs
    last, once ``output`` holds the result (a coalesced call copies out)."""
    comm = pg.comm
    n = pg._size
    finish: Optional[Callable[[], None]] = _averager(output, n) if how.average else None
    if into is not None:

        def finish() -> None:
            if how.average:
                kernels.divide(into, n, out=output)  # the copy and the division in one pass
            else:
                output[...] = into
            scratch.give(pg, into)

    if then is not None:
        first = finish

        def finish() -> None:
            if first is not None:
                first()
            then()

    recv = output if into is None else into
    start, _, args = _mpi_reduce_scatter(comm, n, how, send, recv)
    return run(
        pg,
        func,
        send.nbytes,
        start,
        args,
        async_op,
        finish,
        [output],
        call,
        key=how.key | OP_BITS[func] | output.size & COUNT,
    )


@collective(Array("output", OUT), Array("input_list", IN, LIST))
def reduce_scatter(
    output: np.ndarray,
    input_list: List[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``input_list[i]`` across the group into ``output`` on group rank i.

    Args:
        output: receives this rank's reduced slice.
        input_list: one array per rank of the group, each shaped like ``output``.
    """
    func = "reduce_scatter"
    pg = resolve(group, func)
    if pg is None:
        return None
    n = pg._size
    # The common case (a plain contiguous writeable output, a list of n plain
    # contiguous arrays of its dtype and shape) needs no more checks.
    fast = (
        type(output) is np.ndarray
        and (f := output.flags).c_contiguous
        and f.writeable
        and (dtype := output.dtype) in MPI_TYPES
        and plain_arrays(input_list, n, dtype, output.shape, writeable=False)
    )
    if fast:
        inputs = input_list
        if native.again_list(pg, func, output, inputs, op, async_op):  # (compiled: as before)
            return None
    else:
        output = check_output(func, "output", output)
        inputs = [
            check_input(func, f"input_list[{i}]", x)
            for i, x in enumerate(check_list(func, "input_list", input_list, n))
        ]
        dtype = check_same_dtype(func, [output] + inputs)
        check_same_shape(func, "input_list", inputs, output.shape, "output")
    how = _plan(op, dtype, func)
    desc = lambda: f"{func}({op.name}, output {sig(output)})"  # noqa: E731
    way, win, trial = _scatter_way(pg, how, dtype, func, n * output.nbytes, op.name)
    if way != "mpi" or trial is not None:
        return _scatter_along(pg, func, way, win, trial, output, inputs, None, op, how, async_op,
                              desc)  # fmt: skip
    if (  # (only what every rank shares: each lays out its arrays as it will)
        how.plain
        and pair.applies(func, n, n * output.nbytes)
        and not pg._aliases
        and not _order_matters(op.name, dtype)
    ):
        key = how.key | OP_BITS[func] | output.size & COUNT
        form = "aside" if any(may_alias(x, output) for x in inputs) else "apart"
        kept = False if fast else None  # (again_list found no call kept with this list)
        return pair.reduce_scatter(pg, func, output, inputs, None, form, how.mpi_op,
                                   how.datatype, async_op, key, desc, op, kept)  # fmt: skip
    if how.plain and not async_op and debug.PLAIN:
        # Synchronous, MPI's own op (pycoll.collectives._common.plain), as
        # reduce_scatter_tensor's common case: the generic path's bookkeeping
        # cost 5.2 us a call of 8 B on one rank, this one 3.4 us; kept by the
        # compiled path (the inputs copied side by side into a buffer the
        # call keeps, there), ... (docs/measurements/list_forms.py).
        key = how.key | OP_BITS[func] | output.size & COUNT
        # (no call of the live trials' sizes kept, as in all_reduce)
        if fast and pg._native is not None and n * output.nbytes < pg._live_from:
            what = native.REDUCE_SCATTER
            if _mpi.reduce_scatter_v(output.nbytes):  # (as _mpi_reduce_scatter chooses)
                what = native.REDUCE_SCATTER_V
            if native.call(pg, func, key, what, None, output, output.size, how.datatype, how.mpi_op,
                           0, output, inputs[0], op, items=tuple(inputs)):  # fmt: skip
                return None
        send = np.concatenate([x.reshape(-1) for x in inputs])  # (never the output: a copy)
        start, blocking, args = _mpi_reduce_scatter(pg.comm, n, how, send, output)
        plain(pg, func, key, start, blocking, *args)
        return None
    send = np.concatenate([x.reshape(-1) for x in inputs])  # (never the output: a copy)
    if how.prescale is not None:
        kernels.scale(send, how.prescale, out=send)
    return _reduce_scatter_block(pg, func, send, output, how, async_op, desc)


@collective(Array("output", OUT), Array("input", IN), aware=True)
def reduce_scatter_tensor(
    output: np.ndarray,
    input: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    group: Optional[ProcessGroup] = None,
    async_op: bool = False,
    stream: Any = None,
) -> Optional[Work]:
    """Reduce ``input`` across the group and scatter the result in equal parts.

    Args:
        output: receives this rank's part; ``output.size * group size`` must
            equal ``input.size``.
        input: the array to reduce; rank i receives elements
            ``[i * output.size, (i + 1) * output.size)`` of the flattened sum.
    """
    func = "reduce_scatter_tensor"
    pg = STATE.default
    if group is not None or pg is None:
        pg = resolve(group, func)  # raises before init; None for a non-member
        if pg is None:
            return None
    n = pg._size
    kept = None  # False where native.call may keep the call (see all_reduce)
    if (  # the same call as before on these arrays: compiled (pycoll.native)
        pg._native is not None
        and (not async_op or async_op is True)  # (with a Work: pycoll.native.again's work)
        and debug.PLAIN
        and type(output) is np.ndarray
        and (
            # torch's in-place form, the output a new view of the input each
            # call: the call kept on the input, known by the output's place
            kept := _in_input(output, input)
            and output.size * n == input.size
            and output.flags.writeable
            and native.again(
                pg, func, input, _mpi.IN_PLACE, op, input=output, place=output, work=async_op
            )
            # else two arrays (views of one buffer that do not overlap included)
            or native.again(pg, func, output, input, op, input=input, work=async_op)
        )
    ):
        return kept if async_op else None
    # Two plain contiguous arrays of one dtype, the output writeable, sizes
    # that fit: no more checks (the common case, inline as all_reduce's).
    if not (
        type(output) is np.ndarray
        and type(input) is np.ndarray
        and (f := output.flags).c_contiguous
        and f.writeable
        and input.flags.c_contiguous
        and (dtype := output.dtype) == input.dtype
        and dtype in MPI_TYPES
        and input.size == output.size * n
    ):
        output = check_output(func, "output", output)
        input = check_input(func, "input", input)
        dtype = check_same_dtype(func, [output, input])
        check_size(func, "input", input, output.size * n, "output.size x group size")
    how = _plan(op, dtype, func)
    desc = lambda: f"{func}({op.name}, output shape={output.shape}, input {sig(input)})"  # noqa: E731
    nbytes = input.nbytes
    if (  # (the sizes first: small calls, the hot path, make no call)
        nbytes >= SCATTER_SHM_BYTES_OPEN_MPI
        or 0 < PAIRWISE_BYTES <= nbytes
        or 0 < PAIRWISE_BYTES_OPEN_MPI <= nbytes
        or nbytes >= pg._tuned_rs_from
        or nbytes >= pg._live_from
    ):
        way, win, trial = _scatter_way(pg, how, dtype, func, nbytes, op.name)
        if way != "mpi" or trial is not None:
            flat, count = input.reshape(-1), output.size
            parts = [flat[d * count : (d + 1) * count] for d in range(n)]
            return _scatter_along(pg, func, way, win, trial, output, parts, input, op, how,
                                  async_op, desc)  # fmt: skip
    if pg._plans is not None and how.plain and input.nbytes <= PLAN_LIMIT:  # repeated?
        key = how.key | OP_BITS[func] | output.size & COUNT
        made = persistent.for_reduce_scatter(pg, key, output, how.datatype, how.mpi_op)
        if made is not None:
            if not async_op and debug.PLAIN:  # kept as the lane above looks for it
                if _in_input(output, input):
                    kept = native.call_plan(pg, func, made, input, _mpi.IN_PLACE, op, input,
                                            output, place=output)  # fmt: skip
                else:
                    kept = native.call_plan(pg, func, made, output, input, op, input, output)
                if kept:
                    return None
            return made.call(pg, func, input, output, async_op, desc)
    if (  # (only what every rank shares: each lays out its arrays as it will)
        how.plain
        and pair.applies(func, n, nbytes)
        and not pg._aliases
        and not _order_matters(op.name, dtype)
    ):
        form = "apart"
        if _in_input(output, input) and own_part(output, input, pg._rank):
            form = "in place"
        elif may_alias(input, output):
            form = "aside"
        flat, count = input.reshape(-1), output.size
        halves = (flat[:count], flat[count:])
        key = how.key | _REDUCE_SCATTER_TENSOR | output.size & COUNT
        return pair.reduce_scatter(pg, func, output, halves, input, form, how.mpi_op,
                                   how.datatype, async_op, key, desc, op, kept)  # fmt: skip
    if how.plain and (not async_op or async_op is True) and debug.PLAIN:
        # The common case, straight to MPI (pycoll.collectives._common.plain):
        # the generic path's bookkeeping was a third of this call's cost at 8 B.
        # torch's in-place form receives beside the input, as below (a buffer
        # of the kept call's own: with a Work, not kept, pycoll.native.call).
        aliased = may_alias(input, output)
        key = how.key | _REDUCE_SCATTER_TENSOR | output.size & COUNT
        if pg._native is not None and nbytes < pg._live_from:  # (as in all_reduce)
            what = native.REDUCE_SCATTER
            if _mpi.reduce_scatter_v(output.nbytes):  # (as _mpi_reduce_scatter chooses)
                what = native.REDUCE_SCATTER_V
            if not aliased:  # (kept: the output's answer from the lane above)
                kept = kept is False and native.call(
                    pg, func, key, what, input, output, output.size, how.datatype, how.mpi_op,
                    0, output, input, op, work=async_op,
                )  # fmt: skip
            else:  # in place: kept receiving beside, as below (the lane above finds it;
                # an input first seen in this call is left by native.call at once)
                kept = _in_input(output, input) and native.call(
                    pg, func, key, what, input, None, output.size, how.datatype, how.mpi_op,
                    0, input, _mpi.IN_PLACE, op, beside=output, place=output, work=async_op,
                )  # fmt: skip
            if kept:
                return kept if async_op else None
        if not async_op:
            into = scratch.beside(pg, output) if aliased else None
            recv = output if into is None else into
            start, blocking, args = _mpi_reduce_scatter(pg.comm, n, how, input, recv)
            plain(pg, func, key, start, blocking, *args)
            if into is not None:
                output[...] = into
                scratch.give(pg, into)
            return None
    send, into = input, None
    if how.prescale is not None:
        send = _scaled(input, how.prescale)
    elif may_alias(input, output):
        # torch's in-place form (output this rank's part of input): MPI takes
        # the input as it is and leaves the result beside it, to be copied
        # in; 1/n of the input copied, where a private copy of the whole
        # input cost 1.3-1.9x a raw in-place call from 2 MiB.
        into = scratch.beside(pg, output)
    return _reduce_scatter_block(pg, func, send, output, how, async_op, desc, into)


def _in_input(output: np.ndarray, input: Any) -> bool:
    """Whether ``output`` is a view of ``input``'s memory, as torch's in-place
    reduce-scatter makes it (a view of ``input``, or of what ``input`` views)."""
    base = output.base
    return base is not None and (base is input or base is getattr(input, "base", None))


def _same(arrays: Any, tensors: Any) -> bool:
    """The same array objects in the same order."""
    return len(arrays) == len(tensors) and all(map(operator.is_, arrays, tensors))
