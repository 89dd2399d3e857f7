"""Object collectives: picklable Python objects of any size, 2 GiB and over included.

Each object is pickled, the sizes are exchanged, then the bytes. Payloads
past MPI's 2**31-1 count limit travel as whole 1 MiB blocks (a contiguous MPI
datatype) plus the remaining bytes, which works on MPIs without MPI-4
large-count calls and needs no padded copy. A rank whose
object cannot be pickled still takes part in the size exchange (with size
-1), so every rank raises instead of the others waiting for it.
"""

from __future__ import annotations

import pickle
from typing import Any, List, Optional, Tuple, cast

import numpy as np

from .. import _mpi, crosscheck, watch
from ..arrays import check_list
from ..groups import ProcessGroup, resolve
from ._common import RESERVED_TAG, group_rank, sequenced
from .p2p import _p2p, _peer, _source

_CHUNK = 1 << 20
_INT_MAX = (1 << 31) - 1
_chunk_type: Any = None


def _parts(buf: np.ndarray, nbytes: int) -> List[list]:
    """Buffer specs that together cover ``buf[:nbytes]``, none with a count past
    MPI's int limit: whole 1 MiB blocks, then the remaining bytes. Sender and
    receiver derive the same parts from ``nbytes``."""
    global _chunk_type
    MPI = _mpi.MPI
    if nbytes <= _INT_MAX:
        return [[buf, nbytes, MPI.BYTE]]
    if _chunk_type is None:
        _chunk_type = MPI.BYTE.Create_contiguous(_CHUNK).Commit()
    whole = nbytes // _CHUNK
    parts = [[buf, whole, _chunk_type]]
    if nbytes > whole * _CHUNK:
        parts.append([buf[whole * _CHUNK :], nbytes - whole * _CHUNK, MPI.BYTE])
    return parts


def _transfer(
    pg: ProcessGroup,
    op: str,
    seq: Optional[int],
    start: Any,
    buf: np.ndarray,
    nbytes: int,
    *args: Any,
) -> None:
    """``start(spec, *args)`` (Ibcast, Isend or Irecv) for each part of the
    payload, each waited for within the group's timeout."""
    for spec in _parts(buf, nbytes):
        watch.call(pg, op, seq, start, spec, *args)


def _pack(obj: Any) -> Tuple[np.ndarray, Optional[BaseException]]:
    """Pickle ``obj`` into a send buffer, or return the error."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # handed back so the caller can tell the other ranks
        return np.empty(0, np.uint8), exc
    return np.frombuffer(data, np.uint8), None


def _unpack(buf: np.ndarray, nbytes: int) -> Any:
    return pickle.loads(buf.data[:nbytes])


def _pickle_error(func: str, who: List[int], exc: Optional[BaseException]) -> TypeError:
    if exc is not None:
        return TypeError(f"{func}: the object could not be pickled: {exc}")
    return TypeError(
        f"{func}: the object on rank(s) {who} could not be pickled (see the "
        f"error there); nothing was exchanged"
    )


_REFUSED = -2  # a size that says: the root refused its output list


def _sizes(
    pg: ProcessGroup,
    func: str,
    payload: np.ndarray,
    exc: Optional[BaseException],
    refused: Optional[Exception] = None,
) -> np.ndarray:
    """Every rank's payload size, on every rank; raise everywhere if one failed
    to pickle, or if the root ``refused`` its output list (only it can check
    that: it still takes part, so every rank raises and the group stays in step)."""
    MPI = _mpi.MPI
    sizes = np.empty(pg.size(), np.int64)
    size = _REFUSED if refused is not None else -1 if exc is not None else payload.size
    mine = np.array([size], np.int64)
    watch.call(
        pg,
        func,
        pg.sequence_number(),
        pg.comm.Iallgather,
        [mine, MPI.INT64_T],
        [sizes, MPI.INT64_T],
    )
    if refused is not None:
        raise refused
    if (sizes == _REFUSED).any():
        who = pg.ranks[int(np.flatnonzero(sizes == _REFUSED)[0])]
        raise ValueError(
            f"{func}: the root (rank {who}) refused its output list (see the error raised "
            f"there), so nothing was exchanged"
        )
    if (sizes < 0).any():
        raise _pickle_error(func, [pg.ranks[i] for i in np.flatnonzero(sizes < 0)], exc)
    return sizes


def _displs(sizes: np.ndarray) -> List[int]:
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64).tolist()


def all_gather_object(
    object_list: List[Any], obj: Any, group: Optional[ProcessGroup] = None
) -> None:
    """Gather a picklable object from every rank into ``object_list`` on every rank.

    Args:
        object_list: a list with one slot per rank of the group; slot i is
            set to group rank i's object.
        obj: this rank's object.

    Example (2 ranks)::

        >>> out = [None, None]
        >>> pycoll.all_gather_object(out, {"rank": rank})
        >>> out                      # both ranks: [{'rank': 0}, {'rank': 1}]
    """
    func = "all_gather_object"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg.size()
    _check_slots(func, "object_list", object_list, n)
    MPI = _mpi.MPI
    payload, exc = _pack(obj)
    comm = pg.comm
    with sequenced(pg, func, "all_gather_object()") as seq:
        sizes = _sizes(pg, func, payload, exc)
        total = int(sizes.sum())
        if total <= _INT_MAX:
            recv = np.empty(total, np.uint8)
            displs = _displs(sizes)
            rspec = [recv, (sizes.tolist(), displs), MPI.BYTE]
            watch.call(pg, func, seq, comm.Iallgatherv, [payload, MPI.BYTE], rspec)
            for i in range(n):
                object_list[i] = _unpack(recv[displs[i] :], int(sizes[i]))
        else:
            for i in range(n):
                size = int(sizes[i])
                buf = payload if i == pg.rank() else np.empty(size, np.uint8)
                _transfer(pg, func, seq, comm.Ibcast, buf, size, i)
                object_list[i] = _unpack(buf, size)


def _check_slots(func: str, name: str, x: Any, n: Optional[int]) -> None:
    if not isinstance(x, list):
        raise TypeError(
            f"{func}: {name} must be a list (it is filled in place), got {type(x).__name__}"
        )
    check_list(func, name, x, n)


def gather_object(
    obj: Any,
    object_gather_list: Optional[List[Any]] = None,
    dst: int = 0,
    group: Optional[ProcessGroup] = None,
) -> None:
    """Gather a picklable object from every rank into ``object_gather_list`` on ``dst``.

    Args:
        obj: this rank's object.
        object_gather_list: on ``dst``, a list with one slot per rank of the
            group; None on every other rank.
        dst: global rank that receives.
    """
    func = "gather_object"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg.size()
    root = group_rank(pg, dst, "dst", func)
    is_root = root == pg.rank()
    refused: Optional[Exception] = None
    if is_root:
        try:
            _check_slots(func, "object_gather_list", object_gather_list, n)
        except (TypeError, ValueError) as error:
            refused = error  # raised on every rank by _sizes, dst's own error on dst
    elif object_gather_list is not None:
        raise ValueError(
            f"{func}: object_gather_list must be None on ranks other than dst "
            f"({dst}); only dst receives"
        )
    MPI = _mpi.MPI
    comm = pg.comm
    payload, exc = _pack(obj)
    key = crosscheck.key(func, root=root)
    with sequenced(pg, func, f"gather_object(dst={dst})", key) as seq:
        sizes = _sizes(pg, func, payload, exc, refused)
        total = int(sizes.sum())
        if not is_root:
            if total <= _INT_MAX:
                watch.call(pg, func, seq, comm.Igatherv, [payload, MPI.BYTE], None, root)
            else:
                _transfer(pg, func, seq, comm.Isend, payload, payload.size, root, RESERVED_TAG)
            return None
        slots = cast(List[Any], object_gather_list)  # checked above, on dst
        if total <= _INT_MAX:
            recv = np.empty(total, np.uint8)
            displs = _displs(sizes)
            rspec = [recv, (sizes.tolist(), displs), MPI.BYTE]
            watch.call(pg, func, seq, comm.Igatherv, [payload, MPI.BYTE], rspec, root)
            for i in range(n):
                slots[i] = _unpack(recv[displs[i] :], int(sizes[i]))
        else:
            for i in range(n):
                size = int(sizes[i])
                buf = payload if i == root else np.empty(size, np.uint8)
                if i != root:
                    _transfer(pg, func, seq, comm.Irecv, buf, size, i, RESERVED_TAG)
                slots[i] = _unpack(buf, size)


def broadcast_object_list(
    object_list: List[Any], src: int = 0, group: Optional[ProcessGroup] = None, device: Any = None
) -> None:
    """Replace the entries of ``object_list`` on every rank with those on ``src``.

    Args:
        object_list: on ``src``, the objects to send; elsewhere, a list of
            the same length whose entries are overwritten.
        src: global rank that sends.
        device: accepted for torch.distributed compatibility; unused.
    """
    func = "broadcast_object_list"
    if (pg := resolve(group, func)) is None:
        return None
    root = group_rank(pg, src, "src", func)
    _check_slots(func, "object_list", object_list, None)
    MPI = _mpi.MPI
    comm = pg.comm
    is_root = root == pg.rank()
    payload, exc = _pack(list(object_list)) if is_root else (np.empty(0, np.uint8), None)
    desc = f"broadcast_object_list(src={src}, {len(object_list)} objects)"
    key = crosscheck.key(func, root=root)  # a length that differs from src's raises below
    with sequenced(pg, func, desc, key) as seq:
        size = np.array([-1 if exc is not None else payload.size], np.int64)
        watch.call(pg, func, seq, comm.Ibcast, [size, MPI.INT64_T], root)
        nbytes = int(size[0])
        if nbytes < 0:
            raise _pickle_error(func, [src], exc)
        buf = payload if is_root else np.empty(nbytes, np.uint8)
        _transfer(pg, func, seq, comm.Ibcast, buf, nbytes, root)
    if not is_root:
        objs = _unpack(buf, nbytes)
        if len(objs) != len(object_list):
            raise ValueError(
                f"{func}: object_list has {len(object_list)} entries on this "
                f"rank but {len(objs)} on src ({src}); make them the same length"
            )
        object_list[:] = objs


def scatter_object_list(
    scatter_object_output_list: List[Any],
    scatter_object_input_list: Optional[List[Any]] = None,
    src: int = 0,
    group: Optional[ProcessGroup] = None,
) -> None:
    """Send ``scatter_object_input_list[i]`` from ``src`` to group rank i.

    Args:
        scatter_object_output_list: a non-empty list; its first entry is set
            to the object this rank receives.
        scatter_object_input_list: on ``src``, one object per rank of the
            group; ignored elsewhere.
        src: global rank that sends.
    """
    func = "scatter_object_list"
    if (pg := resolve(group, func)) is None:
        return None
    n = pg.size()
    root = group_rank(pg, src, "src", func)
    out = scatter_object_output_list
    _check_slots(func, "scatter_object_output_list", out, None)
    if not out:
        raise ValueError(
            f"{func}: scatter_object_output_list must have at least one entry to receive into"
        )
    is_root = root == pg.rank()
    MPI = _mpi.MPI
    comm = pg.comm
    exc = None
    refused: Optional[Exception] = None
    payloads: List[np.ndarray] = []
    if is_root:
        try:
            inputs = check_list(func, "scatter_object_input_list", scatter_object_input_list, n)
        except (TypeError, ValueError) as error:
            refused = error  # src still takes part: every rank raises (below)
            sizes = np.full(n, _REFUSED, np.int64)
        else:
            packed = [_pack(o) for o in inputs]
            exc = next((e for _, e in packed if e is not None), None)
            payloads = [p for p, _ in packed]
            sizes = np.array([-1 if exc else p.size for p in payloads], np.int64)
    else:
        sizes = np.empty(n, np.int64)
    key = crosscheck.key(func, root=root)
    with sequenced(pg, func, f"scatter_object_list(src={src})", key) as seq:
        watch.call(pg, func, seq, comm.Ibcast, [sizes, MPI.INT64_T], root)
        if refused is not None:
            raise refused
        if (sizes == _REFUSED).any():
            raise ValueError(
                f"{func}: src (rank {src}) refused its scatter_object_input_list (see the "
                f"error raised there), so nothing was exchanged"
            )
        if (sizes < 0).any():
            raise _pickle_error(func, [src], exc)
        total = int(sizes.sum())
        mine = int(sizes[pg.rank()])
        if total <= _INT_MAX:
            send = None
            if is_root:
                send = [
                    np.concatenate(payloads) if payloads else np.empty(0, np.uint8),
                    (sizes.tolist(), _displs(sizes)),
                    MPI.BYTE,
                ]
            buf = np.empty(mine, np.uint8)
            watch.call(pg, func, seq, comm.Iscatterv, send, [buf, MPI.BYTE], root)
        elif is_root:
            for i in range(n):
                if i != root:
                    size = int(sizes[i])
                    _transfer(pg, func, seq, comm.Isend, payloads[i], size, i, RESERVED_TAG)
            buf = payloads[root]
        else:
            buf = np.empty(mine, np.uint8)
            _transfer(pg, func, seq, comm.Irecv, buf, mine, root, RESERVED_TAG)
    out[0] = _unpack(buf, mine)


def send_object_list(
    object_list: List[Any],
    dst: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    device: Any = None,
) -> None:
    """Send the picklable objects of ``object_list`` to global rank ``dst``.

    Not a collective: only ``dst`` must call :func:`recv_object_list`.
    """
    func = "send_object_list"
    if (pg := resolve(group, func)) is None:
        return None
    if dst is None:
        raise ValueError(f"{func}: dst is required (the global rank to send to)")
    peer = _peer(pg, dst, "dst", func)
    _check_slots(func, "object_list", object_list, None)
    payload, exc = _pack(list(object_list))
    if exc is not None:
        raise _pickle_error(func, [], exc)
    MPI = _mpi.MPI
    size = np.array([payload.size], np.int64)
    _p2p(pg, func, pg.comm.Isend, [size, MPI.INT64_T], peer, peer, RESERVED_TAG)
    for spec in _parts(payload, payload.size):
        _p2p(pg, func, pg.comm.Isend, spec, peer, peer, RESERVED_TAG)


def recv_object_list(
    object_list: List[Any],
    src: Optional[int] = None,
    group: Optional[ProcessGroup] = None,
    device: Any = None,
) -> int:
    """Receive objects sent by :func:`send_object_list` into ``object_list``.

    Args:
        object_list: a list as long as the sender's; its entries are replaced.
        src: global rank to receive from (any rank if None).

    Returns:
        The sender's global rank (-1 on a rank outside ``group``).
    """
    func = "recv_object_list"
    pg = resolve(group, func)
    if pg is None:
        return -1
    source = _source(pg, src, func)
    _check_slots(func, "object_list", object_list, None)
    MPI = _mpi.MPI
    size = np.empty(1, np.int64)
    status = MPI.Status()
    peer = None if source == MPI.ANY_SOURCE else source
    _p2p(pg, func, pg.comm.Irecv, [size, MPI.INT64_T], peer, source, RESERVED_TAG, status)
    sender = status.Get_source()
    nbytes = int(size[0])
    buf = np.empty(nbytes, np.uint8)
    for spec in _parts(buf, nbytes):
        _p2p(pg, func, pg.comm.Irecv, spec, sender, sender, RESERVED_TAG)
    objs = _unpack(buf, nbytes)
    if len(objs) != len(object_list):
        raise ValueError(
            f"{func}: object_list has {len(object_list)} entries but rank "
            f"{pg.ranks[sender]} sent {len(objs)}; make them the same length"
        )
    object_list[:] = objs
    return pg.ranks[sender]
