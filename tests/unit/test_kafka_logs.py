"""librdkafka's lines go through Python logging with repeats dropped, and an unreachable Kafka is one clear
line with exit code 2 from every CLI command that talks to Kafka (no broker is needed: nothing listens)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deltacoord.schemas.kafka_logs import HANDSHAKE_PERSIST_S, RepeatFilter, kafka_config, kafka_logger, login_refusal

REPO = Path(__file__).resolve().parents[2]


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("deltacoord.kafka", logging.ERROR, __file__, 1, msg, None, None)


def test_repeats_are_dropped_then_counted() -> None:
    f = RepeatFilter(interval_s=3600)
    first = _record("FAIL [thrd:127.0.0.1:19092/bootstrap]: Connect to ipv4#127.0.0.1:19092 failed: refused (after 0ms)")
    assert f.filter(first)
    # The same message with other numbers (ports, client ids, times) is a repeat.
    for i in range(50):
        assert not f.filter(_record(f"FAIL [thrd:127.0.0.1:{19000 + i}/bootstrap]: Connect to ipv4#127.0.0.1:{19000 + i} "
                                    f"failed: refused (after {i}ms)"))
    assert f.filter(_record("another message"))
    f.interval_s = 0.0
    again = _record("FAIL [thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed: refused (after 0ms)")
    assert f.filter(again) and "and 50 more like it" in again.getMessage()


def test_every_client_config_routes_logs_to_the_kafka_logger() -> None:
    conf = kafka_config({"bootstrap.servers": "x:1"})
    assert conf["logger"] is kafka_logger() and conf["bootstrap.servers"] == "x:1"
    mine = logging.getLogger("app")
    assert kafka_config({"logger": mine})["logger"] is mine


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("argv", [
    ["table", "append", "{tmp}/t", "--json-rows", "-"],
    ["table", "create", "{tmp}/t", "--schema", "id:long"],
    ["tail", "{tmp}/t"],
    ["verify", "{tmp}/t"],
])
def test_unreachable_kafka_is_one_line_and_exit_code_2(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    bootstrap = f"127.0.0.1:{_closed_port()}"
    # A hang guard, not a timing assertion: before, these commands waited 30 to 60 s and printed hundreds of lines.
    r = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", *args, "--bootstrap-servers", bootstrap],
                       cwd=REPO, capture_output=True, text=True, input='{"id": 1}\n', timeout=25)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "rdkafka" not in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert f"cannot reach Kafka at {bootstrap}: connection refused" in lines[0]


_RESET = ("ssl://b1:9093/1: SSL handshake failed: Disconnected: SSL connection closed by peer: "
          "connecting to a PLAINTEXT broker listener? (after 1ms in state SSL_HANDSHAKE)")
_REFUSED = "ssl://b1:9093/1: Connect to ipv4#10.0.0.1:9093 failed: Connection refused (after 0ms in state CONNECT)"


def test_an_untrusted_certificate_or_a_refused_login_is_final_at_once() -> None:
    for why in ("ssl://b1:9093/1: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
                "sasl_ssl://b1:9094/1: SASL authentication error: Authentication failed during authentication"):
        assert login_refusal([(0.1, why)], start=0.0, now=0.1) == why


def test_a_reset_handshake_is_a_misconfiguration_only_when_nothing_else_is_heard_for_a_while() -> None:
    # A PLAINTEXT listener answers a TLS client with a reset, every time: after the persistence window, refused.
    resets = [(t / 10, _RESET) for t in range(40)]
    assert login_refusal(resets[:5], start=0.0, now=0.5) is None
    assert login_refusal(resets, start=0.0, now=HANDSHAKE_PERSIST_S + 0.1) == _RESET
    # librdkafka also words a cut-off handshake without "SSL handshake failed" (seen on a loaded machine).
    closed = "ssl://b1:9093/bootstrap: Disconnected: SSL connection closed by peer (after 1ms in state SSL_HANDSHAKE)"
    mixed = [(t / 10, _RESET if t % 2 else closed) for t in range(40)]
    assert login_refusal(mixed, start=0.0, now=HANDSHAKE_PERSIST_S + 0.1) == mixed[-1][1]
    # A broker shutting down resets the handshake too, then refuses connections: that is a restart, not a refusal
    # of this client's TLS (a coordinator restarted during a broker restart exited 2 on this before).
    restart = [(0.1, _RESET), (0.2, _REFUSED), *((t / 10, _RESET) for t in range(3, 40))]
    assert login_refusal(restart, start=0.0, now=HANDSHAKE_PERSIST_S + 0.1) is None
    assert login_refusal([], start=0.0, now=60.0) is None
