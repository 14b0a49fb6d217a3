"""librdkafka's lines go through Python logging with repeats dropped, and an unreachable Kafka is one clear
line with exit code 2 from every CLI command that talks to Kafka (no broker is needed: nothing listens)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deltacoord.schemas.kafka_logs import RepeatFilter, kafka_config, kafka_logger

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
