"""Dropping a coordinated table (`deltacoord table drop`, `Table.drop`) and re-creating it at the same path, against
a real broker and coordinator; delta-rs reads what is left.

A drop is recorded on the commits topic: restarts (from the whole topic or a state snapshot) never bring the
table back, and the table created afterwards at the same location, under the same table id, holds only its own
versions. A coordinated table whose directory was deleted around the coordinator is halted at the next restart,
naming the drop, instead of having its history republished over data files that are gone.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from deltalake import DeltaTable, write_deltalake

from deltacoord.cli.tables import register
from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.kafka import batch_checks
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.reader.claim import CLAIM_KEY, read_claim
from deltacoord.reader.log import TableNotFoundError
from deltacoord.reader.snapshot import Snapshot
from deltacoord.reader.stream import CommitStream, StreamGapError
from deltacoord.schemas.errors import CommitOutcomeUnknownError, InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import CONTROL_DROP, CONTROL_PREFIX, DROP_DELETE_FILES, DROPPED_ERROR_TYPE, Topics
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.storage.table import TableStorage
from deltacoord.writer.table import Table, TableExistsError
from deltacoord.writer.transaction import Transaction as WriterTransaction
from deltacoord.writer.transaction import error_from_decision
from tests.integration.coord_harness import (
    coordinator_thread,
    fresh_topics,
    harness_settings,
    start_coordinator_process,
)
from tests.integration.test_writer_operations import SCHEMA, data

pytestmark = pytest.mark.kafka


def _cli() -> click.Group:
    group = click.Group("deltacoord")
    register(group)
    return group


def _cli_run(topics: Topics, bootstrap: str, *args: str) -> Result:
    prefix = topics.proposals.removesuffix(".proposals")
    return CliRunner().invoke(_cli(), [*args, "--bootstrap-servers", bootstrap, "--topic-prefix", prefix])


def _cli_json(topics: Topics, bootstrap: str, *args: str) -> dict[str, Any]:
    result = _cli_run(topics, bootstrap, *args)
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def _ids(path: Path, version: int | None = None) -> list[int]:
    """The ids delta-rs reads at `version` (default: the latest)."""
    return sorted(DeltaTable(str(path), version=version).to_pyarrow_table().column("id").to_pylist())


def _log_versions(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def _wait_for(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def _snapshot_now(coord: Coordinator) -> None:
    worker = coord._workers[0]
    written = worker.snapshots_written
    worker.request_snapshot()
    worker.wait_snapshot()
    deadline = threading.Event()
    for _ in range(600):
        if worker.snapshots_written > written:
            return
        deadline.wait(0.1)
    raise AssertionError("no state snapshot was written")


def test_rm_rf_then_create_goes_through_drop_and_restarts_republish_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            t.create(SCHEMA)
            t.append(data([1, 2], "2024-01-01", "old"))
            shutil.rmtree(path)
            # The coordinator still holds the table: a creation is refused, naming the drop.
            refused = _cli_run(topics, kafka_bootstrap, "table", "create", str(path), "--schema", "id:long,date:string,value:string")
            assert refused.exit_code == 1, refused.output
            assert "TableExistsError" in refused.output and f"deltacoord table drop {t.uri}" in refused.output
        assert not path.exists()
        with coordinator_thread(kafka_bootstrap, topics) as coord:
            # Recovery finds neither a log nor a claim: the table is halted, nothing is republished.
            assert not path.exists(), "the deleted table's history was republished"
            halted = coord.health()[1]["halted_tables"]
            assert isinstance(halted, dict) and t.table_id in halted
            assert "deltacoord table drop" in str(halted[t.table_id])
            with pytest.raises(InvalidProposalError) as stopped:
                t.begin_create(SCHEMA).commit("CREATE TABLE", changes_data=False)
            assert stopped.value.reason == ReasonCode.TABLE_HALTED and "deltacoord table drop" in str(stopped.value)
            status = _cli_json(topics, kafka_bootstrap, "table", "status", str(path))
            assert (status["state"], status["version"]) == ("halted", 1) and "deltacoord table drop" in status["halted"]
            dropped = _cli_json(topics, kafka_bootstrap, "table", "drop", str(path))
            assert (dropped["version"], dropped["operation"]) == (1, "DROP TABLE")
            assert t.table_id not in coord.health()[1]["halted_tables"]
            status = _cli_json(topics, kafka_bootstrap, "table", "status", str(path))
            assert (status["state"], status["version"], status["halted"], status["drops"]) == ("dropped", 1, None, 1)
            created = _cli_json(topics, kafka_bootstrap, "table", "create", str(path), "--schema",
                                "id:long,date:string,value:string")
            assert created["version"] == 0
            t.close()
            t = Table(path, kafka_bootstrap, topics=topics)  # a handle that never saw the dropped table's versions
            assert t.append(data([10], "2024-01-02", "new")).version == 1
        assert _ids(path) == [10]
        with coordinator_thread(kafka_bootstrap, topics) as coord:  # recovery from the whole commits topic
            assert not coord.health()[1]["halted_tables"]
            assert t.append(data([11], "2024-01-02", "new")).version == 2
            status = _cli_json(topics, kafka_bootstrap, "table", "status", str(path))
            assert (status["state"], status["version"], status["drops"]) == ("coordinated", 2, 1)
        assert _log_versions(path) == [0, 1, 2], "only the new table's versions are in _delta_log"
        assert _ids(path) == [10, 11]
    finally:
        t.close()


def test_drop_with_files_then_create_and_restarts_keep_the_tables_apart(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Also from a state snapshot taken after the re-creation, and from the whole topic; the same table id (the
    path's URI) names both tables, and no decision of the dropped one reaches the new one."""
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    state = {"state_root": str(tmp_path / "state"), "snapshot_every_records": 1000}
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
            t.create(SCHEMA, properties={"delta.checkpointInterval": "2"})
            t.append(data([1, 2, 3], "2024-01-01", "old"))
            t.append(data([4], "2024-01-01", "old"))
            old_id = Snapshot.load(t.uri).metadata.id
            _snapshot_now(coord)  # the old table is in this snapshot
            reading = CommitStream(t.table_id, kafka_bootstrap, topics=topics, starting_version=0, include_all_commits=True)
            seen: list[int] = []
            _wait_for(lambda: seen.extend(e.version for e in reading.poll(0.5)) or seen == [0, 1, 2], "versions 0..2")
            r = t.drop(delete_files=True)
            assert (r.version, r.already_committed) == (2, False)
            dropped_ms = int(time.time() * 1000)
            assert not path.exists()
            with pytest.raises(InvalidProposalError) as again:
                t.drop(delete_files=True)
            assert again.value.reason == ReasonCode.UNKNOWN_TABLE
            with pytest.raises(TableNotFoundError):
                t.append(data([5], "2024-01-01", "old"))  # nothing is left to write to
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
            assert not path.exists(), "the dropped table was republished from the state snapshot"
            assert t.create(SCHEMA).version == 0
            assert Snapshot.load(t.uri).metadata.id != old_id
            assert t.append(data([10], "2024-01-02", "new")).version == 1
            _snapshot_now(coord)
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state):
            t.invalidate()  # a state from a snapshot keeps no winners window: read the latest version
            assert t.append(data([11], "2024-01-02", "new")).version == 2
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides={"state_root": str(tmp_path / "none")}):
            assert t.append(data([12], "2024-01-02", "new")).version == 3
        # A stream that delivered the dropped table's versions stops, saying how to read the new table: from a time
        # after the drop (the versions before it are the dropped table's).
        with pytest.raises(StreamGapError, match=r"was dropped at version 2.*starting_timestamp="):
            _wait_for(lambda: reading.poll(0.5) and False, "the stream's error")
        reading.close()
        with CommitStream(t.table_id, kafka_bootstrap, topics=topics, starting_timestamp=dropped_ms,
                          include_all_commits=True) as s:
            seen = []
            _wait_for(lambda: seen.extend(e.version for e in s.poll(0.5)) or len(seen) >= 4, "the new table's versions")
            assert seen == [0, 1, 2, 3]
        rep = verify_table(harness_settings(kafka_bootstrap, topics), str(path), t.table_id)
        assert_verified(rep)
        assert rep.topic_versions == rep.published_versions == 4
    finally:
        t.close()
    assert _log_versions(path) == [0, 1, 2, 3]
    assert _ids(path) == [10, 11, 12]
    assert [_ids(path, v) for v in range(4)] == [[], [10], [10, 11], [10, 11, 12]]


def test_drop_keeping_files_leaves_a_delta_table_no_coordinator_decides(kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    storage = TableStorage(str(path))
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            t.create(SCHEMA)
            t.append(data([1, 2], "2024-01-01", "dc"))
            assert read_claim(storage) is not None
            r = t.drop()  # DROP FEATURE at version 2 first, then the drop
            assert r.version == 2
            snap = Snapshot.load(t.uri)
            assert snap.version == 2 and COORDINATED not in (snap.protocol.writer_features or ())
            assert read_claim(storage) is None, f"{CLAIM_KEY} is removed: the location is free"
            with pytest.raises(TableExistsError):
                t.create(SCHEMA)  # a Delta table is there: keep it, or delete it
            # Delta writers write it again, as after a release.
            write_deltalake(str(path), data([3], "2024-01-01", "rs"), mode="append")
        with coordinator_thread(kafka_bootstrap, topics):
            assert _log_versions(path) == [0, 1, 2, 3]
            assert t.adopt().version == 3  # and the coordinator may take it back
            assert t.append(data([4], "2024-01-01", "dc")).version == 5
    finally:
        t.close()
    assert _ids(path) == [1, 2, 3, 4]


def test_a_halted_table_with_its_log_is_dropped_with_its_files_only(kafka_bootstrap: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A halted table's writer feature cannot be dropped by a commit: keeping its files is refused, naming the ways out."""
    # The store is asked before every ratification, so the version written around halts the table before version 2.
    monkeypatch.setattr(batch_checks, "FREE_AFTER_OWN_PUT_S", 0.0)
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            t.create(SCHEMA)
            t.append(data([1], "2024-01-01", "dc"))
            # Version 2 written around the coordinator (Delta writers refuse the table: a file written by hand).
            (path / "_delta_log" / f"{2:020d}.json").write_text('{"commitInfo":{"operation":"WRITE"}}\n')
            with pytest.raises(InvalidProposalError) as halted:
                t.append(data([3], "2024-01-01", "dc"))
            assert halted.value.reason == ReasonCode.TABLE_HALTED
            with pytest.raises(InvalidProposalError) as kept:
                t.drop()
            assert kept.value.reason == ReasonCode.TABLE_HALTED
            assert "--delete-files" in str(kept.value) and "resume" in str(kept.value)
            assert (path / "_delta_log").exists()
            assert t.drop(delete_files=True).version == 1
            assert not path.exists()
            assert t.create(SCHEMA).version == 0
            assert t.append(data([7], "2024-01-02", "new")).version == 1
    finally:
        t.close()
    assert _ids(path) == [7]


def test_a_created_table_killed_before_its_first_publication_is_republished_not_halted(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """No `_delta_log` yet is no deleted table: the creation claimed the location before it was ratified."""
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                      env={"DELTACOORD_FAULT": "after_kafka_commit:1"})
    outcome: list[object] = []

    def create() -> None:
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120, coordinator_check=False) as w:
            try:
                outcome.append(w.create(SCHEMA).version)
            except CommitOutcomeUnknownError as e:  # the killed coordinator answered nothing
                outcome.append(e)

    th = threading.Thread(target=create)
    th.start()
    first.proc.wait(120)
    assert first.proc.returncode == -9, "the fault point was not reached"
    assert not (path / "_delta_log").exists() and read_claim(TableStorage(str(path))) is not None
    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    try:
        th.join(180)
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120, coordinator_check=False) as t:
            assert t.append(data([1], "2024-01-01", "x")).version == 1
    finally:
        second.kill(15)
    assert _log_versions(path) == [0, 1]
    assert _ids(path) == [1]


def test_rm_rf_then_drop_while_the_coordinator_runs(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Without a restart in between: the drop of a table whose files are gone needs no DROP FEATURE commit."""
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            t.create(SCHEMA)
            t.append(data([1], "2024-01-01", "old"))
            shutil.rmtree(path)
            with pytest.raises(TableExistsError, match="deltacoord table drop"):
                t.create(SCHEMA)
            assert t.drop().version == 1
            assert not path.exists(), "a drop of a deleted table writes nothing there"
            assert t.create(SCHEMA).version == 0
            assert t.append(data([2], "2024-01-01", "new")).version == 1
    finally:
        t.close()
    assert _ids(path) == [2]


def _send(t: Table, p: Any) -> Any:
    """Send a drop request (a proposal as the writer built it) and wait for its answer."""
    try:
        return t.client.decided(t.client.propose(p, wait="ratified", control=CONTROL_DROP), p.table_id, 60)
    finally:
        t.client.forget(p.proposal_id)


def _drop_request(t: Table, read_version: int, delete_files: bool) -> Any:
    tx = WriterTransaction(t, read_version)
    tx.proposal_id = f"{CONTROL_PREFIX}{CONTROL_DROP}:{uuid.uuid4()}"
    return tx.proposal("DROP TABLE", changes_data=False, parameters={DROP_DELETE_FILES: str(delete_files).lower()})


def test_a_replayed_drop_request_never_drops_the_table_created_after_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A captured drop request sent again is answered as the first time (its id is remembered, also across a
    restart); one with a new id but an old version (made before the table's latest commits) drops nothing."""
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            t.create(SCHEMA)
            t.append(data([1], "2024-01-01", "old"))
            drop = _drop_request(t, 1, delete_files=True)
            first = _send(t, drop)
            assert (first.error_type, first.winning_version, first.duplicate_of) == (DROPPED_ERROR_TYPE, 1, None)
            assert not path.exists()
            t.close()
            t = Table(path, kafka_bootstrap, topics=topics)  # the request went around the handle
            t.create(SCHEMA)
            assert t.append(data([2], "2024-01-01", "new")).version == 1
            again = _send(t, drop)
            assert (again.error_type, again.winning_version, again.duplicate_of) == (DROPPED_ERROR_TYPE, 1, 1)
            assert _ids(path) == [2]
        with coordinator_thread(kafka_bootstrap, topics):
            assert _send(t, drop).duplicate_of == 1
            assert t.append(data([3], "2024-01-01", "new")).version == 2
            stale = dataclasses.replace(drop, proposal_id=f"{CONTROL_PREFIX}{CONTROL_DROP}:{uuid.uuid4()}")
            refused = error_from_decision(_send(t, stale))
            assert isinstance(refused, InvalidProposalError) and refused.reason == ReasonCode.STALE_CONTROL_REQUEST
            assert t.append(data([4], "2024-01-01", "new")).version == 3
    finally:
        t.close()
    assert _ids(path) == [2, 3, 4]


def test_a_released_table_is_forgotten_by_a_drop_and_its_path_created_again(kafka_bootstrap: str, tmp_path: Path) -> None:
    """`release` then `create` was TABLE_RELEASED: the drop forgets the released table (its files, the uncoordinated
    writers', are not the coordinator's to delete)."""
    path = tmp_path / "t"
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            t.create(SCHEMA)
            t.append(data([1], "2024-01-01", "old"))
            assert t.release().version == 2
            with pytest.raises(InvalidProposalError) as theirs:
                t.drop(delete_files=True)
            assert theirs.value.reason == ReasonCode.TABLE_RELEASED and path.exists()
            assert t.drop().version == 2
            shutil.rmtree(path)  # the uncoordinated writers' files, deleted by their owner
            assert t.create(SCHEMA).version == 0
            assert t.append(data([2], "2024-01-01", "new")).version == 1
            status = _cli_json(topics, kafka_bootstrap, "table", "status", str(path))
            assert (status["state"], status["version"], status["drops"]) == ("coordinated", 1, 1)
    finally:
        t.close()
    assert _ids(path) == [2]
