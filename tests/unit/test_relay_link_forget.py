"""A writer tells its relay which proposals it forgot: with its next proposal when the relay says it takes
them so, one frame per id to a relay that does not (an older relay)."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from typing import Any

import pytest

from deltacoord.schemas.routing import Topics
from deltacoord.writer import relay_wire
from deltacoord.writer.relay_link import FORGET_BATCH, RelayLink


class WireRelay:
    """The relay's side of the socket, at the frame level only: it greets and records what the writer sends."""

    def __init__(self, hello: dict[str, Any]) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"dc-link-{uuid.uuid4().hex[:10]}.sock")
        self.frames: list[dict[str, Any]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(1)
        self._hello = hello
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        conn.settimeout(30)
        with conn:
            relay_wire.receive(conn)
            relay_wire.send(conn, {"op": "hello", "ok": True, "partitions": 1, "reply_partition": 0, **self._hello})
            try:
                while True:
                    self.frames.append(relay_wire.receive(conn)[0])
            except (OSError, relay_wire.RelayClosedError):
                return

    def received(self) -> list[dict[str, Any]]:
        self._thread.join(30)
        assert not self._thread.is_alive()
        self._server.close()
        os.unlink(self.path)
        return [{k: v for k, v in f.items() if k in ("op", "pid", "pids", "forget")} for f in self.frames]


def _forget_then_propose(relay: WireRelay, forgotten: int) -> list[dict[str, Any]]:
    link = RelayLink(relay.path, Topics.with_prefix("t"))
    for i in range(forgotten):
        link.forget(f"f{i}")
    link.produce("p", "t.proposals", 0, b"k", b"v", [])
    link.close()
    return relay.received()


def test_forgotten_ids_travel_with_the_next_proposal() -> None:
    frames = _forget_then_propose(WireRelay({"forget_pids": True}), 2)
    assert frames == [{"op": "propose", "pid": "p", "forget": ["f0", "f1"]}]


def test_many_forgotten_ids_are_sent_without_waiting_for_a_proposal() -> None:
    frames = _forget_then_propose(WireRelay({"forget_pids": True}), FORGET_BATCH + 1)
    assert frames == [{"op": "forget", "pids": [f"f{i}" for i in range(FORGET_BATCH)]},
                      {"op": "propose", "pid": "p", "forget": [f"f{FORGET_BATCH}"]}]


@pytest.mark.parametrize("hello", [{}, {"forget_pids": False}], ids=["older relay", "refused"])
def test_a_relay_that_does_not_take_them_so_hears_of_each_at_once(hello: dict[str, Any]) -> None:
    frames = _forget_then_propose(WireRelay(hello), 2)
    assert frames == [{"op": "forget", "pid": "f0"}, {"op": "forget", "pid": "f1"}, {"op": "propose", "pid": "p"}]
