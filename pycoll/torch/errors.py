"""pycoll's errors as members of torch's DistBackendError family.

A timeout, an MPI error or a call mismatch under the torch API is raised as a
class that is both torch's ``torch.distributed.DistBackendError`` (what code
written for NCCL and gloo catches) and pycoll's own error of that kind (what
code written for pycoll catches), with pycoll's message: which rank, which
call, what the others were doing.

A timeout's message starts with torch's phrasing (gloo's "Timed out waiting
1000ms for ..."; at DETAIL also torch's "Ranks 1, 2 failed to pass
monitoredBarrier in 1000 ms"), which torch's tests and user code match, and
goes on with pycoll's diagnosis.
"""

from __future__ import annotations

from typing import Dict, Optional, Type, cast

import torch.distributed as dist

from .. import debug, errors
from ..groups import get_rank, is_initialized

__all__ = ["DistBackendError", "DistTimeoutError", "CollectiveMismatchError", "as_torch"]


class DistBackendError(dist.DistBackendError, errors.DistBackendError):
    """MPI reported an error (torch's DistBackendError and pycoll's)."""


class DistTimeoutError(dist.DistBackendError, errors.DistTimeoutError):
    """An operation did not complete within its timeout; the group is unusable
    afterwards (torch's DistBackendError and pycoll's DistTimeoutError)."""


class CollectiveMismatchError(dist.DistBackendError, errors.CollectiveMismatchError):
    """The ranks called different collectives at the same point of a group's
    sequence (torch's DistBackendError and pycoll's CollectiveMismatchError)."""


class DistError(dist.DistBackendError, errors.DistError):
    """Any other pycoll error under the torch API (torch's DistBackendError
    and pycoll's DistError)."""


# Most specific first: the first pycoll class an error is an instance of wins.
_CLASSES: Dict[Type[errors.DistError], Type[BaseException]] = {
    errors.DistTimeoutError: DistTimeoutError,
    errors.CollectiveMismatchError: CollectiveMismatchError,
    errors.DistBackendError: DistBackendError,
    errors.DistError: DistError,
}


def as_torch(exc: BaseException) -> Optional[BaseException]:
    """``exc`` as the torch-family class of its kind, with the same message and
    attributes; None when it is not one of pycoll's DistErrors (a ValueError
    for bad input stays what it is) or already a torch one."""
    if isinstance(exc, dist.DistError) or not isinstance(exc, errors.DistError):
        return None
    for mine, theirs in _CLASSES.items():
        if isinstance(exc, mine):
            new = cast(BaseException, theirs.__new__(theirs))
            new.args = exc.args
            if isinstance(exc, errors.DistTimeoutError) and exc.args:
                new.args = (_in_torchs_words(exc), *exc.args[1:])
            new.__dict__.update(exc.__dict__)
            new.__cause__ = exc.__cause__
            new.__traceback__ = exc.__traceback__
            return new
    return None  # pragma: no cover - DistError is the last key


def _in_torchs_words(exc: errors.DistTimeoutError) -> str:
    """A timeout's message with torch's phrasing first (see the module's docstring)."""
    text = str(exc.args[0])
    if "failed to pass monitoredBarrier" in text:  # pycoll's monitored_barrier says it already
        return text
    rank = get_rank() if is_initialized() else -1
    what = exc.op + (f" (seq {exc.seq})" if exc.seq is not None else "")
    head = errors.timed_out_words(rank, what or "an operation", exc.timeout)
    if debug.LEVEL >= debug.DebugLevel.DETAIL:  # torch: a monitored barrier before each call
        head += ": " + errors.monitored_barrier_words(exc.ranks, exc.timeout)
    return f"{head}. pycoll: {text}"
