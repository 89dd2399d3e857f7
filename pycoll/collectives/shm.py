"""all_reduce through the node's shared memory: large arrays, and
FusedAllReduce's many small ones, on one node.

MPI's all_reduce on one node moves a large array several times through main
memory: at 64 MiB on two ranks MPICH reached 2.1 GB/s here, where one core
copies 19-40 GB/s. This path works in chunks that stay in the caches, through
an MPI-3 shared window (``MPI_Win_allocate_shared``) holding two chunk-sized
halves per rank:

1. each rank copies its next chunk of the array into its half of the window;
2. (barrier) each rank reduces its 1/n slice of the chunk across every
   rank's copy, in place in its own copy, with pycoll's compiled kernels (an
   AVG divides in the same pass as its last sum);
3. (barrier) each rank copies every rank's reduced slice into its array,
   while it copies the chunk after into the other half (so a chunk costs two
   barriers).

The array itself is read once and written once; everything else happens in
the cache. The barriers are ``MPI_Ibarrier`` on a communicator of the
window's own, and each step is a stage of one Work (pycoll.work), so the
call is one collective: one sequence number, one DETAIL check, waits bounded
by the group's timeout, synchronous or async alike. Calls in flight on one
group use the window one after the other (an earlier one is finished before
the next starts), in issue order on every rank.

What is reduced is one array (:class:`Contiguous`), or a FusedAllReduce's
many arrays as if packed back to back (:class:`Scattered`): then step 1
copies each array's pieces straight into the window and step 3 copies each
array straight out of the ranks' slices, so no fusion buffer is packed or
unpacked (pycoll.fusion).

The same window carries the coalesced all-gathers (:class:`Gathered`: each
rank's arrays in, every rank's out, one barrier a chunk) and reduce-scatters,
of one array or a list (:class:`Block`, :class:`Blocks`): each rank copies a
chunk of every rank's part of its inputs in, reduces its own part across
every rank's copy in place, and copies it out, one barrier a chunk.

The window is made on a group's first eligible call, on every rank alike,
and only where every rank of the group shares one node; it is freed with the
group.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import _mpi, kernels, paths, progress, watch
from ..crosscheck import COUNT, OP_BITS
from ..groups import ProcessGroup
from ..kernels import threads
from ..ops import Plan
from ..paths import rule
from ..reduceop import ReduceOp
from ..work import Work
from ._common import run
from ._reduction import AllReduce, ReduceScatter, all_reduce_desc, aside, prescaler
from .ring import parts

__all__ = [
    "CHUNK",
    "Window",
    "window",
    "usable",
    "all_reduce",
    "Contiguous",
    "Scattered",
    "ShmAllReduce",
    "for_copies",
    "all_gather",
    "Gathered",
    "ShmAllGather",
    "for_scatter",
    "reduce_scatter",
    "Block",
    "Blocks",
    "ShmReduceScatter",
]

# Bytes of one rank's copy of a chunk: a multiple of 16, so chunks end on an
# element of any dtype. 2 MiB measured best of 0.25-4 MiB at 64 MiB on 2 ranks
# (each chunk costs two barriers and a few calls; smaller ones are dominated
# by those, larger ones fall out of the cache).
CHUNK = 2 << 20
# PYCOLL_SHM_BYTES: where set, the size from which an all_reduce takes the
# window (pycoll.paths.rule); 0 makes no window at all, so that no
# call of any kind goes through one (a node whose shared memory is short).
SHM_SET = rule.SHM_SET  # PYCOLL_SHM_BYTES (pycoll.paths.rule)
FREE_WAIT = 10.0  # seconds destroy_process_group waits for the others to free the window
_KEY = "shm.window"


class Window:
    """A group's shared window: for each rank two halves of CHUNK bytes, and
    a communicator for the barriers; ``crowded`` says whether its ranks
    outnumber the cores they may run on together (the same on every rank)."""

    def __init__(
        self, comm: Any, chunk: int, timeout: float, gone: Callable[[float], bool]
    ) -> None:
        MPI = _mpi.MPI
        self.chunk = chunk
        self.timeout = timeout
        self.gone = gone  # whether a peer gave up on the group (progress.peers_gave_up)
        self.comm = comm.Dup()  # the calls' barriers
        self.leaving = comm.Dup()  # free()'s: never confused with a call's left pending
        self.win = MPI.Win.Allocate_shared(2 * chunk, 1, comm=self.comm)
        n = self.comm.Get_size()
        self.halves: List[List[np.ndarray]] = [[], []]
        for r in range(n):
            buf, _ = self.win.Shared_query(r)
            seg = np.frombuffer(buf, np.uint8, 2 * chunk)
            self.halves[0].append(seg[:chunk])
            self.halves[1].append(seg[chunk:])
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch: Sync orders the stores
        # Whether the node's ranks outnumber the cores they may run on
        # together (ranks bound to a core each are not crowded): agreed here,
        # so that a choice made from it is the same on every rank.
        cpus = frozenset().union(*self.comm.allgather(threads.cpus()))
        self.crowded = n > len(cpus)
        self.work: Any = None  # the call in flight using it, if any
        self.freed = False

    def free(self) -> None:
        """Free the window, once every rank is freeing it too: MPI_Win_free
        waits for all of them, and a rank whose group timed out never comes.

        Two barriers, each waited for within FREE_WAIT (or the group's
        timeout, if shorter), or until a peer's progress record says its
        operation on the group timed out (such a rank frees nothing): the
        first says every rank has come, the second that every rank saw the
        first complete in time. A rank that gives up on the first enters no
        second, so a rank that came later than that (its first barrier
        complete at once) gives up on the second instead of going on to
        MPI_Win_free alone, where it would wait for good. A rank that gives
        up leaves the window to the end of the job (``freed`` stays False)."""
        for _ in range(2):
            request = self.leaving.Ibarrier()
            deadline = time.monotonic() + min(self.timeout, FREE_WAIT)
            if not progress.wait_unless(request, deadline, self.gone):
                progress.keep_alive([request])
                return
        self.win.Unlock_all()
        self.win.Free()
        self.comm.Free()
        self.leaving.Free()
        self.freed = True


def window(pg: Any, func: str) -> Optional[Window]:
    """The group's window, made on its first eligible call (every rank makes
    that call, the collective ``func``); None where the group's ranks do not
    all share one node, or PYCOLL_SHM_BYTES is 0.

    Making it takes MPI's blocking calls on the group's communicator, which
    would wait for good on a rank that never makes the call. So the ranks
    first meet at a nonblocking barrier, waited for within the group's
    timeout: a late rank is named (DistTimeoutError, the group broken, as any
    collective's timeout) instead of hanging the others."""
    if SHM_SET == 0:  # (PYCOLL_SHM_BYTES=0)
        return None
    made = pg.attached(_KEY)
    if made is None:
        MPI = _mpi.MPI
        if pg.is_broken():  # (its calls raise at once: so does this one)
            raise watch.broken(pg, func)
        watch.wait(pg, func, pg.sequence_number() + 1, [pg.comm.Ibarrier()])
        node = pg.comm.Split_type(MPI.COMM_TYPE_SHARED)
        one_node = node.Get_size() == pg.size()
        node.Free()
        ranks = pg.ranks
        others = [r for r in ranks if r != ranks[pg.rank()]]
        gone = progress.peers_gave_up(pg._board, others, pg._uid)
        made = Window(pg.comm, CHUNK, pg.timeout.total_seconds(), gone) if one_node else False
        pg.attach(_KEY, made, _free)
    return made or None


def _free(made: Any) -> None:
    if made:
        made.free()


def usable(pg: ProcessGroup, how: Plan, dtype: np.dtype, func: str) -> Optional[Window]:
    """The group's window, where an all_reduce large enough for it can go
    through it: more than one rank, pycoll's kernels reduce (an AVG's
    division in its last sum: real floats only), no aliased device buffers
    in flight on the group, and every rank on one node (see :func:`window`).
    None otherwise."""
    if how.average and not kernels.divides(dtype):
        return None
    return for_copies(pg, func)


def all_reduce(
    pg: ProcessGroup,
    win: Window,
    func: str,
    data: Any,
    dtype: np.dtype,
    op: ReduceOp,
    how: Plan,
    async_op: bool,
    result: Any,
    desc: Callable[[], str],
    prepare: Optional[Callable[[], None]],
    key: int,
) -> Optional[Work]:
    """``data`` (:class:`Contiguous` or :class:`Scattered`) all-reduced
    through ``win`` as the collective ``func``, by pycoll's pipeline
    (pycoll.collectives._common.run). One call at a time uses the window: an
    earlier async one is finished first, on every rank alike."""
    name = how.kernel_op(op)
    job = ShmAllReduce(win, data, dtype.itemsize, name, how.average, dtype)
    return _alone(pg, win, func, data.nbytes, job, async_op, result, desc, prepare, key)


def _alone(
    pg: ProcessGroup,
    win: Window,
    func: str,
    nbytes: int,
    job: Any,
    async_op: bool,
    result: Any,
    desc: Any,
    prepare: Optional[Callable[[], None]],
    key: int,
) -> Optional[Work]:
    """Run ``job`` (a pipeline's start and stages) on ``win`` as the
    collective ``func``, by pycoll.collectives._common.run, once the call
    before it on the window is finished: one call at a time uses the window,
    in issue order on every rank alike."""
    if win.work is not None:
        earlier, win.work = win.work, None
        earlier.wait()
    work = run(
        pg, func, nbytes, job.start, (), async_op, None, result, desc, prepare, job.stages, key,
        "window",
    )  # fmt: skip
    if async_op:
        win.work = work
    return work


class Contiguous:
    """What :class:`ShmAllReduce` reduces: one array's bytes (a uint8 view),
    copied into the window and back chunk by chunk."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.nbytes = len(data)

    def copy_in(self, k: int, lo: int, size: int, mine: np.ndarray) -> None:
        mine[:size] = self.data[lo : lo + size]

    def copy_out(self, k: int, lo: int, halves: List[np.ndarray], slices: List[slice]) -> None:
        for r, part in enumerate(slices):
            self.data[lo + part.start : lo + part.stop] = halves[r][part]


_Table = Tuple[np.ndarray, np.ndarray, np.ndarray]  # three int64 columns, one row a piece


def _pieces(
    offsets: np.ndarray, ends: np.ndarray, addresses: np.ndarray, a: int, b: int, base: int
) -> _Table:
    """Bytes [a, b) of arrays packed back to back (array i at bytes
    ``[offsets[i], ends[i])``, its own memory at ``addresses[i]``), where
    packed byte p lies at address ``base + p`` (in a window half): for each
    array they fall in, one piece, as (its address there, its address in the
    array, bytes)."""
    first = int(np.searchsorted(ends, a, "right"))
    last = int(np.searchsorted(offsets, b, "left"))
    starts = np.maximum(offsets[first:last], a)
    stops = np.minimum(ends[first:last], b)
    keep = stops > starts  # (empty arrays have no bytes to copy)
    starts, stops = starts[keep], stops[keep]
    inside = addresses[first:last][keep] + (starts - offsets[first:last][keep])
    return base + starts, inside, stops - starts


class _Packed:
    """Many arrays as if packed back to back, copied straight into a window
    half chunk by chunk: the copy-in :class:`Scattered` and :class:`Gathered`
    share. A chunk's copy is one compiled call over a table of (target,
    source, bytes) pieces; the tables depend only on the arrays' addresses
    and the window's, so they are made once per chunk and kept (the caller
    keeps one per window).

    Args:
        win: the window the tables point into.
        addresses, sizes, offsets: each array's address, byte count and
            offset in the packed order (int64 arrays).
        dtype, scale: a factor every copied-in element (of ``dtype``) is
            multiplied by in the window (a PREMUL_SUM), or None.
    """

    def __init__(
        self,
        win: Window,
        addresses: np.ndarray,
        sizes: np.ndarray,
        offsets: np.ndarray,
        dtype: Any = None,
        scale: Any = None,
    ) -> None:
        self.win, self.dtype, self.scale = win, dtype, scale
        self.addresses, self.offsets = addresses, offsets
        self.ends = offsets + sizes
        self.nbytes = int(self.ends[-1]) if len(sizes) else 0
        self._in: Dict[int, _Table] = {}  # chunk -> its copy-in table
        self._out: Dict[int, _Table] = {}  # chunk -> its copy-out table

    def _pieces(self, a: int, b: int, base: int, addresses: Optional[np.ndarray] = None) -> _Table:
        """:func:`_pieces` of these arrays, or of others laid out as they are
        (``addresses``: where each one's bytes go instead)."""
        into = self.addresses if addresses is None else addresses
        return _pieces(self.offsets, self.ends, into, a, b, base)

    def copy_in(self, k: int, lo: int, size: int, mine: np.ndarray) -> None:
        table = self._in.get(k)
        if table is None:
            table = self._in[k] = self._pieces(lo, lo + size, int(mine.ctypes.data) - lo)
        kernels.copy_pieces(*table, size)
        if self.scale is not None:
            part = mine[:size].view(self.dtype)
            kernels.scale(part, self.scale, out=part)


class Scattered(_Packed):
    """What :class:`ShmAllReduce` reduces: many arrays as if packed back to
    back (a FusedAllReduce's), copied straight into the window and straight
    out of every rank's reduced slice, with no fusion buffer between
    (``scale``: a PREMUL_SUM's factor, applied in the window, so the arrays
    are never written before the result)."""

    def copy_out(self, k: int, lo: int, halves: List[np.ndarray], slices: List[slice]) -> None:
        table = self._out.get(k)
        if table is None:
            pieces = [
                self._pieces(lo + part.start, lo + part.stop, int(halves[r].ctypes.data) - lo)
                for r, part in enumerate(slices)
            ]
            window, arrays, sizes = (np.concatenate(column) for column in zip(*pieces))
            table = self._out[k] = (arrays, window, sizes)
        targets, sources, sizes = table
        kernels.copy_pieces(targets, sources, sizes, slices[-1].stop)


class _Pipeline:
    """A call through ``win`` in chunks of ``data`` (its ``nbytes``), for
    pycoll.collectives._common.run: :meth:`start` copies the first chunk
    into this rank's half and starts the barrier after it; the subclass's
    :attr:`stages` do the rest, each ending on a barrier."""

    def __init__(self, win: Window, data: Any, step: int = 0) -> None:
        self.win, self.data = win, data
        self.n, self.me = win.comm.Get_size(), win.comm.Get_rank()
        step = step or win.chunk
        self.chunks = [(lo, min(step, data.nbytes - lo)) for lo in range(0, data.nbytes, step)]

    def start(self) -> Any:
        """Copy the first chunk in; start the barrier after it."""
        self._copy_in(0)
        return self._barrier()

    def _barrier(self) -> Any:
        self.win.win.Sync()  # this rank's stores, visible before the barrier ends
        return self.win.comm.Ibarrier()

    def _copy_in(self, k: int) -> None:
        lo, size = self.chunks[k]
        self.data.copy_in(k, lo, size, self.win.halves[k % 2][self.me])


class _Reducing(_Pipeline):
    """A pipeline whose ranks each reduce their part of every chunk in the
    window, by the pycoll.kernels op ``name`` (``average``: an AVG, divided
    by the group size in the last pass)."""

    def __init__(self, win: Window, data: Any, name: str, average: bool, step: int = 0) -> None:
        super().__init__(win, data, step)
        self.name, self.average = name, average

    def _reduce_mine(self, halves: List[np.ndarray], part: slice, dtype: Any) -> np.ndarray:
        """Reduce bytes ``part`` of this rank's half across every rank's half
        (elements of ``dtype``), in place in its own; those bytes."""
        dst = halves[self.me][part]
        others = [r for r in range(self.n) if r != self.me]
        if len(dst):
            for i, r in enumerate(others):
                divide = self.n if self.average and i == len(others) - 1 else None
                kernels.reduce(self.name, halves[r][part].view(dtype), dst.view(dtype), divide)
        return dst


class ShmAllReduce(_Reducing):
    """One all_reduce through ``win``: :meth:`start` and :attr:`stages`, for
    pycoll.collectives._common.run.

    Args:
        data: what is reduced in place: :class:`Contiguous` (one array) or
            :class:`Scattered` (many).
        itemsize: bytes per element (slices are cut on element boundaries).
        name: the reduction (a pycoll.kernels op name).
        average: divide the result by the group size (AVG).
    """

    def __init__(
        self, win: Window, data: Any, itemsize: int, name: str, average: bool, dtype: Any
    ) -> None:
        super().__init__(win, data, name, average)
        self.itemsize, self.dtype = itemsize, dtype
        self.stages: List[Callable[[], List[Any]]] = []
        for k in range(len(self.chunks)):
            self.stages.append(functools.partial(self._reduce, k))
            self.stages.append(functools.partial(self._gather, k))

    def _slices(self, k: int) -> List[slice]:
        count = self.chunks[k][1] // self.itemsize
        counts, starts = parts(count, self.n)
        item = self.itemsize
        return [slice(s * item, (s + c) * item) for s, c in zip(starts, counts)]

    def _reduce(self, k: int) -> List[Any]:
        """Reduce this rank's slice of chunk ``k`` across every rank's copy."""
        self.win.win.Sync()
        self._reduce_mine(self.win.halves[k % 2], self._slices(k)[self.me], self.dtype)
        return [self._barrier()]

    def _gather(self, k: int) -> List[Any]:
        """Copy every rank's reduced slice of chunk ``k`` out, and the next chunk in."""
        self.win.win.Sync()
        lo, _ = self.chunks[k]
        self.data.copy_out(k, lo, self.win.halves[k % 2], self._slices(k))
        if k + 1 < len(self.chunks):
            self._copy_in(k + 1)
        return [self._barrier()]


def for_copies(pg: ProcessGroup, func: str) -> Optional[Window]:
    """The group's window, where a call that only copies (an all-gather) can
    go through it: more than one rank, no aliased device buffers in flight on
    the group, every rank on one node (see :func:`window`). None otherwise."""
    if pg._size < 2 or pg._aliases:
        return None
    return window(pg, func)


def all_gather(
    pg: ProcessGroup,
    win: Window,
    func: str,
    data: Gathered,
    async_op: bool,
    result: Any,
    desc: Any,
    key: int,
) -> Optional[Work]:
    """Every rank's packed bytes (``data``: :class:`Gathered`) gathered
    through ``win`` as the collective ``func``, by pycoll's pipeline. One call
    at a time uses the window, as in :func:`all_reduce`."""
    job = ShmAllGather(win, data)
    return _alone(pg, win, func, job.n * data.nbytes, job, async_op, result, desc, None, key)


class Gathered(_Packed):
    """What :class:`ShmAllGather` gathers: this rank's arrays as if packed back
    to back, copied straight into its half of the window, and every rank's
    copied straight out to where the caller wants them (``targets``, an
    (n, K) int64 table: where rank r's array i goes), with no buffer
    between."""

    def __init__(
        self,
        win: Window,
        addresses: np.ndarray,
        sizes: np.ndarray,
        offsets: np.ndarray,
        targets: np.ndarray,
    ) -> None:
        super().__init__(win, addresses, sizes, offsets)
        self.targets = targets

    def copy_out(self, k: int, lo: int, size: int, halves: List[np.ndarray]) -> None:
        table = self._out.get(k)
        if table is None:
            pieces = [
                self._pieces(lo, lo + size, int(halves[r].ctypes.data) - lo, self.targets[r])
                for r in range(len(halves))
            ]
            window, arrays, sizes = (np.concatenate(column) for column in zip(*pieces))
            table = self._out[k] = (arrays, window, sizes)
        kernels.copy_pieces(*table, size * len(halves))


class ShmAllGather(_Pipeline):
    """One all-gather through ``win``: :meth:`start` and :attr:`stages`, for
    pycoll.collectives._common.run. Chunk by chunk, each rank copies its next
    chunk into its half of the window; once every rank has (a barrier), each
    copies every rank's chunk out, then its chunk after into the other half,
    and a barrier again, so a half is written only after every rank has read
    it: one barrier per chunk."""

    def __init__(self, win: Window, data: Gathered) -> None:
        super().__init__(win, data)
        self.stages: List[Callable[[], List[Any]]] = [
            functools.partial(self._out, k) for k in range(len(self.chunks))
        ]

    def _out(self, k: int) -> List[Any]:
        self.win.win.Sync()
        lo, size = self.chunks[k]
        self.data.copy_out(k, lo, size, self.win.halves[k % 2])
        if k + 1 < len(self.chunks):
            self._copy_in(k + 1)
        return [self._barrier()]


def for_scatter(pg: ProcessGroup, how: Plan, dtype: np.dtype, func: str) -> Optional[Window]:
    """The group's window, where a reduce-scatter (one array or a coalesced
    list) can go through it: as :func:`usable`, and a chunk of every rank's
    block (16 bytes at least) fits one rank's half. None otherwise."""
    win = usable(pg, how, dtype, func)
    return win if win is not None and win.chunk >= 16 * pg._size else None


def reduce_scatter(
    pg: ProcessGroup,
    win: Window,
    func: str,
    data: Any,
    op: ReduceOp,
    how: Plan,
    recv: Optional[np.ndarray],
    async_op: bool,
    result: Any,
    desc: Any,
    key: int,
    then: Optional[Callable[[], None]] = None,
) -> Optional[Work]:
    """A reduce-scatter of one array or many (``data``: :class:`Block` or
    :class:`Blocks`) through ``win`` as the collective ``func``, by pycoll's
    pipeline: this rank's part of every input, reduced, lands in the
    outputs ``data`` was made for, or back to back in ``recv``; ``then``
    runs once every input has been read and every result written (to copy
    results received aside into outputs that overlap the inputs). One call
    at a time uses the window, as in :func:`all_reduce`."""
    name = how.kernel_op(op)
    job = ShmReduceScatter(win, data, name, how.average, recv, then)
    return _alone(pg, win, func, job.n * data.nbytes, job, async_op, result, desc, None, key)


class _Parted:
    """What :class:`ShmReduceScatter` reduces, in general: inputs of n equal
    parts, seen as n blocks, block d the d-th part of every input back to
    back (pycoll.collectives.coalesced's packed layout, never built). Chunk
    k is bytes ``[lo, lo + size)`` of every block: each rank copies them
    from its inputs into its window half (block d's at ``d * size``),
    reduces block ``me`` there across every rank's half, and copies the
    result out. The subclasses say how the bytes are found.

    Args:
        win: the window the copies go through.
        nbytes: one block's bytes.
        dtype, scale: the inputs' dtype, and a factor every copied-in
            element is multiplied by in the window (a PREMUL_SUM), or None.
    """

    def __init__(self, win: Window, nbytes: int, dtype: Any, scale: Any) -> None:
        self.win, self.nbytes, self.dtype, self.scale = win, nbytes, dtype, scale
        self.n = win.comm.Get_size()
        # A chunk of every block fits one rank's half; a multiple of 16 bytes,
        # so a chunk ends on an element of any dtype.
        self.step = win.chunk // self.n // 16 * 16  # (for_scatter: 16 at least)

    def _scale(self, mine: np.ndarray, size: int) -> None:
        if self.scale is not None:
            block = mine[: self.n * size].view(self.dtype)
            kernels.scale(block, self.scale, out=block)


class Block(_Parted):
    """One array's reduce-scatter: ``parts`` (n arrays of the output's bytes,
    uint8 views: the input's parts, or reduce_scatter's list) are the
    blocks, copied in and out by numpy slices."""

    def __init__(
        self, win: Window, parts: List[np.ndarray], output: np.ndarray, dtype: Any, scale: Any
    ) -> None:
        super().__init__(win, len(output), dtype, scale)
        self.parts, self.output = parts, output

    def copy_in(self, k: int, lo: int, size: int, mine: np.ndarray) -> None:
        for d, part in enumerate(self.parts):
            mine[d * size : (d + 1) * size] = part[lo : lo + size]
        self._scale(mine, size)

    def copy_out(self, k: int, lo: int, reduced: np.ndarray, recv: Optional[np.ndarray]) -> None:
        target = self.output if recv is None else recv.reshape(-1).view(np.uint8)
        target[lo : lo + len(reduced)] = reduced


class Blocks(_Parted):
    """Many arrays' reduce-scatter (a coalesced one's), copied straight from
    the inputs into the window and straight out to the outputs: each chunk's
    copy is one compiled call over a table of (target, source, bytes)
    pieces, made once per chunk and kept.

    Args:
        addresses: each input's address (int64).
        parts, offsets: each input's part in bytes, and where it starts in a
            block (int64).
        places: each output's address (int64), or None where the results
            go back to back into the call's ``recv``.
    """

    def __init__(
        self,
        win: Window,
        addresses: np.ndarray,
        parts: np.ndarray,
        offsets: np.ndarray,
        dtype: Any,
        scale: Any,
        places: Optional[np.ndarray],
    ) -> None:
        ends = offsets + parts
        super().__init__(win, int(ends[-1]) if len(parts) else 0, dtype, scale)
        self.places = places
        self.addresses, self.parts, self.offsets, self.ends = addresses, parts, offsets, ends
        self._in: Dict[int, _Table] = {}
        self._out: Dict[int, _Table] = {}

    def copy_in(self, k: int, lo: int, size: int, mine: np.ndarray) -> None:
        table = self._in.get(k)
        if table is None:
            at = int(mine.ctypes.data) - lo
            moved = self.addresses + self.parts * np.arange(self.n)[:, None]  # block d's
            pieces = [
                _pieces(self.offsets, self.ends, moved[d], lo, lo + size, at + d * size)
                for d in range(self.n)
            ]
            window, arrays, sizes = (np.concatenate(column) for column in zip(*pieces))
            table = self._in[k] = (window, arrays, sizes)
        kernels.copy_pieces(*table, self.n * size)
        self._scale(mine, size)

    def copy_out(self, k: int, lo: int, reduced: np.ndarray, recv: Optional[np.ndarray]) -> None:
        """This rank's reduced bytes ``[lo, lo + len(reduced))`` of its block,
        to the outputs (or ``recv``)."""
        if recv is not None:
            recv.reshape(-1).view(np.uint8)[lo : lo + len(reduced)] = reduced
            return
        table = self._out.get(k)
        if table is None:
            assert self.places is not None
            window, arrays, sizes = _pieces(
                self.offsets, self.ends, self.places, lo, lo + len(reduced),
                int(reduced.ctypes.data) - lo,
            )  # fmt: skip
            table = self._out[k] = (arrays, window, sizes)
        kernels.copy_pieces(*table, len(reduced))


class ShmReduceScatter(_Reducing):
    """One reduce-scatter (of one array or a list) through ``win``: :meth:`start` and
    :attr:`stages`, for pycoll.collectives._common.run. Chunk by chunk, each
    rank copies the chunk of every block into its half of the window; once
    every rank has (a barrier), each reduces its own block's chunk across
    every rank's half, in place in its own, copies it out, then copies its
    next chunk into the other half, and a barrier again, so a half is
    written only after every rank has read it: one barrier per chunk.

    Args:
        name: the reduction (a pycoll.kernels op name).
        average: divide the result by the group size (AVG).
        recv: where the results go back to back, or None (the outputs
            ``data`` was made for).
        then: run at the end of the last chunk, or None.
    """

    def __init__(
        self,
        win: Window,
        data: Any,
        name: str,
        average: bool,
        recv: Optional[np.ndarray],
        then: Optional[Callable[[], None]] = None,
    ) -> None:
        super().__init__(win, data, name, average, data.step)
        self.recv, self.then = recv, then
        self.stages: List[Callable[[], List[Any]]] = [
            functools.partial(self._reduce, k) for k in range(len(self.chunks))
        ]

    def _reduce(self, k: int) -> List[Any]:
        self.win.win.Sync()
        lo, size = self.chunks[k]
        mine = slice(self.me * size, (self.me + 1) * size)
        dst = self._reduce_mine(self.win.halves[k % 2], mine, self.data.dtype)
        self.data.copy_out(k, lo, dst, self.recv)
        if k + 1 < len(self.chunks):
            self._copy_in(k + 1)
        elif self.then is not None:
            self.then()
        return [self._barrier()]


def start_all_reduce(pg: ProcessGroup, job: AllReduce) -> Optional[Work]:
    """all_reduce of one array through the node's shared window."""
    tensor, op, how, async_op, key, win = job
    return all_reduce(
        pg,
        win,
        "all_reduce",
        Contiguous(tensor.reshape(-1).view(np.uint8)),
        tensor.dtype,
        op,
        how,
        async_op,
        [tensor],
        all_reduce_desc(op, tensor),
        prescaler(tensor, how.prescale),
        key,
    )


def start_reduce_scatter(pg: ProcessGroup, job: ReduceScatter) -> Optional[Work]:
    """``parts`` (one array shaped like ``output`` per rank: the parts of
    reduce_scatter_tensor's input, or reduce_scatter's list) reduce-scattered
    into ``output`` through ``win`` (:class:`pycoll.collectives.shm.Block`).
    The output is written chunk by chunk: where it is this rank's part
    itself (torch's in-place form) it is taken as it is, since only the
    chunk being written reads those bytes; an output that overlaps the
    parts otherwise receives aside and is copied in at the end."""
    func, output, parts, op, how, async_op, desc, win = job
    _, into, then = aside(pg, output, parts)
    flat = lambda x: x.reshape(-1).view(np.uint8)  # noqa: E731
    data = Block(win, [flat(part) for part in parts], flat(output), output.dtype, how.prescale)
    key = how.key | OP_BITS[func] | output.size & COUNT
    return reduce_scatter(pg, win, func, data, op, how, into, async_op, [output], desc, key, then)


def _all_reduce_window(pg: Any, c: paths.Call) -> Optional[Window]:
    return usable(pg, c.how, c.dtype, c.func)


def _scatter_window(pg: Any, c: paths.Call) -> Optional[Window]:
    return for_scatter(pg, c.how, c.dtype, c.func)


ALL_REDUCE_PATH = paths.register(paths.Path(
    "window", ("all_reduce",), paths.window_carries, start_all_reduce, _all_reduce_window,
    "through the node's shared memory, each rank a part",
))  # fmt: skip
SCATTER_PATH = paths.register(paths.Path(
    "window", ("reduce_scatter", "reduce_scatter_tensor"), paths.window_carries,
    start_reduce_scatter, _scatter_window, "through the node's shared memory",
))  # fmt: skip
