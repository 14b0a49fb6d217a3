"""An aborted Kafka transaction costs one batch, not a replay of the commits topic.

A coordinator decides a batch against forks of its table states (the overlay)
and applies the overlay only after the transaction commits. Here the first
transaction after some history fails before its commit (the `before_kafka_commit`
fault point, `:fail`), so it is really aborted on the broker; the batch is
consumed and decided again. The test counts the commits-topic records the
coordinator reads to rebuild state (none after start-up, though the topic
then holds a history that a replay would read), and checks that every
decision equals the one a run without the abort makes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from deltacoord.coordinator import faults
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.rules import batch
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.codec import decode_decision, encode_proposal
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.routing import H_PROPOSAL_ID, H_TABLE_ID, Topics
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.unit.builders import add, metadata, proposal, protocol, txn

POINT = "before_kafka_commit"


def _history(uri: str) -> list[Proposal]:
    """Versions 0..5: a Serializable table partitioned by part, five blind appends."""
    create = proposal(-1, [protocol(), metadata(("part",), isolation="Serializable")], operation="CREATE TABLE", changes_data=False,
                      table_id=uri, table_uri=uri, proposal_id="create")
    appends = [proposal(v, [add(f"part={v % 2}/h{v}.parquet", part=v % 2)], table_id=uri, table_uri=uri,
                        proposal_id=f"h{v}") for v in range(5)]
    return [create, *appends]


def _batch(uri: str) -> list[Proposal]:
    """Proposals whose decisions depend on the ones before them in the same batch (head is 5)."""
    kw: dict[str, Any] = {"table_id": uri, "table_uri": uri}
    a = proposal(5, [add("part=0/a.parquet", part=0)], proposal_id="a", **kw)
    return [
        a,  # commits 6
        a,  # a redelivery: version 6 again, not a second commit
        proposal(5, [add("part=0/b.parquet", part=0)], predicates=["part = 0"], proposal_id="b", **kw),  # a appended to part=0
        proposal(4, [add("part=1/c.parquet", part=1), txn("q", 1)], app_ids=["q"], proposal_id="c", **kw),  # commits 7
        proposal(5, [add("part=1/d.parquet", part=1), txn("q", 2)], app_ids=["q"], proposal_id="d", **kw),  # c wrote q
        proposal(3, [add("part=0/e.parquet", part=0)], predicates=["part = 1"], proposal_id="e", **kw),  # h3 is in part=1
        proposal(50, [add("part=0/f.parquet", part=0)], proposal_id="f", **kw),  # beyond the head
    ]


def _produce(bootstrap: str, topics: Topics, proposals: list[Proposal]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for prop in proposals:
        p.produce(topics.proposals, value=encode_proposal(prop), key=prop.table_id.encode(), partition=0,
                  headers=[(H_PROPOSAL_ID, prop.proposal_id.encode()), (H_TABLE_ID, prop.table_id.encode())])
    assert p.flush(30) == 0


def _read(bootstrap: str, topics: Topics, n: int, timeout_s: float = 120.0) -> list[Decision]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "abort-test", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topics.commits, 0, 0)])
        out: list[Decision] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n:
            assert time.monotonic() < deadline, f"only {len(out)} of {n} decisions after {timeout_s:.0f}s"
            for m in c.consume(100, 0.5):
                value = m.value()
                if m.error() is None and value is not None:
                    out.append(decode_decision(value))
        return out
    finally:
        c.close()


def _run(bootstrap: str, table: Path, *, abort: bool) -> tuple[list[tuple[Any, ...]], float, int]:
    """(decisions without table ids, commits-topic records read by recovery, times the fault point was reached)."""
    uri = table.resolve().as_uri()
    topics = fresh_topics(bootstrap)
    history, batch = _history(uri), _batch(uri)
    with coordinator_thread(bootstrap, topics) as coord:
        _produce(bootstrap, topics, history)
        _read(bootstrap, topics, len(history))
        faults.arm(f"{POINT}:1:fail" if abort else None)
        try:
            _produce(bootstrap, topics, batch)
            decisions = _read(bootstrap, topics, len(history) + len(batch))
            reached = faults.reached(POINT)
        finally:
            faults.arm(None)
        recovered = coord.metrics.registry.get_sample_value("deltacoord_recovery_records_total")
    assert recovered is not None
    summary = [(d.proposal_id, d.outcome.value, d.version, d.duplicate_of, d.error_type, d.reason_code) for d in decisions]
    return summary, recovered, reached


def test_an_aborted_transaction_reads_nothing_back_and_decides_the_same(kafka_bootstrap: str, tmp_path: Path) -> None:
    plain, plain_read, _ = _run(kafka_bootstrap, tmp_path / "plain", abort=False)
    aborted, aborted_read, reached = _run(kafka_bootstrap, tmp_path / "aborted", abort=True)

    assert reached >= 1  # the first transaction after the history failed and was aborted on the broker
    # Recovery ran once, at start-up, on an empty commits topic; the abort read nothing back
    # although the topic then held 6 committed decisions.
    assert plain_read == 0 and aborted_read == 0
    assert aborted == plain
    # The decisions depend on the batch's own earlier acceptances (had the aborted attempt's commits
    # stayed in the state, `a` would come back as a duplicate and `c` at another version).
    assert [row[1:] for row in plain[6:]] == [
        ("COMMITTED", 6, None, None, None),
        ("COMMITTED", 6, 6, None, None),
        ("REJECTED", None, None, "ConcurrentAppendException", None),
        ("COMMITTED", 7, None, None, None),
        ("REJECTED", None, None, "ConcurrentTransactionException", None),
        ("REJECTED", None, None, "ConcurrentAppendException", None),
        ("REJECTED", None, None, "InvalidProposalError", "READ_VERSION_AHEAD"),
    ]


def test_a_bug_in_the_decision_path_halts_that_table_not_the_daemon(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TypeError raised while deciding one table's proposal is ours, not the writer's: that table is halted
    (recorded, so it survives restarts) and its proposal refused with TABLE_HALTED, never COMMITTED; the daemon
    keeps running for the other tables (exit 5 is left for failures that are not one table's)."""
    uri = (tmp_path / "t").resolve().as_uri()
    topics = fresh_topics(kafka_bootstrap)
    create = _history(uri)[0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug in the decision path")

    monkeypatch.setattr(batch, "decide", broken)
    settings = CoordinatorSettings(kafka_bootstrap, topics=topics, group_id=f"{topics.proposals}-coord",
                                   transactional_id_prefix=f"{topics.proposals}-tx")
    coord = Coordinator(settings, publish_fsync=False)
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.setdefault("code", coord.run()), daemon=True)
    t.start()
    try:
        _produce(kafka_bootstrap, topics, [create])
        answers = [d for d in _read(kafka_bootstrap, topics, 1) if d.proposal_id == "create"]
        assert len(answers) == 1 and not answers[0].committed, answers
        assert answers[0].reason_code == "TABLE_HALTED"
        assert coord.publisher.halted(create.table_id) is not None
        assert t.is_alive(), "the daemon stopped on one table's bug"
    finally:
        coord.stop_event.set()
        t.join(60)
    assert not any(d.committed for d in read_decisions(settings, 0))
