"""pycoll.rpc: peer-to-peer RPC over the job's MPI, with torch.distributed.rpc's API.

    import pycoll.rpc as rpc
    rpc.init_rpc(f"worker{rank}")                  # every rank of the job
    y = rpc.rpc_sync("worker1", numpy.add, args=(x, 1))
    fut = rpc.rpc_async(1, f, args=(...))          # a name, a WorkerInfo or a rank
    rref = rpc.remote("worker1", Model)            # the value stays on worker1
    rref.rpc_sync().forward(batch)                 # run its method there
    rpc.shutdown()                                 # every rank

Any picklable object goes; numpy arrays (and CPU torch tensors) travel out
of band at MPI's speed, without a size limit. The agent runs on its own
duplicate of MPI_COMM_WORLD, so RPC never mixes with pycoll's collectives,
and needs MPI_THREAD_MULTIPLE (mpi4py's default). docs/guide/rpc.md is the
guide; docs/design.md says how the agent works.
"""

from ..work import Future
from . import functions
from .agent import WorkerInfo
from .api import (
    RpcBackendOptions,
    debug_info,
    get_worker_info,
    init_rpc,
    is_initialized,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from .rref import RRef

__all__ = [
    "Future",
    "RRef",
    "RpcBackendOptions",
    "WorkerInfo",
    "debug_info",
    "functions",
    "get_worker_info",
    "init_rpc",
    "is_initialized",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]
