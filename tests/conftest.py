"""Shared fixtures: a real Kafka broker and real object-storage servers for integration tests.

`kafka_bootstrap` resolves, in order: `KAFKA_BOOTSTRAP_SERVERS`; a local JVM
broker from Maven Central jars (`deltacoord.tooling.broker.LocalBroker`); a
testcontainers Kafka container when a Docker engine answers. With none of
them the run fails loudly: Kafka tests are never skipped.

`s3_server`, `azurite_server` and `gcs_server` start the project's local storage
servers (`deltacoord.tooling.storage_servers`) once per session; `s3_bucket`,
`azure_container` and `gcs_bucket` give each test a fresh bucket, and
`object_store_bucket` runs a test once per store. A server that cannot be
installed or started fails the test with how to fix it.

`table_place` runs a test once on a local directory and once on S3, and
`any_table_place` on each of local, S3, Azure and GCS: a `TablePlace` names the
test's tables, reads their `_delta_log` and gives the coordinator its
`table_roots` and storage options, so one test body serves every store.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from deltacoord.tooling.broker import LocalBroker
from deltacoord.tooling.ports import free_port
from deltacoord.tooling.storage_servers import (
    AzuriteServer,
    GcsServer,
    LocalStorageServer,
    S3Server,
    StorageServerError,
)

if TYPE_CHECKING:
    from deltacoord.storage.table import TableStorage

HOW_TO_GET_A_BROKER = (
    "no Kafka broker for the tests. Either set KAFKA_BOOTSTRAP_SERVERS to a broker with transactions enabled, "
    "or install Java 17+ and Maven so the local broker can run (`deltacoord jars fetch kafka` then "
    "`deltacoord broker start`), or run a Docker engine for testcontainers."
)


# -- markers -------------------------------------------------------------------------------------

ROOMS = ("kafka", "spark", "storage", "cluster")
"""What a test may need besides Python: `make check` runs the tests that need none of them, plus `check` ones."""

_KAFKA_FIXTURES = frozenset({"kafka_bootstrap", "local_broker"})
_STORAGE_FIXTURES = frozenset({"s3_server", "azurite_server", "gcs_server", "s3_bucket", "azure_container",
                               "gcs_bucket", "object_store_bucket", "any_table_place"})


def _needs_storage(item: pytest.Item, names: set[str]) -> bool:
    if names & _STORAGE_FIXTURES:
        return True
    callspec = getattr(item, "callspec", None)
    return "table_place" in names and callspec is not None and callspec.params.get("table_place") != "local"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with the rooms its fixtures need, so `-m "not kafka"` and `make check` can trust the
    markers; a test that needs a room without its fixture (a subprocess that starts its own broker, a Spark
    session) carries the marker itself."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        if _needs_storage(item, names):
            item.add_marker(pytest.mark.storage)
        group = _process_group(item, names)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _process_group(item: pytest.Item, names: set[str]) -> str | None:
    """Which tests `make test` (pytest-xdist, `--dist loadgroup`) keeps in one test process: the cluster tests
    share one three-broker cluster, the tests that take the `spark` fixture one Spark session (a JVM of 1-2 GB:
    one per process would fill two cores with JVM start-ups), and `make check`'s tests of the other rooms one
    broker and one set of storage servers. Every other test goes wherever a process is free."""
    if item.get_closest_marker("cluster"):
        return "cluster"
    if item.get_closest_marker("spark") and "spark" in names:
        return "spark"  # a Spark test that starts its own driver process, or none, goes anywhere
    if item.get_closest_marker("check"):
        return "rooms"
    return None


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
    # Tests restart it: on a port nothing asks for by number, never 19092, which another test's broker may take
    # while it is down (its clients would then reach that other cluster: "reports different ClusterId").
    broker.start(port=free_port())
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
_SERVER_FIXTURES = {"s3": "s3_server", "azure": "azurite_server", "gcs": "gcs_server"}


@pytest.fixture(params=list(_BUCKET_FIXTURES))
def object_store_bucket(request: pytest.FixtureRequest) -> StoreBucket:
    """A fresh bucket on each local store in turn (the test runs once per store)."""
    bucket: StoreBucket = request.getfixturevalue(_BUCKET_FIXTURES[request.param])
    return bucket


@dataclass(frozen=True)
class TablePlace:
    """Where a test keeps its tables: a local directory, or a fresh bucket on a local storage server."""

    kind: str  # "local", "s3", "azure" or "gcs"
    root: str  # the directory, or the bucket's URI
    storage_options: dict[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    def uri(self, name: str) -> str:
        """The location of the table `name` (a path for a local place)."""
        return str(Path(self.root) / name) if self.is_local else f"{self.root}/{name}"

    def of(self, path: Path) -> str:
        """A test's local table path (`tmp_path / "t"`), moved to this place (unique per test directory)."""
        return str(path) if self.is_local else f"{self.root}/{path.parent.name}/{path.name}"

    def table_id(self, uri: str) -> str:
        """What `deltacoord.writer.table.Table` uses as the table's id by default."""
        from deltacoord.storage.table import normalize_table_uri

        return Path(uri).resolve().as_uri() if self.is_local else normalize_table_uri(uri)

    def storage(self, uri: str) -> TableStorage:
        from deltacoord.storage.table import TableStorage

        return TableStorage(uri, self.storage_options, fsync=False)

    def commit_key(self, version: int) -> str:
        return f"_delta_log/{version:020d}.json"

    def exists(self, uri: str, key: str) -> bool:
        return self.storage(uri).exists(key)

    def read(self, uri: str, key: str) -> bytes:
        return self.storage(uri).get(key)

    def delta_table(self, uri: str, version: int | None = None) -> Any:
        """delta-rs's view of the table (with the same storage options)."""
        from deltalake import DeltaTable

        return DeltaTable(uri, version=version, storage_options=self.storage_options or None)

    def delta_tables(self, uri: str, versions: Iterable[int]) -> Iterator[tuple[int, Any]]:
        """(version, delta-rs table at it) for ascending `versions`: a fresh load each on a local place, one
        table moved forward (`load_as_version`, which reads only the commits in between) on an object store."""
        if self.is_local:
            for v in versions:
                yield v, self.delta_table(uri, v)
            return
        dt: Any = None
        for v in versions:
            if dt is None:
                dt = self.delta_table(uri, v)
            else:
                dt.load_as_version(v)
            yield v, dt

    @property
    def coordinator_settings(self) -> dict[str, Any]:
        """`CoordinatorSettings` fields that let a coordinator serve this place (nothing for a local one)."""
        if self.is_local:
            return {}
        return {"table_roots": (self.root,), "storage_options": dict(self.storage_options)}

    @property
    def coordinator_args(self) -> list[str]:
        """The same as `coordinator run` flags."""
        if self.is_local:
            return []
        args = ["--table-roots", self.root]
        for k, v in self.storage_options.items():
            args += ["--storage-option", f"{k}={v}"]
        return args


def make_place(request: pytest.FixtureRequest, kind: str, directory: Path) -> TablePlace:
    """A place of `kind`: `directory` itself for "local", else a fresh bucket on that local server."""
    if kind == "local":
        return TablePlace("local", str(directory))
    server: StoreServer = request.getfixturevalue(_SERVER_FIXTURES[kind])
    bucket = server.new_bucket()
    return TablePlace(kind, bucket.root, dict(bucket.storage_options))


@pytest.fixture(params=["local", "s3"])
def table_place(request: pytest.FixtureRequest, tmp_path: Path) -> TablePlace:
    """The test runs with its tables in a local directory, then in a bucket of the local S3 server."""
    return make_place(request, request.param, tmp_path)


@pytest.fixture(params=["local", "s3", "azure", "gcs"])
def any_table_place(request: pytest.FixtureRequest, tmp_path: Path) -> TablePlace:
    """The test runs on a local directory, S3 (versitygw), Azure (Azurite) and GCS (fake-gcs-server)."""
    return make_place(request, request.param, tmp_path)
