"""The listening-port chooser keeps out of the range outgoing connections take their local ports from."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from deltacoord.tooling import ports


def test_a_chosen_port_is_free_and_below_the_ephemeral_range() -> None:
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert 20000 <= port < low
        with socket.socket() as s:
            # As the servers bind (the JVM, Go and Node set it): a port some closed connection left in TIME_WAIT
            # is free for a listener.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.free_port()))
        s.listen()
        assert not ports.port_free(s.getsockname()[1])


def test_a_machine_whose_range_leaves_no_room_gets_a_port_from_the_os(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "_RANGE_FILE", tmp_path / "range")
    assert ports.port_free(ports.free_port())
