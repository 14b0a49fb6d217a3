"""`/healthz` is not ready, with the reason, while a table cannot publish or Kafka cannot be reached (issue 36).

Before: with one table's `_delta_log` unwritable (or its store stopped) `/healthz` stayed 200 with no reason,
only `deltacoord_publish_lag_versions` moved; with the broker down it stayed 200 too. Now both turn it 503
(`ready` false) with a reason naming the table and its error, or Kafka, after `publish_failing_s` /
`kafka_unreachable_s`; `/livez` stays 200 (a restart cures neither), and both come back once the cause is gone.

The tests run as root, where chmod does not stop writes: the table's `_delta_log` is swapped for a regular file
of the same name (as in test_publish_faults), so every publication of the table fails for real. Kafka is a
dedicated broker of this test, killed and started again on its port.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.schemas.routing import Topics
from deltacoord.tooling.broker import LocalBroker
from deltacoord.tooling.ports import free_port
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics, harness_settings

SCHEMA = pa.schema([("id", pa.int64())])


def _get(coord: Coordinator, path: str) -> tuple[int, dict[str, Any]]:
    assert coord._server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{coord._server.port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_table_that_cannot_publish_makes_healthz_not_ready_naming_it_until_fixed(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    bad_root, good_root = (tmp_path / "bad").resolve(), (tmp_path / "good").resolve()
    with coordinator_thread(kafka_bootstrap, topics, metrics_port=0, settings_overrides={"publish_failing_s": 2.0}) as coord, \
            Table(bad_root, kafka_bootstrap, topics=topics, wait="ratified") as bad, \
            Table(good_root, kafka_bootstrap, topics=topics) as good:
        bad.create(SCHEMA)
        good.create(SCHEMA)
        bad.append(pa.table({"id": [0]}))
        bad.wait_published(1, 30)
        _wait(lambda: _get(coord, "/healthz")[0] == 200, "/healthz 200 with every table published")
        log_dir = bad_root / "_delta_log"
        os.rename(log_dir, bad_root / "_delta_log.away")
        log_dir.write_bytes(b"not a directory")
        try:
            assert bad.append(pa.table({"id": [1]})).version == 2  # decided; its publication fails
            _wait(lambda: _get(coord, "/healthz")[0] == 503, "/healthz 503 while the table cannot publish", 60)
            code, body = _get(coord, "/healthz")
            assert code == 503 and body["ok"] is False and body["ready"] is False, body
            failing = [r for r in body["reasons"] if r.startswith("publication failing")]
            assert len(failing) == 1 and bad.table_id in failing[0] and "version 2" in failing[0], body["reasons"]
            assert "NotADirectoryError" in failing[0] or "FileExistsError" in failing[0], failing[0]
            assert set(body["publish_failing"]) == {bad.table_id}, body
            assert body["publish_failing"][bad.table_id]["version"] == 2, body
            assert good.table_id not in str(body["reasons"])
            # Not a reason to restart: liveness stays 200 with the same body.
            live_code, live = _get(coord, "/livez")
            assert live_code == 200 and live["live"] is True and live["ready"] is False, live
            # The other table keeps committing and publishing meanwhile (a default commit waits for _delta_log).
            assert good.append(pa.table({"id": [7]})).version == 1
            assert (good_root / "_delta_log" / f"{1:020d}.json").exists()
        finally:
            log_dir.unlink()
            os.rename(bad_root / "_delta_log.away", log_dir)
        # Fixed: the retries (backoff <= 5 s) publish the version and readiness comes back.
        bad.wait_published(2, 60)
        _wait(lambda: _get(coord, "/healthz")[0] == 200, "/healthz 200 once the table publishes again", 60)
        code, body = _get(coord, "/healthz")
        assert code == 200 and body["ready"] is True and body["publish_failing"] == {} and "reasons" not in body, body


def test_kafka_unreachable_makes_healthz_not_ready_until_the_broker_is_back(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker")
    info = broker.start(port=free_port())
    try:
        topics = fresh_topics(info.bootstrap_servers)
        with coordinator_thread(info.bootstrap_servers, topics, metrics_port=0,
                                settings_overrides={"kafka_unreachable_s": 2.0}) as coord:
            _wait(lambda: _get(coord, "/healthz")[0] == 200, "/healthz 200 with the broker up")
            assert coord.kafka_reachability.unreachable_for() is None
            broker.kill()

            def kafka_reason() -> bool:
                code, body = _get(coord, "/healthz")
                return code == 503 and any(r.startswith("Kafka unreachable") for r in body.get("reasons", ()))

            _wait(kafka_reason, "/healthz 503 with a Kafka reason while the broker is down", 60)
            code, body = _get(coord, "/healthz")
            assert code == 503, body
            reason = next(r for r in body["reasons"] if r.startswith("Kafka unreachable"))
            assert body["ready"] is False and f"127.0.0.1:{info.port}" in reason, reason
            assert body["live"] is True, body  # a restart would not bring the broker back
            assert broker.start().port == info.port
            _wait(lambda: _get(coord, "/healthz")[0] == 200, "/healthz 200 once the broker is back", 120)
            code, body = _get(coord, "/healthz")
            assert code == 200 and body["ready"] is True and "reasons" not in body, body
    finally:
        broker.stop()


def test_a_coordinator_started_before_its_broker_waits_for_it_and_serves_once_it_is_up(tmp_path: Path) -> None:
    """Started while no broker answers (a cluster still starting, or losing a node under a busy machine), the
    coordinator keeps asking about its topics instead of exiting 1 on the first admin request that times out (seen
    in the three-broker history run: `describe_configs(...).result(30)` raised TimeoutError at startup)."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    topics = Topics.with_prefix(f"t{uuid.uuid4().hex[:8]}")
    coord = Coordinator(harness_settings(bootstrap, topics), publish_fsync=False)
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.setdefault("code", coord.run()), daemon=True)
    t.start()
    broker = LocalBroker(tmp_path / "broker")
    try:
        time.sleep(35)  # beyond the 30 s a first metadata request waits before it fails
        assert t.is_alive() and not coord.ready, f"with no broker the coordinator stopped ({result}) or claimed ready"
        broker.start(port=port)
        _wait(lambda: coord.ready, "the coordinator ready once its broker is up", 120)
        with Table(str(tmp_path / "t"), bootstrap, topic_prefix=topics.proposals.removesuffix(".proposals")) as table:
            table.create(SCHEMA)
            assert table.append(pa.table({"id": [1]})).version == 1
    finally:
        coord.stop_event.set()
        t.join(60)
        broker.stop()
    assert result.get("code") == 0, result
