"""The relay bounds frame size, buffered bytes and connections (issue 36).

Before: the relay read frames up to 256 MiB per connection and served any number of connections: 4 connections
streaming partial frames took it from 152 to 954 MiB, 500 idle connections made 1,021 threads. Now
(`deltacoord.writer.relay_limits.RelayLimits`, `deltacoord relay run --max-...`): a frame over `max_frame_bytes` is refused
unread and its connection closed; frames held over every connection stay under `max_buffered_bytes`; connections
beyond `max_connections` are refused with an error the writer raises while the others keep working; a connection
that sends part of a frame (or no greeting) and stalls is closed after `frame_timeout_s`; an idle writer costs one
thread. Real sockets against a running relay on a real broker; the assertions read the relay's own counters.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from deltacoord.schemas.errors import ProposalNotSentError
from deltacoord.schemas.routing import Topics
from deltacoord.writer import relay_wire
from deltacoord.writer.relay import Relay
from deltacoord.writer.relay_limits import RelayLimits
from deltacoord.writer.relay_link import RelayLink, RelayUnavailableError
from tests.integration.coord_harness import fresh_topics

LIMITS = RelayLimits(max_frame_bytes=64 * 1024, max_buffered_bytes=128 * 1024, max_connections=4, frame_timeout_s=1.5)


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap)


@pytest.fixture
def relay(kafka_bootstrap: str, topics: Topics) -> Iterator[Relay]:
    r = Relay(f"/tmp/dc-relay-limits-{uuid.uuid4().hex[:10]}.sock", kafka_bootstrap, topics=topics, limits=LIMITS)
    try:
        assert r.replies.wait_leased(60), "the relay leased no reply partition"
        yield r
    finally:
        r.close()


def _connect(relay: Relay) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)  # a relay that never answers fails the test instead of hanging it
    s.connect(relay.path)
    return s


def _greeted(relay: Relay) -> socket.socket:
    s = _connect(relay)
    head = relay_wire.greet(s, relay.topics)
    assert head["ok"] is True and head["max_frame"] == LIMITS.max_frame_bytes, head
    return s


def _closed_by_relay(s: socket.socket) -> bool:
    """True once the relay closed `s` (frames it sent before are read and dropped). A connection closed with bytes
    of ours still unread by the relay ends with a reset instead of an end of stream."""
    while True:
        try:
            relay_wire.receive(s)
        except (relay_wire.RelayClosedError, ConnectionResetError):
            return True


def _propose(s: socket.socket, relay: Relay, pid: str) -> dict[str, object]:
    relay_wire.send(s, {"op": "propose", "pid": pid, "topic": relay.topics.proposals, "partition": 0, "key": "t",
                        "headers": []}, b"value")
    head, _ = relay_wire.receive(s)
    return head


def test_an_oversize_frame_is_refused_unread_and_its_connection_closed(relay: Relay) -> None:
    s = _greeted(relay)
    # A frame announcing 10 MiB, of which only 1 KiB is sent: the relay answers and closes without waiting for the rest.
    s.sendall(struct.pack(">II", 20, 10 * 1024 * 1024) + b"x" * 1024)
    head, _ = relay_wire.receive(s)
    assert head["op"] == "error" and "over this relay's limit of 65536 bytes" in str(head["error"]), head
    assert _closed_by_relay(s)
    s.close()
    stats = relay.stats()
    assert stats["refused_frames"] == 1 and stats["buffered_peak_bytes"] < LIMITS.max_frame_bytes, stats
    # A writer is told before sending anything: the relay's limit came with its greeting.
    link = RelayLink(relay.path, relay.topics)
    try:
        with pytest.raises(ProposalNotSentError, match=r"over the 65536-byte limit of the relay .*nothing was sent"):
            link.produce("big", relay.topics.proposals, 0, b"t", b"v" * (LIMITS.max_frame_bytes + 1), [])
        # The same link still proposes what fits.
        link.produce("small", relay.topics.proposals, 0, b"t", b"v" * 1024, []).result(60)
    finally:
        link.close()
    assert relay.stats()["refused_frames"] == 1  # the oversize proposal never reached the relay


def test_connections_beyond_the_limit_are_refused_while_the_others_keep_working(
        relay: Relay, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deltacoord.writer.relay")
    served = [_greeted(relay) for _ in range(LIMITS.max_connections)]
    try:
        extra = _connect(relay)
        head, _ = relay_wire.receive(extra)  # the refusal comes in place of the greeting
        assert head["op"] == "hello" and head["ok"] is False, head
        assert "at most 4 connections" in str(head["error"]) and "--max-connections" in str(head["error"]), head
        assert _closed_by_relay(extra)
        extra.close()
        with pytest.raises(RelayUnavailableError, match="refused this writer: the relay serves at most 4 connections"):
            RelayLink(relay.path, relay.topics)
        for _ in range(10):  # many more: each refused, none served, no thread for any
            more = _connect(relay)
            assert relay_wire.receive(more)[0]["ok"] is False
            more.close()
        # The served connections work as before: a proposal is produced and confirmed.
        for i, s in enumerate(served):
            head = _propose(s, relay, f"p{i}")
            assert head["op"] == "delivered" and "error" not in head, head
        stats = relay.stats()
        assert stats["connections"] == 4 and stats["refused_connections"] == 12, stats
        # Idle writers (their answers went out at once) cost one thread each.
        assert stats["connection_threads"] == 4, stats
        refusals = [r for r in caplog.records if "refused" in r.getMessage() and "--max-connections" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]  # logged once, not once per connection
        # A freed place is taken again.
        served.pop().close()
        _wait(lambda: relay.stats()["connections"] == 3, "the closed connection to leave")
        served.append(_greeted(relay))
        relay_wire.send(served[-1], {"op": "counts"})
        counts = relay_wire.receive(served[-1])[0]
        assert counts["op"] == "counts" and counts["connections"] == 4 and counts["proposals"] == 4, counts
    finally:
        for s in served:
            s.close()


def test_a_connection_that_stalls_mid_frame_or_before_greeting_is_closed_an_idle_one_is_kept(relay: Relay) -> None:
    idle = _greeted(relay)
    partial = _greeted(relay)
    partial.sendall(struct.pack(">II", 100, 1000) + b'{"op":')  # part of a frame, then nothing
    silent = _connect(relay)  # never greets
    try:
        head, _ = relay_wire.receive(partial)
        assert head["op"] == "error" and "not complete within 2s" in str(head["error"]), head
        assert _closed_by_relay(partial)
        assert _closed_by_relay(silent)
        _wait(lambda: relay.stats()["stalled_closed"] == 2 and relay.stats()["connections"] == 1,
              "both stalled connections to be counted and gone")
        stats = relay.stats()
        assert stats["buffered_bytes"] == 0 and stats["connections"] == 1, stats
        # The greeted connection that sent nothing for longer than the timeout is still served.
        time.sleep(LIMITS.frame_timeout_s * 2)
        relay_wire.send(idle, {"op": "counts"})
        assert relay_wire.receive(idle)[0]["stalled_closed"] == 2
    finally:
        for s in (idle, partial, silent):
            s.close()


def test_buffered_bytes_stay_under_the_limit_with_partial_frames_on_every_connection(relay: Relay) -> None:
    size = 60 * 1024  # under max_frame_bytes; three of them are over max_buffered_bytes (128 KiB)
    conns = [_greeted(relay) for _ in range(LIMITS.max_connections)]
    try:
        for s in conns:  # every connection starts a frame and sends half of it
            s.sendall(struct.pack(">II", 2, size - 2) + b"{}" + b"x" * (size // 2))
        for s in conns:
            assert _closed_by_relay(s)
        _wait(lambda: relay.stats()["connections"] == 0, "the closed connections to leave")
        stats = relay.stats()
        assert stats["buffered_peak_bytes"] <= LIMITS.max_buffered_bytes, stats
        # Two frames were buffered at once (the relay's own peak, not a sample), the others waited for room.
        assert stats["buffered_peak_bytes"] == 2 * size, stats
        # Each was closed: two stalled mid-frame, the others stalled too once room came, or found none in time.
        assert stats["stalled_closed"] >= 2 and stats["stalled_closed"] + stats["buffer_full_closed"] == 4, stats
        assert stats["buffered_bytes"] == 0 and stats["connections"] == 0, stats
        # Nothing is left held: a whole frame of the same size is read and answered.
        s = _greeted(relay)
        s.sendall(relay_wire.frame({"op": "counts", "pad": "x" * (size - 100)}))
        assert relay_wire.receive(s)[0]["op"] == "counts"
        s.close()
    finally:
        for s in conns:
            s.close()
