"""A write with no coordinator serving its partition fails within seconds, and proposes nothing.

Without the check the proposal would wait for a decision nobody makes, end as an
unknown outcome after the decision timeout, and commit later once a coordinator
starts, so a user re-running the write would get the rows twice. The check costs
no broker round trip per commit of a busy writer: replies renew its answer.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from deltacoord.cli.tables import register
from deltacoord.schemas.errors import NoCoordinatorError, ProposalNotSentError
from deltacoord.schemas.routing import Topics
from deltacoord.writer import serving
from deltacoord.writer.group_questions import QuestionFailed
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("id", pa.int64())])
#: "Within seconds": the check gives up after `serving.SETTLE_S`; the rest is room for a loaded machine. Far below
#: what a proposal nobody decides would take (the decision timeout, then an unknown outcome).
FAIL_WITHIN_S = serving.SETTLE_S + 60
#: Each admin request's bound in these tests: a loaded machine's slow answer must not read as "cannot tell" (then
#: the writer proposes as without the check).
REQUEST_TIMEOUT_S = 60.0


def _proposals_end(bootstrap: str, topics: Topics) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "deltacoord-lookup-test"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topics.proposals, 0), timeout=30)[1])
    finally:
        c.close()


def _parquet_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def _warm(check: serving.CoordinatorCheck) -> None:
    """Until the check's admin child process has answered once: its start is not what the timing measures."""
    deadline = time.monotonic() + 180
    while True:
        try:
            check.kafka.describe([check.group_id], REQUEST_TIMEOUT_S)
            return
        except QuestionFailed as e:
            assert time.monotonic() < deadline, f"the admin child process gave no answer within 180 s: {e}"
            time.sleep(0.5)


def test_no_coordinator_fails_within_seconds_and_proposes_nothing(kafka_bootstrap: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "REQUEST_TIMEOUT_S", REQUEST_TIMEOUT_S)
    topics = fresh_topics(kafka_bootstrap)
    prefix = topics.proposals.removesuffix(".proposals")
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        t.append(pa.table({"id": [1]}, schema=SCHEMA))
    files = _parquet_files(path)
    end = _proposals_end(kafka_bootstrap, topics)

    # The coordinator has stopped (it left its group): a new writer finds no one serving the partition.
    with Table(path, kafka_bootstrap, topic_prefix=prefix) as t:
        _warm(t.client.coordinator_check)
        started = time.monotonic()
        with pytest.raises(NoCoordinatorError) as ei:
            t.append(pa.table({"id": [99]}, schema=SCHEMA))
        took = time.monotonic() - started
    assert took < FAIL_WITHIN_S, f"the write failed after {took:.1f}s"
    err = ei.value
    assert isinstance(err, ProposalNotSentError)  # nothing was sent: a retry is safe
    assert (err.topic, err.partition) == (topics.proposals, 0)
    text = str(err)
    assert f"partition 0 of topic {topics.proposals}" in text, text
    assert f"deltacoord coordinator run --bootstrap-servers {kafka_bootstrap} --topic-prefix {prefix}" in text, text
    assert "nothing was proposed" in text and "DELTACOORD_COORDINATOR_CHECK=0" in text, text
    assert _parquet_files(path) == files, "the check comes before staging: no file was written"
    assert _proposals_end(kafka_bootstrap, topics) == end, "no proposal was produced"
    assert t.client.coordinator_check.kafka.started >= 1  # the group is not Stable: the exact question was asked

    # The CLI says the same in one line (no traceback), exit 1.
    cli = click.Group("deltacoord")
    register(cli)
    res = CliRunner().invoke(cli, ["table", "append", str(path), "--json-rows", '[{"id": 98}]',
                                   "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix])
    assert res.exit_code == 1, res.output
    assert f"no coordinator serves partition 0 of topic {topics.proposals}" in res.output, res.output
    assert "Traceback" not in res.output
    assert _proposals_end(kafka_bootstrap, topics) == end

    # Once a coordinator runs, nothing of the refused writes commits: only what is written from now on.
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        assert t.append(pa.table({"id": [2]}, schema=SCHEMA)).version == 2
    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == [1, 2]


def test_a_busy_writer_asks_kafka_about_the_coordinator_at_most_once_per_trusted_interval(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics), Table(tmp_path / "t", kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA)
        check = t.client.coordinator_check
        asked = check.questions
        started = time.monotonic()
        for i in range(20):
            t.append(pa.table({"id": [i]}, schema=SCHEMA))
        elapsed = time.monotonic() - started
        # Every decision renews the answer: only a pause longer than TRUSTED_S between commits asks again.
        assert check.questions - asked <= elapsed // serving.TRUSTED_S, (check.questions - asked, elapsed)
        assert check.group_id == f"{topics.proposals.removesuffix('.proposals')}-coordinator"


def test_coordinators_under_another_group_id_are_found(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    other = f"{topics.proposals}-custom-group"
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides={"group_id": other}), \
            Table(tmp_path / "t", kafka_bootstrap, topics=topics) as t:
        assert t.create(SCHEMA).version == 0
        assert t.client.coordinator_check.group_id == other  # asked directly from now on


def test_a_stable_coordinator_group_is_seen_in_process_without_the_child(kafka_bootstrap: str, tmp_path: Path) -> None:
    # The quick look (ListGroups, in the writer's process) finds the coordinators' group Stable: every proposals
    # partition is held, so a fresh writer's first commits never start the child that asks the exact question.
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics), Table(tmp_path / "t", kafka_bootstrap, topics=topics) as t:
        assert t.create(SCHEMA).version == 0
        assert t.append(pa.table({"id": [1]}, schema=SCHEMA)).version == 1
        check = t.client.coordinator_check
        assert check.quick_looks >= 1
        assert check.kafka.started == 0, "the exact question (a child process) was asked of a Stable group"
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("id").to_pylist() == [1]
