"""Persistent collectives for the calls a program repeats.

A training loop makes the same small collective (the same collective, count,
dtype, root and reduction) thousands of times. MPI-4's persistent
collectives (``MPI_Allreduce_init`` and kin) set such a call up once; each
use is then ``MPI_Start`` and a test. On MPICH 5 an 8-byte all_reduce on 2
ranks took 1.1 us that way against 2.3 us as ``MPI_Iallreduce`` (whose
schedule MPICH builds on every call) and 2.6 us through mpi4py's blocking
``Allreduce``: it is how pycoll's synchronous small calls come level with raw
mpi4py despite their bookkeeping.

**Agreement.** Making a persistent collective is itself a collective call:
every rank must make the same ones, in the same order, and from then on use
them where the others do. So the choice depends only on what the ranks of a
correct program share: the sequence of the group's call keys
(pycoll.crosscheck.key). Every call of the collectives below counts its key
here, whatever path it takes (synchronous or not, fast path or not, debug
or not); a key's ``PROMOTE``-th call makes its plan on every rank, and every
later call with that key uses it. A plan's buffers are pycoll's own (the
arrays a rank passes may change from call to call, and differ between
ranks): each use copies the input in and the result out, which for the
sizes plans are made for (``LIMIT`` bytes at most) costs about 0.1 us each
way. A rank whose earlier asynchronous use of a plan is still in flight
finishes that one (its Work completes, results copied out) before the plan
is used again.

The plans are bounded: ``MAX_PLANS`` per group, keys of up to ``LIMIT``
bytes, the counts of at most ``MAX_SEEN`` keys (then forgotten, on every
rank alike). They are freed with their group.

**With the compiled path** (pycoll.native), a call a made plan serves, made
again on the same arrays, is kept: its copy in, ``MPI_Start``, tests and
copy out are one compiled call. Nothing else is kept on a group with plans,
since a kept call would skip this module's count of the calls.

**The price, and why it is off by default.** Ranks whose calls disagree (a
rank skipped a collective, or passed another count or dtype) pair their
ordinary calls anyway: MPI returns wrong results without an error, and the
call check (pycoll.crosscheck) finds the disagreement a bounded number of
calls later. Persistent requests pair only with the same request on the
other ranks, so with plans such ranks wait for each other instead, until the
group's timeout, whose diagnosis names them. ``PYCOLL_PERSISTENT=1`` turns
plans on (where the MPI has persistent collectives, MPI-4); ``0``, the
default, leaves them off. The gain measured on MPICH and Open MPI is in
docs/benchmarks.md ("Which path wins where").
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional, Union

import numpy as np

from . import _mpi, debug, groups, watch
from .collectives._common import hold, let_go, plain, run

__all__ = ["ENV_VAR", "Plan", "Plans", "lookup"]

ENV_VAR = "PYCOLL_PERSISTENT"
PROMOTE = 3  # a key's calls until its plan is made (the PROMOTE-th makes it)
LIMIT = 16 << 10  # bytes: the largest buffer a plan holds (copies must stay cheap)
# The collectives whose calls of up to LIMIT bytes (their largest array) every
# rank counts here, plans or not (the others have no plans: barrier, the list
# and object forms).
COUNTED = frozenset(
    ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
     "all_to_all_single")
)  # fmt: skip
MAX_PLANS = 64  # per group
MAX_SEEN = 4096  # keys counted per group before the counts start over

ENABLED = False  # set from ENV_VAR at init_process_group (configure)


def configure() -> None:
    """Read ``PYCOLL_PERSISTENT`` (at init_process_group)."""
    global ENABLED
    raw = os.environ.get(ENV_VAR, "0").strip()
    if raw not in ("0", "1", ""):
        raise ValueError(
            f"The value of {ENV_VAR} must be '1' (persistent collectives for repeated small "
            f"calls: faster, but ranks whose calls disagree wait for each other until the "
            f"timeout) or '0' (the default), got {raw!r}"
        )
    # mpi4py built against an MPI before MPI-4 has no persistent collectives.
    ENABLED = raw == "1" and hasattr(_mpi.MPI.Comm, "Allreduce_init")
    groups.PLANS = Plans if ENABLED else None


@contextmanager
def forced(on: bool = True) -> Iterator[None]:
    """Groups made inside get plans (``on``) or none, whatever
    ``PYCOLL_PERSISTENT`` says: for pycoll-bench's side-by-side runs and the
    tests. Every rank must make the group inside it alike."""
    global ENABLED
    before = ENABLED
    ENABLED = on and hasattr(_mpi.MPI.Comm, "Allreduce_init")
    groups.PLANS = Plans if ENABLED else None
    try:
        yield
    finally:
        ENABLED = before
        groups.PLANS = Plans if ENABLED else None


class Plan:
    """One key's persistent collective: its request, its buffers (``send``
    copied in, ``recv`` copied out; one array for an in-place collective),
    and the asynchronous Work using it, while there is one."""

    __slots__ = ("key", "nbytes", "request", "send", "recv", "work")

    def __init__(self, key: int, nbytes: int, request: Any, send: Any, recv: Any) -> None:
        self.key = key
        self.nbytes = nbytes
        self.request = request
        self.send = send
        self.recv = recv
        self.work: Any = None

    def start(self) -> Any:
        self.request.Start()
        return self.request

    def blocking(self) -> None:
        request = self.request
        request.Start()
        request.Wait()

    def call(
        self,
        pg: Any,
        op: str,
        inp: Optional[np.ndarray],
        out: Optional[np.ndarray],
        async_op: bool,
        call: Union[str, Callable[[], str], None] = None,
    ) -> Any:
        """Run the collective on ``inp`` (None where this rank sends nothing)
        into ``out`` (None where it receives nothing), synchronously or as a
        Work, with pycoll's usual sequencing, checks and waits."""
        if self.work is not None:  # its last asynchronous use: finished first
            work, self.work = self.work, None
            work.wait()
        if inp is not None:
            if inp.ndim == 1:
                self.send[...] = inp
            else:
                self.send.reshape(inp.shape)[...] = inp
        if not async_op and debug.PLAIN:
            if watch.BLOCKING:
                plain(pg, op, self.key, self.start, self.blocking)
            else:
                self._issue_and_wait(pg, op)
            if out is not None:
                if out.ndim == 1:
                    out[...] = self.recv
                else:
                    out[...] = self.recv.reshape(out.shape)
            return None
        finish = None if out is None else lambda: _copy_out(out, self.recv)
        work = run(
            pg,
            op,
            self.nbytes,
            self.start,
            (),
            async_op,
            finish,
            [out if out is not None else inp],
            call,
            key=self.key,
        )
        if async_op:
            self.work = work
        return work

    def _issue_and_wait(self, pg: Any, op: str) -> None:
        """pycoll.collectives._common.plain with the plan's request started in
        place: the call a training loop repeats,
        where the compiled path is off (PYCOLL_NATIVE=0). Through plain, whose
        start is a call of its own, an 8-byte all_reduce took 10.9 us, not
        9.2, on 2 ranks of the CI VM (docs/measurements/ab_versions.py)."""
        lock = hold(pg)
        try:
            seq = watch.count(pg, op, self.key)
            ring = pg._flight
            if ring is not None:
                ring.append(self.key)
            request = self.request
            try:
                request.Start()
            except _mpi.MPI.Exception as exc:
                raise watch.backend_error(op, seq, exc) from None
        finally:
            let_go(pg, lock)
        watch.wait1(pg, op, seq, request)
        watch.end(pg, seq)

    def free(self) -> None:
        work, self.work = self.work, None
        if work is None or work._done:
            self.request.Free()


def _copy_out(out: np.ndarray, scratch: np.ndarray) -> None:
    if out.ndim == 1:
        out[...] = scratch
    else:
        out[...] = scratch.reshape(out.shape)


class Plans:
    """A group's plans: key -> Plan, and the keys' call counts."""

    __slots__ = ("made", "seen", "off")

    def __init__(self) -> None:
        self.made: Dict[int, Plan] = {}
        self.seen: Dict[int, int] = {}
        self.off = False

    @staticmethod
    def counts(op: str, nbytes: int) -> bool:
        """Whether every rank counts a call of collective ``op`` whose largest
        array holds ``nbytes`` (so that no path may skip it: pycoll.native)."""
        return op in COUNTED and nbytes <= LIMIT

    def due(self, key: int, nbytes: int) -> bool:
        """Count a call of ``key`` without a plan; True when its plan is to be made now."""
        if self.off or nbytes > LIMIT or len(self.made) >= MAX_PLANS:
            return False
        seen = self.seen
        n = seen.get(key, 0) + 1
        if n < PROMOTE:
            if len(seen) >= MAX_SEEN:
                seen.clear()  # every rank counts the same keys: they all forget at once
            seen[key] = n
            return False
        del seen[key]
        return True

    def make(
        self,
        key: int,
        nbytes: int,
        init: Callable[..., Any],
        args: tuple,
        send: Any,
        recv: Any,
    ) -> Optional[Plan]:
        """Make ``key``'s plan: ``init(*args)`` is the MPI-4 ``*_init`` call on
        the plan's own buffers. An MPI that refuses refuses on every rank:
        the group then makes no more plans."""
        try:
            request = init(*args)
        except (NotImplementedError, _mpi.MPI.Exception):
            self.off = True
            return None
        plan = self.made[key] = Plan(key, nbytes, request, send, recv)
        return plan

    def free(self) -> None:
        for plan in self.made.values():
            plan.free()
        self.made.clear()


def lookup(pg: Any, key: int, nbytes: int) -> Union[Plan, bool]:
    """The plan for this call of ``key`` on ``pg``; True if this call is the
    one to make it (the caller makes it with ``pg._plans.make``); False if
    it has none. Every call of a collective that plans apply to comes here,
    whatever its path, so every rank counts the same calls."""
    plans: Optional[Plans] = pg._plans
    if plans is None:
        return False
    plan = plans.made.get(key)
    if plan is not None:
        return plan
    return plans.due(key, nbytes)


def _one_buffer(
    pg: Any, key: int, tensor: np.ndarray, init: Callable[..., Any], args: Callable[..., tuple]
) -> Optional[Plan]:
    """The plan of a call made in place on one buffer of ``tensor``'s shape
    (``init``: MPI's persistent call; ``args``: its arguments, given the
    buffer), or None."""
    plan = lookup(pg, key, tensor.nbytes)
    if plan is True:
        buf = np.empty(tensor.size, tensor.dtype)
        return pg._plans.make(key, tensor.nbytes, init, args(buf), buf, buf)
    return plan or None


def for_all_reduce(
    pg: Any, key: int, tensor: np.ndarray, datatype: Any, mpi_op: Any
) -> Optional[Plan]:
    """all_reduce's plan for this call (in place on one buffer), or None."""
    return _one_buffer(
        pg, key, tensor, pg.comm.Allreduce_init,
        lambda buf: (_mpi.MPI.IN_PLACE, [buf, datatype], mpi_op),
    )  # fmt: skip


def for_broadcast(
    pg: Any, key: int, tensor: np.ndarray, datatype: Any, root: int
) -> Optional[Plan]:
    """broadcast's plan (one buffer; ``root`` a group rank), or None."""
    return _one_buffer(pg, key, tensor, pg.comm.Bcast_init, lambda buf: ([buf, datatype], root))


def for_reduce(
    pg: Any, key: int, tensor: np.ndarray, datatype: Any, mpi_op: Any, root: int
) -> Optional[Plan]:
    """reduce's plan (one buffer, in place on ``root``, a group rank), or None.
    Every rank copies its input in; only the root copies the result out."""
    if root == pg._rank:
        return _one_buffer(
            pg, key, tensor, pg.comm.Reduce_init,
            lambda buf: (_mpi.MPI.IN_PLACE, [buf, datatype], mpi_op, root),
        )  # fmt: skip
    return _one_buffer(
        pg, key, tensor, pg.comm.Reduce_init, lambda buf: ([buf, datatype], None, mpi_op, root)
    )


def for_all_gather(pg: Any, key: int, inp: np.ndarray, datatype: Any) -> Optional[Plan]:
    """all_gather_into_tensor's plan (``inp`` one rank's part), or None."""
    nbytes = inp.nbytes * pg._size
    plan = lookup(pg, key, nbytes)
    if plan is True:
        send = np.empty(inp.size, inp.dtype)
        recv = np.empty(inp.size * pg._size, inp.dtype)
        args = ([send, datatype], [recv, datatype])
        return pg._plans.make(key, nbytes, pg.comm.Allgather_init, args, send, recv)
    return plan or None


def for_reduce_scatter(
    pg: Any, key: int, out: np.ndarray, datatype: Any, mpi_op: Any
) -> Optional[Plan]:
    """reduce_scatter_tensor's plan (``out`` one rank's part), or None."""
    nbytes = out.nbytes * pg._size
    plan = lookup(pg, key, nbytes)
    if plan is True:
        send = np.empty(out.size * pg._size, out.dtype)
        recv = np.empty(out.size, out.dtype)
        args = ([send, datatype], [recv, datatype], mpi_op)
        return pg._plans.make(key, nbytes, pg.comm.Reduce_scatter_block_init, args, send, recv)
    return plan or None


def for_all_to_all(
    pg: Any, key: int, inp: np.ndarray, datatype: Any, in_place: bool
) -> Optional[Plan]:
    """all_to_all_single's plan (equal splits; ``inp`` the whole input), or
    None: MPI's in-place form on one buffer where ``in_place`` (the same on
    every rank: pycoll.collectives.alltoall's choice), else two buffers."""
    plan = lookup(pg, key, inp.nbytes)
    if plan is True:
        send = np.empty(inp.size, inp.dtype)
        if in_place:
            recv = send
            args: tuple = (_mpi.MPI.IN_PLACE, [recv, datatype])
        else:
            recv = np.empty(inp.size, inp.dtype)
            args = ([send, datatype], [recv, datatype])
        return pg._plans.make(key, inp.nbytes, pg.comm.Alltoall_init, args, send, recv)
    return plan or None
