"""reduce on three ranks or more as MPI's reduce-scatter, then MPI's gather
of the parts to the root: where MPICH runs its nonblocking v-form
reduce-scatter pairwise, faster than its own reduce from 16 MiB
(pycoll.paths.rule, SCATTERED_BYTES)."""

from __future__ import annotations

from typing import Any, List, Optional

from .. import paths
from ..groups import ProcessGroup
from ..work import Work
from . import scratch
from ._common import run
from ._reduction import Reduce, averager, prescaler, reduce_desc, scaled
from .ring import parts


def reduce(pg: ProcessGroup, job: Reduce) -> Optional[Work]:
    """reduce as MPI's reduce-scatter into a part of pycoll's scratch on
    every rank (counts as even as the size allows), then MPI's gather of the
    parts into the root's array. The root's array is scaled first for a
    PREMUL_SUM and divided at the end for an AVG, as MPI's own reduce's; the
    other ranks send their arrays, or a PREMUL_SUM's scaled copy, and keep
    them."""
    tensor, dst, root, op, how, async_op, key = job
    flat = tensor.reshape(-1)
    n, me, dtype = pg.size(), pg.rank(), tensor.dtype
    counts, starts = parts(flat.size, n)
    part = scratch.take(pg, counts[me] * dtype.itemsize, dtype)
    is_root = root == me
    send = flat if is_root or how.prescale is None else scaled(flat, how.prescale)
    comm, datatype = pg.comm, how.datatype

    def gather() -> List[Any]:
        into = [flat, counts, starts, datatype] if is_root else None
        return [comm.Igatherv([part, datatype], into, root)]

    average = averager(tensor, n) if is_root and how.average else None

    def finish() -> None:
        scratch.give(pg, part)
        if average is not None:
            average()

    return run(
        pg, "reduce", tensor.nbytes, comm.Ireduce_scatter,
        ([send, datatype], [part, datatype], counts, how.mpi_op), async_op, finish, [tensor],
        lambda: reduce_desc(op, dst, tensor),
        prescaler(tensor, how.prescale) if is_root else None, [gather], key, path="scattered",
    )  # fmt: skip


def _carries(c: paths.Call) -> bool:
    return c.ranks > 2 and not c.device  # (MPI's own calls: any op, any dtype MPI reduces)


PATH = paths.register(paths.Path(
    "scattered", ("reduce",), _carries, reduce, None,
    "MPI's reduce-scatter, then MPI's gather of the parts to the root",
))  # fmt: skip
