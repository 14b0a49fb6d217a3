"""The chaos run's relay and store faults, one at a time, against the real relay, broker and S3 server.

* A store outage: the S3 server stops with a commit staged; the coordinator cannot check the version it
  would ratify and refuses the proposal (STORAGE_UNAVAILABLE, retryable), and the writer is told that
  refusal, not a storage error from cleaning up files it cannot reach. Restarted on the same port and
  data, the table takes the next commit and delta-rs reads every acknowledged row.
* A relay SIGKILL: a new relay serves the same socket.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltacoord.coordinator.kafka import batch_checks
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import Topics
from deltacoord.storage.table import TableStorage
from deltacoord.tooling.storage_servers import S3Server
from deltacoord.writer import staging
from deltacoord.writer.relay import relay_counts
from deltacoord.writer.table import Table
from tests.history.services import RelayProcess, StoreOutage, relay_socket_path
from tests.integration.coord_harness import coordinator_thread, fresh_topics

pytestmark = [pytest.mark.kafka, pytest.mark.storage]

SCHEMA = pa.schema([("id", pa.int64())])


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


@contextlib.contextmanager
def _table_on_a_store(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[StoreOutage, Table, dict[str, str]]]:
    """A created table in a bucket of a local S3 server that can be stopped and restarted, its coordinator running."""
    server = S3Server(home=tmp_path / "s3")
    server.start(die_with_parent=True)
    store = StoreOutage(server)
    try:
        bucket = f"outage-{uuid.uuid4().hex[:12]}"
        server.create_bucket(bucket)
        options = dict(store.info.storage_options)
        topics = fresh_topics(kafka_bootstrap)
        with coordinator_thread(kafka_bootstrap, topics, table_roots=(f"s3://{bucket}",), storage_options=options), \
                Table(f"s3://{bucket}/t", kafka_bootstrap, topics=topics, storage_options=options) as t:
            t.create(SCHEMA)
            yield store, t, options
    finally:
        server.stop()


def _ids(t: Table, options: dict[str, str]) -> list[int]:
    return sorted(DeltaTable(t.uri, storage_options=options).to_pyarrow_table().column("id").to_pylist())


def test_a_commit_during_a_store_outage_is_refused_as_retryable_and_the_store_returns_with_its_data(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store is asked before every ratification (otherwise, within 2 s of publishing version 1, the commit
    # would be ratified and published once the store is back: the next test).
    monkeypatch.setattr(batch_checks, "FREE_AFTER_OWN_PUT_S", 0.0)
    with _table_on_a_store(kafka_bootstrap, tmp_path) as (store, t, options):
        t.append(_rows(1))
        tx = t.begin()
        tx.stage(staging.write_data_files(t.storage, _rows(2), []))
        staged = [a.path for a in tx.staged]
        port = store.info.port
        store.stop()
        with pytest.raises(InvalidProposalError) as refused:
            tx.commit("WRITE")
        assert refused.value.reason == ReasonCode.STORAGE_UNAVAILABLE, refused.value
        store.restart()
        assert store.info.port == port
        assert t.append(_rows(3)).version == 2
        left = TableStorage(t.uri, options, fsync=False)
        assert all(left.exists(p) for p in staged), "the file staged for the refused proposal is still there"
        assert _ids(t, options) == [1, 3]


def test_a_commit_just_after_a_publication_during_a_store_outage_is_published_once_the_store_returns(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Within moments of publishing version 1 the coordinator takes version 2 as free without asking the store: a
    commit proposed as the store goes down is ratified, its writer (waiting for publication) waits, and the version
    is published once the store is back. Nothing acknowledged is invisible, nothing is lost."""
    with _table_on_a_store(kafka_bootstrap, tmp_path) as (store, t, options):
        tx = t.begin()
        tx.stage(staging.write_data_files(t.storage, _rows(2), []))
        assert t.append(_rows(1)).version == 1
        store.stop()
        committed: list[int] = []
        failed: list[BaseException] = []

        def commit() -> None:
            try:
                committed.append(tx.commit("WRITE").version)
            except BaseException as e:  # reported below
                failed.append(e)

        writer = threading.Thread(target=commit)
        writer.start()
        writer.join(3.0)
        assert writer.is_alive() and not committed and not failed, (committed, failed)
        store.restart()
        writer.join(120)
        assert not writer.is_alive() and not failed, failed
        assert committed == [2]
        assert _ids(t, options) == [1, 2]


def test_a_relay_sigkilled_is_served_again_on_the_same_socket(kafka_bootstrap: str, tmp_path: Path) -> None:
    """`RelayProcess.start` returns once the relay answers on its socket: after a SIGKILL (which leaves the
    socket file) a new process serves the same path. Writers through a restarted relay: tests/integration/test_relay.py."""
    topics: Topics = fresh_topics(kafka_bootstrap)
    relay = RelayProcess(kafka_bootstrap, topics, relay_socket_path(), tmp_path / "relay.log")
    relay.start()
    try:
        first = relay.proc
        relay.kill()
        assert first is not None and first.returncode == -9 and not relay.alive()
        assert Path(relay.socket_path).exists()  # a dead relay leaves its socket file
        with pytest.raises(OSError):
            relay_counts(relay.socket_path, topics, timeout_s=5)
        relay.start()
        assert relay.alive() and relay.proc is not first and relay.starts == 2
        assert relay_counts(relay.socket_path, topics)["proposals"] == 0  # a fresh process
    finally:
        relay.stop()
