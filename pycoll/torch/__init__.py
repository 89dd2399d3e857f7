"""pycoll as a torch.distributed backend: DDP and torch's whole API over MPI.

    import torch.distributed as dist
    import pycoll.torch                      # registers the backend "pycoll"
    dist.init_process_group("pycoll")        # under pycoll-run, mpiexec or srun

Importing this module registers the backend with torch
(``Backend.register_backend("pycoll", ..., extended_api=True,
devices=["cpu", "cuda"])``) and the ``mpi://`` rendezvous
(pycoll.torch.rendezvous); it starts nothing. See docs/guide/torch.md.
"""

from __future__ import annotations

import torch.distributed as dist

from .backend import NAME, ProcessGroupPycoll, create
from .errors import CollectiveMismatchError, DistBackendError, DistError, DistTimeoutError
from .rendezvous import register as _register_rendezvous
from .work import TorchWork

__all__ = [
    "NAME",
    "ProcessGroupPycoll",
    "TorchWork",
    "DistError",
    "DistBackendError",
    "DistTimeoutError",
    "CollectiveMismatchError",
    "register",
]


def register() -> None:
    """Register the backend "pycoll" and the rendezvous ``mpi://`` with torch
    (done on import; harmless again)."""
    if not dist.is_backend_available(NAME):
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])
    _register_rendezvous()


register()
