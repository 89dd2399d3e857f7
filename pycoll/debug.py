"""Debug levels and the INFO log of collectives.

``PYCOLL_DEBUG`` (OFF, INFO or DETAIL, any case) sets the level; it is read
when pycoll is imported and again by :func:`set_debug_level_from_env` and
:func:`pycoll.init_process_group`. At INFO every collective is logged through
the ``pycoll`` logger with its group, sequence number, size and duration.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
from typing import Callable, Dict, List

import numpy as np

from . import _mpi
from .errors import CollectiveMismatchError

__all__ = ["DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env"]

ENV_VAR = "PYCOLL_DEBUG"

logger = logging.getLogger("pycoll")


class DebugLevel(enum.IntEnum):
    """How much pycoll checks and reports about each collective."""

    OFF = 0
    INFO = 1
    DETAIL = 2


# The collectives read this int on every call, so it is a plain module
# attribute rather than a property behind a function call.
LEVEL: int = DebugLevel.OFF
# Whether the synchronous fast paths (collectives._common.plain) may run:
# debug OFF and no timeline being recorded (pycoll.trace), which both need the
# general path. One flag, so that the fast paths test one attribute.
PLAIN: bool = True
_tracing = False


def set_tracing(on: bool) -> None:
    """A timeline starts or stops being recorded (pycoll.trace.timeline)."""
    global PLAIN, _tracing
    _tracing = on
    PLAIN = LEVEL == DebugLevel.OFF and not on


def get_debug_level() -> DebugLevel:
    """Return the debug level in force."""
    return DebugLevel(LEVEL)


def set_debug_level(level: DebugLevel) -> None:
    """Set the debug level for this process.

    From INFO up the ``pycoll`` logger passes INFO records, and where the
    program has not configured logging (no handler on it nor on the root
    logger) they go to stderr, one line each prefixed with the rank, as
    torch's debug output does: setting PYCOLL_DEBUG=INFO shows something
    without a line of logging set-up.
    """
    global LEVEL, PLAIN
    if not isinstance(level, DebugLevel):
        raise TypeError(f"level must be a pycoll.DebugLevel, got {type(level).__name__}")
    LEVEL = level
    PLAIN = level == DebugLevel.OFF and not _tracing
    if level >= DebugLevel.INFO:
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(_RankFormatter())
            logger.addHandler(handler)


class _RankFormatter(logging.Formatter):
    """``[rank N] pycoll INFO: message``, with the rank in MPI's world."""

    def format(self, record: logging.LogRecord) -> str:
        MPI = _mpi.MPI
        rank = MPI.COMM_WORLD.Get_rank() if MPI is not None and MPI.Is_initialized() else "?"
        return f"[rank {rank}] pycoll {record.levelname}: {record.getMessage()}"


def set_debug_level_from_env() -> None:
    """Set the debug level from ``PYCOLL_DEBUG`` (OFF when it is unset or empty).

    Raises:
        ValueError: the variable holds anything but OFF, INFO or DETAIL.
    """
    raw = os.environ.get(ENV_VAR)
    if raw is None or not raw.strip():
        set_debug_level(DebugLevel.OFF)
        return
    try:
        level = DebugLevel[raw.strip().upper()]
    except KeyError:
        raise ValueError(
            f"The value of {ENV_VAR} must be one of OFF, INFO or DETAIL (any case), got {raw!r}"
        ) from None
    set_debug_level(level)


FINGERPRINT_BYTES = 256


def check_fingerprint(
    ranks: List[int],
    group_name: str,
    op: str,
    seq: int,
    call: str,
    exchange: Callable[[np.ndarray, np.ndarray], None],
) -> None:
    """At DETAIL: compare what every member is about to call; raise on all if they differ.

    Each member contributes a fixed-size record, so the exchange (an
    all-gather over the group, made by ``exchange(mine, everyone)``) always
    matches across ranks, whatever collective each of them was about to run.
    """
    text = f"{call} at seq {seq}".encode()[:FINGERPRINT_BYTES]
    mine = np.zeros(FINGERPRINT_BYTES, np.uint8)
    mine[: len(text)] = np.frombuffer(text, np.uint8)
    everyone = np.empty((len(ranks), FINGERPRINT_BYTES), np.uint8)
    exchange(mine, everyone)
    if (everyone == mine).all():
        return
    calls = {
        ranks[i]: bytes(row).rstrip(b"\0").decode(errors="replace")
        for i, row in enumerate(everyone)
    }
    by_call: Dict[str, List[int]] = {}
    for rank, what in calls.items():
        by_call.setdefault(what, []).append(rank)
    parts = sorted(by_call.items(), key=lambda item: (len(item[1]), item[1]))
    said = " while ".join(
        f"{'rank' if len(who) == 1 else 'ranks'} {','.join(map(str, who))} called {what}"
        for what, who in parts
    )
    raise CollectiveMismatchError(
        f"{op}: the ranks of group {group_name!r} disagree on the collective to run: "
        f"{said}. Nothing was exchanged.",
        op,
        seq,
        calls,
    )


def log_collective(op: str, group_desc: str, seq: int, nbytes: int, seconds: float) -> None:
    """Log one completed collective at INFO."""
    logger.info(
        "%s group=%s seq=%d bytes=%d duration_us=%.1f", op, group_desc, seq, nbytes, seconds * 1e6
    )
