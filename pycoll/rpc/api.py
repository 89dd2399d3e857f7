"""init_rpc, the calls, shutdown: torch.distributed.rpc's functions over the agent."""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Union

from .. import _mpi
from ..errors import DistTimeoutError
from ..progress import keep_alive
from ..work import Future
from . import current as _current
from .agent import LEAVING, Agent, WorkerInfo
from .current import current, is_initialized
from .rref import RRef

To = Union[str, WorkerInfo, int]
NAME = re.compile(r"[A-Za-z0-9_:\-]+")
MAX_NAME = 128  # bytes, as torch's WorkerInfo

_LIFECYCLE = threading.Lock()
_BROKEN: Optional[str] = None  # a shutdown that could not finish: the process must not finalize MPI


@dataclass
class RpcBackendOptions:
    """Options of pycoll.rpc's agent (torch's TensorPipeRpcBackendOptions is
    accepted too: its ``num_worker_threads`` and ``rpc_timeout`` are used).

    Attributes:
        num_worker_threads: threads that run requests (torch's default, 16).
        rpc_timeout: default timeout of a call in seconds (torch's, 60); 0
            means none. Also bounds init_rpc and shutdown.
        heartbeat: seconds between heartbeats to every peer; 0 (default)
            sends none. With heartbeats, a peer silent for
            ``heartbeat * heartbeat_misses`` seconds has its pending calls
            failed, naming it.
        heartbeat_misses: see heartbeat.
        spin: polls the progress thread makes ``busy_pause`` seconds apart
            (0: yielding the core between polls) after a message, before it
            sleeps longer and longer, up to ``idle_pause`` seconds: the
            latency of the first message after a quiet spell.
    """

    num_worker_threads: int = 16
    rpc_timeout: float = 60.0
    heartbeat: float = 0.0
    heartbeat_misses: int = 3
    spin: int = 50
    busy_pause: float = 0.0
    idle_pause: float = 1e-3


def _options(given: Any) -> RpcBackendOptions:
    if given is None:
        return RpcBackendOptions()
    if isinstance(given, RpcBackendOptions):
        options = given
    elif hasattr(given, "rpc_timeout"):  # torch's options
        options = RpcBackendOptions(
            num_worker_threads=getattr(given, "num_worker_threads", 16),
            rpc_timeout=given.rpc_timeout,
        )
    else:
        raise TypeError(
            "init_rpc: rpc_backend_options must be pycoll.rpc.RpcBackendOptions, not "
            f"{type(given).__name__}"
        )
    if options.num_worker_threads < 1:
        raise ValueError(
            f"init_rpc: num_worker_threads must be at least 1, not {options.num_worker_threads}"
        )
    if options.rpc_timeout < 0 or options.heartbeat < 0:
        raise ValueError("init_rpc: rpc_timeout and heartbeat must be >= 0 seconds (0: none)")
    return options


def _arguments(name: Any, backend: Any, given: Any) -> RpcBackendOptions:
    """This rank's arguments checked; its options."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or len(name.encode()) > MAX_NAME:
        raise ValueError(
            f"init_rpc: worker name {name!r} is not valid: use 1 to {MAX_NAME} letters, digits, "
            "'_', '-' or ':'"
        )
    if backend is not None:
        raise ValueError(
            f"init_rpc: pycoll.rpc runs over MPI only; leave backend=None (got {backend!r})"
        )
    return _options(given)


def init_rpc(
    name: str,
    backend: Any = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    rpc_backend_options: Any = None,
) -> None:
    """Start this worker's RPC agent; collective over every rank of the job.

    Args:
        name: this worker's name, unique in the job (letters, digits, ``_``,
            ``-``, ``:``; at most 128 bytes).
        backend: unused (pycoll.rpc has one backend, MPI); must be None.
        rank, world_size: MPI's, if given (they must agree with it).
        rpc_backend_options: an RpcBackendOptions.

    Raises:
        ValueError: a bad or duplicate name, a bad option, or a
            rank/world_size MPI does not agree with; raised on every rank
            (the ranks exchange names first, a refused rank an empty one).
        RuntimeError: RPC is already initialized, or MPI lacks
            MPI_THREAD_MULTIPLE.
        DistTimeoutError: not every rank called init_rpc within the timeout.
    """
    refused: Optional[Exception] = None  # this rank's arguments, refused after the exchange
    options = RpcBackendOptions()
    try:
        options = _arguments(name, backend, rpc_backend_options)
    except (TypeError, ValueError) as exc:
        refused = exc
    MPI = _mpi.load()
    with _LIFECYCLE:
        if is_initialized():
            raise RuntimeError(
                "init_rpc: RPC is already initialized on this worker; call shutdown() first"
            )
        level = MPI.Query_thread()
        if level != MPI.THREAD_MULTIPLE:
            levels = {
                MPI.THREAD_SINGLE: "SINGLE",
                MPI.THREAD_FUNNELED: "FUNNELED",
                MPI.THREAD_SERIALIZED: "SERIALIZED",
            }
            raise RuntimeError(
                f"init_rpc: pycoll.rpc needs MPI_THREAD_MULTIPLE (its progress and worker threads "
                "call MPI at once), but MPI was initialized with "
                f"MPI_THREAD_{levels.get(level, level)}: "
                "leave mpi4py.rc.thread_level at its default, 'multiple', or use an MPI built with "
                "thread support"
            )
        world = MPI.COMM_WORLD
        size, me = world.Get_size(), world.Get_rank()
        mismatch = (rank is not None and rank != me) or (
            world_size is not None and world_size != size
        )
        if refused is None and mismatch:
            refused = ValueError(
                f"init_rpc: rank={rank}, world_size={world_size} disagree with MPI's (rank {me} of "
                f"{size}); leave them out, pycoll.rpc takes them from MPI"
            )
        deadline = time.monotonic() + (options.rpc_timeout or 60.0)
        comm, request = world.Idup()
        if not _wait(request, deadline):
            raise _init_timed_out("duplicating MPI_COMM_WORLD")
        # a rank whose arguments were refused sends an empty name, so that
        # every rank raises rather than the others waiting for it
        names = _exchange_names(comm, "" if refused is not None else name, deadline)
        if refused is not None:
            comm.Free()
            raise refused
        others = [r for r, n in enumerate(names) if not n]
        if others:
            comm.Free()
            raise ValueError(
                f"init_rpc: the arguments of rank(s) {', '.join(map(str, others))} were refused "
                "(their errors say why); no worker was started"
            )
        taken: Dict[str, list] = {}
        for r, n in enumerate(names):
            taken.setdefault(n, []).append(r)
        clashes = {n: rs for n, rs in taken.items() if len(rs) > 1}
        if clashes:
            comm.Free()
            text = "; ".join(
                f"{n!r} by ranks {', '.join(map(str, rs))}" for n, rs in clashes.items()
            )
            raise ValueError(f"init_rpc: worker names must be unique, but {text}")
        agent = Agent(comm, names, options)
        _current.AGENT = agent
        agent.start()
        atexit.unregister(_at_exit)  # registered once, however often RPC starts
        atexit.register(_at_exit)


def _wait(request: Any, deadline: float) -> bool:
    """Wait for an MPI request, polling gently, at most until ``deadline``;
    False if it did not complete (the request is then kept alive for good:
    MPI may still write into its buffers)."""
    while not request.Test():
        if time.monotonic() > deadline:
            keep_alive([request])
            return False
        time.sleep(2e-4)
    return True


def _init_timed_out(doing: str) -> DistTimeoutError:
    """init_rpc's error when not every rank took part; the process must then
    end without finalizing MPI (see _at_exit)."""
    global _BROKEN
    _BROKEN = f"pycoll.rpc: init_rpc did not finish ({doing})"
    return DistTimeoutError(
        f"init_rpc: timed out {doing}: not every rank of the job took part in time "
        "(every rank must call init_rpc)",
        op="init_rpc",
    )


def _exchange_names(comm: Any, name: str, deadline: float) -> list:
    import numpy as np

    MPI = _mpi.MPI
    mine = np.zeros(MAX_NAME, np.uint8)
    raw = name.encode()
    mine[: len(raw)] = np.frombuffer(raw, np.uint8)
    everyone = np.zeros((comm.Get_size(), MAX_NAME), np.uint8)
    if not _wait(comm.Iallgather([mine, MPI.BYTE], [everyone, MPI.BYTE]), deadline):
        raise _init_timed_out("exchanging worker names")
    return [bytes(row).rstrip(b"\0").decode() for row in everyone]


def shutdown(graceful: bool = True, timeout: float = -1) -> None:
    """Stop this worker's agent.

    Graceful (the default; collective over every worker): every worker goes
    on serving until all have called shutdown and no call is in flight
    anywhere (nested calls included), so every Future is complete when it
    returns. It is bounded by ``timeout`` seconds (-1: the agent's
    rpc_timeout); past it, it raises DistTimeoutError naming the workers
    that never called shutdown, and the process will end at exit without
    finalizing MPI (where it would hang), with that message.

    ``graceful=False`` stops this worker at once: its pending calls fail.
    """
    global _BROKEN
    with _LIFECYCLE:
        agent = current("shutdown")
        limit = agent.seconds(timeout, "shutdown")
        limit = agent.timeout or 60.0 if limit == float("inf") else limit
        deadline = time.monotonic() + limit
        if not graceful:
            agent.stop(deadline)
            agent._fail_all(RuntimeError(f"pycoll.rpc: the agent of {agent.me} was shut down"))
            _current.AGENT = None
            return
        try:
            _quiesce(agent, deadline, limit)
        except DistTimeoutError as exc:
            agent.stop(time.monotonic() + 1.0)
            agent._fail_all(exc)
            _BROKEN = str(exc)
            _current.AGENT = None
            raise
        stopped = agent.stop(deadline)
        if stopped and agent.farewell(deadline):
            agent.comm.Free()
        else:  # a message may still come: the communicator's context id stays taken
            keep_alive([agent.comm])
        _current.AGENT = None


def _quiesce(agent: Agent, deadline: float, limit: float) -> None:
    """Wait until every worker is in shutdown and no call is in flight (two
    rounds of summed counts that balance and agree: Mattern's four-counter
    termination test), serving all the while."""
    import numpy as np

    MPI = _mpi.MPI
    for rank in range(len(agent.workers)):
        if rank != agent.rank:
            agent._post(rank, (LEAVING,))
    previous = None
    while True:
        with agent._lock:
            counts = np.array(
                [agent.sent, agent.served, agent.answered, agent.begun, agent.ended], np.int64
            )
        total = np.zeros(5, np.int64)
        request = agent.comm.Iallreduce(counts, total, MPI.SUM)
        if not _wait(request, deadline):
            keep_alive([counts, total])
            absent = [
                w.name for w in agent.workers if w.id != agent.rank and w.id not in agent.leaving
            ]
            who = (
                f"{', '.join(absent)} never called shutdown"
                if absent
                else "calls were still in flight"
            )
            raise DistTimeoutError(
                f"shutdown: timed out after {limit:g} s on {agent.me}: {who}, "
                f"{agent.pending()} of this worker's calls unanswered",
                op="shutdown",
                elapsed=limit,
                ranks=[w.id for w in agent.workers if w.name in absent],
            )
        balanced = total[0] == total[1] == total[2] and total[3] == total[4]
        if balanced and previous is not None and (previous == total).all():
            return
        previous = total


def _at_exit() -> None:
    """At exit: a graceful shutdown if the program did not make one; after one
    that failed, end the process without MPI_Finalize (which would wait on
    the operations left in flight), saying why."""
    if is_initialized():
        try:
            shutdown()
        except Exception as exc:
            sys.stderr.write(f"pycoll.rpc: shutdown at exit failed: {exc}\n")
    if _BROKEN is not None:
        sys.stderr.write(f"{_BROKEN}\npycoll.rpc: ending the process without finalizing MPI\n")
        sys.stderr.flush()
        os._exit(1)


# -- the calls -------------------------------------------------------------------------


def _check(func: Any, args: Any, kwargs: Any, what: str) -> None:
    if not callable(func):
        raise TypeError(f"{what}: func must be callable, not {type(func).__name__}")
    if args is not None and not isinstance(args, (tuple, list)):
        raise TypeError(f"{what}: args must be a tuple or list, not {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"{what}: kwargs must be a dict, not {type(kwargs).__name__}")


def rpc_async(
    to: To,
    func: Callable[..., Any],
    args: Optional[Sequence[Any]] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    timeout: float = -1,
) -> Future:
    """Run ``func(*args, **kwargs)`` on worker ``to``; a Future of its result.

    ``to`` is a worker name, a WorkerInfo or a rank. ``timeout`` in seconds
    (-1: rpc_timeout, 0: none); past it the Future fails with a
    DistTimeoutError. An exception raised by ``func`` is raised by the
    Future's wait() as its own type, its message naming the worker.
    """
    agent = current("rpc_async")
    _check(func, args, kwargs, "rpc_async")
    return agent.call(agent.resolve(to, "rpc_async"), func, args, kwargs, timeout)


def rpc_sync(
    to: To,
    func: Callable[..., Any],
    args: Optional[Sequence[Any]] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    timeout: float = -1,
) -> Any:
    """As rpc_async, waiting for the result."""
    agent = current("rpc_sync")
    _check(func, args, kwargs, "rpc_sync")
    return agent.call(agent.resolve(to, "rpc_sync"), func, args, kwargs, timeout).wait()


def remote(
    to: To,
    func: Callable[..., Any],
    args: Optional[Sequence[Any]] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    timeout: float = -1,
) -> RRef:
    """Run ``func`` on ``to`` and keep the result there; an RRef to it.

    Returns at once. An error of ``func`` is raised by ``to_here()``;
    ``timeout`` bounds the owner's confirmation.
    """
    agent = current("remote")
    _check(func, args, kwargs, "remote")
    return agent.remote(agent.resolve(to, "remote"), func, args, kwargs, timeout)


def get_worker_info(worker_name: Optional[str] = None) -> WorkerInfo:
    """The WorkerInfo of ``worker_name`` (default: this worker)."""
    agent = current("get_worker_info")
    if worker_name is None:
        return agent.me
    return agent.workers[agent.resolve(worker_name, "get_worker_info")]


def debug_info() -> Dict[str, int]:
    """Counts for tests and diagnosis (as torch's ``_get_debug_info``):
    owner RRefs with users, pending calls, requests sent/served/answered."""
    agent = current("debug_info")
    return {
        "num_owner_rrefs": len(agent.owners),
        "num_pending_futures": agent.pending(),
        "num_pending_users": len(agent.users),
        "sent": agent.sent,
        "served": agent.served,
        "answered": agent.answered,
        "begun": agent.begun,
        "ended": agent.ended,
    }
