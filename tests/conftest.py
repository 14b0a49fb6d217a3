"""Shared fixtures: a real Kafka broker for every integration test.

`kafka_bootstrap` resolves, in order: `KAFKA_BOOTSTRAP_SERVERS`; a local JVM
broker from Maven Central jars (`coordinator.tooling.broker.LocalBroker`); a
testcontainers Kafka container when a Docker engine answers. With none of
them the run fails loudly: Kafka tests are never skipped.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator.tooling.broker import LocalBroker

HOW_TO_GET_A_BROKER = (
    "no Kafka broker for the tests. Either set KAFKA_BOOTSTRAP_SERVERS to a broker with transactions enabled, "
    "or install Java 17+ and Maven so the local broker can run (`deltacoord jars fetch kafka` then "
    "`deltacoord broker start`), or run a Docker engine for testcontainers."
)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def local_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker | None]:
    """The session's local JVM broker, or None when the broker is external."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield None
        return
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        yield None
        return
    broker = LocalBroker(home=tmp_path_factory.mktemp("kafka-broker"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(local_broker: LocalBroker | None) -> Iterator[str]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if local_broker is not None:
        info = local_broker.status()
        assert info is not None, "the local broker died"
        yield info.bootstrap_servers
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        container = (
            KafkaContainer()
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        )
        with container:
            yield container.get_bootstrap_server()
        return
    pytest.fail(HOW_TO_GET_A_BROKER, pytrace=False)


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Fresh topic / transactional-id names so tests never share state."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def table_dir(tmp_path: Path) -> Path:
    d = tmp_path / "table"
    d.mkdir()
    return d
