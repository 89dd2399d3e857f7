"""Numbers read from pycoll's environment variables (PYCOLL_TIMEOUT,
PYCOLL_CHECK_EVERY, PYCOLL_FLIGHT_RECORDS, the PYCOLL_*_BYTES sizes), each
checked where it is read: a value that does not parse or is out of range
raises a ValueError naming the variable, what it must be and what it was,
before anything is sent."""

from __future__ import annotations

import os
from typing import Callable, Optional, TypeVar

__all__ = ["number", "nbytes"]

T = TypeVar("T", int, float)


def number(
    name: str, kind: Callable[[str], T], default: T, valid: Callable[[T], bool], need: str
) -> T:
    """The variable ``name`` as ``kind`` (int or float); ``default`` where it is
    unset or blank.

    Raises:
        ValueError: ``"{name} must be {need}, got '...'"`` where the value does
            not parse as ``kind`` or ``valid`` rejects it.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be {need}, got {raw!r}") from None
    if not valid(value):
        raise ValueError(f"{name} must be {need}, got {raw!r}")
    return value


def nbytes(name: str, zero: str) -> Optional[int]:
    """The variable ``name``, a size in bytes (digits only), or None where it
    is not set; ``zero`` says what 0 means, for the error message."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}={text!r}: set it to a number of bytes (0: {zero})")
    return int(text)
