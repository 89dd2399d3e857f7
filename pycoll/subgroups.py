"""Making groups: new_group, new_subgroups, new_subgroups_by_enumeration, split_group.

Every group is an MPI communicator of its own, made from its parent's with
``MPI_Comm_create`` (all parent ranks call), ``MPI_Comm_create_group`` (only
the members call: ``use_local_synchronization=True``) or ``MPI_Comm_split``;
no data travels through the world group to make one. Ranks are global ranks
(ranks of the default group), sorted, as in torch.distributed.
"""

from __future__ import annotations

import operator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _mpi
from .errors import DistBackendError
from .groups import (
    BACKEND,
    STATE,
    GroupMember,
    ProcessGroup,
    not_initialized,
    resolve,
)
from .world import parse_backend

__all__ = ["new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"]

Subgroup = Union[ProcessGroup, int]  # a ProcessGroup, or GroupMember.NON_GROUP_MEMBER

# How many groups with exactly these members this process has made with local
# synchronization; the members agree on it, so it names the group and tags
# MPI_Comm_create_group.
_local_counts: Dict[Tuple[int, ...], int] = {}


def _default(func: str) -> ProcessGroup:
    pg = STATE.default
    if pg is None:
        raise not_initialized(func)
    return pg


def _check_backend(func: str, backend: Optional[str]) -> str:
    """The new group's backend: ``backend`` checked, or the default group's."""
    if backend is None:
        default = STATE.default
        return default.name() if default is not None else BACKEND
    return parse_backend(backend, func)


def _timeout(func: str, timeout: Optional[timedelta], parent: ProcessGroup) -> timedelta:
    if timeout is None:
        return parent.timeout
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"{func}: timeout must be a positive datetime.timedelta, got {timeout!r}")
    return timeout


def _ranks(func: str, name: str, ranks: Any, valid: Sequence[int]) -> List[int]:
    """Check a list of distinct ranks drawn from ``valid``; return it sorted."""
    if not isinstance(ranks, (list, tuple, range)):
        raise TypeError(f"{func}: {name} must be a list of ranks, got {type(ranks).__name__}")
    out = []
    for r in ranks:
        if isinstance(r, bool):
            raise TypeError(f"{func}: {name} must hold ints, got {r!r}")
        try:
            out.append(operator.index(r))
        except TypeError:
            raise TypeError(f"{func}: {name} must hold ints, got {r!r}") from None
    allowed = set(valid)
    bad = [r for r in out if r not in allowed]
    if bad:
        raise ValueError(
            f"{func}: {name} holds {bad}, which are not ranks of the group "
            f"(valid ranks are {min(valid)}..{max(valid)})"
            if list(valid) == list(range(len(valid)))
            else f"{func}: {name} holds {bad}, which are not ranks of the group ({list(valid)})"
        )
    if len(set(out)) != len(out):
        dup = sorted({r for r in out if out.count(r) > 1})
        raise ValueError(f"{func}: {name} lists rank(s) {dup} more than once")
    return sorted(out)


@contextmanager
def _new_communicator(func: str) -> Iterator[None]:
    """Turn MPI running out of communicators into an error that says what to do."""
    try:
        yield
    except _mpi.MPI.Exception as exc:
        said = str(exc).lower()
        if "too many communicators" not in said and "context id" not in said:
            raise
        raise DistBackendError(
            f"{func}: MPI has no communicator left for a new group ({len(STATE.groups)} "
            f"groups are live; MPI allows a few thousand per process). Destroy the "
            f"groups you no longer use with pycoll.destroy_process_group(group), or "
            f"reuse groups instead of making one per step. MPI said: "
            f"{str(exc).splitlines()[-1].strip()}",
            func,
        ) from None


def _register(
    func: str,
    comm: Any,
    ranks: List[int],
    name: str,
    timeout: timedelta,
    desc: Optional[str],
    backend: str,
) -> ProcessGroup:
    comm.Set_name(f"pycoll:{name}")
    try:
        with _new_communicator(func):  # the group's side communicator
            pg = ProcessGroup(comm, ranks, name, timeout, desc or name, backend)
    except Exception:
        comm.Free()
        raise
    STATE.groups[name] = pg
    return pg


def _child_name(parent: ProcessGroup, kind: str) -> str:
    return f"{parent.group_name}/{kind}{parent.count_child()}"


def new_group(
    ranks: Optional[Sequence[int]] = None,
    timeout: Optional[timedelta] = None,
    backend: Optional[str] = None,
    use_local_synchronization: bool = False,
    group_desc: Optional[str] = None,
) -> Optional[Subgroup]:
    """Make a group of the given global ranks.

    Args:
        ranks: the members (global ranks, any order, no repeats); None means
            every rank, an empty list none (every caller is a non-member).
        timeout: the group's timeout (default: the default group's).
        backend: None or ``"mpi"``.
        use_local_synchronization: if False (the default) every rank of the
            default group must call, and ranks outside get
            ``GroupMember.NON_GROUP_MEMBER``; if True only the members call and
            ranks outside get None at once. Then groups of disjoint ranks can
            be made at the same time by different ranks, and making the same
            rank set twice gives two independent groups.
        group_desc: a description used in messages and logs.

    Returns:
        The new ProcessGroup on members; NON_GROUP_MEMBER or None elsewhere.
    """
    func = "new_group"
    world = _default(func)
    chosen = _check_backend(func, backend)
    group_timeout = _timeout(func, timeout, world)
    members = (
        list(range(world.size()))
        if ranks is None
        else _ranks(func, "ranks", ranks, range(world.size()))
    )
    me = world.rank()
    MPI = _mpi.MPI
    world_group = world.comm.Get_group()
    mpi_group = world_group.Incl(members)
    world_group.Free()
    try:
        if use_local_synchronization:
            if me not in members:
                return None
            key = tuple(members)
            count = _local_counts.get(key, 0)
            _local_counts[key] = count + 1
            name = f"local[{','.join(map(str, members))}]#{count}"
            with _new_communicator(func):
                comm = world.comm.Create_group(mpi_group, tag=count % 32768)
        else:
            name = _child_name(world, "group")
            with _new_communicator(func):
                comm = world.comm.Create(mpi_group)
            if comm == MPI.COMM_NULL:
                return GroupMember.NON_GROUP_MEMBER
    finally:
        mpi_group.Free()
    return _register(func, comm, members, name, group_timeout, group_desc, chosen)


def _split(
    func: str,
    parent: ProcessGroup,
    layout: Sequence[Sequence[int]],
    kind: str,
    timeout: Optional[timedelta],
    desc: Optional[str],
    backend: str,
) -> Tuple[int, Optional[ProcessGroup]]:
    """Split ``parent`` into the disjoint sets of parent group ranks in ``layout``
    (collective over ``parent``); return this rank's index and part (-1, None
    when it is in no set)."""
    MPI = _mpi.MPI
    group_timeout = _timeout(func, timeout, parent)
    color = next((i for i, part in enumerate(layout) if parent.rank() in part), -1)
    name = _child_name(parent, kind)
    with _new_communicator(func):
        comm = parent.comm.Split(MPI.UNDEFINED if color < 0 else color, key=parent.rank())
    if comm == MPI.COMM_NULL:
        return color, None
    members = parent.ranks
    ranks = [members[i] for i in sorted(layout[color])]
    return color, _register(func, comm, ranks, f"{name}.{color}", group_timeout, desc, backend)


def new_subgroups(
    group_size: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    timeout: Optional[timedelta] = None,
    backend: Optional[str] = None,
    group_desc: Optional[str] = None,
) -> Tuple[ProcessGroup, List[Subgroup]]:
    """Split ``group`` (default: the world) into equal subgroups of consecutive ranks.

    Args:
        group_size: ranks per subgroup; must divide the group's size. None
            makes one subgroup per node (the ranks that share memory).

    Returns:
        (this rank's subgroup, every subgroup in order), where subgroups this
        rank is not in appear as ``GroupMember.NON_GROUP_MEMBER``.
    """
    func = "new_subgroups"
    parent = resolve(group, func)
    if parent is None:
        raise ValueError(f"{func}: this rank is not a member of the group to split")
    chosen = _check_backend(func, backend)
    n = parent.size()
    if group_size is None:
        MPI = _mpi.MPI
        node = parent.comm.Split_type(MPI.COMM_TYPE_SHARED, key=parent.rank())
        node_members = tuple(sorted(node.allgather(parent.rank())))
        node.Free()
        layout = sorted(set(parent.comm.allgather(node_members)))
    else:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"{func}: group_size must be a positive int, got {group_size!r}")
        if n % group_size:
            raise ValueError(
                f"{func}: the group's size {n} must be divisible by group_size {group_size}"
            )
        layout = [tuple(range(i, i + group_size)) for i in range(0, n, group_size)]
    color, mine = _split(func, parent, layout, "subgroup", timeout, group_desc, chosen)
    if mine is None:  # every rank is in one subgroup
        raise RuntimeError(f"{func}: MPI left rank {parent.rank()} out of every subgroup")
    subgroups: List[Subgroup] = [
        mine if i == color else GroupMember.NON_GROUP_MEMBER for i in range(len(layout))
    ]
    return mine, subgroups


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: Sequence[Sequence[int]],
    timeout: Optional[timedelta] = None,
    backend: Optional[str] = None,
    group_desc: Optional[str] = None,
) -> Tuple[Optional[ProcessGroup], List[Subgroup]]:
    """Make the listed subgroups of the world (every rank calls).

    Args:
        ranks_per_subgroup_list: one list of global ranks per subgroup; no
            rank may appear twice; ranks in none get None as their subgroup.

    Returns:
        (this rank's subgroup or None, every subgroup in order), where
        subgroups this rank is not in appear as ``GroupMember.NON_GROUP_MEMBER``.
    """
    func = "new_subgroups_by_enumeration"
    world = _default(func)
    chosen = _check_backend(func, backend)
    layout = _disjoint(func, ranks_per_subgroup_list, world.size())
    color, mine = _split(func, world, layout, "enum", timeout, group_desc, chosen)
    subgroups: List[Subgroup] = [
        mine if i == color and mine is not None else GroupMember.NON_GROUP_MEMBER
        for i in range(len(layout))
    ]
    return mine, subgroups


def _disjoint(func: str, lists: Any, n: int) -> List[List[int]]:
    """Check non-empty, non-overlapping lists of ranks in 0..n-1; return them sorted."""
    if not isinstance(lists, (list, tuple)) or not lists:
        raise ValueError(f"{func}: expects a non-empty list of rank lists")
    seen: Dict[int, int] = {}
    layout = []
    for i, ranks in enumerate(lists):
        part = _ranks(func, f"subgroup {i}", ranks, range(n))
        if not part:
            raise ValueError(f"{func}: subgroup {i} is empty")
        for r in part:
            if r in seen:
                raise ValueError(
                    f"{func}: rank {r} appears in both subgroup {seen[r]} and subgroup {i}; "
                    f"subgroups must not overlap"
                )
            seen[r] = i
        layout.append(part)
    return layout


def split_group(
    parent_pg: Optional[ProcessGroup] = None,
    split_ranks: Optional[Sequence[Sequence[int]]] = None,
    timeout: Optional[timedelta] = None,
    group_desc: Optional[str] = None,
) -> Optional[ProcessGroup]:
    """Split ``parent_pg`` (default: the world) into disjoint groups.

    Args:
        split_ranks: one list per new group of *group ranks of the parent*
            (not global ranks); lists must not overlap.

    Returns:
        The new group this rank belongs to, or None if it is in no list.
    """
    func = "split_group"
    parent = resolve(parent_pg, func)
    if parent is None:
        return None
    if split_ranks is None:
        raise ValueError(f"{func}: split_ranks is required (lists of parent group ranks)")
    layout = _disjoint(func, split_ranks, parent.size())
    return _split(func, parent, layout, "split", timeout, group_desc, parent.name())[1]
