"""The life of the default group: init_process_group, destroy_process_group,
and the exit hook that runs the call check's last exchange when a program
ends without destroying its groups.

Starting pycoll sets up every layer once (debug level, call check, wait mode,
the progress board, the aborting excepthook); ending it frees them in
reverse. The groups themselves, and the state that holds them, are
pycoll.groups'.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from datetime import timedelta
from typing import Any, Optional

from pycoll.gpu.backend_config import BackendConfig

from . import _mpi, crosscheck, debug, native, persistent, tuning, watch
from .groups import (
    BACKEND,
    STATE,
    GroupMember,
    ProcessGroup,
    default_timeout,
    not_initialized,
    resolve,
)
from .kernels.threads import cores
from .ops import free_user_ops
from .progress import Board
from .trace import recorder, timeline

__all__ = ["init_process_group", "destroy_process_group", "parse_backend"]


def parse_backend(backend: Optional[str], func: str) -> str:
    """``"mpi"``, or a backend config such as ``"cpu:mpi,cuda:nccl"`` (torch's
    format, checked by pycoll.gpu.BackendConfig), normalized. Host arrays
    always go through MPI, so a config must give ``cpu`` to ``mpi``."""
    if backend is None:
        return BACKEND
    if not isinstance(backend, str):
        raise TypeError(f"{func}: backend must be a string, got {type(backend).__name__}")
    try:
        config = BackendConfig(backend)
    except ValueError as exc:
        raise ValueError(f"{func}: {exc}") from None
    mapping = config.get_device_backend_map()
    if mapping.get("cpu") != BACKEND:
        raise ValueError(
            f"{func}: backend {backend!r} is not available alone; pycoll runs host "
            f"arrays on MPI, so name both: backend='cpu:mpi,cuda:nccl' (or 'mpi')"
        )
    if mapping.get("cuda", BACKEND) == BACKEND:
        return BACKEND
    return str(config)


def init_process_group(
    backend: Optional[str] = BACKEND,
    init_method: Optional[str] = None,
    timeout: Optional[timedelta] = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    comm: Any = None,
) -> None:
    """Initialize the default process group over MPI.

    Under mpirun/mpiexec/srun no argument is needed: rank and size come from
    MPI. Every rank of the communicator must call it (it is collective).

    Args:
        backend: ``"mpi"`` (None means the same), or a backend config naming
            one backend per device kind, ``"cpu:mpi,cuda:nccl"``: CUDA arrays
            then go through NCCL where it has the collective (pycoll.gpu.nccl).
        init_method: None or ``"env://"``; MPI does the rendezvous, so any
            other value is refused rather than silently ignored.
        timeout: the default timeout of operations on the group (and of the
            groups made from it). None: ``PYCOLL_TIMEOUT`` seconds where that
            is set, else 30 minutes.
        world_size: if given, checked against the communicator's size.
        rank: if given, checked against this process's rank.
        store: must be None: MPI needs no key-value store.
        group_name: a name for the default group (default ``"default_pg"``).
        comm: an mpi4py intracommunicator to run on instead of COMM_WORLD;
            pycoll duplicates it, so the caller keeps full use of it.

    Raises:
        RuntimeError: the default group is already initialized.
        ValueError: world_size or rank disagree with MPI, or an argument
            asks for something MPI does not do.
    """
    if STATE.default is not None:
        raise RuntimeError(
            "init_process_group: trying to initialize the default process "
            "group twice! Call destroy_process_group() first."
        )
    backend_name = parse_backend(backend, "init_process_group")
    if init_method not in (None, "env://"):
        raise ValueError(
            f"init_process_group: init_method={init_method!r} is not used: MPI connects "
            f"the ranks itself; leave init_method out (or use 'env://')"
        )
    if store is not None:
        raise ValueError(
            "init_process_group: store must be None: MPI connects the ranks "
            "without a key-value store"
        )
    if timeout is None:
        timeout = default_timeout()
    if not isinstance(timeout, timedelta):
        raise TypeError(
            f"init_process_group: timeout must be a datetime.timedelta, got "
            f"{type(timeout).__name__}"
        )
    if timeout.total_seconds() <= 0:
        raise ValueError(f"init_process_group: timeout must be positive, got {timeout}")
    debug.set_debug_level_from_env()
    crosscheck.set_every(crosscheck.every_from_env())
    recorder.records_from_env()  # a bad PYCOLL_FLIGHT_RECORDS fails here, before any group
    watch.set_wait_mode_from_env()
    watch.install_excepthook()
    MPI = _mpi.load()
    persistent.configure()
    native.configure()
    if comm is None:
        comm = MPI.COMM_WORLD
    elif not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(
            f"init_process_group: comm must be an mpi4py intracommunicator, got {comm!r}"
        )
    size, me = comm.Get_size(), comm.Get_rank()
    if world_size not in (-1, None) and world_size != size:
        raise ValueError(
            f"init_process_group: world_size={world_size} was given but MPI "
            f"runs {size} ranks; leave world_size out or make them agree"
        )
    if rank not in (-1, None) and rank != me:
        raise ValueError(
            f"init_process_group: rank={rank} was given but MPI says this "
            f"process is rank {me}; leave rank out or make them agree"
        )
    own = comm.Dup()
    own.Set_name("pycoll:default")
    node = own.Split_type(MPI.COMM_TYPE_SHARED, key=me)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    # Rank 0 names the job (the flight recorder's files) and reads the tuning
    # table and the live tuning's mode; every rank gets them, so every rank
    # chooses its paths alike.
    job = time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid()) if me == 0 else None
    job, table, error, live = own.bcast(
        (job, *tuning.read(), tuning.read_live()) if me == 0 else None
    )
    if error is not None:
        own.Free()
        raise ValueError(f"init_process_group: {error}")
    tuning.install(tuning.for_job(table, one_node=local_size == size, warn=me == 0))
    tuning.install_live(live)
    STATE.local_rank, STATE.local_size = local_rank, local_size
    watch.set_spinning(STATE.local_size <= cores())
    STATE.board = Board(own, timeout.total_seconds())
    pg = ProcessGroup(own, list(range(size)), group_name or "default_pg", timeout, "", backend_name)
    STATE.default = pg
    STATE.groups = {pg.group_name: pg}
    GroupMember.WORLD = pg
    # The flight recorder's names for this rank and job (pycoll.trace.recorder)
    recorder.RANK = MPI.COMM_WORLD.Get_rank()
    recorder.JOB = job
    recorder.install_signal()
    atexit.register(_at_exit)
    directory = os.environ.get(timeline.ENV, "").strip()
    if directory:
        timeline.start(directory)


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Free a group's communicator; with no argument (or the default group),
    free every group and return to the uninitialized state.

    Collective over the group's members: each group's last call check
    (pycoll.crosscheck) runs first, within 10 s or the group's timeout if
    that is shorter.

    Raises:
        CollectiveMismatchError: the ranks did not make the same collective
            calls on a group (raised once everything is freed).
    """
    if STATE.default is None:
        raise not_initialized("destroy_process_group")
    if group is None or group is STATE.default:
        timeline.stop()  # this rank's timeline file, if one is being recorded
        groups = list(STATE.groups.values())
        deadline = _final_deadline(STATE.default)
        found = [crosscheck.final(pg, deadline) for pg in groups if not pg.is_destroyed()]
        for pg in groups:
            pg.destroy()
        free_user_ops()
        atexit.unregister(_at_exit)
        if STATE.board is not None:
            STATE.board.close()
        STATE.board = None
        STATE.default = None
        STATE.groups = {}
        STATE.local_rank = STATE.local_size = None
        GroupMember.WORLD = None
        tuning.install(None)
        tuning.install_live("off")
        watch.remove_excepthook()
    else:
        member = resolve(group, "destroy_process_group")
        if member is None:
            return
        found = [crosscheck.final(member, _final_deadline(member))]
        member.destroy()
        STATE.groups.pop(member.group_name, None)
    for error in found:
        if error is not None:
            raise error


def _final_deadline(pg: ProcessGroup) -> float:
    return time.monotonic() + min(pg.timeout.total_seconds(), crosscheck.FINAL_WAIT)


def _at_exit() -> None:
    """At exit without destroy_process_group: the final exchange of every live
    group, within EXIT_WAIT seconds; a disagreement is printed and ends the
    job with status 1, as an uncaught exception would."""
    timeline.stop()
    deadline = time.monotonic() + crosscheck.EXIT_WAIT
    errors = []
    for pg in list(STATE.groups.values()):
        if pg.is_destroyed():
            continue
        error = crosscheck.final(pg, deadline)
        if error is not None:
            errors.append(error)
    if errors:
        rank = _mpi.MPI.COMM_WORLD.Get_rank()
        for error in errors:
            sys.stderr.write(f"pycoll: rank {rank}: CollectiveMismatchError: {error}\n")
        sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward it (see watch.timed_out)
        _mpi.MPI.COMM_WORLD.Abort(1)
