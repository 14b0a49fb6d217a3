"""The relay's frames carry any proposal and any Kafka header unchanged, and refuse what is not a frame."""

from __future__ import annotations

import socket
import struct

import pytest

from deltacoord.writer import relay_wire
from deltacoord.writer.replies import Routing


def test_a_frame_carries_binary_headers_and_body_unchanged() -> None:
    a, b = socket.socketpair()
    try:
        signature = bytes(range(256))  # every byte value, as an Ed25519 signature may hold
        headers: list[tuple[str, str | bytes | None]] = [("deltacoord.signature", signature), ("none", None),
                                                         ("text", "é")]
        relay_wire.send(a, {"op": "propose", "headers": relay_wire.encode_headers(headers)}, b"\x00avro\xff")
        head, body = relay_wire.receive(b)
        assert head["op"] == "propose" and body == b"\x00avro\xff"
        assert relay_wire.decode_headers(head["headers"]) == [("deltacoord.signature", signature), ("none", None),
                                                              ("text", "é".encode())]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("raw", [
    struct.pack(">II", 3, 0) + b"[1]",  # a head that is not an object
    struct.pack(">II", 4, 0) + b"{not",  # not JSON
    struct.pack(">II", relay_wire.MAX_FRAME, 1),  # over the limit, refused before reading it
    struct.pack(">II", 10, 0) + b"{}",  # cut off
])
def test_what_is_not_a_frame_ends_the_connection(raw: bytes) -> None:
    a, b = socket.socketpair()
    try:
        a.sendall(raw)
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(relay_wire.RelayClosedError):
            relay_wire.receive(b)
    finally:
        a.close()
        b.close()


def test_a_forwarded_reply_settles_only_its_own_proposal() -> None:
    routing = Routing()
    with routing._lock:
        mine = routing.register("p-1", 0, "ratified")
    routing.route(relay_wire.Record([("deltacoord.proposal_id", b"p-2")], b""))
    assert routing.counts.foreign == 1 and not mine.decision.done()
