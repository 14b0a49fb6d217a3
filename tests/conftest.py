"""Shared fixtures: a real Kafka broker and real object-storage servers for integration tests.

`kafka_bootstrap` resolves, in order: `KAFKA_BOOTSTRAP_SERVERS`; a local JVM
broker from Maven Central jars (`coordinator.tooling.broker.LocalBroker`); a
testcontainers Kafka container when a Docker engine answers. With none of
them the run fails loudly: Kafka tests are never skipped.

`s3_server`, `azurite_server` and `gcs_server` start the project's local storage
servers (`coordinator.tooling.storage_servers`) once per session; `s3_bucket`,
`azure_container` and `gcs_bucket` give each test a fresh bucket, and
`object_store_bucket` runs a test once per store. A server that cannot be
installed or started fails the test with how to fix it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coordinator.tooling.broker import LocalBroker
from coordinator.tooling.storage_servers import (
    AzuriteServer,
    GcsServer,
    LocalStorageServer,
    S3Server,
    StorageServerError,
)

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


# -- object storage -------------------------------------------------------------------------------

HOW_TO_GET_STORAGE_SERVERS = (
    "run `make servers` (it builds versitygw and fake-gcs-server with Go 1.26+ and installs Azurite with "
    "Node.js 20+/npm into ~/.cache/deltacoord/storage-servers), then rerun the tests; the server's log is named above"
)


@dataclass(frozen=True)
class StoreBucket:
    """A fresh bucket (or container) on a local server: where a test may put tables."""

    kind: str
    name: str
    root: str
    storage_options: dict[str, str]

    def table_uri(self, name: str) -> str:
        return f"{self.root}/{name}"


@dataclass
class StoreServer:
    """A running local storage server, as the session fixtures yield it."""

    kind: str
    scheme: str
    endpoint: str
    storage_options: dict[str, str]
    server: LocalStorageServer = field(repr=False)

    def new_bucket(self) -> StoreBucket:
        name = f"t{uuid.uuid4().hex[:16]}"
        try:
            self.server.create_bucket(name)
        except StorageServerError as e:
            pytest.fail(f"creating bucket {name} on the local {self.kind} server failed: {e}", pytrace=False)
        return StoreBucket(self.kind, name, f"{self.scheme}://{name}", dict(self.storage_options))


def _storage_server(server: LocalStorageServer, scheme: str) -> Iterator[StoreServer]:
    try:
        info = server.start(die_with_parent=True)
    except StorageServerError as e:
        pytest.fail(f"the local {server.kind} storage server is unavailable: {e}\nTo fix: {HOW_TO_GET_STORAGE_SERVERS}",
                    pytrace=False)
    try:
        yield StoreServer(server.kind, scheme, info.endpoint, dict(info.storage_options), server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    """versitygw: S3 with enforced `If-None-Match: *`."""
    yield from _storage_server(S3Server(home=tmp_path_factory.mktemp("s3-server")), "s3")


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    """Azurite's blob service: Azure Blob Storage / ADLS Gen2."""
    yield from _storage_server(AzuriteServer(home=tmp_path_factory.mktemp("azurite")), "az")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    """fake-gcs-server with XML-API uploads: GCS with `ifGenerationMatch=0`."""
    yield from _storage_server(GcsServer(home=tmp_path_factory.mktemp("gcs-server")), "gs")


@pytest.fixture
def s3_bucket(s3_server: StoreServer) -> StoreBucket:
    return s3_server.new_bucket()


@pytest.fixture
def azure_container(azurite_server: StoreServer) -> StoreBucket:
    return azurite_server.new_bucket()


@pytest.fixture
def gcs_bucket(gcs_server: StoreServer) -> StoreBucket:
    return gcs_server.new_bucket()


_BUCKET_FIXTURES = {"s3": "s3_bucket", "azure": "azure_container", "gcs": "gcs_bucket"}


@pytest.fixture(params=list(_BUCKET_FIXTURES))
def object_store_bucket(request: pytest.FixtureRequest) -> StoreBucket:
    """A fresh bucket on each local store in turn (the test runs once per store)."""
    bucket: StoreBucket = request.getfixturevalue(_BUCKET_FIXTURES[request.param])
    return bucket
