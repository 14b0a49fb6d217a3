"""Adopting existing Delta tables (written by delta-rs) and releasing them, against a real broker and coordinator.

The coordinator reads an adopted table's state from its own storage, decides every commit after the adopted
version, and rebuilds that state after a restart from the adoption record; delta-rs reads every version, before
and after the adoption, as our reader does. A released table is the uncoordinated writers' again.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltacoord.cli.tables import register
from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker
from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.delta_log.verify import verify_table
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.reader.claim import CLAIM_KEY, read_claim
from deltacoord.reader.log import checkpoint_exists
from deltacoord.reader.snapshot import Snapshot
from deltacoord.reader.stream import CommitStream, StreamGapError
from deltacoord.schemas.actions import DomainMetadata, SetTransaction
from deltacoord.schemas.errors import ConcurrentDeleteReadException, InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import (
    ADOPTED_ERROR_TYPE,
    CONTROL_ADOPT,
    CONTROL_PREFIX,
    CONTROL_RELEASE,
    RELEASED_ERROR_TYPE,
    Topics,
    partition_for,
)
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.storage.table import TableStorage
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction as WriterTransaction
from deltacoord.writer.transaction import error_from_decision
from tests.integration.coord_harness import coordinator_thread, fresh_topics, harness_settings
from tests.integration.test_writer_operations import SCHEMA, assert_delta_rs_agrees, data, rows

pytestmark = pytest.mark.kafka


def _delta_rs_table(path: Path, *, checkpoint_interval: int = 6) -> None:
    """Versions 0..4 written by delta-rs: two partitions, two appends (one with an app transaction), a DELETE,
    a checkpoint at version 3 (`create_checkpoint`), one more append."""
    uri = str(path)
    write_deltalake(uri, data([1, 2, 3, 4], ["2024-01-01", "2024-01-01", "2024-01-02", "2024-01-02"], "rs"),
                    partition_by=["date"], configuration={"delta.checkpointInterval": str(checkpoint_interval)})
    write_deltalake(uri, data([5], "2024-01-03", "rs"), mode="append")
    write_deltalake(uri, data([6], "2024-01-03", "rs"), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction("pipe", 5)]))
    DeltaTable(uri).delete("id = 4")
    DeltaTable(uri).create_checkpoint()
    write_deltalake(uri, data([7], "2024-01-01", "rs"), mode="append")
    storage = Snapshot.load(uri).storage
    assert DeltaTable(uri).version() == 4 and checkpoint_exists(storage, 3) and not checkpoint_exists(storage, 4)


def _delta_rs_rows(path: Path, version: int) -> list[tuple[Any, ...]]:
    return rows(DeltaTable(str(path), version=version).to_pyarrow_table().select(["id", "date", "value"]))


def _stale_txn(t: Table) -> InvalidProposalError:
    """A commit re-using the app transaction delta-rs recorded before the adoption ("pipe" at version 5)."""
    tx = t.begin()
    tx.add(SetTransaction("pipe", 5, int(time.time() * 1000)))
    with pytest.raises(InvalidProposalError) as ei:
        tx.commit("STREAMING UPDATE", changes_data=False)
    return ei.value


def _wait_for(check: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:.0f}s"
        time.sleep(0.1)


def test_a_delta_rs_table_is_adopted_decided_and_rebuilt_after_a_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _delta_rs_table(path)
    before = [_delta_rs_rows(path, v) for v in range(5)]
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        # The coordinator that adopts loads the table in its checkpoint worker, as the daemon does.
        with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=CheckpointWorker()):
            with pytest.raises(InvalidProposalError) as unknown:
                t.append(data([100], "2024-01-01", "x"))
            assert unknown.value.reason == ReasonCode.UNKNOWN_TABLE
            assert f"deltacoord table adopt {t.uri}" in str(unknown.value) and "version 4" in str(unknown.value)

            adopted = t.adopt()  # adopted at 4; version 5 adds the deltacoord-coordinated writer feature
            assert (adopted.version, adopted.already_committed, adopted.operation) == (4, False, "ADOPT TABLE")
            assert COORDINATED in (t.snapshot().protocol.writer_features or ()) and t.snapshot().version == 5
            again = t.adopt()  # asked again: the same answer (at the version it is at), nothing changed
            assert (again.version, again.already_committed) == (5, True)
            assert t.snapshot().version == 5

            assert t.append(data([8], "2024-01-02", "dc")).version == 6
            assert t.delete("id = 5").version == 7  # removes file C, written by delta-rs before the adoption
            assert _stale_txn(t).reason == ReasonCode.STALE_TXN_VERSION  # delta-rs's app transaction is known
        # A restart rebuilds the adopted table from the adoption record (its log at version 4) and versions 5..7.
        with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint):
            with pytest.raises(ConcurrentDeleteReadException):  # read version 6: the winner (7) removed file C
                t.delete("id = 5", snapshot=t.snapshot(version=6))
            assert _stale_txn(t).reason == ReasonCode.STALE_TXN_VERSION
            assert t.delete("id = 1").version == 8  # rewrites pre-adoption file A
            assert t.update("id = 3", {"value": "'up'"}).version == 9
            for i in range(10, 13):
                assert t.append(data([i], "2024-01-03", "dc")).version == i
            storage = Snapshot.load(str(path)).storage
            # delta.checkpointInterval = 6: the coordinators checkpoint the adopted table at 6 (the first one, in its
            # worker, from delta-rs's checkpoint 3) and 12.
            _wait_for(lambda: checkpoint_exists(storage, 6) and checkpoint_exists(storage, 12), "checkpoints 6 and 12")
    finally:
        t.close()
    assert [_delta_rs_rows(path, v) for v in range(5)] == before  # the adopted history is untouched
    assert DeltaTable(str(path)).version() == 12
    assert _delta_rs_rows(path, 12) == [(2, "2024-01-01", "rs"), (3, "2024-01-02", "up"), (6, "2024-01-03", "rs"),
                                        (7, "2024-01-01", "rs"), (8, "2024-01-02", "dc"),
                                        *((i, "2024-01-03", "dc") for i in range(10, 13))]
    assert assert_delta_rs_agrees(t) == 13  # every version, before and after the adoption
    report = verify_table(harness_settings(kafka_bootstrap, topics), t.uri, t.table_id)
    assert report.ok, report.problems
    assert (report.adopted_versions, report.topic_versions, report.published_versions) == (5, 8, 8)
    # The change feed on the commits topic starts after the adopted version; earlier ones are in _delta_log only.
    with CommitStream(t.table_id, kafka_bootstrap, topics=topics, starting_version=5, include_all_commits=True) as s:
        seen: list[int] = []
        _wait_for(lambda: seen.extend(e.version for e in s.poll(0.5)) or seen[-1:] == [12], "the change feed to version 12")
    assert seen == list(range(5, 13))
    with CommitStream(t.table_id, kafka_bootstrap, topics=topics, starting_version=2) as s, \
            pytest.raises(StreamGapError, match=r"adopted by the coordinator at version 4: versions 2\.\.4"):
        _wait_for(lambda: s.poll(0.5) and False, "the stream's gap error")


def _cli() -> click.Group:
    group = click.Group("deltacoord")
    register(group)
    return group


def _cli_json(topics: Topics, bootstrap: str, *args: str) -> dict[str, Any]:
    import json

    prefix = topics.proposals.removesuffix(".proposals")
    result = CliRunner().invoke(_cli(), [*args, "--bootstrap-servers", bootstrap, "--topic-prefix", prefix])
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def _snapshot_now(coord: Coordinator) -> None:
    """Have the coordinator write a state snapshot covering every record so far, and wait for it."""
    worker = coord._workers[0]
    written = worker.snapshots_written
    worker.request_snapshot()
    _wait_for(lambda: worker.snapshots_written > written, "a state snapshot")


def test_release_hands_the_table_back_and_adopt_takes_it_again(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Also across restarts from state snapshots: the adopted state and the release are in them."""
    path = tmp_path / "t"
    _delta_rs_table(path)
    topics = fresh_topics(kafka_bootstrap)
    state = {"state_root": str(tmp_path / "state"), "snapshot_every_records": 1000}
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
            assert _cli_json(topics, kafka_bootstrap, "table", "adopt", str(path))["version"] == 4  # feature added at 5
            assert t.append(data([8], "2024-01-02", "dc")).version == 6
            released = _cli_json(topics, kafka_bootstrap, "table", "release", str(path))  # feature dropped at 7
            assert (released["version"], released["operation"]) == (7, "RELEASE TABLE")
            assert t.release().already_committed  # asked again: the same answer
            with pytest.raises(InvalidProposalError) as refused:
                t.append(data([100], "2024-01-01", "x"))
            assert refused.value.reason == ReasonCode.TABLE_RELEASED
            assert f"deltacoord table adopt {t.uri}" in str(refused.value)
            _snapshot_now(coord)
        # The table is delta-rs's again: its writes need no coordinator.
        write_deltalake(str(path), data([11], "2024-01-01", "rs-again"), mode="append")
        assert DeltaTable(str(path)).version() == 8
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
            assert coord.metrics.recovery_records._value.get() < 3, "the release comes from the state snapshot"
            with pytest.raises(InvalidProposalError) as still:
                t.append(data([101], "2024-01-01", "x"))
            assert still.value.reason == ReasonCode.TABLE_RELEASED
            assert t.adopt().version == 8  # adopted again, from what delta-rs wrote meanwhile (feature added at 9)
            assert t.append(data([12], "2024-01-02", "dc")).version == 10
            _snapshot_now(coord)
        with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
            assert coord.metrics.recovery_records._value.get() < 3, "the adopted state comes from the state snapshot"
            assert t.delete("id = 11").version == 11  # a file delta-rs wrote while the table was released
    finally:
        t.close()
    assert {r[0] for r in _delta_rs_rows(path, 11)} == {1, 2, 3, 5, 6, 7, 8, 12}
    assert assert_delta_rs_agrees(t) == 12


def _raw_adopt(t: Table, read_version: int) -> InvalidProposalError:
    """An adopt request as another client would send it, claiming to have read `read_version`."""
    tx = WriterTransaction(t, read_version)
    tx.proposal_id = f"{CONTROL_PREFIX}{CONTROL_ADOPT}:{uuid.uuid4()}"
    p = tx.proposal("ADOPT TABLE", changes_data=False)
    d = t.client.decided(t.client.propose(p, wait="ratified", control=CONTROL_ADOPT), p.table_id, 60)
    assert not d.committed
    err = error_from_decision(d)
    assert isinstance(err, InvalidProposalError)
    return err


def test_adoption_refusals_and_features_the_coordinator_enforces(kafka_bootstrap: str, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    empty = served / "empty"
    empty.mkdir()
    future = served / "future"
    _delta_rs_table(future)
    # One writer feature nobody knows yet: writing the table would ignore it, so it cannot be coordinated.
    (future / "_delta_log" / f"{5:020d}.json").write_text(
        '{"protocol":{"minReaderVersion":1,"minWriterVersion":7,"writerFeatures":["appendOnly","invariants",'
        '"futureFeature"]}}\n{"commitInfo":{"operation":"UPGRADE PROTOCOL","timestamp":0}}\n')
    elsewhere = tmp_path / "elsewhere"
    _delta_rs_table(elsewhere)
    plain = served / "plain"
    _delta_rs_table(plain)
    topics = fresh_topics(kafka_bootstrap)
    handles = [Table(p, kafka_bootstrap, topics=topics) for p in (empty, future, elsewhere, plain)]
    t_empty, t_future, t_elsewhere, t_plain = handles
    try:
        with coordinator_thread(kafka_bootstrap, topics, table_roots=(str(served),)) as coord:
            with pytest.raises(InvalidProposalError) as none:
                t_empty.adopt()
            assert none.value.reason == ReasonCode.UNKNOWN_TABLE
            assert "no Delta table" in str(none.value) and f"deltacoord table create {t_empty.uri}" in str(none.value)
            cli = CliRunner().invoke(_cli(), ["table", "adopt", str(empty), "--bootstrap-servers", kafka_bootstrap,
                                              "--topic-prefix", topics.proposals.removesuffix(".proposals")])
            assert cli.exit_code == 1 and "UNKNOWN_TABLE" in cli.output and "no Delta table" in cli.output, cli.output
            with pytest.raises(InvalidProposalError) as nothing:  # a commit onto nothing is told to create the table
                WriterTransaction(t_empty, 0).commit("WRITE")
            assert nothing.value.reason == ReasonCode.UNKNOWN_TABLE
            assert f"There is no Delta table at {t_empty.uri}: create it first" in str(nothing.value)

            with pytest.raises(InvalidProposalError) as feature:
                t_future.adopt()
            assert feature.value.reason == ReasonCode.UNSUPPORTED_TABLE_FEATURE
            assert "futureFeature" in str(feature.value)

            with pytest.raises(InvalidProposalError) as outside:
                t_elsewhere.adopt()
            assert outside.value.reason == ReasonCode.TABLE_OUTSIDE_ROOTS

            # A creation onto the foreign log is refused by its reason (nothing halts); adopting it is the way in.
            with pytest.raises(InvalidProposalError) as exists:
                t_plain.begin_create(SCHEMA).commit("CREATE TABLE", changes_data=False)
            assert exists.value.reason == ReasonCode.TABLE_EXISTS_UNCOORDINATED
            assert "(version 4)" in str(exists.value) and f"deltacoord table adopt {t_plain.uri}" in str(exists.value)
            assert t_plain.table_id not in coord.health()[1]["halted_tables"]  # type: ignore[operator]
            assert read_claim(TableStorage(plain)) is None  # a refused creation claims nothing
            assert t_plain.adopt().version == 4  # and version 5 adds the deltacoord-coordinated writer feature
            assert t_plain.append(data([8], "2024-01-02", "dc")).version == 6
            stale = _raw_adopt(t_plain, 4)  # the table is coordinated, and moved on since the requester looked
            assert stale.reason == ReasonCode.TABLE_ALREADY_COORDINATED and "version 6" in str(stale)

            # delta-rs made the table at protocol (1, 2), and adoption added only deltacoord's own feature: no
            # domainMetadata feature, so no domainMetadata actions.
            tx = t_plain.begin()
            tx.add(DomainMetadata("app.cfg", "{}"))
            with pytest.raises(InvalidProposalError) as domains:
                tx.commit("SET DOMAIN", changes_data=False)
            assert domains.value.reason == ReasonCode.MISSING_TABLE_FEATURE and "app.cfg" in str(domains.value)
    finally:
        for h in handles:
            h.close()
    assert not (empty / "_delta_log").exists() and DeltaTable(str(future)).version() == 5
    assert DeltaTable(str(elsewhere)).version() == 4 and DeltaTable(str(plain)).version() == 6


def _alias_elsewhere(table_id: str, partitions: int) -> str:
    """Another table id for the same location, routed to another proposals partition than `table_id`."""
    home = partition_for(table_id, partitions)
    return next(a for i in range(1000) if partition_for(a := f"alias-{i}", partitions) != home)


def _refused(call: Any) -> InvalidProposalError:
    with pytest.raises(InvalidProposalError) as ei:
        call()
    return ei.value


def test_one_location_is_one_table_across_partitions(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A second table id may neither adopt nor create a location another id holds, even when its proposals go to
    another partition; the first id's table goes on, and a release frees the location for another id."""
    adopted_path, created_path = tmp_path / "adopted", tmp_path / "created"
    _delta_rs_table(adopted_path)
    topics = fresh_topics(kafka_bootstrap, partitions=4)
    first = Table(adopted_path, kafka_bootstrap, topics=topics)
    alias = Table(adopted_path, kafka_bootstrap, topics=topics, table_id=_alias_elsewhere(first.table_id, 4))
    made = Table(created_path, kafka_bootstrap, topics=topics)
    made_alias = Table(created_path, kafka_bootstrap, topics=topics, table_id=_alias_elsewhere(made.table_id, 4))
    handles = [first, alias, made, made_alias]
    try:
        with coordinator_thread(kafka_bootstrap, topics) as coord:
            assert first.adopt().version == 4  # and version 5 adds the deltacoord-coordinated writer feature
            held = read_claim(first.storage)
            assert held is not None and held.table_id == first.table_id and held.claimed_by.startswith(CONTROL_PREFIX)
            # The writer refuses before sending; the coordinator refuses what is sent anyway.
            early = _refused(alias.adopt)
            assert early.reason == ReasonCode.TABLE_LOCATION_TAKEN and "Nothing was sent" in str(early)
            assert f"table_id={first.table_id!r}" in str(early)
            sent = _refused(lambda: alias._control(CONTROL_ADOPT, "ADOPT TABLE", None))
            assert sent.reason == ReasonCode.TABLE_LOCATION_TAKEN and "Nothing was sent" not in str(sent)
            assert f"table id {first.table_id!r}" in str(sent) and CLAIM_KEY in str(sent)
            # Issue 36's finding: both ids were ratified as the same version, one row never visible. Now the alias is
            # no table: its commits are refused, and the first id's go on.
            assert first.append(data([8], "2024-01-02", "dc")).version == 6
            assert _refused(lambda: alias.append(data([9], "2024-01-02", "alias"))).reason == ReasonCode.UNKNOWN_TABLE
            assert first.append(data([10], "2024-01-02", "dc")).version == 7

            # A creation claims its location: an alias's creation is refused, whichever partition decides it.
            assert made.create(SCHEMA).version == 0
            taken = _refused(lambda: made_alias.begin_create(SCHEMA).commit("CREATE TABLE", changes_data=False))
            assert taken.reason == ReasonCode.TABLE_LOCATION_TAKEN and f"{made.table_id!r}" in str(taken)
            assert _refused(lambda: made_alias.adopt()).reason == ReasonCode.TABLE_LOCATION_TAKEN
            assert made.append(data([1], "2024-01-01", "made")).version == 1
            assert not coord.health()[1]["halted_tables"]  # type: ignore[index]

            # A release frees the location: the alias may adopt it now, and the first id no longer may.
            assert first.release().version == 8  # the DROP FEATURE commit
            assert read_claim(first.storage) is None
            assert alias.adopt().version == 8  # and 9 adds the feature again
            assert _refused(first.adopt).reason == ReasonCode.TABLE_LOCATION_TAKEN
            assert alias.append(data([11], "2024-01-03", "alias")).version == 10
    finally:
        for h in handles:
            h.close()
    assert {r[0] for r in _delta_rs_rows(adopted_path, 10)} == {1, 2, 3, 5, 6, 7, 8, 10, 11}
    assert rows(DeltaTable(str(created_path)).to_pyarrow_table()) == [(1, "2024-01-01", "made")]


def _send(t: Table, p: Any, kind: str) -> Any:
    """Send a control request (a proposal as the writer built it) and wait for its answer."""
    try:
        return t.client.decided(t.client.propose(p, wait="ratified", control=kind), p.table_id, 60)
    finally:
        t.client.forget(p.proposal_id)


def _request(t: Table, kind: str, operation: str) -> Any:
    """A control request as `Table.adopt`/`release` builds it (the table's current version, a new id), not sent."""
    tx = WriterTransaction(t, Snapshot.load(str(t.root)).version)
    tx.proposal_id = f"{CONTROL_PREFIX}{kind}:{uuid.uuid4()}"
    return tx.proposal(operation, changes_data=False)


def test_a_replayed_control_request_gets_its_first_answer_and_changes_nothing(kafka_bootstrap: str,
                                                                              tmp_path: Path) -> None:
    """A captured adopt or release request sent again later (after the table was released and adopted again, and
    after a restart) is answered as it was the first time; the table stays as it is and goes on committing."""
    path = tmp_path / "t"
    _delta_rs_table(path)
    topics = fresh_topics(kafka_bootstrap)
    t = Table(path, kafka_bootstrap, topics=topics)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            adopt = _request(t, CONTROL_ADOPT, "ADOPT TABLE")
            first_adopt = _send(t, adopt, CONTROL_ADOPT)
            assert (first_adopt.winning_version, first_adopt.duplicate_of) == (4, None)
            assert t.append(data([8], "2024-01-02", "dc")).version == 5
            release = _request(t, CONTROL_RELEASE, "RELEASE TABLE")
            first_release = _send(t, release, CONTROL_RELEASE)
            assert (first_release.error_type, first_release.winning_version) == (RELEASED_ERROR_TYPE, 5)
            write_deltalake(str(path), data([9], "2024-01-01", "rs"), mode="append")  # version 6, uncoordinated
            assert t.adopt().version == 6  # and 7 adds the deltacoord-coordinated writer feature
            assert t.append(data([10], "2024-01-02", "dc")).version == 8

            again = _send(t, release, CONTROL_RELEASE)  # replayed: the first answer, and the table stays adopted
            assert (again.error_type, again.winning_version, again.duplicate_of) == (RELEASED_ERROR_TYPE, 5, 5)
            assert t.append(data([11], "2024-01-02", "dc")).version == 9
            old = _send(t, adopt, CONTROL_ADOPT)  # replayed: adopted at 4 as first answered; nothing is reloaded
            assert (old.error_type, old.winning_version, old.duplicate_of) == (ADOPTED_ERROR_TYPE, 4, 4)
            # A commit reusing the adopt request's id is a commit: the adoption record answers only the request.
            assert t.append(data([12], "2024-01-02", "dc"), proposal_id=adopt.proposal_id).version == 10
        # Recovery folds the repeated answers as what they are (nothing), and remembers the first ones.
        with coordinator_thread(kafka_bootstrap, topics):
            assert t.append(data([13], "2024-01-02", "dc")).version == 11
            assert _send(t, release, CONTROL_RELEASE).duplicate_of == 5
            assert t.append(data([14], "2024-01-02", "dc")).version == 12
            # A request naming an older version than the table's (made before its latest commits) adopts nothing,
            # even with an id never seen: here after a release, so the table is not coordinated.
            assert t.release().version == 13  # the DROP FEATURE commit
            write_deltalake(str(path), data([15], "2024-01-01", "rs"), mode="append")  # version 14
            stale = dataclasses.replace(adopt, proposal_id=f"{CONTROL_PREFIX}{CONTROL_ADOPT}:{uuid.uuid4()}")
            refused = error_from_decision(_send(t, stale, CONTROL_ADOPT))
            assert isinstance(refused, InvalidProposalError) and refused.reason == ReasonCode.STALE_CONTROL_REQUEST
            assert "saw table" in str(refused) and "version 4" in str(refused) and "version 14" in str(refused)
            assert _refused(lambda: t.append(data([16], "2024-01-02", "x"))).reason == ReasonCode.TABLE_RELEASED
            assert t.adopt().version == 14
    finally:
        t.close()
    assert DeltaTable(str(path)).version() == 15
    assert {r[0] for r in _delta_rs_rows(path, 15)} == {1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}


def test_a_table_without_a_claim_claims_its_location_at_its_next_commit(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Tables created before claims existed (here: their claim removed) claim their location at their first commit
    after a restart; one whose location another id took meanwhile is halted before it ratifies a version."""
    kept, lost = tmp_path / "kept", tmp_path / "lost"
    topics = fresh_topics(kafka_bootstrap, partitions=4)
    t_kept, t_lost = Table(kept, kafka_bootstrap, topics=topics), Table(lost, kafka_bootstrap, topics=topics)
    alias = Table(lost, kafka_bootstrap, topics=topics, table_id=_alias_elsewhere(t_lost.table_id, 4))
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            for t in (t_kept, t_lost):
                assert t.create(SCHEMA).version == 0
                assert t.append(data([1], "2024-01-01", "a")).version == 1
        for path in (kept, lost):
            (path / CLAIM_KEY).unlink()
        with coordinator_thread(kafka_bootstrap, topics) as coord:
            assert alias.adopt().version == 1  # nothing says the location is taken: the alias claims it
            assert t_kept.append(data([2], "2024-01-01", "b")).version == 2
            held = read_claim(t_kept.storage)
            assert held is not None and held.table_id == t_kept.table_id
            halted = _refused(lambda: t_lost.append(data([2], "2024-01-01", "lost")))
            assert halted.reason == ReasonCode.TABLE_HALTED and f"table id {alias.table_id!r}" in str(halted)
            assert t_lost.table_id in coord.health()[1]["halted_tables"]  # type: ignore[operator]
            assert alias.append(data([3], "2024-01-01", "alias")).version == 2  # the one table of that location
    finally:
        for t in (t_kept, t_lost, alias):
            t.close()
    assert rows(DeltaTable(str(lost)).to_pyarrow_table()) == [(1, "2024-01-01", "a"), (3, "2024-01-01", "alias")]
