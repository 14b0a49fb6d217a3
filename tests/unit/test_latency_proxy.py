"""The latency proxy passes every byte through, in order, and adds its round trip to each exchange."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from deltacoord.tooling.latency_proxy import LatencyProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address  # type: ignore[misc]
    finally:
        server.shutdown()
        server.server_close()


def _exchange(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port)) as s:
        start = time.monotonic()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            assert chunk, "the proxy closed the connection early"
            got += chunk
        return got, time.monotonic() - start


def test_every_byte_arrives_in_order_after_the_round_trip(echo: tuple[str, int]) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: many chunks each way
    with LatencyProxy(echo, round_trip_ms=100) as proxy:
        got, elapsed = _exchange(proxy.port, payload)
        assert got == payload
        assert elapsed >= 0.095  # at least the injected round trip (a lower bound: a busy machine only adds)
        small, again = _exchange(proxy.port, b"ping")
        assert small == b"ping" and again >= 0.095


def test_exchanges_in_flight_at_once_overlap() -> None:
    """Eight clients at once are all in flight together: the proxy delays, it does not queue. The server behind
    it answers nobody until all eight requests have reached it, which a proxy passing one exchange at a time
    never lets happen (a structural check: elapsed times on a shared machine prove nothing)."""
    arrived = threading.Barrier(8 + 1)

    class _AnswerWhenAllArrived(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data = self.request.recv(65536)
            arrived.wait(60)
            self.request.sendall(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _AnswerWhenAllArrived)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with LatencyProxy(server.server_address, round_trip_ms=200) as proxy:  # type: ignore[arg-type]
            results: list[float] = []
            threads = [threading.Thread(target=lambda: results.append(_exchange(proxy.port, b"x" * 100)[1]))
                       for _ in range(8)]
            for t in threads:
                t.start()
            arrived.wait(60)  # raises BrokenBarrierError if the eight never were in flight together
            for t in threads:
                t.join(60)
            assert len(results) == 8 and min(results) >= 0.19
    finally:
        server.shutdown()
        server.server_close()


def test_a_negative_round_trip_is_refused() -> None:
    with pytest.raises(ValueError, match="round_trip_ms"):
        LatencyProxy(("127.0.0.1", 1), round_trip_ms=-1)
