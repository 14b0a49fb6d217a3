"""The relay's frames on its Unix socket: a JSON head and raw bytes (a proposal's or a reply's value).

A frame is two big-endian 32-bit lengths, the head's UTF-8 JSON and the body. Kafka
headers travel in the head as `[name, value]` pairs, the value's bytes as Latin-1
text (every byte maps to one character, so any value, a signature too, survives).
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

from deltacoord.schemas.routing import Topics

_LENGTHS = struct.Struct(">II")
#: Bytes of a frame before its head: the two lengths.
LENGTHS_SIZE = _LENGTHS.size
#: A frame larger than this is refused by a reader of frames (the relay refuses far smaller ones: its
#: `max_frame_bytes`, told to writers in its greeting).
MAX_FRAME = 256 * 1024 * 1024

Headers = list[tuple[str, bytes | None]]


class RelayClosedError(ConnectionError):
    """The other end of a relay connection closed it (or sent something that is not a frame)."""


def encode_headers(headers: list[tuple[str, str | bytes | None]]) -> list[list[str | None]]:
    out: list[list[str | None]] = []
    for name, value in headers:
        raw = value.encode() if isinstance(value, str) else value
        out.append([name, None if raw is None else raw.decode("latin-1")])
    return out


def decode_headers(raw: Any) -> Headers:
    return [(str(name), None if value is None else str(value).encode("latin-1")) for name, value in raw or ()]


def frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame's bytes."""
    data = json.dumps(head, separators=(",", ":")).encode()
    return _LENGTHS.pack(len(data), len(body)) + data + body


def send(sock: socket.socket, head: dict[str, Any], body: bytes = b"") -> None:
    sock.sendall(frame(head, body))


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise RelayClosedError("the relay connection was closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def lengths(prefix: bytes) -> tuple[int, int]:
    """(head length, body length) of a frame from its first LENGTHS_SIZE bytes."""
    head_len, body_len = _LENGTHS.unpack(prefix)
    return int(head_len), int(body_len)


def parse_head(data: bytes) -> dict[str, Any]:
    """A frame's head from its bytes; RelayClosedError when it is not a JSON object."""
    try:
        head = json.loads(data)
    except ValueError as e:
        raise RelayClosedError(f"a relay frame's head is not JSON: {e}") from None
    if not isinstance(head, dict):
        raise RelayClosedError("a relay frame's head is not a JSON object")
    return head


def receive(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """The next frame: (head, body); RelayClosedError when the connection ends or carries no frame."""
    head_len, body_len = lengths(_exactly(sock, _LENGTHS.size))
    if head_len + body_len > MAX_FRAME:
        raise RelayClosedError(f"a relay frame of {head_len + body_len} bytes is over the {MAX_FRAME}-byte limit")
    head = parse_head(_exactly(sock, head_len))
    return head, _exactly(sock, body_len) if body_len else b""


def greet(sock: socket.socket, topics: Topics) -> dict[str, Any]:
    """Open a relay connection for a deployment's topics; the relay's answer (`ok`, else `error`)."""
    try:
        send(sock, {"op": "hello", "proposals": topics.proposals, "replies": topics.replies})
    except OSError:
        # A relay that refuses the connection (it serves its maximum) answers and closes without reading the
        # greeting: its answer, already here, says why.
        try:
            return receive(sock)[0]
        except (OSError, RelayClosedError):
            pass
        raise
    return receive(sock)[0]


@dataclass
class Record:
    """A reply record as the relay forwarded it: what `deltacoord.writer.replies.Routing.route` reads."""

    _headers: Headers
    _value: bytes | None

    def headers(self) -> Headers:
        return self._headers

    def value(self) -> bytes | None:
        return self._value
