"""A compiled call's words: the layout that pycoll.native writes and
pycoll.kernels.starts reads (an int64 array per call), and the codes of what
a call starts. Apart from both, so that neither imports the other: native
stays free of numba until its first compiled call, and starts has no need of
native's Python.
"""

from __future__ import annotations

__all__ = [
    "ALL_REDUCE",
    "BROADCAST",
    "REDUCE",
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "ALL_TO_ALL",
    "BARRIER",
    "REDUCE_SCATTER_V",
    "START",
    "ALL_TO_ALL_V",
    "GATHER",
    "SCATTER",
    "PAIR",
    "WHAT",
    "SEND",
    "RECV",
    "COUNT",
    "DATATYPE",
    "OP",
    "ROOT",
    "STATE",
    "COPY_TO",
    "COPY_FROM",
    "COPY_BYTES",
    "COUNTS",
    "PLAN",
    "IN_TO",
    "IN_FROM",
    "IN_BYTES",
    "IN_SKIP",
    "IN_SKIP_BYTES",
    "IN_TABLE",
    "IN_ROWS",
    "OUT_TABLE",
    "OUT_ROWS",
    "STATUS_AT",
    "SOURCE",
    "FOLD_IN",
    "FOLD_INOUT",
    "CALL_WORDS",
    "REFUSED",
    "SCATTER_STATUS",
]

# What a call starts (call's ``what``).
ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BARRIER = range(7)
REDUCE_SCATTER_V = 7  # MPI_Ireduce_scatter, equal counts (pycoll._mpi.reduce_scatter_v)
START = 8  # MPI_Start of a persistent plan's request (pycoll.persistent)
# MPI_Ialltoallv with this rank's own counts 0 (pycoll.collectives.alltoall's
# large even all-to-all): COUNTS the address of int32 counts then
# displacements, the same for both sides; COUNT the group's size.
ALL_TO_ALL_V = 9
GATHER = 10  # MPI_Igather (torch's list form on the root: received into a buffer the call keeps)
# MPI_Iscatter of bytes, each part behind its root's 8-byte status word
# (pycoll.collectives.scatter): see call_scatter.
SCATTER = 11
# MPI_Isendrecv over the group's side communicator, tagged with the call's
# sequence number, then MPI_Reduce_local where OP is not 0
# (pycoll.collectives.pair): ROOT is the rank sent to, SOURCE the rank
# received from (either MPI_PROC_NULL), COUNT elements of DATATYPE each way,
# and the fold's operands are at FOLD_IN and FOLD_INOUT; the copy once done
# (COPY_TO...) comes after the fold.
PAIR = 12

# A call's words, as the compiled code reads them: what it starts, the send
# buffer's address (MPI_IN_PLACE's value, or 0), the receive buffer's (or 0),
# MPI's count, datatype, op and root, the address of its group's state, a
# copy made once the call is done (to, from, bytes: 0 bytes for none), the
# address of MPI's counts (an int array: REDUCE_SCATTER_V's recvcounts), for
# START the plan's request handle, then a copy made before the call starts
# (to, from, bytes) and a part of its range left out (offset and bytes),
# then the copies a list form makes, each an int64 table of (to, from,
# bytes) rows: its address and row count for those made before the call
# starts (a reduce-scatter's inputs stacked) and for those made once it is
# done (an all-gather's parts copied out), 0 rows for none; last, the
# address of a status word the copies made once done wait on (0 for none):
# where the word is not 0 once the call is done, no copy is made and the
# compiled code returns REFUSED (a scatter whose root refused its list).
WHAT, SEND, RECV, COUNT, DATATYPE, OP, ROOT, STATE = range(8)
COPY_TO, COPY_FROM, COPY_BYTES, COUNTS = range(8, 12)
PLAN, IN_TO, IN_FROM, IN_BYTES, IN_SKIP, IN_SKIP_BYTES = range(12, 18)
IN_TABLE, IN_ROWS, OUT_TABLE, OUT_ROWS = range(18, 22)
STATUS_AT = 22
SOURCE, FOLD_IN, FOLD_INOUT = 23, 24, 25
CALL_WORDS = 26
# What the compiled code returns for a call done whose status word (STATUS_AT)
# said its root refused: nothing was copied out. (0 is done, -1 under way,
# anything else MPI's error code.)
REFUSED = -2
SCATTER_STATUS = 8  # bytes of a scattered part's status word
