"""Small collectives of two ranks as one exchange: all_reduce, reduce and
the reduce-scatters (reduce_scatter_tensor, and reduce_scatter's list form).

On two ranks a small all_reduce is one message each way and a fold, and a
reduce one message and a fold on the root. MPI's nonblocking collectives,
which pycoll's default wait mode makes, can cost several times that: in a C
loop on 2 ranks of the CI VM an 8-byte ``MPI_Iallreduce`` and its tests took
1.2 us on Open MPI (libnbc), ``MPI_Isendrecv`` and ``MPI_Reduce_local`` 0.5;
on MPICH a 16 KiB ``MPI_Ireduce`` took 2.3x the one message and the fold,
``MPI_Iallreduce`` 1.4x the exchange and the fold
(docs/measurements/pair_floor.c). A reduce-scatter is one message each way too
(each rank's part of the other's input) and a fold, where Open MPI's
nonblocking call took 1.3-1.9x its blocking one from 2 KiB. Where
:func:`applies` says so, such a call is made here instead: one ``Isendrecv``
over the group's side communicator (a side left empty with ``MPI_PROC_NULL``:
the reduce's root sends nothing, its other rank receives nothing), tagged with
the call's sequence number as the ring's messages are
(pycoll.collectives.ring.side), then MPI's own op folds the peer's copy in
(``MPI_Reduce_local``). A kept call (pycoll.native) makes the same messages and
the same fold from compiled code, so ranks may mix the two; that is where the
exchange gains most. On an array made afresh for each call the plain path's
fold and copy in Python cost about what MPI's call saves.

An all_reduce's result is the same on every rank, bit for bit. Most ops
give the same bits in either order (SUM and PRODUCT of integers and IEEE
floats, but for which NaN's payload comes out; the logical and bitwise ops):
each rank folds the copy it received into its own array. MIN and MAX of
floats do not (min(0.0, -0.0) is -0.0, min(-0.0, 0.0) is 0.0): for those
both ranks fold rank 0's array into rank 1's (``Reduce_local(in=rank 0's,
inout=rank 1's)``), rank 0 into the copy it received, which it then copies
back; a reduce-scatter with them keeps MPI's call. Only the calls MPI does
alone (no pre-scaling, no division after: :attr:`pycoll.ops.Plan.plain`)
come here, with the op MPI would have been given (a builtin, or one of
pycoll's user ops).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from .. import _mpi, debug, native, paths, watch
from .._env import nbytes
from ..groups import ProcessGroup
from ..ops import order_matters
from ..work import Work
from ._common import lean, plain, run
from .ring import side

__all__ = [
    "BYTES",
    "MPICH_FROM",
    "SCATTER_BELOW",
    "applies",
    "all_reduce",
    "reduce",
    "reduce_scatter",
]

# Which calls are made here, by measured crossovers
# (docs/measurements/pair_paths.py, 2 ranks of the CI VM), in the default wait
# mode:
# - On Open MPI an all_reduce below BYTES (from there pycoll's doubling takes
#   over): on an array given again (the compiled path) it took 0.58-0.80x the
#   time of Open MPI's nonblocking all_reduce through pycoll at 8 B-32 KiB, on
#   an array made afresh 0.84-0.89x from 4 KiB and 1.08-1.18x below (the fold
#   in Python). Open MPI's reduce is cheap to start (the root's Python is what
#   a small reduce costs there): the exchange took 0.67-0.97x given again and
#   1.05-1.40x made afresh, so it keeps MPI's call.
# - On MPICH an all_reduce or reduce from MPICH_FROM below BYTES (then pycoll's
#   reduce to a root, or MPI's call): MPICH's own calls slow down there
#   (mpi4py's all_reduce 5.6 us at 14 KiB, 12.4 at 16 KiB); the exchange took
#   0.76-0.92x (all_reduce) and 0.23-0.58x (reduce) given again, 0.91-1.00x
#   and 0.63-0.75x made afresh, at 16-60 KiB. Between 8 and 16 KiB it took
#   1.3-1.6x (MPICH's point-to-point slows down first), and below it lost
#   0.3-1.2 us on arrays made afresh.
# - A reduce_scatter_tensor or reduce_scatter (its input's bytes) below
#   SCATTER_BELOW, where pycoll's pairwise exchange takes over
#   (pycoll.paths.rule's PAIRWISE_BYTES), on Open MPI at any size and
#   on MPICH from MPICH_FROM.
#   Open MPI's nonblocking reduce-scatter took 1.3-1.9x its blocking one from
#   2 KiB; the exchange took 0.15-0.81x its time through pycoll on arrays
#   given again, on arrays made afresh 0.47-0.97x from 8 KiB and 1.04-1.28x
#   below. On MPICH from 16 KiB it took 0.48-0.90x given again and 0.84-1.08x
#   made afresh (below, 0.97-1.13x made afresh). MIN and MAX of floats keep
#   MPI's call (the caller's rule): their bits follow the operands' order.
# In blocking mode the MPIs' blocking calls stay (not measured against the
# exchange). PYCOLL_PAIR_BYTES, where set, is the size below which every
# all_reduce, reduce and reduce-scatter on two ranks is made here, on every
# MPI and in either wait mode (0: never).
_SET = nbytes("PYCOLL_PAIR_BYTES", "never")
BYTES = 64 << 10 if _SET is None else _SET
MPICH_FROM = 16 << 10
SCATTER_BELOW = {"Open MPI": 256 << 10, "MPICH": 1 << 20}
_NOTHING = np.empty(0, np.uint8)


def applies(func: str, ranks: int, nbytes: int) -> bool:
    """Whether a call of collective ``func`` (``all_reduce``, ``reduce``,
    ``reduce_scatter_tensor`` or ``reduce_scatter``: then ``nbytes`` are its
    input's) of ``nbytes`` on a group of ``ranks`` is made here (never on an
    MPI without ``MPI_Isendrecv``, which came with MPI-4.0)."""
    if ranks != 2:
        return False
    if _SET is not None:
        if nbytes >= _SET:
            return False
    elif watch.BLOCKING:
        return False
    elif func in ("reduce_scatter_tensor", "reduce_scatter"):
        vendor = _mpi.VENDOR
        if nbytes >= SCATTER_BELOW.get(vendor, 0) or vendor == "MPICH" and nbytes < MPICH_FROM:
            return False
    elif nbytes >= BYTES:
        return False
    elif _mpi.VENDOR == "MPICH":
        if nbytes < MPICH_FROM:
            return False
    elif func != "all_reduce" or _mpi.VENDOR != "Open MPI":
        return False
    return _mpi.has("MPI_Isendrecv")  # (last: the library asked only where it would matter)


def _exchange(
    pg: ProcessGroup, func: str, send: Any, dest: int, recv: Any, source: int, datatype: Any
) -> Any:
    """Start the exchange (called once the call is counted: its tag comes
    from the sequence number)."""
    comm, tag = side(pg, func)
    return comm.Isendrecv([send, datatype], dest, tag, [recv, datatype], source, tag)


def _exchanged(
    pg: ProcessGroup, func: str, send: Any, dest: int, recv: Any, source: int, datatype: Any
) -> None:
    """:func:`_exchange` under ``PYCOLL_WAIT=blocking``: waited for with the
    GIL released, watched by the watchdog thread as MPI's blocking calls are."""
    _exchange(pg, func, send, dest, recv, source, datatype).Wait()


def _folder(
    fold: Tuple[Any, Any, Any], datatype: Any, back: Optional[np.ndarray]
) -> Callable[[], None]:
    """The step after the exchange, for a Work or a checked call: the fold,
    then the copy back, if any."""

    def finish() -> None:
        fold[0].Reduce_local([fold[1], datatype], [fold[2], datatype])
        if back is not None:
            np.copyto(back, fold[2])

    return finish


def _call(
    pg: ProcessGroup,
    func: str,
    key: int,
    async_op: bool,
    desc: Callable[[], str],
    main: np.ndarray,
    other: Any,
    extra: Any,
    kept: Any,
    exchange: Tuple[Any, int, Any, int, Any],
    fold: Optional[Tuple[Any, Any, Any]],
    back: Optional[np.ndarray],
    place: Any = None,
    result: Optional[np.ndarray] = None,
    nbytes: Optional[int] = None,
    items: Optional[Tuple[Any, ...]] = None,
) -> Optional[Work]:
    """Make one call: kept and compiled (pycoll.native) where it may be,
    else counted and waited for as MPI's own calls are (pycoll.collectives.
    _common), its fold and copy back after. ``exchange`` is
    :func:`_exchange`'s (send, dest, recv, source, datatype); ``fold`` is
    (op, in, inout) or None; ``back``, where not None, gets ``inout`` once
    folded; ``place`` and ``items`` as for native.call. A Work's result and
    the call's bytes are ``result`` and ``nbytes`` where given (a
    reduce-scatter's output, and its input's bytes), else ``main``'s."""
    if not async_op and debug.PLAIN:
        if kept is False and native.call_pair(
            pg, func, key, main, other, extra, exchange, fold, back, place, items
        ):
            return None
        seq = plain(pg, func, key, _exchange, _exchanged, pg, func, *exchange)
        if fold is not None:  # (inline: a closure costs what this does)
            datatype = exchange[4]
            try:
                fold[0].Reduce_local([fold[1], datatype], [fold[2], datatype])
            except _mpi.MPI.Exception as exc:
                raise watch.backend_error(func, seq, exc) from None
            if back is not None:
                np.copyto(back, fold[2])
        return None
    finish = None if fold is None else _folder(fold, exchange[4], back)
    args = (pg, func, *exchange)
    value = [main if result is None else result]
    size = main.nbytes if nbytes is None else nbytes
    if async_op is True and debug.PLAIN:
        return lean(pg, func, size, _exchange, args, True, finish, value, key)
    return run(pg, func, size, _exchange, args, async_op, finish, value, desc, key=key, path="pair")


def all_reduce(
    pg: ProcessGroup,
    tensor: np.ndarray,
    mpi_op: Any,
    datatype: Any,
    ordered: bool,
    async_op: bool,
    key: int,
    desc: Callable[[], str],
    extra: Any,
    kept: Any,
) -> Optional[Work]:
    """all_reduce ``tensor`` in place on a group of two ranks with MPI's op
    ``mpi_op`` (``extra`` is the ReduceOp a kept call is known by; ``kept``
    what native.again answered). Where the op's bits depend on its
    operands' order (``ordered``: MIN and MAX of floats), rank 0 folds its
    array into the copy it received, then copies the result back, so that
    both ranks fold rank 0's array into rank 1's; for the others each rank
    folds the copy it received into its own array, which gives the same
    bits."""
    theirs = np.empty(tensor.shape, tensor.dtype)
    peer = 1 - pg._rank
    back = None
    if pg._rank == 0 and ordered:
        fold, back = (mpi_op, tensor, theirs), tensor
    else:
        fold = (mpi_op, theirs, tensor)
    exchange = (tensor, peer, theirs, peer, datatype)
    return _call(
        pg, "all_reduce", key, async_op, desc, tensor, _mpi.IN_PLACE, extra, kept, exchange,
        fold, back,
    )  # fmt: skip


def reduce_scatter(
    pg: ProcessGroup,
    func: str,
    output: np.ndarray,
    parts: Any,
    whole: Optional[np.ndarray],
    form: str,
    mpi_op: Any,
    datatype: Any,
    async_op: bool,
    key: int,
    desc: Callable[[], str],
    extra: Any,
    kept: Any,
) -> Optional[Work]:
    """A reduce-scatter of a group of two ranks into ``output``: each rank
    sends the other its part of ``parts`` (one contiguous array per rank, of
    ``output``'s size) and folds its own part's copy in. ``whole`` is the
    array the parts are of (reduce_scatter_tensor's input), or None for the
    list form (reduce_scatter's list, kept by its arrays). ``form`` says
    where ``output`` lies, which each rank decides alone (the path itself
    follows only what both share, so that they meet):

    - ``"apart"``: apart from the parts; the peer's copy is received into it
      and this rank's part folded in;
    - ``"in place"``: this rank's part of ``whole`` itself (torch's form);
      the peer's copy is received aside and folded into it;
    - ``"aside"``: overlapping the parts otherwise; the peer's copy is
      received aside, this rank's part folded into it, and the result
      copied into ``output`` once the parts are no longer read (not kept).

    For ops whose bits do not depend on the operands' order (the caller
    keeps MIN and MAX of floats off this path): each element's result is on
    one rank only."""
    peer, mine = 1 - pg._rank, parts[pg._rank]
    send = parts[peer]
    size = output.nbytes * 2
    if form != "apart":
        theirs = np.empty(output.shape, output.dtype)
        exchange = (send, peer, theirs, peer, datatype)
        if form == "aside":
            return _call(pg, func, key, async_op, desc, output, None, extra, None, exchange,
                         (mpi_op, mine, theirs), output, result=output, nbytes=size)  # fmt: skip
        assert whole is not None
        return _call(pg, func, key, async_op, desc, whole, _mpi.IN_PLACE, extra, False, exchange,
                     (mpi_op, theirs, output), None, place=output, result=output,
                     nbytes=size)  # fmt: skip
    exchange = (send, peer, output, peer, datatype)
    if whole is not None:
        return _call(pg, func, key, async_op, desc, output, whole, extra, kept, exchange,
                     (mpi_op, mine, output), None, result=output, nbytes=size)  # fmt: skip
    items = tuple(parts)
    return _call(pg, func, key, async_op, desc, output, items[0], extra, kept, exchange,
                 (mpi_op, mine, output), None, result=output, nbytes=size,
                 items=items)  # fmt: skip


def reduce(
    pg: ProcessGroup,
    func: str,
    tensor: np.ndarray,
    root: int,
    mpi_op: Any,
    datatype: Any,
    async_op: bool,
    key: int,
    desc: Callable[[], str],
    extra: Any,
    kept: Any,
) -> Optional[Work]:
    """reduce ``tensor`` to group rank ``root`` of a group of two ranks: the
    other rank sends its array, the root folds it into its own."""
    null = _mpi.MPI.PROC_NULL
    if pg._rank != root:  # (it receives nothing: an empty buffer, its array may be read-only)
        exchange = (tensor, root, _NOTHING, null, datatype)
        return _call(pg, func, key, async_op, desc, tensor, None, extra, kept, exchange,
                     None, None)  # fmt: skip
    theirs = np.empty(tensor.shape, tensor.dtype)
    fold = (mpi_op, theirs, tensor)  # (the root's result alone: any order will do)
    exchange = (tensor, null, theirs, 1 - root, datatype)
    return _call(
        pg, func, key, async_op, desc, tensor, _mpi.IN_PLACE, extra, kept, exchange, fold, None
    )


def _carries(c: paths.Call) -> bool:
    """Whether MPI's own call of ``c`` goes by the exchange: an op MPI
    carries whole (or a two-rank AVG, one user op: pycoll.collectives.reduce),
    host memory, the sizes of :func:`applies`; a reduce-scatter not of MIN or
    MAX of floats (their bits follow the operands' order)."""
    if c.device or not (c.how.plain or c.how.average and c.ranks == 2 and c.func == "all_reduce"):
        return False
    if c.func.startswith("reduce_scatter") and order_matters(c.op, c.dtype):
        return False
    return applies(c.func, c.ranks, c.nbytes)


# A form of MPI's own call (the collectives ask it after pycoll.paths.choose,
# inline: the small calls' hot path), registered for pycoll.paths.explain.
for _func, _start in (("all_reduce", all_reduce), ("reduce", reduce),
                      ("reduce_scatter", reduce_scatter),
                      ("reduce_scatter_tensor", reduce_scatter)):  # fmt: skip
    paths.register(paths.Path(
        "pair", (_func,), _carries, _start, None, "one exchange of the two ranks' arrays",
        form=True,
    ))  # fmt: skip
