"""barrier: wait until every rank of the group has reached it."""

from __future__ import annotations

from typing import Any, Optional

from .. import debug
from ..groups import ProcessGroup, resolve
from ..work import Work
from ._common import DETAIL, detail, run

__all__ = ["barrier"]


def barrier(
    group: Optional[ProcessGroup] = None, async_op: bool = False, device_ids: Any = None
) -> Optional[Work]:
    """Block until every rank of the group has called barrier.

    Args:
        group: the group (default: the world).
        async_op: return a Work that completes once all ranks have arrived.
        device_ids: accepted for torch.distributed compatibility; unused.
    """
    pg = resolve(group, "barrier")
    if pg is None:
        return None
    if debug.LEVEL >= DETAIL:
        detail(pg, "barrier", "barrier()", async_op)
    comm = pg.comm
    return run(pg, "barrier", 0, comm.Barrier, comm.Ibarrier, (), async_op)
