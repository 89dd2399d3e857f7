"""The messages between pycoll-run and its rank wrappers: one JSON object per
line over TCP, so the supervisor can read many ranks with one selector.

Standalone (no pycoll import): the rank wrapper loads it by path."""

from __future__ import annotations

import json
import os
import sys

# typing is imported for the type checker only: it is a sixth of what the rank
# wrapper's start costs on each rank (mypy takes this name as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any, Dict, Iterator, Optional

    Message = Dict[str, Any]

ADDR_ENV = "PYCOLL_RUN_ADDR"  # host:port of pycoll-run, for the rank wrappers
TOKEN_ENV = "PYCOLL_RUN_TOKEN"  # proves a connection comes from this job
RANK_VARS_ENV = "PYCOLL_RUN_RANK_VARS"  # the launcher's variables for rank and size
TRACEBACK_FD = "PYCOLL_RUN_TRACEBACK_FD"  # where boot writes an uncaught traceback
MALFORMED = "malformed"  # what Reader makes of a line that is not a message


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class Reader:
    """Splits a byte stream into messages (or raw lines, with ``raw=True``)."""

    def __init__(self, raw: bool = False) -> None:
        self._buffer = b""
        self._raw = raw

    def feed(self, data: bytes) -> Iterator[Any]:
        """The complete lines in ``data`` (and what came before), in order.

        A line that is not a JSON object is yielded as ``{"t": MALFORMED,
        "line": ...}`` (its start): anything that can reach the port can send
        anything, and the reader of it decides, without crashing, what to do.
        """
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if self._raw:
                yield line
                continue
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                message = {"t": MALFORMED, "line": line[:80].decode("utf-8", "replace")}
            yield message

    def rest(self) -> Optional[bytes]:
        """What is left after the stream ended (a last line with no newline)."""
        rest, self._buffer = self._buffer, b""
        return rest or None


def receive(sock: socket.socket, reader: Reader) -> Iterator[Message]:
    """Block for the next batch of messages; yields nothing at end of stream."""
    data = sock.recv(65536)
    if not data:
        return
    yield from reader.feed(data)


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
