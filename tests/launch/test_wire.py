"""pycoll.launch.wire: the frames between pycoll-run and its rank wrappers,
and the token line that must come before any of them is decoded."""

from __future__ import annotations

import marshal

from pycoll.launch import wire

TOKEN = "c0ffee"
HELLO = {"t": "hello", "rank": 3, "host": "node-é", "visible": ["0", "1"], "gpus": 2}
ENV = {"t": "env", "env": {"RANK": "3", "WEIRD": "tab\tnew\nline \x00 ünïcode"}}


def _stream(*messages):
    return wire.greeting(TOKEN) + b"".join(wire.encode(m) for m in messages)


def test_messages_come_back_whole_however_the_bytes_are_split():
    data = _stream(HELLO, ENV, {"t": "exit", "code": -9})
    for step in (1, 2, 3, 7, 64, len(data)):
        reader = wire.Reader(TOKEN)
        got = []
        for at in range(0, len(data), step):
            got.extend(reader.feed(data[at : at + step]))
        assert got == [HELLO, ENV, {"t": "exit", "code": -9}], step


def test_a_first_line_without_the_jobs_token_is_a_stranger_and_nothing_is_decoded():
    for first in (b"not a message\n", wire.greeting("guess"), b"x" * 300):
        reader = wire.Reader(TOKEN)
        got = list(reader.feed(first + wire.encode(HELLO)))
        assert [m["t"] for m in got] == [wire.STRANGER], first
        assert got[0]["line"] == first[:80].rstrip(b"\n").decode()
        assert list(reader.feed(wire.encode(HELLO))) == []  # never decoded afterwards


def test_a_short_first_line_waits_for_the_rest():
    reader = wire.Reader(TOKEN)
    assert list(reader.feed(b"pycoll-run c0f")) == []
    assert list(reader.feed(b"fee\n" + wire.encode(HELLO))) == [HELLO]


def test_a_frame_that_is_not_a_message_is_malformed_and_the_next_one_still_read():
    bad = [marshal.dumps([1, 2]), marshal.dumps({"t": 5}), b"\xff\x00garbage"]
    data = wire.greeting(TOKEN)
    for payload in bad:
        data += len(payload).to_bytes(4, "big") + payload
    data += wire.encode(HELLO)
    got = list(wire.Reader(TOKEN).feed(data))
    assert [m["t"] for m in got] == [wire.MALFORMED] * 3 + ["hello"]


def test_a_frame_too_long_to_be_a_message_ends_the_stream():
    reader = wire.Reader(TOKEN)
    huge = (wire.FRAME_LIMIT + 1).to_bytes(4, "big")
    got = list(reader.feed(wire.greeting(TOKEN) + wire.encode(HELLO) + huge + b"x" * 10))
    assert [m["t"] for m in got] == ["hello", wire.MALFORMED]
    assert str(wire.FRAME_LIMIT + 1) in got[1]["line"]
    assert list(reader.feed(wire.encode(HELLO))) == []


def test_without_a_token_frames_are_read_from_the_start():
    # (the wrapper's side: pycoll-run's frames need no greeting)
    assert list(wire.Reader().feed(wire.encode(ENV) + wire.encode({"t": "stop"}))) == [
        ENV,
        {"t": "stop"},
    ]


def test_lines():
    lines = wire.Lines()
    assert lines.feed(b"a\nb") == [b"a"]
    assert lines.feed(b"c\n\nd") == [b"bc", b""]
    assert lines.rest() == b"d"
    assert lines.rest() is None


def test_a_caller_may_stop_reading_part_way():
    """The supervisor drops a stranger's connection at its first message: what
    the reader has taken in is behind it either way, never read twice."""
    reader = wire.Reader(TOKEN)
    first = next(iter(reader.feed(_stream(HELLO, ENV))))
    assert first == HELLO
    assert reader.feed(wire.encode({"t": "stop"})) == [{"t": "stop"}]
