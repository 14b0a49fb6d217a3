"""The relay's connection to one writer: frames written at once when the socket takes them, queued behind
one another when it does not, and a writer that stops reading (or is gone) ends only its own connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from deltacoord.writer import relay, relay_wire
from deltacoord.writer.relay import _Connection

BODY = 64 * 1024  # 64 frames of this size are far more than a Unix socket buffers


@dataclass
class Pair:
    conn: _Connection
    theirs: socket.socket  # the writer's end
    closed: list[_Connection]  # connections the relay was told are closed


@pytest.fixture
def pair() -> Iterator[Pair]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(30)  # a lost frame fails the test instead of hanging it
    closed: list[_Connection] = []
    p = Pair(_Connection(ours, closed.append), theirs, closed)
    yield p
    p.conn.close()
    ours.close()
    theirs.close()


def _send_all(conn: _Connection, frames: int) -> None:
    """Send from another thread, so a send that blocked would show as a thread still running."""
    t = threading.Thread(target=lambda: [conn.send({"op": "reply", "n": i}, bytes([i % 256]) * BODY)
                                         for i in range(frames)])
    t.start()
    t.join(10)
    assert not t.is_alive(), "a send blocked on a writer that was not reading"


def test_frames_reach_a_slow_reader_whole_and_in_order(pair: Pair) -> None:
    _send_all(pair.conn, 64)
    assert pair.conn._backlog > 0, "the socket filled up: the rest waits in the connection's queue"
    for i in range(64):
        head, body = relay_wire.receive(pair.theirs)
        assert head == {"op": "reply", "n": i}
        assert body == bytes([i % 256]) * BODY
    assert not pair.closed


def test_a_frame_the_socket_takes_whole_is_written_without_the_queue(pair: Pair) -> None:
    pair.conn.send({"op": "delivered", "pid": "p1"})
    assert pair.conn._backlog == 0 and pair.conn._out.empty()
    assert relay_wire.receive(pair.theirs) == ({"op": "delivered", "pid": "p1"}, b"")


def test_a_writer_that_stopped_reading_loses_only_its_connection(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay, "MAX_QUEUED_FRAMES", 4)
    _send_all(pair.conn, 64)
    assert pair.closed == [pair.conn]


def test_a_writer_that_is_gone_closes_its_connection(pair: Pair) -> None:
    pair.theirs.close()
    pair.conn.send({"op": "reply", "n": 0})
    assert pair.closed == [pair.conn]
    pair.conn.send({"op": "reply", "n": 1})  # nothing more once closed
    assert pair.closed == [pair.conn]
