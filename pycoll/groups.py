"""Process groups, the default group, and the registry that holds them
(made and ended by pycoll.world and pycoll.subgroups).

A ProcessGroup owns an MPI communicator of its own (a duplicate of the one it
was made from), so pycoll's messages never mix with the caller's MPI traffic,
and counts the collectives issued on it (its sequence number). All library
state lives in one object, :data:`STATE`.
"""

from __future__ import annotations

import os
import threading
import warnings
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _env, _mpi, crosscheck, progress, tuning
from .progress import uid_of
from .trace import recorder

BACKEND = "mpi"
DEFAULT_TIMEOUT = timedelta(minutes=30)
TIMEOUT_ENV = "PYCOLL_TIMEOUT"  # seconds: the default timeout, set without editing code


def default_timeout() -> timedelta:
    """``PYCOLL_TIMEOUT`` seconds where it is set, else 30 minutes (torch's default).

    Raises:
        ValueError: the variable is not a positive number of seconds.
    """
    seconds = _env.number(
        TIMEOUT_ENV, float, DEFAULT_TIMEOUT.total_seconds(), lambda s: 0 < s < float("inf"),
        f"a positive number of seconds (e.g. {TIMEOUT_ENV}=60)",
    )  # fmt: skip
    return timedelta(seconds=seconds)


# What makes a new group's persistent plans: pycoll.persistent sets it where
# they are on (it imports the collectives, which import this module).
PLANS: Optional[Callable[[], Any]] = None


class ProcessGroup:
    """A set of ranks that run collectives together, over one MPI communicator.

    Ranks are numbered twice: the *global* rank (the rank in the default
    group) names a process everywhere in pycoll's API, as in torch.distributed;
    the *group* rank (0..size-1) is its place in this group.
    """

    __slots__ = (
        "comm",
        "_rank",
        "_size",
        "_ranks",
        "_group_rank_of",
        "_backend",
        "group_name",
        "group_desc",
        "timeout",
        "_seq",
        "_destroyed",
        "_children",
        "_lock",
        "_owner",
        "_shared",
        "_busy",
        "_broken",
        "_uid",
        "_rec",
        "_word",
        "_timeout_s",
        "_attached",
        "_side",
        "_keys",
        "_mask",
        "_check",
        "_staged",
        "_board",
        "_flight",
        "_fwait",
        "_plans",
        "_aliases",
        "_strays",
        "_tuned_from",
        "_tuned",
        "_tuned_rs_from",
        "_tuned_rs",
        "_live_from",
        "_native",
        "__weakref__",  # the flight recorder's registry of groups holds them weakly
    )

    def __init__(
        self,
        comm: Any,
        ranks: List[int],
        group_name: str,
        timeout: timedelta,
        group_desc: str = "",
        backend: str = BACKEND,
    ):
        self.comm = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._ranks = list(ranks)
        self._group_rank_of = {g: i for i, g in enumerate(self._ranks)}
        self._backend = backend
        self.group_name = group_name
        self.group_desc = group_desc or group_name
        self.timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._seq = 0
        # What other layers keep per group (pycoll.gpu.nccl: the NCCL communicator),
        # with what frees it: see attach().
        self._attached: Dict[str, Tuple[Any, Optional[Callable[[Any], None]]]] = {}
        # A duplicate communicator for pycoll's own traffic (the ring's messages,
        # the call check's exchanges); (communicator, request) while
        # MPI_Comm_idup is under way: see pycoll.watch.side_comm. Made here,
        # where every member makes the group (as MPI_Comm_dup: Open MPI was seen
        # to fail an idup still under way when the ranks' next calls on the group
        # disagreed), so the call check's first exchange finds it ready; with
        # the check off, made on first use.
        self._side: Any = comm.Dup() if crosscheck.EVERY else None
        # The call check (pycoll.crosscheck): one key per call, in slot seq & _mask
        # of the ledger (with the check on, the send buffer of its next exchange).
        self._check: Any = crosscheck.Checker(self._side) if crosscheck.EVERY else None
        self._keys: Any = self._check.ledger() if self._check else crosscheck.idle_ledger()
        self._mask = len(self._keys) - 1
        # Works made of several steps (each started once the last is done), in
        # issue order, until they complete: see Work.wait.
        self._staged: List[Any] = []
        self._destroyed = False
        self._children = 0  # groups made from this one, for their names
        self._lock = threading.Lock()  # one issue order per group (pycoll.watch)
        # While one thread alone uses the group, its fast synchronous calls skip
        # the lock (collectives._common.plain): _owner is that thread, _busy says
        # one such call is under way, _shared that a second thread came.
        self._owner: Optional[int] = None
        self._shared = False
        self._busy = False
        # The DistTimeoutError (or CollectiveMismatchError) that broke the group.
        self._broken: Any = None
        # This group's record on the progress board (pycoll.progress).
        self._uid = uid_of(group_name)
        board = self._board = STATE.board
        self._rec: Any = board.rec if board is not None else None
        self._word = board.claim(self._uid, self) if board is not None else 0
        # Its flight recorder (pycoll.trace.recorder): a ring of its last
        # operations (None when off), and the fast path's long wait (seq, since).
        self._flight: Any = None
        self._fwait: Optional[Tuple[int, float]] = None
        # Its persistent collectives (pycoll.persistent), where they are on.
        self._plans: Any = PLANS() if PLANS is not None else None
        self._aliases = False  # its calls' arrays alias device memory (_common.device_aliases)
        # Its compiled fast path's state (pycoll.native), once it has one.
        self._native: Any = None
        # The tuning table's entries for a group of its size (pycoll.tuning),
        # all_reduce's and reduce_scatter's, each with the least size they
        # decide (one comparison on the hot path).
        self._tuned_from, self._tuned = tuning.entries_for("all_reduce", self._size)
        self._tuned_rs_from, self._tuned_rs = tuning.entries_for("reduce_scatter", self._size)
        # The least all_reduce whose path its own first calls measure and
        # choose (pycoll.autotune; tuning.NEVER where none do: tuning.live_from).
        self._live_from = tuning.live_from(self._size)
        # A peer's message may still come on comm outside any call (a
        # monitored_barrier gave up waiting for it): destroy_process_group
        # then leaves the communicator to MPI_Finalize, as a freed one's
        # context id, taken by a later communicator, would receive it.
        self._strays = False
        recorder.attach(self)

    def rank(self) -> int:
        """This process's rank within the group."""
        return self._rank

    def size(self) -> int:
        """Number of ranks in the group."""
        return self._size

    def name(self) -> str:
        """The backend's name, ``"mpi"`` or a config such as ``"cpu:mpi,cuda:nccl"``."""
        return self._backend

    def sequence_number(self) -> int:
        """How many collectives this rank has issued on the group.

        Every collective counts once (barrier and object collectives too);
        point-to-point operations do not count. Members that issued the same
        collectives agree on it, which is what makes a hang diagnosable.
        """
        return self._seq

    _get_sequence_number_for_group = sequence_number

    def is_broken(self) -> bool:
        """True once an operation on the group timed out: the group is unusable,
        and what is still pending on it will not complete."""
        return self._broken is not None

    def attach(self, key: str, value: Any, free: Optional[Callable[[Any], None]] = None) -> Any:
        """Keep ``value`` with the group under ``key`` for a layer built on it
        (pycoll.gpu.nccl keeps the group's NCCL communicator under "nccl"), so the
        layer needs no table of groups of its own; ``free(value)`` runs when the
        group is destroyed in good order (not after a timeout, when MPI or NCCL
        may still be using it). Returns ``value``."""
        if key in self._attached:
            raise RuntimeError(f"group {self.group_desc!r} already has {key!r} attached")
        self._attached[key] = (value, free)
        return value

    def attached(self, key: str) -> Any:
        """What :meth:`attach` kept under ``key``; None if nothing."""
        entry = self._attached.get(key)
        return None if entry is None else entry[0]

    def tuned(self, collective: str) -> Tuple[int, Any]:
        """The tuning table's entries this group follows for ``collective``
        (``"all_reduce"`` or ``"reduce_scatter"``): the least size they
        decide and the entries (pycoll.tuning; read by pycoll.paths)."""
        if collective == "all_reduce":
            return self._tuned_from, self._tuned
        return self._tuned_rs_from, self._tuned_rs

    def tune(self, collective: str, least: int, entries: Any) -> None:
        """Follow ``entries`` (deciding from ``least`` bytes) for
        ``collective`` from the next call on (pycoll.tuning.decide)."""
        if collective == "all_reduce":
            self._tuned_from, self._tuned = least, entries
        else:
            self._tuned_rs_from, self._tuned_rs = least, entries

    def live_from(self) -> int:
        """The least all_reduce whose path this group's own first calls
        measure and choose (pycoll.autotune; tuning.NEVER where none do)."""
        return self._live_from

    def count_child(self) -> int:
        """Count one more group made from this one and return the count (the
        new group's name is numbered by it: pycoll.subgroups)."""
        self._children += 1
        return self._children

    def is_destroyed(self) -> bool:
        """True once :meth:`destroy` has run."""
        return self._destroyed

    def destroy(self) -> None:
        """Free what the group holds: its communicators, its persistent plans,
        what layers attached, its slot on the progress board; the group is
        unusable after. pycoll.world's destroy_process_group calls it once
        the group's last call check has run. A group broken by a timeout
        keeps its communicators (a timed-out operation may still use them)."""
        if self._destroyed:
            return
        side_free = crosscheck.free(self)
        if self._broken is None:
            plans, self._plans = self._plans, None
            if plans is not None:
                plans.free()
            if self._strays:
                progress.keep_alive([self.comm])
            else:
                self.comm.Free()
            side = self._side
            if isinstance(side, tuple):  # MPI_Comm_idup still under way
                progress.keep_alive(list(side))
            elif side is not None and side_free:
                side.Free()
            for value, free in self._attached.values():
                if free is not None:
                    free(value)
        self._attached.clear()
        self._destroyed = True
        board = self._board
        if board is not None and not board.closed:
            board.release(self._word)  # the slot is free for a later group
        self._rec = self._board = self._native = None  # (the compiled path wrote to the record)

    @property
    def ranks(self) -> List[int]:
        """Global ranks of the members, in group-rank order."""
        return list(self._ranks)

    def __repr__(self) -> str:
        state = ", destroyed" if self._destroyed else ""
        return (
            f"ProcessGroup(name={self.group_name!r}, rank={self._rank}, "
            f"size={self._size}, seq={self._seq}{state})"
        )


class _State:
    """Everything pycoll remembers between calls.

    Attributes:
        default: the default (world) group, None before init_process_group.
        groups: every live group by name, the default one included.
        local_rank: this process's rank among the ranks on its node.
        local_size: how many ranks share this process's node.
    """

    def __init__(self) -> None:
        self.default: Optional[ProcessGroup] = None
        self.groups: Dict[str, ProcessGroup] = {}
        self.local_rank: Optional[int] = None
        self.local_size: Optional[int] = None
        self.board: Any = None  # pycoll.progress.Board, once initialized


STATE = _State()


class GroupMember:
    """torch.distributed's markers for groups.

    ``GroupMember.WORLD`` is the default group once initialized (None before);
    ``GroupMember.NON_GROUP_MEMBER`` is what a rank outside a new group gets.
    """

    WORLD: Optional[ProcessGroup] = None
    NON_GROUP_MEMBER = -100


class _World:
    """``pycoll.group.WORLD``: the default group, looked up when read."""

    @property
    def WORLD(self) -> Optional[ProcessGroup]:
        return STATE.default


group = _World()


def not_initialized(func: str) -> RuntimeError:
    return RuntimeError(
        f"{func}: the default process group has not been initialized; "
        f"please make sure to call pycoll.init_process_group() first"
    )


def resolve(group: Any, func: str) -> Optional[ProcessGroup]:
    """The ProcessGroup a call runs on, or None when this rank is not a member.

    A rank outside the group gets a UserWarning and the call does nothing, as
    in torch.distributed.
    """
    if group is None:
        pg = STATE.default
        if pg is None:
            raise not_initialized(func)
        return pg
    if type(group) is ProcessGroup:
        if group._destroyed:
            raise RuntimeError(
                f"{func}: process group {group.group_name!r} has been destroyed; "
                f"create a new group to keep communicating"
            )
        return group
    if isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER:
        if STATE.default is None:
            raise not_initialized(func)
        warnings.warn(
            f"Running {func} on global rank {STATE.default.rank()} which does not "
            f"belong to the given group.",
            UserWarning,
            stacklevel=3,
        )
        return None
    raise TypeError(
        f"{func}: group must be a pycoll.ProcessGroup or None, got {type(group).__name__}"
    )


def is_initialized() -> bool:
    """True once init_process_group has run (and destroy has not)."""
    return STATE.default is not None


def is_mpi_available() -> bool:
    """True when mpi4py and its MPI extension are installed (MPI is not started)."""
    return _mpi.available()


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 if not a member."""
    pg = resolve_quiet(group, "get_rank")
    return -1 if pg is None else pg.rank()


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 if not a member."""
    pg = resolve_quiet(group, "get_world_size")
    return -1 if pg is None else pg.size()


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    """The backend of ``group``: ``"mpi"``, or its config (``"cpu:mpi,cuda:nccl"``)."""
    pg = resolve_quiet(group, "get_backend")
    if pg is None:
        raise ValueError("get_backend: this rank is not a member of the group")
    return pg.name()


def resolve_quiet(group: Any, func: str) -> Optional[ProcessGroup]:
    """Like resolve, without the not-a-member warning (for queries)."""
    if isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER:
        if STATE.default is None:
            raise not_initialized(func)
        return None
    return resolve(group, func)


def _registered(group: Any, func: str) -> ProcessGroup:
    if not isinstance(group, ProcessGroup) or STATE.groups.get(group.group_name) is not group:
        raise ValueError(
            f"{func}: group {group!r} is not registered; pass a group made by "
            f"init_process_group or new_group"
        )
    return group


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """The group rank of the process whose global rank is ``global_rank``."""
    pg = _registered(group, "get_group_rank")
    try:
        return pg._group_rank_of[global_rank]
    except KeyError:
        raise ValueError(
            f"get_group_rank: global rank {global_rank} is not part of group "
            f"{pg.group_name!r} (its ranks are {pg._ranks})"
        ) from None


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """The global rank of the process at ``group_rank`` in ``group``."""
    pg = _registered(group, "get_global_rank")
    if not isinstance(group_rank, int) or not 0 <= group_rank < pg.size():
        raise ValueError(
            f"get_global_rank: group rank {group_rank} is not part of group "
            f"{pg.group_name!r} (valid group ranks are 0..{pg.size() - 1})"
        )
    return pg._ranks[group_rank]


def get_process_group_ranks(group: ProcessGroup) -> List[int]:
    """The global ranks of ``group``'s members, in group-rank order."""
    return _registered(group, "get_process_group_ranks").ranks


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """This process's rank among the processes on its node.

    Taken from ``LOCAL_RANK`` when set (as launchers set it); otherwise, once
    the default group is initialized, from MPI's shared-memory split of it;
    otherwise ``fallback_rank``.

    Raises:
        RuntimeError: none of the three is available.
    """
    env = os.environ.get("LOCAL_RANK")
    if env is not None:
        try:
            return int(env)
        except ValueError:
            raise RuntimeError(f"LOCAL_RANK must be an integer, got {env!r}") from None
    if STATE.local_rank is not None:
        return STATE.local_rank
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "get_node_local_rank: LOCAL_RANK is not set, the default process group is not "
        "initialized and no fallback_rank was given; set LOCAL_RANK, call "
        "init_process_group() first, or pass fallback_rank"
    )
