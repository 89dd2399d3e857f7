"""pycoll's own exceptions.

Each subclasses the built-in a caller would expect (RuntimeError for a bad
state of the job), so ``except RuntimeError`` keeps working, and carries the
facts of the failure as attributes, so code never has to parse a message.
"""

from __future__ import annotations

from types import TracebackType
from typing import Dict, List, Optional

__all__ = [
    "DistError",
    "DistBackendError",
    "DistTimeoutError",
    "CollectiveMismatchError",
    "monitored_barrier_words",
    "timed_out_words",
    "user_frames",
]


class DistError(RuntimeError):
    """Base of pycoll's errors about the distributed job itself."""


class DistBackendError(DistError):
    """MPI reported an error while carrying out an operation.

    Attributes:
        op: name of the pycoll operation, e.g. ``"all_reduce"``.
        seq: the group's sequence number of that operation, or None for
            point-to-point operations, which are not sequenced.
    """

    def __init__(self, message: str, op: str = "", seq: Optional[int] = None):
        super().__init__(message)
        self.op = op
        self.seq = seq


class DistTimeoutError(DistError):
    """An operation did not complete within its timeout.

    Attributes:
        op: name of the pycoll operation.
        seq: the group's sequence number of that operation (None for
            point-to-point operations).
        elapsed: seconds waited before giving up.
        ranks: global ranks known not to have reached the operation (empty
            when this rank cannot know).
        timeout: the timeout that was armed, in seconds (None where unknown).
    """

    def __init__(
        self,
        message: str,
        op: str = "",
        seq: Optional[int] = None,
        elapsed: float = 0.0,
        ranks: Optional[List[int]] = None,
        timeout: Optional[float] = None,
    ):
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.elapsed = elapsed
        self.ranks = list(ranks or [])
        self.timeout = timeout


class CollectiveMismatchError(DistError):
    """The members of a group ran, or were about to run, different collectives
    (or the same one with different arguments), on every member.

    Under ``PYCOLL_DEBUG=DETAIL`` it is raised before the call exchanges any
    data. In the default mode the call check (pycoll.crosscheck) raises it a
    bounded number of calls later, or at destroy_process_group, naming the
    first call where the ranks differed; the group is then unusable.

    Attributes:
        op: this rank's operation at that sequence number.
        seq: the sequence number where the ranks first differ.
        calls: global rank -> what that rank called, e.g.
            ``"all_reduce(SUM, shape=(4,), float32) at seq 17"``.
    """

    def __init__(self, message: str, op: str, seq: int, calls: Dict[int, str]):
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.calls = calls


# torch's wording, which its test suite and user code match with regexes
# (" (Timed out|closed|timeout) ", "failed to pass monitoredBarrier"): gloo's
# and NCCL's phrasing, written once here for pycoll's messages to start with.


def timed_out_words(rank: int, what: str, seconds: Optional[float]) -> str:
    """torch's phrase for a timeout, e.g. "[Rank 0] Timed out waiting 1000ms
    for barrier (seq 3) to complete"."""
    waited = f" {round(seconds * 1000)}ms" if seconds is not None else ""
    return f"[Rank {rank}] Timed out waiting{waited} for {what} to complete"


def monitored_barrier_words(ranks: List[int], seconds: Optional[float]) -> str:
    """torch's phrase for ranks that missed a monitored barrier, e.g. "Rank 3
    failed to pass monitoredBarrier in 1000 ms" ("Ranks 1, 2 ..." for several)."""
    if not ranks:
        who = "A rank"
    elif len(ranks) == 1:
        who = f"Rank {ranks[0]}"
    else:
        who = f"Ranks {', '.join(map(str, ranks))}"
    within = f" in {round(seconds * 1000)} ms" if seconds is not None else ""
    return f"{who} failed to pass monitoredBarrier{within}"


def user_frames(tb: Optional[TracebackType], value: object = None) -> Optional[TracebackType]:
    """For pycoll's own errors (a timeout, a mismatch, an MPI failure), the
    traceback ``tb`` without pycoll's frames, so that it ends at the user's
    call, where the error's message takes over; any other exception's (an
    argument error, a bug inside pycoll) as it is. Used by the excepthooks of
    pycoll.watch and of pycoll-run's ranks (pycoll.launch.boot)."""
    if type(value).__module__ != __name__:
        return tb
    kept = []
    while tb is not None:
        name = str(tb.tb_frame.f_globals.get("__name__", ""))
        if name != "pycoll" and not name.startswith("pycoll."):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out
