"""Containment: nothing acknowledged is invisible, a fault stops one table only, one decision per proposal id.

(a) A version written around the coordinator (by a writer that ignores the protocol: delta-rs refuses, the table
    names the `deltacoord-coordinated` writer feature) is found before the next
    coordinated commit is ratified: that commit is rejected (TABLE_HALTED), never acknowledged as the
    foreign version; a writer that read the foreign version (read version beyond Kafka's head) halts the
    table too; the halt is on the commits topic and survives a restart, as does a halt found at
    recovery (two foreign versions beyond Kafka's head); `deltacoord table resume` is the way out.
(b) The publisher failing on one table, and the decision path failing on one table, halt that table
    only: the other tables go on committing and publishing, the daemon does not exit, the halt
    survives a restart.
(c) A proposal id decided once is answered with its first decision when it comes again, even after
    the table changed so that deciding it again would commit it, and after a restart.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from deltacoord.cli.main import main as cli_main
from deltacoord.coordinator import faults
from deltacoord.coordinator.kafka.control import HALT, RESUME, control_kind
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.rules import batch as batch_module
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import AddFile, CommitInfo, commit_to_json_lines
from deltacoord.schemas.errors import CommitNotPublishedError
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.routing import Topics
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids)}, schema=SCHEMA)


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _append_proposal(uri: str, read_version: int, proposal_id: str | None = None, table_id: str | None = None) -> Proposal:
    pid = proposal_id or str(uuid.uuid4())
    return Proposal(table_id=table_id or uri, table_uri=uri, proposal_id=pid, read_version=read_version, operation="WRITE",
                    changes_data=True, actions=(AddFile(f"part-{pid}.parquet", {}, 10, 0, True),),
                    commit_info=CommitInfo({"operation": "WRITE", "txnId": pid}))


def _decisions(bootstrap: str, topics: Topics, table_id: str) -> list[Decision]:
    settings = CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id="containment-check")
    return [d for d in read_decisions(settings, 0) if d.table_id == table_id]


def _commit_file(root: Path, v: int) -> Path:
    return root / "_delta_log" / f"{v:020d}.json"


def _write_around(root: Path, *ids: int) -> None:
    """Append `ids` around the coordinator as a writer that ignores the protocol would: a data file and the next
    commit file, created exclusively. Delta writers that follow the protocol refuse: the coordinated table names
    the `deltacoord-coordinated` writer feature."""
    from deltalake import write_deltalake

    with pytest.raises(Exception, match=COORDINATED):
        write_deltalake(str(root), _rows(*ids), mode="append")
    name = f"part-around-{uuid.uuid4()}.parquet"
    pq.write_table(_rows(*ids), root / name)
    version = max(int(p.name.split(".")[0]) for p in (root / "_delta_log").glob("*.json")) + 1
    add = AddFile(name, {}, (root / name).stat().st_size, int(time.time() * 1000), True, stats=f'{{"numRecords":{len(ids)}}}')
    with open(_commit_file(root, version), "xb") as f:
        f.write(commit_to_json_lines([CommitInfo({"operation": "WRITE", "timestamp": int(time.time() * 1000)}), add]))


def _resume(bootstrap: str, topics: Topics, table: str) -> None:
    prefix = topics.proposals.removesuffix(".proposals")
    r = CliRunner().invoke(cli_main, ["table", "resume", table, "--bootstrap-servers", bootstrap, "--topic-prefix", prefix])
    assert r.exit_code == 0, r.output


def _halted(coord: Coordinator) -> dict[str, Any]:
    _ok, detail = coord.health()
    halted = detail["halted_tables"]
    assert isinstance(halted, dict)
    return halted


# --------------------------------------------------------------------------- (a) write-around


@pytest.mark.parametrize("read_version", [1, 2], ids=["at-the-head", "beyond-the-head"])
def test_a_write_around_is_never_acknowledged_as_that_version(kafka_bootstrap: str, tmp_path: Path,
                                                              read_version: int) -> None:
    """The next proposal halts the table: one that read Kafka's head (1), and one from a writer that loaded the
    foreign version (2, beyond Kafka's head), which was rejected as READ_VERSION_AHEAD while nothing showed."""
    topics = fresh_topics(kafka_bootstrap)
    root, other = (tmp_path / "t").resolve(), (tmp_path / "other").resolve()
    uri = root.as_uri()
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        with Table(root, kafka_bootstrap, topics=topics) as t, Table(other, kafka_bootstrap, topics=topics) as o:
            t.create(SCHEMA)
            o.create(SCHEMA)
            assert t.append(_rows(1)).version == 1
            t.wait_published(1, 60)
        _write_around(root, 100)  # version 2, written around the coordinator
        foreign = _commit_file(root, 2).read_bytes()
        assert Snapshot.load(str(root)).version == 2 and not _halted(coord)
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            d = client.commit(_append_proposal(uri, read_version), 60)
        finally:
            client.close()
        assert not d.committed and d.reason_code == "TABLE_HALTED", d
        assert "written around the coordinator" in (d.error_message or "")
        # Visible the moment it happens, in /healthz and the gauge.
        assert list(_halted(coord)) == [uri] and coord.metrics.halted_tables._value.get() == 1
        with Table(other, kafka_bootstrap, topics=topics) as o:
            assert o.append(_rows(2)).version == 1, "the other table goes on"
        assert coord.wait_published(60)
    assert _commit_file(root, 2).read_bytes() == foreign, "nothing was overwritten"
    kinds = [control_kind(d) for d in _decisions(kafka_bootstrap, topics, uri)]
    assert kinds.count(HALT) == 1 and not any(d.committed and d.version == 2 for d in _decisions(kafka_bootstrap, topics, uri))
    # After a restart the halt is still in force (it is on the commits topic).
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        assert list(_halted(coord)) == [uri]
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            d = client.commit(_append_proposal(uri, 1), 60)
        finally:
            client.close()
        assert not d.committed and d.reason_code == "TABLE_HALTED"


def test_foreign_versions_beyond_kafkas_head_halt_at_recovery_until_resumed(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    uri = root.as_uri()
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        with Table(root, kafka_bootstrap, topics=topics) as t:
            t.create(SCHEMA)
            assert t.append(_rows(1)).version == 1
        assert coord.wait_published(60)
    # While no coordinator runs, a writer appends twice around it: versions 2 and 3, beyond Kafka's head (1).
    _write_around(root, 100)
    _write_around(root, 101)
    assert _commit_file(root, 3).exists()
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        halted = _halted(coord)
        assert list(halted) == [uri] and "ratified only up to 1" in halted[uri], halted
        assert coord.metrics.halted_tables._value.get() == 1
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            d = client.commit(_append_proposal(uri, 1), 60)
        finally:
            client.close()
        assert not d.committed and d.reason_code == "TABLE_HALTED"
    # Restarted again: the halt recovery found was recorded, and the files are still there anyway.
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        assert list(_halted(coord)) == [uri]
        # The way out: move the foreign versions aside, then resume.
        aside = tmp_path / "aside"
        aside.mkdir()
        for v in (2, 3):
            shutil.move(str(_commit_file(root, v)), aside)
        _resume(kafka_bootstrap, topics, str(root))
        _wait(lambda: not _halted(coord), "the table to be resumed")
        with Table(root, kafka_bootstrap, topics=topics) as t:
            assert t.append(_rows(2)).version == 2
            t.wait_published(2, 60)
    assert sorted(Snapshot.load(root).to_pyarrow().column("id").to_pylist()) == [1, 2]
    kinds = [k for k in (control_kind(d) for d in _decisions(kafka_bootstrap, topics, uri)) if k]
    assert kinds == [HALT, RESUME]


# --------------------------------------------------------------------------- (b) one table's fault


def test_a_publisher_failure_halts_one_table_and_the_halt_survives_a_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    a, b = (tmp_path / "a").resolve(), (tmp_path / "b").resolve()
    with coordinator_thread(kafka_bootstrap, topics) as coord, \
            Table(a, kafka_bootstrap, topics=topics) as ta, Table(b, kafka_bootstrap, topics=topics) as tb:
        ta.create(SCHEMA)
        ta.wait_published(0, 60)  # (a's decision can reach the writer before the coordinator hands it to the publisher)
        faults.arm("publish:1:fail")  # the next publication (b's version 0) fails on an unexpected error
        try:
            # Ratified, never published: the writer waiting for publication hears so at once.
            with pytest.raises(CommitNotPublishedError, match="halted"):
                tb.create(SCHEMA)
            _wait(lambda: b.as_uri() in _halted(coord), "b to halt")
        finally:
            faults.arm(None)
        assert "failed unexpectedly" in _halted(coord)[b.as_uri()]
        assert coord.metrics.halted_tables._value.get() == 1
        for i in range(3):
            assert ta.append(_rows(i)).version == i + 1
        ta.wait_published(3, 60)
        assert not _commit_file(b, 0).exists()
        assert coord.ready and not coord.fenced
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        assert list(_halted(coord)) == [b.as_uri()], "the halt survives a restart"
        with Table(a, kafka_bootstrap, topics=topics) as ta:
            assert ta.append(_rows(9)).version == 4
        assert not _commit_file(b, 0).exists()
        _resume(kafka_bootstrap, topics, str(b))
        _wait(lambda: _commit_file(b, 0).exists() and not _halted(coord), "b's version 0 after the resume")


def test_a_decision_path_fault_on_one_table_halts_only_that_table(kafka_bootstrap: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    topics = fresh_topics(kafka_bootstrap)
    good, bad = (tmp_path / "good").resolve(), (tmp_path / "bad").resolve()
    decide = batch_module.decide

    def faulty(state: Any, p: Proposal, now_ms: int) -> Any:
        if p.table_id == bad.as_uri() and p.read_version >= 0:
            raise ZeroDivisionError("a bug that only this table's proposals reach")
        return decide(state, p, now_ms)

    with coordinator_thread(kafka_bootstrap, topics) as coord, \
            Table(good, kafka_bootstrap, topics=topics) as tg, Table(bad, kafka_bootstrap, topics=topics) as tbad:
        tg.create(SCHEMA)
        tbad.create(SCHEMA)
        monkeypatch.setattr(batch_module, "decide", faulty)
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            d = client.commit(_append_proposal(bad.as_uri(), 0), 60)
        finally:
            client.close()
        assert not d.committed and d.reason_code == "TABLE_HALTED" and "ZeroDivisionError" in (d.error_message or "")
        assert "ZeroDivisionError" in _halted(coord)[bad.as_uri()]
        assert tg.append(_rows(1)).version == 1, "the other table goes on, the daemon did not stop"
        assert coord.ready and not coord.stop_event.is_set()
    monkeypatch.setattr(batch_module, "decide", decide)
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        assert list(_halted(coord)) == [bad.as_uri()]


# --------------------------------------------------------------------------- (c) one decision per proposal id


def test_a_replayed_proposal_gets_its_first_decision(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    uri = root.as_uri()
    replayed = _append_proposal(uri, 0)
    with coordinator_thread(kafka_bootstrap, topics):
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            first = client.commit(replayed, 60)  # the table does not exist yet
            assert not first.committed and first.reason_code == "UNKNOWN_TABLE"
            with Table(root, kafka_bootstrap, topics=topics) as t:
                t.create(SCHEMA)  # now deciding the same proposal again would commit it as version 1
            again = client.commit(replayed, 60)
            assert not again.committed and again.reason_code == "UNKNOWN_TABLE"
        finally:
            client.close()
    with coordinator_thread(kafka_bootstrap, topics):  # the window is rebuilt at recovery
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            third = client.commit(replayed, 60)
        finally:
            client.close()
        assert not third.committed and third.reason_code == "UNKNOWN_TABLE"
        with Table(root, kafka_bootstrap, topics=topics) as t:
            assert t.append(_rows(1)).version == 1, "nothing was committed for the replays"
    answers = [d for d in _decisions(kafka_bootstrap, topics, uri) if d.proposal_id == replayed.proposal_id]
    assert [(d.outcome.value, d.reason_code) for d in answers] == [("REJECTED", "UNKNOWN_TABLE")] * 3


# --------------------------------------------------------------------------- (d) restarts from a state snapshot


def test_a_restart_reads_the_newest_snapshot_plus_the_records_after_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    uri = root.as_uri()
    state = {"state_root": str(tmp_path / "state"), "snapshot_every_records": 10}
    early = _append_proposal(uri, 0)
    rejected = _append_proposal(uri, 99)
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            with Table(root, kafka_bootstrap, topics=topics) as t:
                t.create(SCHEMA)
                assert client.commit(early, 60).version == 1
                assert client.commit(rejected, 60).reason_code == "READ_VERSION_AHEAD"
                for i in range(25):
                    assert t.append(_rows(i)).version == i + 2
        finally:
            client.close()
        assert coord.wait_published(60)
        worker = coord._workers[0]
        written = worker.snapshots_written
        worker.request_snapshot()  # one covering everything, for the check below
        _wait(lambda: worker.snapshots_written > written, "a snapshot covering everything")
    total = 28  # creation, early, rejected, 25 appends
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
        assert coord.metrics.recovery_records._value.get() < 5, "only the records after the snapshot are read"
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            again = client.commit(early, 60)  # a redelivery of a commit from before the snapshot
            assert again.committed and again.duplicate_of == 1
            replay = client.commit(rejected, 60)  # a replayed rejection from before the snapshot
            assert not replay.committed and replay.reason_code == "READ_VERSION_AHEAD"
        finally:
            client.close()
        with Table(root, kafka_bootstrap, topics=topics) as t:
            assert t.append(_rows(100)).version == 27
            t.wait_published(27, 60)
    # _delta_log lost its newest versions: the newest snapshot cannot say where to find them, so an older one
    # (or the whole topic) is read.
    for v in (25, 26, 27):
        _commit_file(root, v).unlink()
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
        assert 5 < coord.metrics.recovery_records._value.get() <= total + 3
        _wait(lambda: _commit_file(root, 27).exists(), "the lost versions to be published again")
    snap = Snapshot.load(root)  # (version 1 adds a file the test never wrote: only the log is read)
    assert snap.version == 27 and len(list(snap.file_paths())) == 27


def test_a_decision_that_cannot_be_encoded_halts_only_its_table(kafka_bootstrap: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from deltacoord.coordinator.kafka import batch_checks as batch_checks_module

    topics = fresh_topics(kafka_bootstrap)
    good, bad = (tmp_path / "good").resolve(), (tmp_path / "bad").resolve()
    encode = batch_checks_module.encode_decision

    def faulty(d: Decision) -> bytes:
        if d.table_id == bad.as_uri() and d.committed:
            raise OverflowError("a bug that only this table's commits reach")
        return encode(d)

    with coordinator_thread(kafka_bootstrap, topics) as coord, \
            Table(good, kafka_bootstrap, topics=topics) as tg, Table(bad, kafka_bootstrap, topics=topics) as tbad:
        tg.create(SCHEMA)
        tbad.create(SCHEMA)
        monkeypatch.setattr(batch_checks_module, "encode_decision", faulty)
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            d = client.commit(_append_proposal(bad.as_uri(), 0), 60)
        finally:
            client.close()
        assert not d.committed and d.reason_code == "TABLE_HALTED" and "OverflowError" in (d.error_message or "")
        assert tg.append(_rows(1)).version == 1 and coord.ready
        assert list(_halted(coord)) == [bad.as_uri()]


def test_recovery_compares_every_version_after_the_snapshot_not_only_the_newest(kafka_bootstrap: str,
                                                                                 tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    state = {"state_root": str(tmp_path / "state"), "snapshot_every_records": 1_000_000}
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
        with Table(root, kafka_bootstrap, topics=topics) as t:
            t.create(SCHEMA)
            for i in range(3):
                t.append(_rows(i))
        assert coord.wait_published(60)
        worker = coord._workers[0]
        worker.request_snapshot()  # covers versions 0..3, all published
        _wait(lambda: worker.snapshots_written == 1, "the snapshot")
        with Table(root, kafka_bootstrap, topics=topics) as t:
            for i in range(3, 6):
                t.append(_rows(i))  # versions 4..6, after the snapshot
        assert coord.wait_published(60)
    # Version 5 (not the newest) is replaced behind the coordinator's back.
    changed = _commit_file(root, 5).read_bytes() + b"\n"
    _commit_file(root, 5).write_bytes(changed)
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides=state) as coord:
        _wait(lambda: root.as_uri() in _halted(coord), "the changed version 5 to halt the table")
        assert "different content" in _halted(coord)[root.as_uri()]
