"""Commit coalescing end to end: appends that arrive while their table's store lags share one Delta version.

The store is stalled by holding publication (the coordinator's check that Kafka shows a decision, held as in
test_shown_when_stable): a version ratified then stays unpublished, so its table's lane is busy. Which proposals
one batch decides is made deterministic by gathering the partition's messages until all the test's writers have
proposed (`_Gather`, around the real loop; Kafka, the rules and the store are real). Each check reads the table
with delta-rs, verifies it against the commits topic, and reads the change feed and the ratified versions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Message
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.partition import PartitionCoordinator
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.stream import CommitStream
from deltacoord.schemas.actions import (
    COALESCED_KEY,
    AddFile,
    CommitInfo,
    SetTransaction,
    commit_to_json_lines,
    parse_commit,
)
from deltacoord.schemas.routing import Topics
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import CommitResult
from tests.integration.coord_harness import coordinator_group, coordinator_thread, fresh_topics
from tests.integration.test_shown_when_stable import HeldStability

SCHEMA = pa.schema([("id", pa.int64())])
WAIT_S = 180.0


class _Gather:
    """Around `PartitionCoordinator.process`: while armed with n, messages are held until n have come, then
    decided as one batch (what a busy coordinator's consumer would hand over at once)."""

    def __init__(self) -> None:
        self.want = 0
        self.held: list[Message] = []
        self.done = threading.Event()
        self._real = PartitionCoordinator.process

    def arm(self, n: int) -> None:
        self.done.clear()
        self.want = n

    def __call__(self, part: PartitionCoordinator, batch: list[Message]) -> None:
        if self.want <= 0:
            self._real(part, batch)
            return
        self.held.extend(batch)
        if len(self.held) < self.want:
            return
        msgs, self.held, self.want = self.held, [], 0
        self._real(part, msgs)
        self.done.set()


@pytest.fixture
def gather(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Gather]:
    g = _Gather()

    def process(self: PartitionCoordinator, batch: list[Message]) -> None:
        g(self, batch)

    monkeypatch.setattr(PartitionCoordinator, "process", process)
    yield g


def _in_threads(calls: list[Callable[[], CommitResult]]) -> tuple[list[threading.Thread], list[Any]]:
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for th in threads:
        th.start()
    return threads, out


def _join(threads: list[threading.Thread]) -> None:
    for th in threads:
        th.join(WAIT_S)
        assert not th.is_alive(), "a writer did not return"


def _commit(root: Path, v: int) -> list[Any]:
    return parse_commit((root / "_delta_log" / f"{v:020d}.json").read_bytes())


def _ids_delta_rs(root: Path) -> list[int]:
    return sorted(DeltaTable(str(root)).to_pyarrow_table().column("id").to_pylist())


def _settings(bootstrap: str, topics: Topics) -> CoordinatorSettings:
    return CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id=coordinator_group(topics) + "-v")


def _writers(root: Path, bootstrap: str, topics: Topics, n: int) -> list[Table]:
    return [Table(root, bootstrap, topics=topics) for _ in range(n)]


def _mixed(ts: list[Table], base: int) -> list[Callable[[], CommitResult]]:
    """Two batch appends and two streaming appends (app ids of their own), one row each."""
    def row(i: int) -> pa.Table:
        return pa.table({"id": [base + i]})

    return [
        lambda: ts[0].append(row(0)),
        lambda: ts[1].append(row(1), app_id="stream-a", app_version=1),
        lambda: ts[2].append(row(2)),
        lambda: ts[3].append(row(3), app_id="stream-b", app_version=7),
    ]


def test_a_batch_and_a_streaming_writer_share_a_version_while_the_store_lags(
        kafka_bootstrap: str, tmp_path: Path, gather: _Gather) -> None:
    topics = fresh_topics(kafka_bootstrap)
    held = HeldStability(kafka_bootstrap, topics.commits)
    root = (tmp_path / "t").resolve()

    def install(c: Coordinator) -> None:
        c.publisher.stable = held

    with coordinator_thread(kafka_bootstrap, topics, before_run=install) as coord:
        t = Table(root, kafka_bootstrap, topics=topics)
        t.create(SCHEMA)
        assert t.append(pa.table({"id": [100]})).version == 1
        # The store stalls: version 2 is ratified and stays unpublished, so the table's lane is busy.
        held.holding.set()
        first, first_out = _in_threads([lambda: Table(root, kafka_bootstrap, topics=topics).append(
            pa.table({"id": [101]}))])
        _wait(lambda: coord.publisher.lag() == 1, "version 2 ratified, not published")
        ts = _writers(root, kafka_bootstrap, topics, 4)
        gather.arm(4)
        threads, out = _in_threads(_mixed(ts, 0))
        assert gather.done.wait(WAIT_S), "the four proposals were decided in one batch"
        # Read-your-writes through the commits topic sees the shared version before it is published. The batch's
        # transaction has committed; read_committed readers see it once its markers are written, which Kafka does
        # after commit_transaction returns: a read a moment later may still end before it.
        _wait(lambda: t.snapshot(ratified=True).version == 3, "the shared version readable in the commits topic")
        ratified = t.snapshot(ratified=True)
        assert ratified.version == 3 and sorted(ratified.to_pyarrow().column("id").to_pylist()) == [0, 1, 2, 3, 100, 101]
        assert not (root / "_delta_log" / f"{3:020d}.json").exists()
        held.holding.clear()
        _join(first + threads)
        assert first_out[0].version == 2
        assert all(isinstance(r, CommitResult) for r in out), out
        assert [r.version for r in out] == [3, 3, 3, 3], "one version for the four commits"
        assert coord.wait_published(WAIT_S)
        assert coord.metrics.coalesced._value.get() == 3

        commit = _commit(root, 3)
        ci = commit[0]
        assert isinstance(ci, CommitInfo)
        assert sorted(ci.txn_ids) == sorted(r.proposal_id for r in out), "the commitInfo names every proposal"
        assert {c["txnId"]: c["operation"] for c in ci.values[COALESCED_KEY]} == {r.proposal_id: "WRITE" for r in out}
        assert len([a for a in commit if isinstance(a, AddFile)]) == 4
        assert sorted((a.app_id, a.version) for a in commit if isinstance(a, SetTransaction)) == [
            ("stream-a", 1), ("stream-b", 7)]
        assert sorted(f.name for f in (root / "_delta_log").glob("*.json")) == [f"{v:020d}.json" for v in range(4)]

        # delta-rs reads the coalesced version as ours does, and at the version before it.
        assert _ids_delta_rs(root) == [0, 1, 2, 3, 100, 101]
        assert sorted(t.to_pyarrow().column("id").to_pylist()) == [0, 1, 2, 3, 100, 101]
        assert sorted(DeltaTable(str(root), version=2).to_pyarrow_table().column("id").to_pylist()) == [100, 101]
        history = DeltaTable(str(root)).history()
        assert any(h.get(COALESCED_KEY) for h in history)

        # Exactly once: both pipelines retrying their app versions are skipped; a new one commits.
        again = [Table(root, kafka_bootstrap, topics=topics) for _ in range(2)]
        assert again[0].append(pa.table({"id": [1]}), app_id="stream-a", app_version=1).already_committed
        assert again[1].append(pa.table({"id": [3]}), app_id="stream-b", app_version=7).already_committed
        assert again[0].append(pa.table({"id": [4]}), app_id="stream-a", app_version=2).version == 4
        assert _ids_delta_rs(root) == [0, 1, 2, 3, 4, 100, 101]

        # The change feed: version for version as _delta_log, the shared version once with its four files.
        with CommitStream(str(root), kafka_bootstrap, topics=topics) as s:
            events = []
            _wait(lambda: bool(events.extend(s.poll(0.5))) or s.position >= 5, "the change feed to reach version 4")
        assert [e.version for e in events if e.added] == [1, 2, 3, 4]
        shared = next(e for e in events if e.version == 3)
        assert len(shared.added) == 4 and shared.actions == tuple(commit)
        for tb in [t, *ts, *again]:
            tb.close()
    rep = verify_table(_settings(kafka_bootstrap, topics), root.as_uri(), root.as_uri())
    assert_verified(rep)
    assert rep.topic_versions == 5 and rep.coalesced_commits == 3 and rep.published_versions == 5


def _stalled_then_four(coord: Coordinator, root: Path, bootstrap: str, topics: Topics, held: HeldStability | None,
                       gather: _Gather, properties: dict[str, str] | None = None
                       ) -> tuple[list[threading.Thread], list[Any]]:
    """Version 1 published; with `held`, version 2 ratified and left unpublished (the store stalls); then four
    writers (two batch, two streaming) proposing at once, decided in one batch. Returns their threads and results."""
    t = Table(root, bootstrap, topics=topics)
    t.create(SCHEMA, properties=properties or {})
    assert t.append(pa.table({"id": [100]})).version == 1
    t.close()
    threads: list[threading.Thread] = []
    if held is not None:
        held.holding.set()
        threads, _ = _in_threads([lambda: Table(root, bootstrap, topics=topics).append(pa.table({"id": [101]}))])
        _wait(lambda: coord.publisher.lag() == 1, "version 2 ratified, not published")
    else:
        assert coord.wait_published(WAIT_S)
    ts = _writers(root, bootstrap, topics, 4)
    gather.arm(4)
    four, out = _in_threads(_mixed(ts, 0))
    assert gather.done.wait(WAIT_S), "the four proposals were decided in one batch"
    return threads + four, out


def _one_version_each(kafka_bootstrap: str, tmp_path: Path, gather: _Gather, *, stalled: bool,
                      properties: dict[str, str] | None) -> None:
    topics = fresh_topics(kafka_bootstrap)
    held = HeldStability(kafka_bootstrap, topics.commits) if stalled else None
    root = (tmp_path / "t").resolve()

    def install(c: Coordinator) -> None:
        if held is not None:
            c.publisher.stable = held

    with coordinator_thread(kafka_bootstrap, topics, before_run=install) as coord:
        threads, out = _stalled_then_four(coord, root, kafka_bootstrap, topics, held, gather, properties)
        if held is not None:
            held.holding.clear()
        _join(threads)
        assert all(isinstance(r, CommitResult) for r in out), out
        first = 3 if stalled else 2
        assert sorted(r.version for r in out) == list(range(first, first + 4)), "one version per commit"
        assert coord.metrics.coalesced._value.get() == 0
        assert coord.wait_published(WAIT_S)
    assert all(COALESCED_KEY not in _commit(root, v)[0].values for v in range(first, first + 4))
    assert _ids_delta_rs(root) == sorted([0, 1, 2, 3, 100] + ([101] if stalled else []))
    rep = verify_table(_settings(kafka_bootstrap, topics), root.as_uri(), root.as_uri())
    assert_verified(rep)
    assert rep.coalesced_commits == 0 and rep.topic_versions == first + 4


def test_coalescing_off_keeps_one_version_per_commit_while_the_store_lags(
        kafka_bootstrap: str, tmp_path: Path, gather: _Gather) -> None:
    _one_version_each(kafka_bootstrap, tmp_path, gather, stalled=True, properties={"deltacoord.coalesce": "false"})


def test_light_load_keeps_one_version_per_commit(kafka_bootstrap: str, tmp_path: Path, gather: _Gather) -> None:
    """The same four commits in one batch while the table's lane is idle: each its own version, as always."""
    _one_version_each(kafka_bootstrap, tmp_path, gather, stalled=False, properties=None)


def test_a_crash_between_ratifying_and_publishing_a_coalesced_version_republishes_the_identical_file(
        kafka_bootstrap: str, tmp_path: Path, gather: _Gather) -> None:
    topics = fresh_topics(kafka_bootstrap)
    held = HeldStability(kafka_bootstrap, topics.commits)
    root = (tmp_path / "t").resolve()

    def install(c: Coordinator) -> None:
        c.publisher.stable = held

    # The first coordinator ratifies the coalesced version 3 and stops before publishing it (its publication
    # is held until it gives up: nothing of version 2 or 3 reaches _delta_log).
    with coordinator_thread(kafka_bootstrap, topics, before_run=install) as coord:
        threads, out = _stalled_then_four(coord, root, kafka_bootstrap, topics, held, gather)
    assert not (root / "_delta_log" / f"{2:020d}.json").exists()
    assert not (root / "_delta_log" / f"{3:020d}.json").exists()
    decisions = [d for d in read_decisions(_settings(kafka_bootstrap, topics), 0) if d.committed]
    leader = next(d for d in decisions if d.version == 3 and d.coalesced_into is None)
    members = [d for d in decisions if d.coalesced_into is not None]
    assert len(members) == 3 and all(d.version == 3 and d.coalesced_into == leader.proposal_id for d in members)
    expected = commit_to_json_lines(leader.actions)
    # The next coordinator recovers from the commits topic and publishes the same bytes.
    held.holding.clear()
    with coordinator_thread(kafka_bootstrap, topics) as again:
        assert again.wait_published(WAIT_S)
        _join(threads)
    assert (root / "_delta_log" / f"{3:020d}.json").read_bytes() == expected
    assert all(isinstance(r, CommitResult) for r in out), out
    assert [r.version for r in out] == [3, 3, 3, 3]
    assert _ids_delta_rs(root) == [0, 1, 2, 3, 100, 101]
    rep = verify_table(_settings(kafka_bootstrap, topics), root.as_uri(), root.as_uri())
    assert_verified(rep)
    assert rep.coalesced_commits == 3 and rep.published_versions == 4


def _wait(cond: Callable[[], bool], what: str) -> None:
    import time

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.spark
def test_delta_on_spark_reads_a_coalesced_version(kafka_bootstrap: str, tmp_path: Path, gather: _Gather,
                                                  spark: SparkSession) -> None:
    topics = fresh_topics(kafka_bootstrap)
    held = HeldStability(kafka_bootstrap, topics.commits)
    root = (tmp_path / "t").resolve()

    def install(c: Coordinator) -> None:
        c.publisher.stable = held

    with coordinator_thread(kafka_bootstrap, topics, before_run=install) as coord:
        threads, out = _stalled_then_four(coord, root, kafka_bootstrap, topics, held, gather)
        held.holding.clear()
        _join(threads)
        assert coord.wait_published(WAIT_S)
    assert [r.version for r in out] == [3, 3, 3, 3]
    df = spark.read.format("delta").load(str(root))
    assert sorted(r.id for r in df.collect()) == [0, 1, 2, 3, 100, 101]
    at2 = spark.read.format("delta").option("versionAsOf", 2).load(str(root))
    assert sorted(r.id for r in at2.collect()) == [100, 101]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{root}`").select("version", "operation").collect()
    assert sorted(r.version for r in history) == [0, 1, 2, 3]
