"""`/healthz` tells the truth, and a stop that leaves ratified versions unpublished says so in its exit code.

* In group mode `/healthz` answered 200 about 2 s after start, while the
  coordinator was still rebuilding its partitions; it now answers 503 until
  every assigned partition is recovered.
* When transactions keep failing while proposals wait, the loop still ticked
  and `/healthz` stayed 200; it now turns 503 with the reason.
* SIGTERM with a dead publisher exited 0; it now exits 6.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from deltacoord.coordinator import faults
from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.kafka import partition as partition_module
from deltacoord.coordinator.kafka.daemon import EXIT_OK, EXIT_UNPUBLISHED, Coordinator
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.writer.table import Table
from tests.integration.coord_harness import (
    coordinator_thread,
    fresh_topics,
    harness_settings,
    start_coordinator_process,
)

SCHEMA = pa.schema([("id", pa.int64())])


def _healthz(coord: Coordinator) -> tuple[int, dict[str, Any]]:
    assert coord._server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{coord._server.port}/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait(cond: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_group_mode_healthz_is_503_until_every_assigned_partition_is_recovered(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    entered, release = threading.Event(), threading.Event()
    rebuild = partition_module.recover_partition

    def held(*args: Any, **kwargs: Any) -> Any:
        """Recovery as it is, held at its start until the test has looked at /healthz."""
        entered.set()
        release.wait(600)  # set once the test has looked (or at its end)
        return rebuild(*args, **kwargs)

    monkeypatch.setattr(partition_module, "recover_partition", held)
    coord = Coordinator(harness_settings(kafka_bootstrap, topics), publish_fsync=False, metrics_port=0)  # group mode
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.setdefault("code", coord.run()), daemon=True)
    t.start()
    try:
        assert entered.wait(180), ("the coordinator did not start recovering its partitions within 180 s (group join "
                                   f"first): thread alive {t.is_alive()}, health {coord.health()[1]}")
        code, body = _healthz(coord)
        assert code == 503, body
        assert not body["ok"] and not body["ready"]
        assert any("recovering partitions" in r for r in body["reasons"]), body
        release.set()
        _wait(lambda: _healthz(coord)[0] == 200, "/healthz 200 after recovery")
        code, body = _healthz(coord)
        assert body["ok"] and body["ready"] and body["partitions"] == [0, 1] and "reasons" not in body
    finally:
        release.set()
        coord.stop_event.set()
        t.join(60)
    assert result["code"] == EXIT_OK


def test_healthz_turns_503_when_decisions_stall_while_proposals_wait(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, partitions=[0], metrics_port=0,
                            settings_overrides={"stall_timeout_s": 2.0}) as coord, \
            Table(tmp_path / "t", kafka_bootstrap, topics=topics, decision_timeout_s=180,
                  coordinator_check=False) as t:  # a static coordinator joins no group: the writers' check for one cannot see it
        t.create(SCHEMA)
        assert _healthz(coord)[0] == 200
        results: list[int] = []
        try:
            # Every transaction from now on fails (as with a broker that keeps refusing): nothing is
            # decided while the append waits; the loop itself keeps running.
            faults.arm("before_kafka_commit:1:failing")
            writer = threading.Thread(target=lambda: results.append(t.append(pa.table({"id": [1]}, schema=SCHEMA)).version))
            writer.start()
            _wait(lambda: _healthz(coord)[0] == 503, "/healthz 503 while decisions stall")
            code, body = _healthz(coord)
            assert code == 503, body
            stalled = [r for r in body["reasons"] if r.startswith("decisions stalled")]
            assert stalled and "partition 0" in stalled[0] and "injected fault" in stalled[0], body
            assert body["ready"] and not body["fenced"]
            # Stalled decisions are a liveness matter too (a restart may cure them): /livez says 503 as well.
            assert coord._server is not None
            with pytest.raises(urllib.error.HTTPError) as live:
                urllib.request.urlopen(f"http://127.0.0.1:{coord._server.port}/livez", timeout=10)
            assert live.value.code == 503 and json.loads(live.value.read())["live"] is False
        finally:
            faults.arm(None)
        writer.join(180)
        assert results == [1], "the waiting append commits once transactions succeed again"
        _wait(lambda: _healthz(coord)[0] == 200, "/healthz 200 once decisions flow")


@pytest.mark.parametrize("fault", ["fail", "latefail"])
@pytest.mark.parametrize("mode", ["static", "group"])
def test_sigterm_with_unpublished_versions_exits_6(kafka_bootstrap: str, tmp_path: Path, mode: str, fault: str) -> None:
    """In group mode too: leaving the group on a stop does not drop what this coordinator still has to publish.

    `latefail`: the publication fails 2 s after it starts, so the halt arises while the SIGTERM'd
    coordinator drains its publisher, after its loop's last turn: it is still recorded before the exit."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    assignment = ("--partitions", "0") if mode == "static" else ()
    # Publishing version 1 fails on an unexpected error: the table halts (persisted), version 1 is
    # ratified and acknowledged, and stays unpublished.
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, *assignment,
                                      env={"DELTACOORD_FAULT": f"publish:2:{fault}"})
    try:
        # wait="ratified": version 1 is ratified but its publication fails (the point of this test).
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120, wait="ratified",
                   coordinator_check=mode != "static") as t:  # the writers' check cannot see static coordinators
            t.create(SCHEMA)
            assert t.append(pa.table({"id": [1]}, schema=SCHEMA)).version == 1
        log1 = (path / "_delta_log" / f"{1:020d}.json")
        assert not log1.exists()
        first.kill(signal.SIGTERM)
    finally:
        if first.alive():
            first.kill()
    assert first.proc.returncode == EXIT_UNPUBLISHED, first.log.read_text(errors="replace")[-3000:]
    assert "ratified versions not in _delta_log" in first.log.read_text(errors="replace")

    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, *assignment)
    try:
        _wait(lambda: "coordinator ready" in second.log.read_text(errors="replace"), "the second coordinator")
        assert not log1.exists(), "the halt survives the restart"
        prefix = topics.proposals.removesuffix(".proposals")
        resumed = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "table", "resume", str(path),
                                  "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix],
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        _wait(log1.exists, "the next owner to publish version 1 once the table is resumed")
        second.kill(signal.SIGTERM)
    finally:
        if second.alive():
            second.kill()
    assert second.proc.returncode == EXIT_OK, second.log.read_text(errors="replace")[-3000:]
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    assert_verified(verify_table(settings, path.as_uri(), path.resolve().as_uri()))
