"""Tables on object storage end to end: every store, the door in front of the coordinator, VACUUM.

* delta-rs reads every version of a table written through the coordinator on
  each store (local, S3, Azure, GCS), checkpoints and `_last_checkpoint`
  included, and the newest version is found from `_last_checkpoint` plus a
  listing that starts at it;
* a proposal naming a table outside `table_roots`, or by a URI that is not a
  normal absolute location, is rejected with its reason code, and a listing of
  the store shows nothing written outside the roots; a table ratified before
  the roots excluded it is halted, not written, while the others go on;
* the writer deletes what it staged for a proposal it abandoned or that never
  reached Kafka;
* VACUUM deletes only unreferenced files older than the retention, on each store.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import list_log_from_hint, newest_commit_version
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol
from deltacoord.schemas.errors import ProposalNotSentError
from deltacoord.schemas.messages import Proposal
from deltacoord.storage.table import TableStorage
from deltacoord.writer import staging
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction
from deltacoord.writer.vacuum import VacuumRetentionError, vacuum
from tests.conftest import StoreBucket, StoreServer, TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string())])
HOUR_MS = 3_600_000


def rows(ids: list[int], date: str, value: str = "v") -> pa.Table:
    return pa.table({"id": ids, "date": [date] * len(ids), "value": [value] * len(ids)}, schema=SCHEMA)


def _data_keys(place: TablePlace, uri: str) -> set[str]:
    """The table's data files: not its log, nor the location's claim (`_deltacoord/table.json`, `deltacoord.reader.claim`)."""
    return {o.key for o in place.storage(uri).list() if not o.key.startswith(("_delta_log/", "_deltacoord/"))}


# --------------------------------------------------------------------------- every store


@pytest.mark.check
def test_every_version_reads_the_same_in_delta_rs_on_each_store(kafka_bootstrap: str, any_table_place: TablePlace) -> None:
    place = any_table_place
    topics = fresh_topics(kafka_bootstrap)
    uri = place.uri("events")
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint, **place.coordinator_settings) as coord, \
            Table(uri, kafka_bootstrap, topics=topics, storage_options=place.storage_options) as t:
        t.create(SCHEMA, partition_by=["date"], properties={"delta.checkpointInterval": "4"})
        for i in range(5):
            t.append(rows([i], f"2024-01-0{i % 2 + 1}"))                     # 1..5
        t.update("date = '2024-01-01'", {"value": "'u'"})                      # 6
        t.delete("id = 1")                                                     # 7
        t.merge(rows([2, 9], "2024-01-01", "m"), ["id"], when_matched_update="*", when_not_matched_insert="*")  # 8
        t.optimize()                                                           # 9
        assert coord.wait_published(60)
        log = place.storage(uri)

        def last_checkpoint() -> int:
            return int(json.loads(log.get("_delta_log/_last_checkpoint"))["version"]) if log.exists(
                "_delta_log/_last_checkpoint") else -1

        deadline = time.monotonic() + 60
        while last_checkpoint() < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert last_checkpoint() == 8 and log.exists(f"_delta_log/{8:020d}.checkpoint.parquet")

    # The newest version: `_last_checkpoint` and a listing that starts at version 8.
    listing = list_log_from_hint(log)
    assert listing.listed_from == 8 and sorted(listing.commits) == [8, 9] and listing.latest_version == 9
    assert newest_commit_version(log) == 9
    for v, theirs in place.delta_tables(uri, range(10)):
        ours = Snapshot.load(uri, version=v, storage_options=place.storage_options).to_pyarrow()
        key = sorted(ours.column_names)
        assert sorted(map(tuple, theirs.to_pyarrow_table().select(key).to_pylist()), key=repr) == \
            sorted(map(tuple, ours.select(key).to_pylist()), key=repr), f"version {v}"
    latest = Snapshot.load(uri, storage_options=place.storage_options)
    assert latest.version == 9 and sorted(latest.to_pyarrow().column("id").to_pylist()) == [0, 2, 3, 4, 9]
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    assert_verified(verify_table(settings, uri, place.table_id(uri), storage_options=place.storage_options))


# --------------------------------------------------------------------------- the door


def _create(table_uri: str) -> Proposal:
    pid = str(uuid.uuid4())
    md = Metadata(id=str(uuid.uuid4()), schema_string='{"type":"struct","fields":[{"name":"id","type":"long",'
                  '"nullable":true,"metadata":{}}]}')
    return Proposal(table_id=f"probe-{pid}", table_uri=table_uri, proposal_id=pid, read_version=-1,
                    operation="CREATE TABLE", changes_data=False, actions=(Protocol(1, 2), md),
                    commit_info=CommitInfo({"operation": "CREATE TABLE", "txnId": pid}))


def _local_files(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()}


def test_bad_and_outside_table_uris_are_refused_and_nothing_is_written_outside_the_roots(
        kafka_bootstrap: str, tmp_path: Path, s3_server: StoreServer) -> None:
    bucket = s3_server.new_bucket()
    name = bucket.name
    local = tmp_path / "lake"
    (local / "tables").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (local / "tables" / "escape").symlink_to(tmp_path / "elsewhere")  # a symlink inside the root pointing out
    roots = (f"s3://{name}/tables", str(local / "tables"))
    probes = {
        f"file://{local}/tables/a/../../escaped": "BAD_TABLE_URI",
        f"file://{local}/tables/%2e%2e/%2e%2e/escaped": "BAD_TABLE_URI",
        f"file://{local}/tables/a%2F..%2F..%2Fescaped": "BAD_TABLE_URI",
        f"{local}/tables/../escaped": "BAD_TABLE_URI",
        "tables/relative": "BAD_TABLE_URI",
        "": "BAD_TABLE_URI",
        f"{local}/tables/nul\x00byte": "BAD_TABLE_URI",
        f"{local}/elsewhere": "TABLE_OUTSIDE_ROOTS",
        f"{local}/tables/escape/t": "TABLE_OUTSIDE_ROOTS",
        f"s3://{name}/tables/../secrets": "BAD_TABLE_URI",
        f"s3://{name}/tables/%2e%2e/secrets": "BAD_TABLE_URI",
        f"s3://{name}/elsewhere/t": "TABLE_OUTSIDE_ROOTS",
        f"s3a://{name}/tables-sibling/t": "TABLE_OUTSIDE_ROOTS",
        f"s3://{name}-other/tables/t": "TABLE_OUTSIDE_ROOTS",
        f"gs://{name}/tables/t": "TABLE_OUTSIDE_ROOTS",
        f"abfss://{name}@account.dfs.core.windows.net/tables/t": "TABLE_OUTSIDE_ROOTS",
        "hdfs://namenode/tables/t": "BAD_TABLE_URI",
    }
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, table_roots=roots, storage_options=bucket.storage_options) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            futures = {uri: client.propose(_create(uri)) for uri in probes}
            decisions = {uri: f.result(60) for uri, f in futures.items()}
            for uri, reason in probes.items():
                d = decisions[uri]
                assert not d.committed and d.reason_code == reason, f"{uri!r}: {d.reason_code} {d.error_message}"
                assert d.error_message
            # Tables under the roots are served, on both stores.
            inside = [f"s3://{name}/tables/ok", str(local / "tables" / "ok")]
            for uri in inside:
                with Table(uri, kafka_bootstrap, topics=topics, client=client, storage_options=bucket.storage_options) as t:
                    t.create(SCHEMA)
                    t.append(rows([1], "d"))
            assert coord.wait_published(60)
            ok, health = coord.health()
            assert ok and not health["halted_tables"], health
        finally:
            client.close()
    # Nothing but the two tables inside the roots was written, anywhere.
    keys = {o.key for o in TableStorage(f"s3://{name}", bucket.storage_options).list()}
    assert keys and all(k.startswith("tables/ok/") for k in keys), sorted(keys)[:10]
    assert {k for k in keys if k.startswith("tables/ok/_delta_log/")} >= {
        f"tables/ok/_delta_log/{0:020d}.json", f"tables/ok/_delta_log/{1:020d}.json"}
    written = _local_files(tmp_path)
    assert written and all(f.startswith("lake/tables/ok/") for f in written), sorted(written)[:10]
    assert not (tmp_path / "escaped").exists() and not any((tmp_path / "elsewhere").iterdir())


def test_a_coordinator_without_roots_serves_no_object_store(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The CREATE for s3://bucket/t that used to be ratified and then kill the publisher is refused at the door."""
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            refused = client.commit(_create("s3://bucket/t"), 60)
            assert not refused.committed and refused.reason_code == "TABLE_OUTSIDE_ROOTS"
            assert "table_roots" in (refused.error_message or "")
            with Table(tmp_path / "t", kafka_bootstrap, topics=topics, client=client) as t:
                t.create(SCHEMA)
                t.append(rows([1], "d"))
            assert coord.wait_published(60) and coord.health()[0]
        finally:
            client.close()


def test_a_ratified_table_outside_new_roots_is_halted_not_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Roots narrowed after a table was created: the recovered table is halted (nothing written there), its
    proposals are refused at the door, and the tables inside the roots keep committing and publishing."""
    topics = fresh_topics(kafka_bootstrap)
    inside, outside = tmp_path / "tables" / "in", tmp_path / "old" / "out"
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        for path in (inside, outside):
            with Table(path, kafka_bootstrap, topics=topics) as t:
                t.create(SCHEMA)
                t.append(rows([1], "d"))
        assert coord.wait_published(60)
    # The old table's files go away; a coordinator confined to tables/ must not write them again.
    shutil.rmtree(outside)
    with coordinator_thread(kafka_bootstrap, topics, table_roots=(str(tmp_path / "tables"),)) as coord:
        with Table(inside, kafka_bootstrap, topics=topics) as t:
            assert t.append(rows([2], "d")).version == 2
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            old = outside.resolve().as_uri()
            pid = str(uuid.uuid4())
            refused = client.commit(Proposal(
                table_id=old, table_uri=old, proposal_id=pid, read_version=1, operation="WRITE", changes_data=True,
                actions=(AddFile("date=d/x.parquet", {"date": "d"}, 10, 0, True),),
                commit_info=CommitInfo({"operation": "WRITE", "txnId": pid})), 60)
        finally:
            client.close()
        assert not refused.committed and refused.reason_code == "TABLE_OUTSIDE_ROOTS"
        assert coord.wait_published(60)
        halted = coord.publisher.halted_tables()
        assert list(halted) == [outside.resolve().as_uri()] and "table_roots" in halted[outside.resolve().as_uri()]
    assert not outside.exists(), "nothing was written outside the roots"
    assert Snapshot.load(inside).version == 2


# --------------------------------------------------------------------------- the writer cleans up


def test_staged_files_of_abandoned_or_unsent_proposals_are_deleted(kafka_bootstrap: str, table_place: TablePlace,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    topics = fresh_topics(kafka_bootstrap)
    uri = table_place.uri("t")
    with coordinator_thread(kafka_bootstrap, topics, **table_place.coordinator_settings), \
            Table(uri, kafka_bootstrap, topics=topics, storage_options=table_place.storage_options) as t:
        t.create(SCHEMA, partition_by=["date"])
        t.append(rows([1], "2024-01-01"))
        before = _data_keys(table_place, uri)
        assert len(before) == 1
        # Abandoned: preparing the proposal fails after the files were staged.
        real = Transaction._proposal

        def broken(self: Transaction, *args: object, **kwargs: object) -> Proposal:
            assert len(self.staged) == 1 and _data_keys(table_place, uri) != before, "the file was staged"
            raise RuntimeError("the writer failed before proposing")

        monkeypatch.setattr(Transaction, "_proposal", broken)
        with pytest.raises(RuntimeError, match="before proposing"):
            t.append(rows([2], "2024-01-02"))
        monkeypatch.setattr(Transaction, "_proposal", real)
        assert _data_keys(table_place, uri) == before
        # Never sent: a proposal larger than the producer may send is refused before it reaches Kafka.
        tx = t.begin()
        tx.stage(staging.write_data_files(t.storage, rows([3], "2024-01-03"), ["date"]))
        assert len(_data_keys(table_place, uri)) == 2
        with pytest.raises(ProposalNotSentError):
            tx.commit("WRITE", parameters={"blob": "x" * 2_000_000})
        assert _data_keys(table_place, uri) == before
        assert t.append(rows([4], "2024-01-04")).version == 2


# --------------------------------------------------------------------------- VACUUM


def test_vacuum_on_each_store(kafka_bootstrap: str, any_table_place: TablePlace) -> None:
    place = any_table_place
    topics = fresh_topics(kafka_bootstrap)
    uri = place.uri("v")
    with coordinator_thread(kafka_bootstrap, topics, **place.coordinator_settings) as coord, \
            Table(uri, kafka_bootstrap, topics=topics, storage_options=place.storage_options) as t:
        t.create(SCHEMA, partition_by=["date"], properties={"delta.deletedFileRetentionDuration": "interval 1 hours"})
        t.append(rows([1], "2024-01-01"))
        t.append(rows([2], "2024-01-02"))
        t.delete("id = 1")  # removes the first file: a tombstone
        orphan = staging.write_data_files(t.storage, rows([9], "2024-01-09"), ["date"])[0]  # a killed writer's file
        assert coord.wait_published(60)
        now = int(time.time() * 1000)
        live = {a.path for a in t.snapshot().files()}
        files = _data_keys(place, uri)
        assert len(files) == 3 and len(live) == 1

        with pytest.raises(VacuumRetentionError, match="shorter than the table's"):
            t.vacuum(retention_hours=0.5)
        # Within the retention every file stays: the tombstone's version may still be read, the orphan may be
        # a writer's file about to be proposed.
        assert t.vacuum(dry_run=True).deleted == []
        assert vacuum(uri, storage_options=place.storage_options, now_ms=now).deleted == []
        # Two hours later: the expired tombstone's file and the orphan go; the live file stays.
        later = vacuum(uri, storage_options=place.storage_options, now_ms=now + 2 * HOUR_MS)
        assert set(later.deleted) == files - live and orphan.path in later.deleted
        assert _data_keys(place, uri) == live
        assert sorted(place.delta_table(uri).to_pyarrow_table().column("id").to_pylist()) == [2]
        assert t.append(rows([3], "2024-01-03")).version == 4


def test_vacuum_keeps_a_file_a_retained_version_references_even_when_old(tmp_path: Path) -> None:
    """The rule apart from file age: a tombstone younger than the retention keeps its file, however old the file."""
    from deltacoord.coordinator.delta_log.files import put_if_absent
    from deltacoord.reader.log import commit_path
    from deltacoord.schemas.actions import RemoveFile, commit_to_json_lines

    root = tmp_path / "t"
    md = Metadata(id="v", schema_string=staging.schema_string(SCHEMA), partition_columns=("date",),
                  configuration={"delta.deletedFileRetentionDuration": "interval 1 hours"})
    files = {name: staging.write_data_files(root, rows([i], "2024-01-01"), ["date"])[0] for i, name in
             enumerate(["kept-live", "removed-recently", "removed-long-ago", "orphan"])}
    now = int(time.time() * 1000)
    commits = [
        [CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2), md],
        [CommitInfo({"operation": "WRITE"}), *(a for name, a in files.items() if name != "orphan")],
        [CommitInfo({"operation": "DELETE"}), files["removed-long-ago"].to_remove(now - 3 * HOUR_MS)],
        [CommitInfo({"operation": "DELETE"}), files["removed-recently"].to_remove(now - HOUR_MS // 2)],
    ]
    for v, actions in enumerate(commits):
        put_if_absent(commit_path(root, v), commit_to_json_lines(actions), fsync=False)
    old = (now - 5 * HOUR_MS) / 1000
    for a in files.values():
        os.utime(root / a.path, (old, old))  # every data file is older than the retention
    assert isinstance(files["orphan"], AddFile) and not isinstance(files["orphan"], RemoveFile)
    res = vacuum(root, now_ms=now)
    assert sorted(res.deleted) == sorted([files["removed-long-ago"].path, files["orphan"].path])
    assert res.kept_referenced == 2  # the live file and the one a version within the retention references
    assert (root / files["removed-recently"].path).exists() and (root / files["kept-live"].path).exists()
    # The log is never touched, and emptied directories of a local table go.
    assert sorted(p.name for p in (root / "_delta_log").iterdir()) == [f"{v:020d}.json" for v in range(4)]


# --------------------------------------------------------------------------- publication by conditional write


def test_publication_on_each_store_never_replaces_a_version(object_store_bucket: StoreBucket) -> None:
    from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
    from deltacoord.coordinator.locations import TableLocations
    from deltacoord.reader.log import commit_key
    from deltacoord.schemas.actions import commit_to_json_lines

    bucket = object_store_bucket
    create = (CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2))
    write = (CommitInfo({"operation": "WRITE"}), AddFile("x.parquet", {}, 1, 0, True))
    around, again = bucket.table_uri("around"), bucket.table_uri("again")
    TableStorage(around, bucket.storage_options).put(commit_key(0), b"written around the coordinator\n")
    TableStorage(again, bucket.storage_options).put(commit_key(0), commit_to_json_lines(create))
    p = Publisher(fsync=False, locations=TableLocations.of([bucket.root], bucket.storage_options))
    p.start()
    try:
        p.submit(PublishTask("around", around, 0, create))
        p.submit(PublishTask("again", again, 0, create))  # identical bytes: a re-publication, publication goes on
        p.submit(PublishTask("again", again, 1, write))
        outside = "s3://elsewhere/t" if bucket.kind != "s3" else "gs://elsewhere/t"
        p.submit(PublishTask("outside", outside, 0, create))
        assert p.wait_idle(60)
        halted = p.halted_tables()
        assert sorted(halted) == ["around", "outside"]
        assert "different content" in halted["around"] and "nothing was overwritten" in halted["around"]
        assert "table_roots" in halted["outside"] and "nothing was written" in halted["outside"]
    finally:
        p.stop()
    assert TableStorage(around, bucket.storage_options).get(commit_key(0)) == b"written around the coordinator\n"
    assert TableStorage(again, bucket.storage_options).get(commit_key(1)) == commit_to_json_lines(write)


def test_a_commit_by_reference_streams_through_every_store(any_table_place: TablePlace,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A staged proposal is read in pieces (ranged reads on an object store) and hashed as it is parsed; the
    decided commit is written to the store and `<v>.json` published as a checked copy of it."""
    from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
    from deltacoord.reader import staged_commits
    from deltacoord.reader.staged_commits import load_proposal, stage_decision
    from deltacoord.schemas.actions import commit_to_json_lines
    from deltacoord.schemas.messages import Decision, Outcome
    from deltacoord.schemas.staged import STAGED_DIR, StagedCommitError, staged_bytes, writer_key

    monkeypatch.setattr(staged_commits, "READ_PIECE_BYTES", 4096)  # many pieces (16 per ranged read on a store)
    uri = any_table_place.uri("by-ref")
    storage = TableStorage(uri, any_table_place.storage_options)
    adds = tuple(AddFile(f"part-{i:05d}-ü.parquet", {}, 100 + i, 1_700_000_000_000, True, stats='{"numRecords":1}')
                 for i in range(3_000))
    data, ref = staged_bytes(adds)
    assert ref.size > 16 * 4096 * 3, "several ranged reads"
    p = Proposal("t", uri, "p-1", 0, "WRITE", True, (), CommitInfo({"txnId": "p-1"}), staged=ref)
    storage.put(writer_key(p.proposal_id, ref), data)
    assert load_proposal(storage, p).actions == adds
    storage.put(writer_key(p.proposal_id, ref), data.replace(b"part-00007", b"part-00008"))
    with pytest.raises(StagedCommitError, match="SHA-256"):
        load_proposal(storage, p)

    commit = (CommitInfo({"operation": "WRITE", "txnId": "p-1"}), *adds)
    decided = stage_decision(storage, Decision("t", uri, "p-1", Outcome.COMMITTED, version=1, actions=commit))
    assert decided.staged is not None
    settings = CoordinatorSettings(bootstrap_servers="unused:9092", **any_table_place.coordinator_settings)
    publisher = Publisher(fsync=False, lanes=1, locations=settings.locations())
    publisher.start()
    try:
        publisher.submit(PublishTask("t", uri, 1, commit[:1], staged=("p-1", decided.staged)))
        assert publisher.wait_idle(60)
    finally:
        publisher.stop()
    assert publisher.halted("t") is None
    assert storage.get("_delta_log/00000000000000000001.json") == commit_to_json_lines(commit)
    assert [i.key for i in storage.list(STAGED_DIR) if "/d-" in i.key] == [], "the decided file is swept"
