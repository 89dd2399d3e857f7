"""pycoll: collective communication on MPI, with torch.distributed's API.

Arrays are numpy arrays (any dtype in ``pycoll.arrays.SUPPORTED_DTYPES``,
bfloat16 included) or CUDA arrays (cupy, torch CUDA tensors: see pycoll.gpu).
Importing pycoll does not start MPI, nor import numpy
or the collectives (they load on first use); :func:`init_process_group`
starts MPI.

    import numpy as np, pycoll
    pycoll.init_process_group()                # under mpiexec -n N
    x = np.full(4, pycoll.get_rank(), np.float32)
    pycoll.all_reduce(x, op=pycoll.ReduceOp.SUM)
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any
from typing import List as _List

if _TYPE_CHECKING:  # the names, for type checkers; at run time they load on first use
    from .collectives.alltoall import all_to_all, all_to_all_single
    from .collectives.barrier import barrier, monitored_barrier
    from .collectives.coalesced import (
        all_gather_into_tensor_coalesced,
        reduce_scatter_tensor_coalesced,
    )
    from .collectives.gather import all_gather, all_gather_coalesced, all_gather_into_tensor, gather
    from .collectives.objects import (
        all_gather_object,
        broadcast_object_list,
        gather_object,
        recv_object_list,
        scatter_object_list,
        send_object_list,
    )
    from .collectives.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
    from .collectives.reduce import (
        all_reduce,
        reduce,
        reduce_scatter,
        reduce_scatter_tensor,
    )
    from .collectives.reduce_coalesced import all_reduce_coalesced
    from .collectives.scatter import broadcast, scatter
    from .debug import DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
    from .errors import CollectiveMismatchError, DistBackendError, DistError, DistTimeoutError
    from .fusion import FusedAllReduce
    from .groups import (
        GroupMember,
        ProcessGroup,
        get_backend,
        get_global_rank,
        get_group_rank,
        get_node_local_rank,
        get_process_group_ranks,
        get_rank,
        get_world_size,
        group,
        is_initialized,
        is_mpi_available,
    )
    from .reduceop import ReduceOp, make_premul_sum
    from .subgroups import new_group, new_subgroups, new_subgroups_by_enumeration, split_group
    from .trace import dump_flight_record
    from .work import Future, Work
    from .world import destroy_process_group, init_process_group

__version__ = "0.1.0"

__all__ = [
    # set-up and groups
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "is_mpi_available",
    "get_rank",
    "get_world_size",
    "get_backend",
    "get_node_local_rank",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "ProcessGroup",
    "GroupMember",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
    "group",
    # collectives
    "all_reduce",
    "all_reduce_coalesced",
    "FusedAllReduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    # point to point
    "send",
    "recv",
    "isend",
    "irecv",
    "P2POp",
    "batch_isend_irecv",
    # objects
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    # ops, work, debug, errors
    "ReduceOp",
    "make_premul_sum",
    "Work",
    "Future",
    "DebugLevel",
    "get_debug_level",
    "set_debug_level",
    "set_debug_level_from_env",
    "DistError",
    "DistBackendError",
    "DistTimeoutError",
    "CollectiveMismatchError",
    # the flight recorder (the timeline: pycoll.trace)
    "dump_flight_record",
]

# Which module defines each public name. ``import pycoll`` loads none of them
# (nor numpy): pycoll-run and the pytest plugin, which live inside the package,
# start without that cost, and a program pays for the modules it uses.
_EXPORTS = {
    "FusedAllReduce": "fusion",
    "dump_flight_record": "trace",
    "all_to_all": "collectives.alltoall",
    "all_to_all_single": "collectives.alltoall",
    "barrier": "collectives.barrier",
    "monitored_barrier": "collectives.barrier",
    "all_gather_into_tensor_coalesced": "collectives.coalesced",
    "reduce_scatter_tensor_coalesced": "collectives.coalesced",
    "all_gather": "collectives.gather",
    "all_gather_coalesced": "collectives.gather",
    "all_gather_into_tensor": "collectives.gather",
    "gather": "collectives.gather",
    "all_gather_object": "collectives.objects",
    "broadcast_object_list": "collectives.objects",
    "gather_object": "collectives.objects",
    "recv_object_list": "collectives.objects",
    "scatter_object_list": "collectives.objects",
    "send_object_list": "collectives.objects",
    "P2POp": "collectives.p2p",
    "batch_isend_irecv": "collectives.p2p",
    "irecv": "collectives.p2p",
    "isend": "collectives.p2p",
    "recv": "collectives.p2p",
    "send": "collectives.p2p",
    "all_reduce": "collectives.reduce",
    "all_reduce_coalesced": "collectives.reduce_coalesced",
    "reduce": "collectives.reduce",
    "reduce_scatter": "collectives.reduce",
    "reduce_scatter_tensor": "collectives.reduce",
    "broadcast": "collectives.scatter",
    "scatter": "collectives.scatter",
    "DebugLevel": "debug",
    "get_debug_level": "debug",
    "set_debug_level": "debug",
    "set_debug_level_from_env": "debug",
    "CollectiveMismatchError": "errors",
    "DistBackendError": "errors",
    "DistError": "errors",
    "DistTimeoutError": "errors",
    "GroupMember": "groups",
    "ProcessGroup": "groups",
    "destroy_process_group": "world",
    "get_backend": "groups",
    "get_global_rank": "groups",
    "get_group_rank": "groups",
    "get_node_local_rank": "groups",
    "get_process_group_ranks": "groups",
    "get_rank": "groups",
    "get_world_size": "groups",
    "group": "groups",
    "init_process_group": "world",
    "is_initialized": "groups",
    "is_mpi_available": "groups",
    "ReduceOp": "reduceop",
    "make_premul_sum": "reduceop",
    "new_group": "subgroups",
    "new_subgroups": "subgroups",
    "new_subgroups_by_enumeration": "subgroups",
    "split_group": "subgroups",
    "Future": "work",
    "Work": "work",
}


def __getattr__(name: str) -> _Any:
    if name == "trace":  # the subpackage, itself callable: with pycoll.trace(dir): ...
        return _importlib.import_module(".trace", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pycoll' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later uses are plain lookups
    return value


def __dir__() -> _List[str]:
    """The public API, the subpackages loaded so far, and the module's own dunders."""
    return sorted(
        name
        for name in set(globals()) | set(__all__)
        if not name.startswith("_") or name.startswith("__") and name.endswith("__")
    )
