"""MPI's nonblocking collectives started and tested from compiled code.

pycoll's synchronous fast path (pycoll.native) hands one call
here: publish the operation on this rank's progress record, start MPI's
nonblocking collective (or a persistent plan's request, its input copied in
first), and test it up to a number of times, with no Python between the
steps. mpi4py would turn each buffer argument into a message
spec, make a Request object and go back to Python between tests; at 8 bytes
that costs more than MPI's own call (docs/benchmarks.md, "The fixed cost of
a small call").

The C functions are those of the libmpi that mpi4py loaded (pycoll._mpi.library),
bound by name with ``llvmlite.binding.add_symbol``, so the compiled code holds
no addresses and numba's disk cache serves every process. Handles are the one
vendor difference: an ``int`` in MPICH and its derivatives, a pointer in Open
MPI and the standard ABI. Each function is bound twice under pycoll's own
names, once per handle width, and each call picks at run time by the
state's ``WIDE`` word (``_call``): the same compiled code serves both kinds of MPI, and a
cache written under one is right under the other. Buffers and pointers are
passed as 64-bit integers, as the C calling conventions of the 64-bit
platforms pycoll runs on pass a pointer.

A two-rank call that pycoll.collectives.pair makes as one exchange is
started here too: ``MPI_Isendrecv`` over the group's side communicator,
tagged with the call's sequence number, then, once done,
``MPI_Reduce_local`` folds the peer's copy in before the call's copy back.

numba is imported with this module, which pycoll imports on first use of the
compiled path.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict

import llvmlite.binding as llvm
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from .. import _mpi
from .._mpi import TAGS  # (a PAIR call's tag: its seq % TAGS, as ring.side's)
from ..progress import LAST, WORDS
from .pack import memcpy
from .words import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    ALL_TO_ALL_V,
    BROADCAST,
    CALL_WORDS,
    COPY_BYTES,
    COPY_FROM,
    COPY_TO,
    COUNT,
    COUNTS,
    DATATYPE,
    FOLD_IN,
    FOLD_INOUT,
    GATHER,
    IN_BYTES,
    IN_FROM,
    IN_ROWS,
    IN_SKIP,
    IN_SKIP_BYTES,
    IN_TABLE,
    IN_TO,
    OP,
    OUT_ROWS,
    OUT_TABLE,
    PAIR,
    PLAN,
    RECV,
    REDUCE,
    REDUCE_SCATTER,
    REDUCE_SCATTER_V,
    REFUSED,
    ROOT,
    SCATTER,
    SEND,
    SOURCE,
    START,
    STATE,
    STATUS_AT,
    WHAT,
)

__all__ = ["start", "block", "finish", "bind", "STATE_WORDS"]

# A group's state words (an int64 array, one per group: its calls' scratch;
# each of its calls' words holds its address, at words.STATE).
WIDE = 0  # 1 where MPI's handles are 64 bits wide
COMM = 1  # the group's communicator
RECORD = 2  # the address of this rank's progress record (pycoll.progress.WORDS words)
SPINS = 3  # tests before start gives the wait back to Python
REQUEST = 4  # the request of a call whose tests ran out
FLAG = 5  # MPI_Test's flag
STATUS = 6  # MPI_Test's status (up to 10 words: larger than any MPI's MPI_Status)
SIDE = 16  # the group's side communicator (a PAIR call's messages)
TAG = 17  # the tag of the call under way (a PAIR call's: from its sequence number)
STATE_WORDS = 18


# The C functions, as (name, parameters): "p" a pointer, "i" an int, "h" a
# handle. The nonblocking calls and MPI_Test, then the blocking calls that
# PYCOLL_WAIT=blocking makes (no barrier: there it takes the checked path).
_FUNCTIONS = {
    "MPI_Iallreduce": "ppihhhp",
    "MPI_Ibcast": "pihihp",
    "MPI_Ireduce": "ppihhihp",
    "MPI_Iallgather": "pihpihhp",
    "MPI_Ireduce_scatter_block": "ppihhhp",
    "MPI_Ireduce_scatter": "ppphhhp",
    "MPI_Ialltoall": "pihpihhp",
    "MPI_Ialltoallv": "ppphppphhp",
    "MPI_Igather": "pihpihihp",
    "MPI_Iscatter": "pihpihihp",
    "MPI_Ibarrier": "hp",
    "MPI_Isendrecv": "pihiipihiihp",
    "MPI_Reduce_local": "ppihh",
    "MPI_Test": "ppp",
    "MPI_Start": "p",
    "MPI_Wait": "pp",
    "MPI_Allreduce": "ppihhh",
    "MPI_Bcast": "pihih",
    "MPI_Reduce": "ppihhih",
    "MPI_Allgather": "pihpihh",
    "MPI_Reduce_scatter_block": "ppihhh",
    "MPI_Reduce_scatter": "ppphhh",
    "MPI_Alltoall": "pihpihh",
    "MPI_Alltoallv": "ppphppphh",
    "MPI_Gather": "pihpihih",
    "MPI_Scatter": "pihpihih",
}


def _external(name: str, wide: bool) -> Any:
    """``name`` under pycoll's own symbol for one handle width."""
    params = {"p": types.int64, "i": types.int32, "h": types.int64 if wide else types.int32}
    alias = f"pycoll_{'wide' if wide else 'narrow'}_{name}"
    sig = types.int32(*[params[c] for c in _FUNCTIONS[name]])
    return types.ExternalFunction(alias, sig)


# Functions an older MPI may lack (MPI_Isendrecv came with MPI-4.0): where it
# does, their symbols point at a stub that returns MPI_ERR_OTHER, so that the
# compiled code still links; pycoll.collectives.pair, their only caller, is
# never taken there (pycoll._mpi.has).
_OPTIONAL = ("MPI_Isendrecv",)
_STUBS: Dict[str, Any] = {}


def _stub(name: str) -> Any:
    """The address of a C-callable function of ``name``'s parameters that
    returns MPI_ERR_OTHER."""
    if name not in _STUBS:
        ctype = {"p": ctypes.c_int64, "i": ctypes.c_int32, "h": ctypes.c_int64}
        proto = ctypes.CFUNCTYPE(ctypes.c_int, *[ctype[c] for c in _FUNCTIONS[name]])
        error = int(_mpi.MPI.ERR_OTHER)
        _STUBS[name] = proto(lambda *args: error)
    return ctypes.cast(_STUBS[name], ctypes.c_void_p).value


def bind() -> None:
    """Point pycoll's symbols at the libmpi mpi4py loaded (before the first
    call of :func:`start` in this process, compiled or loaded from cache)."""
    lib = _mpi.library()
    for name in _FUNCTIONS:
        address: Any
        if name in _OPTIONAL and not _mpi.has(name):
            address = _stub(name)
        else:
            address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        for wide in (False, True):
            llvm.add_symbol(f"pycoll_{'wide' if wide else 'narrow'}_{name}", address)


_N: Dict[str, Any] = {name: _external(name, False) for name in _FUNCTIONS}
_W: Dict[str, Any] = {name: _external(name, True) for name in _FUNCTIONS}
n_iallreduce, w_iallreduce = _N["MPI_Iallreduce"], _W["MPI_Iallreduce"]
n_ibcast, w_ibcast = _N["MPI_Ibcast"], _W["MPI_Ibcast"]
n_ireduce, w_ireduce = _N["MPI_Ireduce"], _W["MPI_Ireduce"]
n_iallgather, w_iallgather = _N["MPI_Iallgather"], _W["MPI_Iallgather"]
n_ireduce_scatter, w_ireduce_scatter = (
    _N["MPI_Ireduce_scatter_block"],
    _W["MPI_Ireduce_scatter_block"],
)
n_ireduce_scatter_v, w_ireduce_scatter_v = _N["MPI_Ireduce_scatter"], _W["MPI_Ireduce_scatter"]
n_ialltoall, w_ialltoall = _N["MPI_Ialltoall"], _W["MPI_Ialltoall"]
n_ialltoallv, w_ialltoallv = _N["MPI_Ialltoallv"], _W["MPI_Ialltoallv"]
n_igather, w_igather = _N["MPI_Igather"], _W["MPI_Igather"]
n_iscatter, w_iscatter = _N["MPI_Iscatter"], _W["MPI_Iscatter"]
n_ibarrier, w_ibarrier = _N["MPI_Ibarrier"], _W["MPI_Ibarrier"]
n_isendrecv, w_isendrecv = _N["MPI_Isendrecv"], _W["MPI_Isendrecv"]
n_reduce_local, w_reduce_local = _N["MPI_Reduce_local"], _W["MPI_Reduce_local"]
mpi_test = _N["MPI_Test"]  # (no handle among its parameters: one width serves)
mpi_start, mpi_wait = _N["MPI_Start"], _N["MPI_Wait"]
n_allreduce, w_allreduce = _N["MPI_Allreduce"], _W["MPI_Allreduce"]
n_bcast, w_bcast = _N["MPI_Bcast"], _W["MPI_Bcast"]
n_reduce, w_reduce = _N["MPI_Reduce"], _W["MPI_Reduce"]
n_allgather, w_allgather = _N["MPI_Allgather"], _W["MPI_Allgather"]
n_reduce_scatter, w_reduce_scatter = _N["MPI_Reduce_scatter_block"], _W["MPI_Reduce_scatter_block"]
n_reduce_scatter_v, w_reduce_scatter_v = _N["MPI_Reduce_scatter"], _W["MPI_Reduce_scatter"]
n_alltoall, w_alltoall = _N["MPI_Alltoall"], _W["MPI_Alltoall"]
n_alltoallv, w_alltoallv = _N["MPI_Alltoallv"], _W["MPI_Alltoallv"]
n_gather, w_gather = _N["MPI_Gather"], _W["MPI_Gather"]
n_scatter, w_scatter = _N["MPI_Scatter"], _W["MPI_Scatter"]


@intrinsic
def _words(typingctx: Any, address: Any) -> Any:
    """The int64 words at ``address``, as a pointer numba can index."""
    sig = types.CPointer(types.int64)(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())

    return sig, codegen


@njit(cache=True)
def _rows(table, rows):
    """The copies of a table of ``rows`` (to, from, bytes) rows at ``table``."""
    if rows:
        copies = carray(_words(table), (3 * rows,))
        for i in range(0, 3 * rows, 3):
            memcpy(copies[i], copies[i + 1], copies[i + 2])


@njit(cache=True)
def _fold(call):
    """A PAIR call's fold once done (MPI_Reduce_local, at the handle width of
    its group's state): 0, or MPI's error code."""
    st = carray(_words(call[STATE]), (STATE_WORDS,))
    a, b, count = call[FOLD_IN], call[FOLD_INOUT], call[COUNT]
    if st[WIDE]:
        return w_reduce_local(a, b, count, call[DATATYPE], call[OP])
    return n_reduce_local(a, b, count, call[DATATYPE], call[OP])


@njit(cache=True)
def _copy(call):
    """The copies a call makes once done (its words COPY_TO to COPY_BYTES,
    and OUT_TABLE's rows), if any, unless its status word (STATUS_AT, where
    it has one) is not 0: then REFUSED, else 0; a PAIR call's fold first
    (MPI's error code where it fails)."""
    if call[WHAT] == PAIR and call[OP]:
        err = _fold(call)
        if err:
            return err
    status = call[STATUS_AT]
    if status and carray(_words(status), (1,))[0]:
        return REFUSED
    if call[COPY_BYTES]:
        memcpy(call[COPY_TO], call[COPY_FROM], call[COPY_BYTES])
    _rows(call[OUT_TABLE], call[OUT_ROWS])
    return 0


@njit(cache=True)
def _copy_in(call):
    """The copies a call makes before it starts (its words IN_TO to IN_BYTES,
    less the part IN_SKIP and IN_SKIP_BYTES leave out, and IN_TABLE's rows),
    if any."""
    nbytes = call[IN_BYTES]
    if nbytes:
        to, source, skip = call[IN_TO], call[IN_FROM], call[IN_SKIP_BYTES]
        if skip:
            at = call[IN_SKIP]
            memcpy(to, source, at)
            at += skip
            memcpy(to + at, source + at, nbytes - at)
        else:
            memcpy(to, source, nbytes)
    _rows(call[IN_TABLE], call[IN_ROWS])


@njit(cache=True)
def _open(address, busy, word):
    """The call's words at ``address``, its group state's address and words,
    and the progress record, with ``busy`` published at ``word`` and the
    call's input copied in (if it copies one)."""
    call = carray(_words(address), (CALL_WORDS,))
    p = call[STATE]
    st = carray(_words(p), (STATE_WORDS,))
    record = carray(_words(st[RECORD]), (WORDS,))
    record[word] = busy
    record[LAST] = word
    _copy_in(call)
    return call, p, st, record


@njit(cache=True)
def _close(call, record, word, busy):
    """A call done: its copy made, its busy bit cleared (unless the word
    moved on); 0, or REFUSED where its status word refused the copy."""
    code = _copy(call)
    if record[word] == busy:
        record[word] = busy - 1
    return code


@njit(cache=True)
def finish(address):
    """The copy of the call at ``address``, once Python's wait saw it done:
    0, or REFUSED (as :func:`_copy`)."""
    return _copy(carray(_words(address), (CALL_WORDS,)))


@njit(cache=True)
def _call(st, p, call, blocking):
    """MPI's call for ``call``: nonblocking, its request left in ``st[REQUEST]``
    (``p`` is the state's address), or blocking. Each C function is taken at
    the state's handle width (a 64-bit word passed as MPICH's 32-bit handle is
    cut to its low half)."""
    wide, comm, req = st[WIDE], st[COMM], p + REQUEST * 8
    what, send, recv, count = call[WHAT], call[SEND], call[RECV], call[COUNT]
    dt, op, root = call[DATATYPE], call[OP], call[ROOT]
    if what == PAIR:  # (root: the rank sent to)
        side, tag, source = st[SIDE], st[TAG], call[SOURCE]
        if wide:
            err = w_isendrecv(send, count, dt, root, tag, recv, count, dt, source, tag, side, req)
        else:
            err = n_isendrecv(send, count, dt, root, tag, recv, count, dt, source, tag, side, req)
        if blocking and not err:
            err = mpi_wait(req, p + STATUS * 8)
        return err
    if what == ALL_REDUCE:
        if blocking:
            if wide:
                return w_allreduce(send, recv, count, dt, op, comm)
            return n_allreduce(send, recv, count, dt, op, comm)
        if wide:
            return w_iallreduce(send, recv, count, dt, op, comm, req)
        return n_iallreduce(send, recv, count, dt, op, comm, req)
    if what == BROADCAST:
        if blocking:
            if wide:
                return w_bcast(recv, count, dt, root, comm)
            return n_bcast(recv, count, dt, root, comm)
        if wide:
            return w_ibcast(recv, count, dt, root, comm, req)
        return n_ibcast(recv, count, dt, root, comm, req)
    if what == REDUCE:
        if blocking:
            if wide:
                return w_reduce(send, recv, count, dt, op, root, comm)
            return n_reduce(send, recv, count, dt, op, root, comm)
        if wide:
            return w_ireduce(send, recv, count, dt, op, root, comm, req)
        return n_ireduce(send, recv, count, dt, op, root, comm, req)
    if what == ALL_GATHER:
        if blocking:
            if wide:
                return w_allgather(send, count, dt, recv, count, dt, comm)
            return n_allgather(send, count, dt, recv, count, dt, comm)
        if wide:
            return w_iallgather(send, count, dt, recv, count, dt, comm, req)
        return n_iallgather(send, count, dt, recv, count, dt, comm, req)
    if what == REDUCE_SCATTER:
        if blocking:
            if wide:
                return w_reduce_scatter(send, recv, count, dt, op, comm)
            return n_reduce_scatter(send, recv, count, dt, op, comm)
        if wide:
            return w_ireduce_scatter(send, recv, count, dt, op, comm, req)
        return n_ireduce_scatter(send, recv, count, dt, op, comm, req)
    if what == START:  # a persistent plan's request: started, or started and waited for
        st[REQUEST] = call[PLAN]
        err = mpi_start(req)
        if blocking and not err:
            err = mpi_wait(req, p + STATUS * 8)
        return err
    if what == REDUCE_SCATTER_V:
        counts = call[COUNTS]
        if blocking:
            if wide:
                return w_reduce_scatter_v(send, recv, counts, dt, op, comm)
            return n_reduce_scatter_v(send, recv, counts, dt, op, comm)
        if wide:
            return w_ireduce_scatter_v(send, recv, counts, dt, op, comm, req)
        return n_ireduce_scatter_v(send, recv, counts, dt, op, comm, req)
    if what == ALL_TO_ALL:
        if blocking:
            if wide:
                return w_alltoall(send, count, dt, recv, count, dt, comm)
            return n_alltoall(send, count, dt, recv, count, dt, comm)
        if wide:
            return w_ialltoall(send, count, dt, recv, count, dt, comm, req)
        return n_ialltoall(send, count, dt, recv, count, dt, comm, req)
    if what == ALL_TO_ALL_V:  # (counts, then displacements at COUNT ints on)
        counts = call[COUNTS]
        displs = counts + 4 * count
        if blocking:
            if wide:
                return w_alltoallv(send, counts, displs, dt, recv, counts, displs, dt, comm)
            return n_alltoallv(send, counts, displs, dt, recv, counts, displs, dt, comm)
        if wide:
            return w_ialltoallv(send, counts, displs, dt, recv, counts, displs, dt, comm, req)
        return n_ialltoallv(send, counts, displs, dt, recv, counts, displs, dt, comm, req)
    if what == GATHER:  # (recv 0 but on the root)
        if blocking:
            if wide:
                return w_gather(send, count, dt, recv, count, dt, root, comm)
            return n_gather(send, count, dt, recv, count, dt, root, comm)
        if wide:
            return w_igather(send, count, dt, recv, count, dt, root, comm, req)
        return n_igather(send, count, dt, recv, count, dt, root, comm, req)
    if what == SCATTER:  # (send 0 but on the root)
        if blocking:
            if wide:
                return w_scatter(send, count, dt, recv, count, dt, root, comm)
            return n_scatter(send, count, dt, recv, count, dt, root, comm)
        if wide:
            return w_iscatter(send, count, dt, recv, count, dt, root, comm, req)
        return n_iscatter(send, count, dt, recv, count, dt, root, comm, req)
    if wide:
        return w_ibarrier(comm, req)
    return n_ibarrier(comm, req)


@njit(cache=True)
def start(address, busy, word):
    """Publish and start one collective, and test it up to ``st[SPINS]`` times.

    ``address`` is that of the call's words: what to start, its buffers'
    addresses, MPI's arguments and its group's state (pycoll.native's words
    WHAT to STATE). ``busy`` is the operation's progress word (seq, op code,
    busy bit), stored at ``word`` of the record and cleared of its busy bit
    once the call is done and its copy (if any) made. (Addresses, not
    arrays: numba takes an int argument in half the time of an array.)

    Returns 0 when the call is done, -1 when it is still under way after the
    tests (its request is then in ``st[REQUEST]``), REFUSED when it is done
    but its status word refused its copy (pycoll.native.call_scatter), or
    MPI's error code.
    """
    call, p, st, record = _open(address, busy, word)
    st[REQUEST] = 0
    st[TAG] = (busy >> 8) % TAGS
    err = _call(st, p, call, False)
    if err:
        return err
    for _ in range(st[SPINS]):
        st[FLAG] = 0
        err = mpi_test(p + REQUEST * 8, p + FLAG * 8, p + STATUS * 8)
        if err:
            return err
        if st[FLAG]:
            return _close(call, record, word, busy)
    return -1


@njit(cache=True, nogil=True)
def block(address, busy, word):
    """:func:`start` under ``PYCOLL_WAIT=blocking``: MPI's blocking call, with
    the GIL released so that the watchdog thread can end a call that outlives
    its timeout (pycoll.watch). Returns 0, REFUSED, or MPI's error code."""
    call, p, st, record = _open(address, busy, word)
    st[TAG] = (busy >> 8) % TAGS
    err = _call(st, p, call, True)
    if err == 0:
        return _close(call, record, word, busy)
    return err
