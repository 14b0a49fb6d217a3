"""A commit returns when Delta readers see it; each writer fetches only its own decisions.

By default a commit returns once `_delta_log/<v>.json` is published (the coordinator's one reply on the
writer's reply partition, sent after publication, says so), so delta-rs sees it the moment `append()`
returns, with no sleep and no retry. Replies travel on the replies topic, on a partition each writer
process leases through a consumer group: a writer's reply consumer never fetches another writer's
decisions. A reply lost with its coordinator is made up for by the commits topic.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from deltacoord.coordinator import faults
from deltacoord.coordinator.kafka import batch_checks
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import CommitNotPublishedError, InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import Topics
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import WaitFor
from tests.conftest import TablePlace
from tests.integration.coord_harness import (
    GroupQuestions,
    append_worker,
    coordinator_thread,
    fresh_topics,
    start_coordinator_process,
)

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string())])


def _row(i: int) -> pa.Table:
    return pa.table({"id": [i], "date": ["2024-01-01"], "value": [f"v{i}"]})


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap, reply_partitions=4)


@pytest.fixture
def coordinator(kafka_bootstrap: str, topics: Topics, table_place: TablePlace) -> Iterator[Coordinator]:
    with coordinator_thread(kafka_bootstrap, topics, **table_place.coordinator_settings) as coord:
        yield coord


def test_a_returned_commit_is_visible_to_delta_rs_at_once(kafka_bootstrap: str, topics: Topics, table_place: TablePlace,
                                                          coordinator: Coordinator, tmp_path: Path) -> None:
    uri = table_place.of(tmp_path / "t")
    t = Table(uri, kafka_bootstrap, topics=topics, storage_options=table_place.storage_options)
    try:
        assert t.create(SCHEMA).version == 0
        assert table_place.delta_table(uri).version() == 0
        for i in range(1, 21):
            r = t.append(_row(i))
            assert r.version == i
            # No sleep, no retry: the version is in _delta_log when append() returns.
            assert table_place.delta_table(uri).version() == i
            assert table_place.exists(uri, table_place.commit_key(i))
        assert table_place.delta_table(uri).to_pyarrow_table().num_rows == 20
    finally:
        t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_version_written_around_before_the_proposal_is_found_before_ratifying(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Version 0 is older than the time the coordinator takes version 1 as free without asking the store.
    monkeypatch.setattr(batch_checks, "FREE_AFTER_OWN_PUT_S", 0.0)
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
    try:
        t.create(SCHEMA)
        before = t.snapshot()
        # Someone wrote version 1 around the coordinator: it is found before version 1 is ratified, so the
        # append is refused (never acknowledged as an invisible version 1).
        (tmp_path / "t" / "_delta_log" / f"{1:020d}.json").write_text('{"commitInfo":{"operation":"ROGUE"}}\n')
        with pytest.raises(InvalidProposalError) as refused:
            t.append(_row(1), snapshot=before)
        assert refused.value.reason == ReasonCode.TABLE_HALTED
        assert coordinator.publisher.halted(t.table_id) is not None
    finally:
        t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
@pytest.mark.parametrize("wait", ["published", "ratified"])
def test_a_version_written_around_just_after_ours_is_never_acknowledged(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path,
        wait: WaitFor) -> None:
    """Just after the coordinator created version 0, version 1 is taken as free without a store round trip when the
    writer waits for publication: the version written around meets the publication, the table halts, the writer
    hears committed but not published, and nothing is overwritten. A writer that returns at ratification makes
    the coordinator ask the store first: refused, never told COMMITTED."""
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics, wait=wait)
    try:
        t.create(SCHEMA)
        t.wait_published(0, 60)
        before = t.snapshot()
        rogue = tmp_path / "t" / "_delta_log" / f"{1:020d}.json"
        rogue.write_text('{"commitInfo":{"operation":"ROGUE"}}\n')
        if wait == "published":
            with pytest.raises(CommitNotPublishedError) as unpublished:
                t.append(_row(1), snapshot=before)
            assert unpublished.value.version == 1 and "around the coordinator" in str(unpublished.value)
        else:
            with pytest.raises(InvalidProposalError) as refused:
                t.append(_row(1), snapshot=before)
            assert refused.value.reason == ReasonCode.TABLE_HALTED
        assert coordinator.publisher.halted(t.table_id) is not None
        assert rogue.read_text() == '{"commitInfo":{"operation":"ROGUE"}}\n', "nothing was overwritten"
    finally:
        t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_version_halted_after_ratification_is_committed_but_not_published(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path) -> None:
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
    try:
        t.create(SCHEMA)
        faults.arm("publish:1:fail")  # the publisher fails on version 1 after it was ratified: the table halts
        with pytest.raises(CommitNotPublishedError) as ei:
            t.append(_row(1))
        assert ei.value.version == 1 and "halted" in str(ei.value)
        assert coordinator.publisher.halted(t.table_id) is not None
    finally:
        faults.arm(None)
        t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_each_writer_fetches_only_its_own_decisions(kafka_bootstrap: str, topics: Topics, table_place: TablePlace,
                                                     coordinator: Coordinator, tmp_path: Path) -> None:
    clients = [CoordinatorClient(kafka_bootstrap, topics=topics) for _ in range(3)]
    try:
        # Three members, four partitions: once every member holds a lease and all four are held, the
        # group is at its target (2/1/1) and no partition moves while the writers commit.
        for c in clients:
            assert c.wait_leased(180), "no reply partition was leased within 180 s"
        deadline = threading.Event()
        for _ in range(1800):
            leases = [c._replies().leased() for c in clients]
            if all(leases) and frozenset().union(*leases) == frozenset(range(4)) and sum(map(len, leases)) == 4:
                break
            deadline.wait(0.1)
        else:
            pytest.fail(f"the reply group did not settle within 180 s: {leases}")
        # A writer reads its new lease's partition at once and stops reading one it lost (or the shared one)
        # a moment after the group moved it: wait for that moment, so the writes below see the settled state.
        for _ in range(600):
            if all(c._replies().reading() <= c._replies().leased() for c in clients):
                break
            deadline.wait(0.1)
        else:
            pytest.fail(f"readers still read partitions they do not hold after 60 s: {[c._replies().reading() for c in clients]}")
        tables = [Table(tmp_path / "t", kafka_bootstrap, topics=topics, client=c) for c in clients]
        tables[0].create(SCHEMA, properties={"deltacoord.coalesce": "false"})  # one version per commit
        errors: list[BaseException] = []

        def write(t: Table, w: int) -> None:
            try:
                for i in range(10):
                    t.append(_row(w * 100 + i))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=write, args=(t, w)) for w, t in enumerate(tables)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert not errors
        assert tables[0].snapshot().version == 30
        for c in clients:
            counts = c.reply_counts
            assert counts.foreign == 0, f"a writer fetched {counts.foreign} answers to other writers' proposals"
            assert counts.records >= 10  # its own decisions (and notices)
        assert clients[0].reply_counts.records >= 11  # the create too
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_more_writer_processes_than_reply_partitions_all_get_their_decisions(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path) -> None:
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
    t.create(SCHEMA, properties={"deltacoord.coalesce": "false"})  # one version per commit
    t.close()
    ctx = multiprocessing.get_context("spawn")
    n, k = 6, 8  # six processes on four reply partitions: some share one and skip the others' answers
    procs = [ctx.Process(target=append_worker, args=(kafka_bootstrap, topics.proposals.removesuffix(".proposals"),
                                                     str(tmp_path / "t"), w, k, str(tmp_path / f"w{w}.json")))
             for w in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        assert p.exitcode == 0
    versions = sorted(r["version"] for w in range(n) for r in json.loads((tmp_path / f"w{w}.json").read_text()))
    assert versions == list(range(1, n * k + 1))
    assert table_place.delta_table(str(tmp_path / "t")).version() == n * k


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_restarted_writer_gets_its_decisions(kafka_bootstrap: str, topics: Topics, table_place: TablePlace,
                                               coordinator: Coordinator, tmp_path: Path) -> None:
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
    t.create(SCHEMA)
    t.append(_row(1))
    t.close()
    for round_ in range(2):
        again = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
        try:
            assert again.append(_row(2 + round_)).version == 2 + round_
            assert table_place.delta_table(str(tmp_path / "t")).version() == 2 + round_
        finally:
            again.close()


def test_a_ratified_commit_is_read_through_deltacoord_before_it_is_published(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The publisher is held (it hangs before writing version 1): `wait="ratified"` commits return, our reader
    sees them from the commits topic, delta-rs does not yet; a default commit says it is not published."""
    topics = fresh_topics(kafka_bootstrap)
    proc = start_coordinator_process(kafka_bootstrap, topics, tmp_path, env={"DELTACOORD_FAULT": "publish:2:hang"})
    path = tmp_path / "t"
    try:
        t = Table(path, kafka_bootstrap, topics=topics, wait="ratified", publish_timeout_s=3.0, decision_timeout_s=120)
        try:
            assert t.create(SCHEMA).version == 0
            for v in (1, 2):
                assert t.append(_row(v)).version == v
                assert not (path / "_delta_log" / f"{v:020d}.json").exists()
                snap = t.snapshot(ratified=True)
                assert snap.version == v
                assert sorted(snap.to_pyarrow().column("id").to_pylist()) == list(range(1, v + 1))
            assert Snapshot.load(path).version == 0  # what _delta_log says
            assert DeltaTable(str(path)).version() == 0
            with pytest.raises(CommitNotPublishedError) as ei:
                t.wait = "published"
                t.append(_row(3))
            assert ei.value.version == 3
            assert "not published" in str(ei.value)
        finally:
            t.close()
    finally:
        proc.kill()


@pytest.mark.parametrize("wait", ["published", "ratified"])
def test_a_reply_lost_with_its_coordinator_is_found_in_the_commits_topic(kafka_bootstrap: str, tmp_path: Path,
                                                                         wait: WaitFor) -> None:
    """The coordinator stops right after the Kafka transaction that ratifies version 2, before any reply:
    the writer finds its decision in the commits topic (nothing is proposed again), and with the default
    wait returns once the successor has published version 2."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    a = start_coordinator_process(kafka_bootstrap, topics, tmp_path, env={"DELTACOORD_FAULT": "after_kafka_commit:3:stop"})
    b = None
    try:
        with Table(path, kafka_bootstrap, topics=topics, wait=wait, decision_timeout_s=120, publish_timeout_s=120) as t:
            t.create(SCHEMA)
            t.append(_row(1))
            result: list[int] = []
            errors: list[BaseException] = []

            def third() -> None:
                try:
                    result.append(t.append(_row(2)).version)
                except BaseException as e:
                    errors.append(e)

            th = threading.Thread(target=third)
            th.start()
            _wait_until(lambda: _state(a.proc.pid) == "T", 60, "the coordinator to stop after its Kafka commit")
            if wait == "ratified":
                th.join(120)  # no coordinator runs: the decision comes from the commits topic
                assert result == [2], errors
                assert not (path / "_delta_log" / f"{2:020d}.json").exists()
            b = start_coordinator_process(kafka_bootstrap, topics, tmp_path)
            th.join(120)
            assert not th.is_alive() and not errors, errors
            assert result == [2]
            if wait == "published":
                assert DeltaTable(str(path)).version() == 2  # visible the moment append() returned
        assert _end_offsets(kafka_bootstrap, topics.proposals) == 3, "a proposal was sent again"
    finally:
        if a.alive():
            os.kill(a.proc.pid, signal.SIGCONT)
            a.kill()
        if b is not None:
            b.kill(15)


def _wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _end_offsets(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "deltacoord-test-offsets"})
    try:
        md = c.list_topics(topic, timeout=30)
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in md.topics[topic].partitions)
    finally:
        c.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_fresh_writers_first_commits_are_answered_on_its_reply_partition(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path) -> None:
    """The reply reader starts reading before the first proposal names a partition (the shared one at once, a
    leased one when leased), and only its own thread assigns it: every answer arrives as a reply, none is left
    to the commits-topic scan that follows REPLY_WAIT_S."""
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
    try:
        t.create(SCHEMA)  # the first commit: most likely before the lease, on the shared partition
        assert t.client.wait_leased(180), "no reply partition was leased within 180 s"
        for i in range(3):  # the first commits on the leased partition
            t.append(_row(i))
        counts = t.client.reply_counts
        assert counts.records >= 4, f"only {counts.records} of 4 answers came as replies"
        assert counts.foreign == 0
        assert t.snapshot().version == 3
    finally:
        t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_fresh_writers_start_up_clients_connect_to_the_brokers_they_learn_at_once(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path) -> None:
    """The clients a first commit waits for (producer, reply reader, the coordinator check's listing) do not use
    librdkafka's sparse connections, whose suppression of new connections held each one's first answer about 11 ms
    after its bootstrap connection was dropped; a setting given by the caller wins, and commits go through both ways."""
    for given, expected in (({}, False), ({"enable.sparse.connections": True}, True)):
        t = Table(tmp_path / f"t-{expected}", kafka_bootstrap, topics=topics, **given)
        try:
            assert t.client.coordinator_check._conf["enable.sparse.connections"] is expected
            t.create(SCHEMA)
            assert t.append(_row(1)).version == 1
            assert t.client.reply_counts.records >= 2
        finally:
            t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_short_lived_writer_commits_without_joining_the_writers_group(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that ends before its lease would start (a CLI write) commits on the shared reply partition, every
    answer a reply, and never becomes a member of the writers' group; asking for a lease starts it at once."""
    monkeypatch.setattr("deltacoord.writer.client.LEASE_AFTER_S", 3600.0)  # the lease starts only when asked for
    questions = GroupQuestions({"bootstrap.servers": kafka_bootstrap})
    group = f"deltacoord-writer-{topics.replies}"

    def members() -> int:
        return len(questions.describe([group], 10)[group]["members"])

    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics)
    try:
        t.create(SCHEMA)
        for i in range(3):
            assert t.append(_row(i)).version == i + 1
        counts = t.client.reply_counts
        assert counts.records - counts.foreign >= 4, f"only {counts.records - counts.foreign} of 4 answers came as replies"
        assert t.client._replies().leased() == frozenset()
        assert members() == 0
        assert t.client.wait_leased(180)  # asked for: the lease starts now
        assert members() == 1
        assert t.append(_row(9)).version == 4
        assert table_place.delta_table(str(tmp_path / "t")).version() == 4
    finally:
        t.close()
        questions.close()


def test_a_closed_writer_gives_its_leased_partitions_back_before_closing_its_lease(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, coordinator: Coordinator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a writer that leases reply partitions: its lease's thread unsubscribes and serves the revocation
    in a poll of its own, then closes the lease with nothing assigned, so no revocation runs inside librdkafka's
    close (where confluent-kafka's fallback unassign could wait for ever holding the GIL); the writer leaves the
    group and its next owner gets the partitions."""
    from deltacoord.writer import client as client_module

    revoked_on: list[str] = []
    on_revoke = client_module.ReplyPartitions._on_revoke

    def noting(self: client_module.ReplyPartitions, consumer: Any, partitions: list[Any]) -> None:
        revoked_on.append(threading.current_thread().name)
        on_revoke(self, consumer, partitions)

    monkeypatch.setattr(client_module.ReplyPartitions, "_on_revoke", noting)
    questions = GroupQuestions({"bootstrap.servers": kafka_bootstrap})
    group = f"deltacoord-writer-{topics.replies}"
    try:
        uri = table_place.of(tmp_path / "t")
        t = Table(uri, kafka_bootstrap, topics=topics, storage_options=table_place.storage_options)
        t.create(SCHEMA)
        assert t.client.wait_leased(180)
        replies = t.client._replies()
        assert isinstance(replies, client_module.ReplyPartitions) and replies.leased()
        t.close()
        assert all(not th.is_alive() for th in replies._threads), "a reply thread outlived close"
        assert revoked_on and set(revoked_on) == {"deltacoord-reply-lease"}, revoked_on
        assert questions.describe([group], 10)[group].get("members", []) == []
    finally:
        questions.close()
