"""Poison is bounded: no message can stop a partition, however large, whatever the topics' limits.

The probes: an undecodable message just under the proposals topic's size limit
could not be copied to the dead-letter topic once headers were added, and a
2 MiB one could not when the dead-letter topic kept Kafka's default 1 MiB. The
coordinator retried the same batch for ever (111 times in 35 s) and every
writer of the partition got CommitOutcomeUnknownError. Now a dead letter keeps
a bounded prefix (full size and SHA-256 in headers); a record Kafka still
refuses is degraded (a dead letter without bytes, then none) and the message
answered with a rejection; the other writers keep committing throughout.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from deltacoord.cli.main import main as cli
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.kafka.topics import DEAD_LETTER_MAX_MESSAGE_BYTES, describe_topic_config
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import H_ERROR, H_PROPOSAL_ID, H_RAW_SHA256, H_RAW_SIZE, H_TABLE_ID, Topics
from deltacoord.writer import staging
from deltacoord.writer.client import CoordinatorClient, Pending
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])
KEEP = 64 * 1024  # the coordinator's default dead_letter_max_bytes


def _set_topic_config(bootstrap: str, topic: str, key: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    deadline = time.monotonic() + 30
    while describe_topic_config(admin, topic)[key].value != value:  # brokers apply it asynchronously
        assert time.monotonic() < deadline, f"{topic} {key} did not become {value}"
        time.sleep(0.1)


def _limit(bootstrap: str, topic: str) -> int:
    return int(describe_topic_config(AdminClient({"bootstrap.servers": bootstrap}), topic)["max.message.bytes"].value)


@dataclass
class Appender:
    """A writer appending one row at a time while the poison is handled; every append must commit."""

    table: Table
    versions: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            i = 0
            while not self.stop.is_set():
                self.versions.append(self.table.append(pa.table({"id": [i]}, schema=SCHEMA)).version)
                i += 1
        except BaseException as e:  # reported by the test
            self.errors.append(e)


@dataclass
class Scene:
    topics: Topics
    coord: Coordinator
    client: CoordinatorClient
    appender: Appender
    #: Proposal id -> its answers, for messages sent `named`.
    expected: dict[str, Pending] = field(default_factory=dict)

    def send(self, value: bytes, *, named: bool) -> tuple[str, float]:
        """Produce `value` to the table's partition (with the writer's headers when `named`, its answers in
        `expected`); returns its id and when."""
        pid = str(uuid.uuid4())
        headers: list[tuple[str, bytes]] = []
        if named:
            self.expected[pid] = self.client.expect(pid)
            headers = [(H_PROPOSAL_ID, pid.encode()), (H_TABLE_ID, self.appender.table.table_id.encode()),
                       self.expected[pid].header]
        p = Producer({"bootstrap.servers": self.coord.settings.bootstrap_servers, "message.max.bytes": 64 * 1024 * 1024,
                      "linger.ms": 0})
        p.produce(self.topics.proposals, value=value, partition=0, headers=headers)
        assert p.flush(60) == 0
        return pid, time.monotonic()

    def commits_go_on(self, after: int = 3) -> None:
        """The concurrent writer commits `after` more appends (every one of them: no unknown outcome)."""
        start = len(self.appender.versions)
        deadline = time.monotonic() + 180
        while len(self.appender.versions) < start + after and not self.appender.errors:
            assert time.monotonic() < deadline, "the concurrent writer stopped committing"
            time.sleep(0.05)
        assert not self.appender.errors, self.appender.errors


@pytest.fixture
def scene(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Scene]:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, partitions=[0]) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics, coordinator_check=False)  # a static coordinator joins no group: the writers' check for one cannot see it
        t = Table(tmp_path / "t", kafka_bootstrap, topics=topics, client=client, decision_timeout_s=120)
        t.create(SCHEMA)
        appender = Appender(t)
        th = threading.Thread(target=appender.run, daemon=True)
        th.start()
        s = Scene(topics, coord, client, appender)
        try:
            s.commits_go_on(after=2)
            yield s
        finally:
            appender.stop.set()
            th.join(180)
            client.close()
        assert not appender.errors, appender.errors
        assert appender.versions == list(range(1, len(appender.versions) + 1)), "every append committed, in order"
        assert coord.ready and not coord.fenced


def _dead_letters(bootstrap: str, topics: Topics, n: int) -> list[Message]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dl-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topics.dead_letters, 0, 0)])
    out: list[Message] = []
    deadline = time.monotonic() + 60
    while len(out) < n and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and m.error() is None:
            out.append(m)
    c.close()
    assert len(out) == n, f"expected {n} dead letters, got {len(out)}"
    return out


def _headers(m: Message) -> dict[str, bytes]:
    return {k: v for k, v in m.headers() or [] if isinstance(v, bytes)}


def _answer(s: Scene, pid: str) -> Decision:
    d = next((d for d in read_decisions(s.coord.settings, 0) if d.proposal_id == pid), None)
    assert d is not None, f"no decision for {pid}"
    return d


def _wait_answered(s: Scene, count: int) -> None:
    """Until the coordinator answered `count` non-writer messages (the metric counts proposals consumed)."""
    deadline = time.monotonic() + 120
    while True:
        done = (s.coord.metrics.registry.get_sample_value("deltacoord_dead_letters_total") or 0) + (
            s.coord.metrics.registry.get_sample_value("deltacoord_unrecordable_total", {"step": "rejection_only"}) or 0)
        if done >= count:
            return
        assert time.monotonic() < deadline, "the poison was not answered"
        time.sleep(0.05)


def _failures(s: Scene) -> float:
    return s.coord.metrics.registry.get_sample_value("deltacoord_transaction_failures_total") or 0.0


def test_an_undecodable_message_just_under_the_topic_limit_is_dead_lettered(scene: Scene) -> None:
    s = scene
    limit = _limit(s.coord.settings.bootstrap_servers, s.topics.proposals)
    poison = bytes([0xFF]) * (limit - 512)  # the largest value the topic takes with the writer's headers
    pid, t0 = s.send(poison, named=True)
    d = s.expected[pid].result(120)
    print(f"\nundecodable message of {len(poison)} bytes (topic limit {limit}): rejected {time.monotonic() - t0:.2f}s "
          f"after it was produced, {_failures(s):.0f} failed transactions")
    assert not d.committed and d.reason_code == "OVERSIZE"
    s.commits_go_on()
    (dl,) = _dead_letters(s.coord.settings.bootstrap_servers, s.topics, 1)
    h = _headers(dl)
    assert dl.value() == poison[:KEEP]
    assert int(h[H_RAW_SIZE]) == len(poison) and h[H_RAW_SHA256].decode() == hashlib.sha256(poison).hexdigest()
    assert b"exceeds the limit" in h[H_ERROR]
    assert _failures(s) == 0, "the bounded dead letter fits at the first attempt"


def test_a_2_mib_message_fits_a_dead_letter_topic_of_1_mib(scene: Scene) -> None:
    s = scene
    assert _limit(s.coord.settings.bootstrap_servers, s.topics.dead_letters) == DEAD_LETTER_MAX_MESSAGE_BYTES == 1024 * 1024
    poison = b"\x00\x01" * (1024 * 1024)  # 2 MiB, under the 4 MiB proposal limit: decoded, and undecodable
    _pid, t0 = s.send(poison, named=False)
    _wait_answered(s, 1)
    print(f"\n2 MiB undecodable message: dead-lettered {time.monotonic() - t0:.2f}s after it was produced")
    s.commits_go_on()
    (dl,) = _dead_letters(s.coord.settings.bootstrap_servers, s.topics, 1)
    assert dl.value() == poison[:KEEP] and int(_headers(dl)[H_RAW_SIZE]) == len(poison)
    assert _failures(s) == 0


@pytest.mark.parametrize("dl_limit,recorded", [(8192, "headers_only"), (200, "rejection_only")])
def test_a_dead_letter_topic_too_small_loses_the_bytes_not_the_partition(scene: Scene, dl_limit: int, recorded: str) -> None:
    """Below what the coordinator sends, `topics describe` says so; dead letters go without bytes, or not at all."""
    s = scene
    bootstrap = s.coord.settings.bootstrap_servers
    _set_topic_config(bootstrap, s.topics.dead_letters, "max.message.bytes", str(dl_limit))
    prefix = s.topics.proposals.removesuffix(".proposals")
    res = CliRunner().invoke(cli, ["topics", "describe", "--bootstrap-servers", bootstrap, "--topic-prefix", prefix])
    assert res.exit_code == 1, res.output
    problems = json.loads(res.output)["problems"]
    assert any(f"max.message.bytes={dl_limit}" in p and s.topics.dead_letters in p for p in problems), problems

    named, anonymous = b"\xc3\x01" * 50_000, b"\xfe" * 100_000
    pid, t0 = s.send(named, named=True)
    s.send(anonymous, named=False)
    d = s.expected[pid].result(120)
    _wait_answered(s, 2)
    print(f"\ndead-letter topic limit {dl_limit}: both messages answered {time.monotonic() - t0:.2f}s after they were "
          f"produced, {_failures(s):.0f} failed transactions")
    assert not d.committed and d.reason_code == "UNDECODABLE"
    s.commits_go_on()
    assert (s.coord.metrics.registry.get_sample_value("deltacoord_unrecordable_total", {"step": recorded}) or 0) >= 2
    if recorded == "headers_only":
        letters = _dead_letters(bootstrap, s.topics, 2)
        assert [m.value() for m in letters] == [None, None]
        assert sorted(int(_headers(m)[H_RAW_SIZE]) for m in letters) == [100_000, 100_000]
        assert all(b"not recorded with its bytes" in _headers(m)[H_ERROR] for m in letters)
    # Each refusal cost one retry (plus one that librdkafka's idempotence needs after a refused
    # batch), not one per poll for ever.
    reg = s.coord.metrics.registry
    steps = sum(reg.get_sample_value("deltacoord_unrecordable_total", {"step": k}) or 0 for k in ("headers_only", "rejection_only"))
    assert _failures(s) <= 2 * steps + 2


def test_a_decision_too_large_for_the_commits_topic_is_rejected_unrecordable(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A valid proposal whose decision Kafka refuses gets UNRECORDABLE; the table and its writers go on."""
    topics = fresh_topics(kafka_bootstrap)
    _set_topic_config(kafka_bootstrap, topics.commits, "max.message.bytes", str(64 * 1024))
    with coordinator_thread(kafka_bootstrap, topics, partitions=[0]) as coord:
        t = Table(tmp_path / "t", kafka_bootstrap, topics=topics, decision_timeout_s=120,
                  coordinator_check=False)  # a static coordinator joins no group: the writers' check for one cannot see it
        t.create(SCHEMA)
        tx = Transaction(t, 0)
        (add,) = staging.write_data_files(t.root, pa.table({"id": [1]}, schema=SCHEMA), ())
        tx.stage([add])
        for i in range(1500):  # ~100 KiB of adds: a valid proposal, a decision above 64 KiB
            tx.add(type(add)(f"part-{i:05d}-{'x' * 40}.parquet", {}, 10, add.modification_time, True))
        with pytest.raises(InvalidProposalError) as ei:
            tx.commit("WRITE")
        assert ei.value.reason == "UNRECORDABLE" and "make it smaller" in str(ei.value)
        assert t.append(pa.table({"id": [2]}, schema=SCHEMA)).version == 1
        assert coord.wait_published(60)
        t.close()
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    assert [(d.version, d.reason_code) for d in read_decisions(settings, 0)] == [(0, None), (None, "UNRECORDABLE"), (1, None)]
