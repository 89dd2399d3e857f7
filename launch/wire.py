"""The messages between pycoll-run and its rank wrappers, over TCP, so the
supervisor can read many ranks with one selector.

A wrapper first sends one line, ``pycoll-run <token>``: the job's token
proves the connection comes from this job. Only then does the supervisor
decode anything, so what a stranger sends is compared as bytes and never
parsed. After it, each message is a flat dict (``{"t": kind, ...}`` of str,
int, list and dict) in one frame: four bytes of length, big-endian, then the
dict in :mod:`marshal`'s format.

marshal, not JSON: this module is imported on every rank before the target
starts, and ``import json`` (with the ``re`` it imports and the patterns it
compiles) was a quarter of the wrapper's start on each rank, where marshal
is built into the interpreter. marshal is not meant for untrusted bytes,
hence the token line before any frame is decoded.

Standalone (no pycoll import): the rank wrapper loads it by path."""

from __future__ import annotations

import marshal
import os
import sys

# typing is imported for the type checker only: it is a sixth of what the rank
# wrapper's start costs on each rank (mypy takes this name as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

    Message = Dict[str, Any]

ADDR_ENV = "PYCOLL_RUN_ADDR"  # host:port of pycoll-run, for the rank wrappers
TOKEN_ENV = "PYCOLL_RUN_TOKEN"  # proves a connection comes from this job
RANK_VARS_ENV = "PYCOLL_RUN_RANK_VARS"  # the launcher's variables for rank and size
TRACEBACK_FD = "PYCOLL_RUN_TRACEBACK_FD"  # where boot writes an uncaught traceback
MALFORMED = "malformed"  # what Reader makes of a frame that is not a message
STRANGER = "stranger"  # what Reader makes of a connection without the job's token
GREETING = b"pycoll-run "  # the start of a wrapper's first line; the token follows
LONGEST_GREETING = 256  # bytes: a first line longer than this is a stranger's
FRAME_LIMIT = 64 << 20  # bytes: a longer frame is malformed (the stream is dropped)
_HEAD = 4  # bytes of a frame's length


def greeting(token: str) -> bytes:
    """A wrapper's first line, proving it belongs to the job with ``token``."""
    return GREETING + token.encode() + b"\n"


def encode(message: Message) -> bytes:
    """One message as a frame."""
    payload = marshal.dumps(message)
    return len(payload).to_bytes(_HEAD, "big") + payload


class Reader:
    """Splits a byte stream of frames into messages.

    With ``token``, the stream must start with :func:`greeting` of it; until
    it has, nothing is decoded, and a first line that is not it yields one
    ``{"t": STRANGER, "line": ...}`` (its start) and nothing after. Anything
    that can reach the port can send anything: the reader of a message
    decides, without crashing, what to make of it. A frame that is not a
    dict with a str ``"t"`` yields ``{"t": MALFORMED, "line": ...}``.
    """

    def __init__(self, token: Optional[str] = None) -> None:
        self._buffer = b""
        self._greeting = None if token is None else greeting(token)
        self._closed = False

    def feed(self, data: bytes) -> List[Message]:
        """The complete messages in ``data`` (and what came before), in order.
        (A list, the reader's state already moved past them: a caller may
        stop reading them part-way.)"""
        if self._closed:
            return []
        buffer = self._buffer + data
        if self._greeting is not None:
            line, newline, rest = buffer.partition(b"\n")
            if not newline and len(buffer) <= LONGEST_GREETING:
                self._buffer = buffer  # the first line is not whole yet
                return []
            if line + newline != self._greeting:
                self._closed, self._buffer = True, b""
                return [{"t": STRANGER, "line": line[:80].decode("utf-8", "replace")}]
            self._greeting = None
            buffer = rest
        out: List[Message] = []
        at = 0
        while len(buffer) - at >= _HEAD:
            size = int.from_bytes(buffer[at : at + _HEAD], "big")
            if size > FRAME_LIMIT:
                self._closed, self._buffer = True, b""  # no way to find the next frame
                out.append({"t": MALFORMED, "line": f"a frame of {size} bytes"})
                return out
            end = at + _HEAD + size
            if end > len(buffer):
                break
            try:
                message = marshal.loads(buffer[at + _HEAD : end])
            except (ValueError, EOFError, TypeError):
                message = None
            if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                start = buffer[at + _HEAD : min(end, at + _HEAD + 80)]
                message = {"t": MALFORMED, "line": start.decode("utf-8", "replace")}
            out.append(message)
            at = end
        self._buffer = buffer[at:]
        return out


class Lines:
    """Splits a byte stream into lines (without their newlines)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> List[bytes]:
        """The complete lines in ``data`` (and what came before), in order."""
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        return lines

    def rest(self) -> Optional[bytes]:
        """What is left after the stream ended (a last line with no newline)."""
        rest, self._buffer = self._buffer, b""
        return rest or None


def receive(sock: Any, reader: Reader) -> Optional[List[Message]]:
    """Block for the next bytes: the messages they complete (perhaps none, a
    frame being split across reads), or None at the end of the stream."""
    data = sock.recv(65536)
    if not data:
        return None
    return reader.feed(data)


def exit_now(code: int) -> None:
    """End the process with ``code`` at once, its output flushed: for the
    rank wrapper and the ``pycoll-run`` command once their job is over and
    reported, where the interpreter's own teardown (a module at a time) would
    add about 10 ms to every job."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
