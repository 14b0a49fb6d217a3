"""The local broker's generated settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.tooling.broker import _cluster_id, broker_command, server_properties


def test_cluster_ids_never_start_with_a_dash() -> None:
    """An id starting with '-' is read as an option by the storage tool (1 in 64 random ids)."""
    ids = [_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_single_node_settings_allow_transactions(tmp_path: Path) -> None:
    props = dict(
        line.split("=", 1) for line in server_properties(19092, 19093, tmp_path).splitlines() if "=" in line
    )
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["log.dirs"] == str(tmp_path)


def test_the_local_broker_jvm_uses_c1_and_takes_extra_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELTACOORD_BROKER_JAVA_OPTS", raising=False)
    cmd = broker_command("java", "cp", "log4j2.yaml", "server.properties")
    assert "-XX:TieredStopAtLevel=1" in cmd and cmd[-2:] == ["kafka.Kafka", "server.properties"]
    monkeypatch.setenv("DELTACOORD_BROKER_JAVA_OPTS", "-XX:TieredStopAtLevel=4 -Xmx2g")
    cmd = broker_command("java", "cp", "log4j2.yaml", "server.properties")
    # Later JVM flags win: the user's options come after the defaults.
    assert cmd.index("-XX:TieredStopAtLevel=4") > cmd.index("-XX:TieredStopAtLevel=1")
    assert cmd.index("-Xmx2g") > cmd.index("-Xmx768m")
