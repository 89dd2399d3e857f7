"""Rendezvous from MPI: ``init_method="mpi://"``, and env:// without variables.

torch needs a key-value store beside any backend (gloo groups made beside
pycoll's, store-based barriers, RPC). Under an MPI launcher rank and size
are known already, so ``mpi://`` starts pycoll (MPI), makes a TCPStore on
rank 0 (on a free port, at ``MASTER_ADDR`` where that is set, else on
127.0.0.1 when every rank shares rank 0's host, else on rank 0's host name)
and tells the other ranks where it is with an MPI broadcast. No environment
variable is read or needed.

``env://`` (torch's default init_method) still reads RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT where they are set (pycoll-run and torchrun set
them). Where the process was started by an MPI launcher (mpiexec, mpirun,
srun) and any of them is missing, pycoll.torch's env:// does what mpi://
does, so that a plain ``init_process_group("pycoll")`` works under any of
them, also with only RANK and WORLD_SIZE set, as many scripts do: a RANK or
WORLD_SIZE that disagrees with MPI is refused, naming both. With all four
set, torch's own env:// runs unchanged.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Tuple
from urllib.parse import urlparse

import torch.distributed as dist
import torch.distributed.rendezvous  # noqa: F401  (the module, for its handler table)

import pycoll

from .backend import torch_timeout, world_group

__all__ = ["mpi_rendezvous", "register", "launched_by_mpi"]

SCHEME = "mpi"
ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Set in every process an MPI launcher starts: MPICH's and Intel MPI's Hydra,
# Open MPI's (ORTE and PRRTE/PMIx), Slurm's srun.
LAUNCHER_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (or srun) started this process."""
    return any(os.environ.get(v) for v in LAUNCHER_VARS)


def _query(url: str) -> Dict[str, str]:
    pairs = (p.split("=", 1) for p in urlparse(url).query.split("&") if "=" in p)
    return {k: v for k, v in pairs}


def _address(world: Any) -> str:
    """Where rank 0's store listens, as the other ranks reach it."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    hosts = [""] * world.size()
    pycoll.all_gather_object(hosts, socket.gethostname(), group=world)
    return "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]


def mpi_rendezvous(
    url: str, timeout: timedelta = timedelta(minutes=30), from_env: bool = False, **kwargs: Any
) -> Iterator[Tuple[Any, int, int]]:
    """torch's rendezvous handler for ``mpi://``: (store, rank, world size)
    from MPI (see the module's docstring). ``from_env``: env:// sent it here,
    so RANK and WORLD_SIZE, where set, must agree with MPI too (``mpi://``
    itself reads no variable).

    Raises:
        ValueError: a rank or world_size given to init_process_group (or,
            with ``from_env``, in the environment) disagrees with MPI's.
    """
    if not pycoll.is_initialized():
        world_group(torch_timeout(timeout))
    world = pycoll.group.WORLD
    assert world is not None
    rank, size = world.rank(), world.size()
    asked = _query(url)
    for key, var, mine in (("rank", "RANK", rank), ("world_size", "WORLD_SIZE", size)):
        given = int(asked.get(key, "-1"))
        if given not in (-1, mine):
            raise ValueError(
                f"init_process_group: {key}={given} was given, but MPI started this "
                f"process as rank {rank} of {size}; leave rank and world_size out "
                f"(MPI knows them), or launch the number of processes you meant"
            )
        if from_env and os.environ.get(var, str(mine)).strip() != str(mine):
            raise ValueError(
                f"init_process_group: the environment sets {var}={os.environ[var]}, but MPI "
                f"started this process as rank {rank} of {size}; unset {var} (MPI knows it), "
                f"or launch the number of processes you meant"
            )
    yield (_store(world, timeout), rank, size)
    raise RuntimeError("mpi:// rendezvous cannot run again: the MPI job is fixed")


# The job's store: rank 0's TCPStore server, made by the first rendezvous and
# kept for the life of the process (a second server per init cost seconds
# now and then while clients found it); each rendezvous gets keys of its own.
_SERVER: List[Any] = []


def _store(world: Any, timeout: timedelta) -> Any:
    if not _SERVER:
        address = _address(world)
        port = [0]
        if world.rank() == 0:
            store = dist.TCPStore(
                address,
                0,
                world.size(),
                is_master=True,
                timeout=timeout,
                wait_for_workers=False,
                multi_tenant=True,
            )
            port[0] = store.port
        pycoll.broadcast_object_list(port, src=0, group=world)
        if world.rank() != 0:
            store = dist.TCPStore(address, port[0], world.size(), is_master=False, timeout=timeout)
        _SERVER[:] = [store, 0]
    _SERVER[1] += 1  # every rank rendezvouses as often as the others
    return dist.PrefixStore(f"pycoll-mpi-{_SERVER[1]}/", _SERVER[0])


def _env_or_mpi(original: Any) -> Any:
    def env_rendezvous(url: str, **kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
        # Under an MPI launcher, what env:// lacks comes from MPI: with none of
        # the variables set, and with some set (RANK and WORLD_SIZE alone, as
        # many scripts do), where mpi_rendezvous checks those given against MPI.
        if launched_by_mpi() and not all(os.environ.get(v) for v in ENV_VARS):
            return mpi_rendezvous(url, from_env=True, **kwargs)
        return original(url, **kwargs)

    env_rendezvous.pycoll_wraps = original  # type: ignore[attr-defined]
    return env_rendezvous


def register() -> None:
    """Register ``mpi://``, and env:// without variables, with torch; harmless twice."""
    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    if SCHEME not in handlers:
        dist.register_rendezvous_handler(SCHEME, mpi_rendezvous)
    # torch has no call to replace a handler: the env:// entry is wrapped in place.
    env = handlers.get("env")
    if env is not None and not hasattr(env, "pycoll_wraps"):
        handlers["env"] = _env_or_mpi(env)
