"""Provisioning and validation of the proposals, commits, dead-letter and replies topics.

The commits topic is the source of truth, so it is never compacted and keeps
its records forever by default (retention.ms=-1); proposals only need to live
until decided. Replication follows the cluster: RF = min(3, brokers) and
min.insync.replicas = RF - 1 (at least 1), with unclean leader election off.

The dead-letter topic gets explicit limits rather than the broker's defaults:
`max.message.bytes` (1 MiB, well above the largest dead letter a coordinator
sends with its default `dead_letter_max_bytes`) and `retention.bytes` (1 GiB),
so a flood of undecodable messages can neither block the coordinator nor fill
the brokers' disks.

The replies topic carries each writer's own decisions and publication notices
(`deltacoord.writer.client`); its partition count bounds how many writer processes get a
partition of their own (`DEFAULT_REPLY_PARTITIONS`), and its records expire after a day.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]

from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.routing import Topics

log = logging.getLogger(__name__)

WEEK_MS = 7 * 24 * 3600 * 1000
#: Explicit limits of the dead-letter topic (see the module docstring).
DEAD_LETTER_MAX_MESSAGE_BYTES = 1024 * 1024
DEAD_LETTER_RETENTION_BYTES = 1024 * 1024 * 1024
#: Partitions of the replies topic: one per live writer process is exclusive; more writers share
#: (each still reads only one partition). Cheap to have: replies are tiny and expire after a day.
DEFAULT_REPLY_PARTITIONS = 32
#: Replies only matter while a writer waits (seconds); a day covers any debugging.
REPLY_RETENTION_MS = 24 * 3600 * 1000


class TopicConfigError(DeltaCoordError, RuntimeError):
    """A topic exists with settings the coordinator cannot work with."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(topics: Topics, partitions: int, replication_factor: int,
                reply_partitions: int = DEFAULT_REPLY_PARTITIONS) -> list[TopicSpec]:
    min_isr = str(max(1, replication_factor - 1))
    common = {"min.insync.replicas": min_isr, "unclean.leader.election.enable": "false", "cleanup.policy": "delete"}
    return [
        TopicSpec(topics.proposals, partitions, replication_factor, {**common, "retention.ms": str(WEEK_MS)}),
        TopicSpec(topics.commits, partitions, replication_factor, {**common, "retention.ms": "-1", "retention.bytes": "-1"}),
        TopicSpec(topics.dead_letters, 1, replication_factor, {
            **common, "retention.ms": str(4 * WEEK_MS), "retention.bytes": str(DEAD_LETTER_RETENTION_BYTES),
            "max.message.bytes": str(DEAD_LETTER_MAX_MESSAGE_BYTES),
        }),
        TopicSpec(topics.replies, reply_partitions, replication_factor, {
            **common, "retention.ms": str(REPLY_RETENTION_MS), "retention.bytes": str(DEAD_LETTER_RETENTION_BYTES),
        }),
    ]


def dead_letter_limit_problem(topic: str, configs: Mapping[str, str | None], record_bound: int) -> str | None:
    """Why the dead-letter topic cannot take every dead letter the coordinator may send, or None."""
    raw = configs.get("max.message.bytes")
    if raw is None or not str(raw).strip().isdigit():
        return None
    limit = int(str(raw).strip())
    if limit >= record_bound:
        return None
    return (f"{topic} has max.message.bytes={limit}, below the {record_bound} bytes a dead letter may take "
            f"(dead_letter_max_bytes plus key and headers): raise it to at least {record_bound}, or lower "
            "dead_letter_max_bytes; until then oversized dead letters are recorded without their bytes")


def ensure_topics(admin: AdminClient, topics: Topics, partitions: int = 1, replication_factor: int | None = None,
                  dead_letter_bound: int | None = None, reply_partitions: int = DEFAULT_REPLY_PARTITIONS,
                  client_config: Mapping[str, Any] | None = None) -> int:
    """Create missing topics, validate existing ones; returns the proposals partition count.

    With `dead_letter_bound` (the largest dead letter this coordinator sends), a dead-letter
    topic too small for it is logged as a warning: such dead letters lose their bytes.
    `client_config` (the admin client's settings) names the principal when the authorizer refuses.
    """
    md = admin.list_topics(timeout=30)
    rf = replication_factor or min(3, max(1, len(md.brokers)))
    specs = topic_specs(topics, partitions, rf, reply_partitions)
    missing = [s for s in specs if s.name not in md.topics]
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor, config=s.config) for s in missing]
        )
        for name, f in futures.items():
            try:
                f.result(30)
            except Exception as e:
                if "AUTHORIZATION_FAILED" in str(e):
                    raise TopicConfigError(_not_authorized(name, client_config or {})) from None
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise TopicConfigError(f"cannot create topic {name}: {e}") from e
        md = _wait_visible(admin, [s.name for s in specs])
    validate_topics(admin, topics, specs)
    if dead_letter_bound is not None:
        cfg = describe_topic_config(admin, topics.dead_letters)
        problem = dead_letter_limit_problem(
            topics.dead_letters, {k: e.value for k, e in cfg.items()}, dead_letter_bound)
        if problem:
            log.warning("%s", problem)
    return len(md.topics[topics.proposals].partitions)


def _not_authorized(topic: str, conf: Mapping[str, Any]) -> str:
    """Why a topic is neither visible nor creatable: with an authorizer, a principal sees only the topics an ACL lets
    it describe, and creating one needs CREATE, which the plan gives nobody but the administrator."""
    from deltacoord.schemas.errors import kafka_principal

    principal = kafka_principal(conf)
    return (f"Kafka refused {principal} DESCRIBE on topic {topic} (no ACL grants it) and then CREATE: create the topics "
            f"as the administrator (`deltacoord topics create`) and grant the coordinators' ACLs (`deltacoord acls "
            f"--apply --coordinator-principal {principal.split(' ')[0]} ...`)")


def _wait_visible(admin: AdminClient, names: Sequence[str], timeout_s: float = 30.0) -> Any:
    """Metadata right after creation may lag: wait until every topic has its partitions."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            md = admin.list_topics(timeout=10)
        except KafkaException as e:
            if not (isinstance(e.args[0], KafkaError) and _transient(e.args[0])) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        if all(n in md.topics and md.topics[n].partitions and md.topics[n].error is None for n in names):
            return md
        if time.monotonic() > deadline:
            raise TopicConfigError(f"topics {list(names)} were created but are not visible after {timeout_s:.0f}s")
        time.sleep(0.1)


def validate_topics(admin: AdminClient, topics: Topics, specs: Sequence[TopicSpec]) -> None:
    md = _wait_visible(admin, [s.name for s in specs])
    p = len(md.topics[topics.proposals].partitions)
    c = len(md.topics[topics.commits].partitions)
    if p != c:
        raise TopicConfigError(
            f"{topics.proposals} has {p} partitions but {topics.commits} has {c}: a table's proposals and decisions "
            "must share a partition index, so both topics need the same count"
        )
    cfg = describe_topic_config(admin, topics.commits)
    policy = cfg["cleanup.policy"].value if "cleanup.policy" in cfg else "delete"
    if "compact" in (policy or ""):
        raise TopicConfigError(
            f"{topics.commits} has cleanup.policy={policy}: the commits topic is the source of truth and must not be compacted"
        )


def describe_topic_config(admin: AdminClient, topic: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """A topic's configuration entries.

    On a cluster the broker answering may not know a topic another broker just
    created (its metadata arrives a moment later) and says UNKNOWN_TOPIC_OR_PART:
    retried until `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result: dict[str, Any] = next(iter(admin.describe_configs([ConfigResource("topic", topic)]).values())).result(30)
            return result
        except KafkaException as e:
            err = e.args[0]
            if not (isinstance(err, KafkaError) and (err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART or _transient(err))) \
                    or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


#: Errors of a broker that died or moved under a request: the next try goes to a live one.
_TRANSIENT = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_CONTROLLER, KafkaError.LEADER_NOT_AVAILABLE})


def _transient(err: KafkaError) -> bool:
    """A broker died or moved under the request (a cluster losing a node while a coordinator starts)."""
    return not err.fatal() and (err.retriable() or err.code() in _TRANSIENT)
