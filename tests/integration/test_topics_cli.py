"""`deltacoord topics create|describe` against the real test broker (a single node, hence --allow-unsafe)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from deltacoord.cli import topics as cli_topics
from deltacoord.cli.main import main as cli_main
from deltacoord.schemas.routing import Topics

pytestmark = pytest.mark.kafka


def _cli() -> click.Group:
    group = click.Group("deltacoord", commands=dict(cli_main.commands))
    cli_topics.register(group)
    return group


def _run(bootstrap: str, *args: str) -> Result:
    # DELTACOORD_* from the environment must not leak into the command.
    env: dict[str, str | None] = {"DELTACOORD_CONFIG": None, "DELTACOORD_TOPIC_PREFIX": None, "DELTACOORD_BOOTSTRAP_SERVERS": None}
    return CliRunner().invoke(_cli(), ["topics", *args, "--bootstrap-servers", bootstrap], env=env)


def _json(res: Result) -> Any:
    # click 8.2+ keeps stderr apart; the JSON document is all of stdout.
    return json.loads(res.stdout)


@pytest.fixture
def prefix(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[str]:
    p = unique_name("topicscli")
    yield p
    t = Topics.with_prefix(p)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    existing = set(admin.list_topics(timeout=30).topics)
    names = [n for n in (t.proposals, t.commits, t.dead_letters, t.replies) if n in existing]
    if names:
        for f in admin.delete_topics(names).values():
            f.result(30)


def test_create_then_describe(kafka_bootstrap: str, prefix: str) -> None:
    t = Topics.with_prefix(prefix)
    res = _run(kafka_bootstrap, "create", "--topic-prefix", prefix, "--partitions", "3", "--replication-factor", "1",
               "--min-insync-replicas", "1", "--allow-unsafe", "--reply-partitions", "5")
    assert res.exit_code == 0, res.output
    out = _json(res)
    assert sorted(out["created"]) == sorted([t.proposals, t.commits, t.dead_letters, t.replies])
    assert out["problems"] == []
    assert "replication factor 1 < 3" in res.stderr

    res = _run(kafka_bootstrap, "describe", "--topic-prefix", prefix)
    assert res.exit_code == 0, res.output
    desc = _json(res)
    topics = desc["topics"]
    assert topics[t.proposals]["partitions"] == topics[t.commits]["partitions"] == 3
    assert topics[t.dead_letters]["partitions"] == 1
    assert topics[t.replies]["partitions"] == 5
    for name in (t.proposals, t.commits, t.dead_letters, t.replies):
        assert topics[name]["exists"] is True
        assert topics[name]["replication_factor"] == 1
        cfg = topics[name]["configs"]
        assert cfg["min.insync.replicas"] == "1"
        assert cfg["unclean.leader.election.enable"] == "false"
    dead = topics[t.dead_letters]["configs"]
    assert dead["max.message.bytes"] == "1048576" and dead["retention.bytes"] == "1073741824"
    commits = topics[t.commits]["configs"]
    assert commits["cleanup.policy"] == "delete"
    assert commits["retention.ms"] == "-1" and commits["retention.bytes"] == "-1"
    assert desc["problems"] == []
    assert any("replication factor 1 < 3" in w for w in desc["warnings"])
    # One line per warning, naming every topic it is about (not one per topic and setting).
    assert len(desc["warnings"]) == len(set(desc["warnings"])) <= 3, desc["warnings"]
    assert all(name in w for w in desc["warnings"] for name in (t.proposals, t.commits, t.dead_letters, t.replies))
    assert len(out["warnings"]) <= 3 and res.stderr.count("warning:") <= 3, (out["warnings"], res.stderr)

    # Again: nothing to create, nothing differs.
    res = _run(kafka_bootstrap, "create", "--topic-prefix", prefix, "--partitions", "3", "--replication-factor", "1",
               "--min-insync-replicas", "1", "--allow-unsafe", "--reply-partitions", "5")
    assert res.exit_code == 0, res.output
    again = _json(res)
    assert again["created"] == [] and again["differences"] == {}
    # A different count is reported, not applied.
    res = _run(kafka_bootstrap, "create", "--topic-prefix", prefix, "--partitions", "4", "--replication-factor", "1",
               "--min-insync-replicas", "1", "--allow-unsafe")
    assert res.exit_code == 0, res.output
    assert _json(res)["differences"][t.commits] == [f"{t.commits} has 3 partitions, not 4"]


def test_unsafe_create_is_refused_and_creates_nothing(kafka_bootstrap: str, prefix: str) -> None:
    res = _run(kafka_bootstrap, "create", "--topic-prefix", prefix, "--partitions", "3", "--replication-factor", "1")
    assert res.exit_code == 2
    assert "replication factor 1 < 3" in res.output and "--allow-unsafe" in res.output
    res = _run(kafka_bootstrap, "describe", "--topic-prefix", prefix)
    assert res.exit_code == 1
    desc = _json(res)
    assert all(not v["exists"] for v in desc["topics"].values())
    assert len(desc["problems"]) == 4


def test_create_refuses_more_replicas_than_brokers(kafka_bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    brokers = len(admin.list_topics(timeout=30).brokers)
    res = _run(kafka_bootstrap, "create", "--topic-prefix", prefix, "--partitions", "1",
               "--replication-factor", str(brokers + 1), "--allow-unsafe")
    assert res.exit_code == 1
    assert f"{brokers} broker(s)" in res.output


def test_describe_flags_a_compacted_commits_topic(kafka_bootstrap: str, prefix: str) -> None:
    t = Topics.with_prefix(prefix)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.create_topics([
        NewTopic(t.proposals, num_partitions=2, replication_factor=1),
        NewTopic(t.commits, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"}),
        NewTopic(t.dead_letters, num_partitions=1, replication_factor=1),
    ])
    for f in futures.values():
        f.result(30)
    res = _run(kafka_bootstrap, "describe", "--topic-prefix", prefix)
    assert res.exit_code == 1
    problems = _json(res)["problems"]
    assert any("cleanup.policy=compact" in p for p in problems)
    # create does not alter existing topics, and fails on the same problem.
    res = _run(kafka_bootstrap, "create", "--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1",
               "--allow-unsafe")
    assert res.exit_code == 1
    assert any("cleanup.policy=compact" in p for p in _json(res)["problems"])
