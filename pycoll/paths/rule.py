"""The built-in rule: from which size, on which MPI and group, each path
takes a call that neither a tuning table nor the live trials decided.

It is data beside :func:`pycoll.paths.choose`: each constant below is a
measured crossover, its comment says where and against what it was
measured, and the program that measured it is under docs/measurements/.
Each ``*_takes`` function reads only the call's description
(:class:`pycoll.paths.Call`) and what MPI was started with, and returns why
its path takes the call, or None; :data:`ORDER` says in which order
:func:`pycoll.paths.choose` asks them. ``PYCOLL_*_BYTES`` set in the
environment replace the sizes (0: never).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

from .. import _mpi, watch
from .._env import nbytes
from ..ops import RING_BYTES, RING_MPIS, SPLIT_BYTES, SPLIT_BYTES_TWO_RANKS

if TYPE_CHECKING:
    from . import Call

__all__ = ["ORDER", "RING_BYTES", "SPLIT_BYTES", "SPLIT_BYTES_TWO_RANKS"]


def size(nbytes: int) -> str:
    """``nbytes`` as text: 16 MiB, 256 KiB, 100 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _from(c: Call, name: str, least: int, where: str = "") -> Optional[str]:
    """Why a call of its size is taken from ``least`` bytes (0: never), or None."""
    if 0 < least <= c.nbytes:
        return f"{size(c.nbytes)} >= {name} ({size(least)}){where}"
    return None


# all_reduce: pycoll's ring (pycoll.collectives.ring), the ops it splits
# (pycoll.ops.Plan.split) from SPLIT_BYTES (SPLIT_BYTES_TWO_RANKS on two
# ranks), MPI's own ops from RING_BYTES on the MPIs of RING_MPIS (both
# measured: pycoll.ops).


def split_from(ranks: int) -> int:
    """The size from which an all_reduce with a Plan.split op is split."""
    return SPLIT_BYTES if ranks > 2 else SPLIT_BYTES_TWO_RANKS


def ring_from() -> int:
    """The size from which an all_reduce with one of MPI's own ops takes
    pycoll's ring: on the MPIs it was measured against (0: never)."""
    return RING_BYTES if _mpi.VENDOR in RING_MPIS else 0


def ring_takes(c: Call) -> Optional[str]:
    if c.split:
        name = "SPLIT_BYTES" if c.ranks > 2 else "SPLIT_BYTES_TWO_RANKS"
        why = _from(c, name, split_from(c.ranks), ", an op pycoll's kernels split")
        if why is not None:
            return why
    if c.average:
        return None  # (an AVG takes the ring as a split op only)
    return _from(c, "RING_BYTES", ring_from(), f" on {_mpi.VENDOR}")


# From this size an all_reduce whose ranks share one node goes through the
# node's shared memory (pycoll.collectives.shm): on 2-4 ranks it measured
# 2.2-3.5x MPICH's own from 32 MiB, where MPICH's falls to 0.5-2 GB/s, and
# 0.7-1.3x below. pycoll's ring comes first (from RING_BYTES, or SPLIT_BYTES
# for its ops), faster still. 0 turns the window off. PYCOLL_SHM_BYTES, where
# set, is this size and SHM_BYTES_MPICH, for any number of ranks and any MPI.
SHM_SET = nbytes("PYCOLL_SHM_BYTES", "never through the shared window")
SHM_BYTES = 32 << 20 if SHM_SET is None else SHM_SET
# On MPICH the window is taken from this size already, up to where the ring
# takes over, in groups whose size is not a power of two: there MPICH adds
# steps for the ranks past a power of two, and the window measured 0.34-0.71x
# its time on 3, 5 and 6 ranks (docs/measurements/all_reduce_paths.py). On a
# power of two the window was faster on one machine and slower on another (2
# ranks: 0.68-0.92x MPICH's time at 1-8 MiB on the 2-core CI VM, 1.15-1.98x on
# a 16-core Xeon whatever its chunk size), so MPICH's own call stays. Open
# MPI's nonblocking barriers, which the window waits on, made it slower there
# at 16 MiB: Open MPI keeps SHM_BYTES.
SHM_BYTES_MPICH = 1 << 20 if SHM_SET is None else SHM_SET
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
SHM_BYTES_PAIR = 256 << 10 if SHM_SET is None else SHM_SET
PAIR_BELOW = 8 << 20


# From this size an all_reduce on a group of two ranks that neither the ring
# nor the window took goes by pycoll's recursive doubling (pycoll.collectives.
# doubling: one exchange, each rank folding the other's copy in) where MPI's
# nonblocking all_reduce in place is Open MPI's binomial tree
# (binomial_in_place). On 2 ranks of the CI VM it took 0.78x the tree's time
# or less at 128-512 KiB in every run (the window, which takes over at
# SHM_BYTES_PAIR, 0.51-0.68x at 256-512 KiB); at 64 KiB 0.67-0.70x in the
# VM's slower state and 0.91-1.02x in its faster, at 32 KiB 0.76-0.78x and
# 1.04-1.07x, so it starts at 64 KiB; below, its steps in Python cost more
# than the tree's second message. On 4 ranks sharing 2 cores it took 1.2-2.6x
# the tree's time at 8-128 KiB and 0.83-1.44x at 256 KiB-4 MiB, where the
# window was faster (docs/measurements/all_reduce_paths.py), so larger groups
# keep MPI's call. PYCOLL_DOUBLING_BYTES, where set, is this size on every MPI
# and in either wait mode (0: never).
_DOUBLING_SET = nbytes("PYCOLL_DOUBLING_BYTES", "never")
DOUBLING_BYTES = 64 << 10 if _DOUBLING_SET is None else _DOUBLING_SET


def doubles(ranks: int) -> bool:
    """Whether an all_reduce on a group of ``ranks`` takes pycoll's recursive
    doubling from DOUBLING_BYTES (where neither the ring nor the window did)."""
    return ranks == 2 and (_DOUBLING_SET is not None or binomial_in_place())


def shm_least() -> int:
    """The least size at which an all_reduce may take the window (its group's
    window is made, or found, from this size)."""
    if _mpi.VENDOR == "MPICH":
        return min(SHM_BYTES, SHM_BYTES_MPICH)
    return min(SHM_BYTES, SHM_BYTES_PAIR) if binomial_in_place() else SHM_BYTES


def binomial_in_place() -> bool:
    """Whether MPI's nonblocking all_reduce, in place, is Open MPI's binomial
    tree (libnbc's default choice, none made for it) and the calls that
    would take the window are nonblocking ones (the default wait mode)."""
    return _mpi.VENDOR == "Open MPI" and not _mpi.ALL_REDUCE_CHOSEN and not watch.BLOCKING


def takes_window(ranks: int, nbytes: int) -> bool:
    """Whether an all_reduce of ``nbytes`` on a group of ``ranks`` goes
    through the group's shared window, where it can have one."""
    if not 0 < shm_least() <= nbytes:
        return False
    if nbytes >= SHM_BYTES:
        return True
    if _mpi.VENDOR == "MPICH":
        return SHM_BYTES_MPICH <= nbytes and ranks & (ranks - 1) != 0
    return ranks in (2, 4) and SHM_BYTES_PAIR <= nbytes < PAIR_BELOW and binomial_in_place()


def window_takes(c: Call) -> Optional[str]:
    if not takes_window(c.ranks, c.nbytes):
        return None
    if c.nbytes >= SHM_BYTES:
        return _from(c, "SHM_BYTES", SHM_BYTES)
    if _mpi.VENDOR == "MPICH":
        return _from(
            c, "SHM_BYTES_MPICH", SHM_BYTES_MPICH, f", {c.ranks} ranks (not a power of two)"
        )
    return (
        f"{size(SHM_BYTES_PAIR)} (SHM_BYTES_PAIR) <= {size(c.nbytes)} < {size(PAIR_BELOW)} "
        f"(PAIR_BELOW), {c.ranks} ranks, Open MPI's binomial tree in place"
    )


def doubling_takes(c: Call) -> Optional[str]:
    if not doubles(c.ranks):
        return None
    return _from(c, "DOUBLING_BYTES", DOUBLING_BYTES, ", two ranks")


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
_PAIRWISE_SET = nbytes("PYCOLL_PAIRWISE_BYTES", "never")
PAIRWISE_BYTES = 1 << 20 if _PAIRWISE_SET is None else _PAIRWISE_SET
PAIRWISE_BYTES_OPEN_MPI = 256 << 10 if _PAIRWISE_SET is None else _PAIRWISE_SET


def pairwise_from() -> int:
    """The least bytes of input from which a two-rank reduce-scatter takes the
    pairwise exchange by the built-in rule (0: never)."""
    return PAIRWISE_BYTES_OPEN_MPI if _mpi.VENDOR == "Open MPI" else PAIRWISE_BYTES


def pairwise_takes(c: Call) -> Optional[str]:
    if c.ranks != 2:
        return None
    name = "PAIRWISE_BYTES_OPEN_MPI" if _mpi.VENDOR == "Open MPI" else "PAIRWISE_BYTES"
    return _from(c, name, pairwise_from(), ", two ranks")


def scatter_window_takes(c: Call) -> Optional[str]:
    if c.ranks == 2 and 0 < pairwise_from() <= c.nbytes:
        return None  # (the pairwise exchange's sizes: where it cannot carry one, MPI's call)
    if _mpi.VENDOR == "Open MPI":
        return _from(c, "SCATTER_SHM_BYTES_OPEN_MPI", SCATTER_SHM_BYTES_OPEN_MPI)
    return _from(c, "SCATTER_SHM_BYTES", SCATTER_SHM_BYTES)


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
_TO_ROOT_SET = nbytes("PYCOLL_TO_ROOT_BYTES", "never")
TO_ROOT_BYTES = 64 << 10 if _TO_ROOT_SET is None else _TO_ROOT_SET
TO_ROOT_BYTES_OPEN_MPI = 8 << 20 if _TO_ROOT_SET is None else _TO_ROOT_SET


def to_root_from() -> int:
    """The least bytes from which a reduce on two ranks takes pycoll's own
    path (0: never)."""
    if _mpi.VENDOR == "Open MPI":
        return TO_ROOT_BYTES_OPEN_MPI
    if _mpi.VENDOR == "MPICH" or _TO_ROOT_SET is not None:
        return TO_ROOT_BYTES
    return 0


def to_root_takes(c: Call) -> Optional[str]:
    if c.ranks != 2:
        return None
    name = "TO_ROOT_BYTES_OPEN_MPI" if _mpi.VENDOR == "Open MPI" else "TO_ROOT_BYTES"
    return _from(c, name, to_root_from(), ", two ranks")


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
_SCATTERED_SET = nbytes("PYCOLL_SCATTERED_BYTES", "never")
SCATTERED_BYTES = 16 << 20 if _SCATTERED_SET is None else _SCATTERED_SET


def scattered_from() -> int:
    """The least bytes from which a reduce on three ranks or more is a
    reduce-scatter, then a gather (0: never)."""
    if _SCATTERED_SET is not None:
        return _SCATTERED_SET
    return SCATTERED_BYTES if _mpi.REDUCE_SCATTER_PAIRWISE else 0


def scattered_takes(c: Call) -> Optional[str]:
    if c.ranks < 3:
        return None
    return _from(c, "SCATTERED_BYTES", scattered_from(), ", three ranks or more")


# The rule: for each collective, its paths in the order they are asked (the
# first that takes the call and can carry it is taken); MPI's own call where
# none does. The paths themselves are registered beside their code
# (pycoll.paths.register).
ORDER: Dict[str, Tuple[Tuple[str, Callable[[Call], Optional[str]]], ...]] = {
    "all_reduce": (("ring", ring_takes), ("window", window_takes), ("doubling", doubling_takes)),
    "reduce_scatter": (("pairwise", pairwise_takes), ("window", scatter_window_takes)),
    "reduce": (("to_root", to_root_takes), ("scattered", scattered_takes)),
}
ORDER["reduce_scatter_tensor"] = ORDER["reduce_scatter"]
