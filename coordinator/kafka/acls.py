"""Kafka ACLs for a deltacoord deployment: who may do what, as data, then as `kafka-acls.sh` lines.

`plan_acls` is a pure function returning one `AclEntry` per granted operation;
`render_commands` turns them into `kafka-acls.sh --add` command lines (one per
principal and resource). Every grant is ALLOW from any host; nothing is DENY.

Writers (the batch client in `writer/`):

* proposals topic: WRITE, DESCRIBE (produce; `partition_of` reads the topic's metadata)
* commits topic: READ, DESCRIBE (tail decisions, look up an unknown outcome)
* consumer groups: READ on their group-id prefixes only (PREFIXED): the reply
  lease group `deltacoord-writer-<replies topic>` and the hand-assigned readers'
  ids. DESCRIBE (not READ) on the coordinators' group, for the check that a
  coordinator serves the table's partition.
* relays (`deltacoord relay run`) propose and lease reply partitions for the
  writers of a host: they get the writers' grants.
* nothing else: no WRITE on commits or dead letters, no transactional ids.

The coordinator:

* proposals topic: READ, DESCRIBE
* commits topic: WRITE, READ, DESCRIBE, and DESCRIBE_CONFIGS (at start it checks
  that the commits topic is not compacted, `deltacoord.coordinator.kafka.topics.validate_topics`)
* dead-letter topic: WRITE, DESCRIBE, DESCRIBE_CONFIGS (at start it checks that
  a dead letter fits the topic's max.message.bytes)
* its consumer group and the `<group>-recovery` group that rebuilds state from the
  commits topic: READ, DESCRIBE (LITERAL)
* transactional ids `<transactional_id_prefix>-<prefix>.proposals-*`: WRITE,
  DESCRIBE (PREFIXED)
* IDEMPOTENT_WRITE on the cluster only with `idempotent_write_acl=True`: brokers
  since Kafka 3.0 (KIP-679) authorise idempotent and transactional producers by
  their topic / transactional-id WRITE, so it is off by default. Writers' idempotent
  producers get it too when it is on.
* no CREATE: create the topics beforehand as an administrator (`deltacoord topics create`).

Readers of the change feed (`deltacoord.reader.stream`, optional): READ, DESCRIBE on commits
and READ on their group prefix.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from deltacoord.schemas.routing import Topics

TOPIC = "TOPIC"
GROUP = "GROUP"
TRANSACTIONAL_ID = "TRANSACTIONAL_ID"
CLUSTER = "CLUSTER"
LITERAL = "LITERAL"
PREFIXED = "PREFIXED"
#: The one cluster resource's name in Kafka's ACL model.
CLUSTER_NAME = "kafka-cluster"

#: Group-id prefixes the client libraries use (writer/client.py, reader/stream.py).
DEFAULT_WRITER_GROUP_PREFIXES = ("deltacoord-writer-", "deltacoord-lookup")
DEFAULT_READER_GROUP_PREFIXES = ("deltacoord-stream-",)

_RESOURCE_FLAG = {TOPIC: "--topic", GROUP: "--group", TRANSACTIONAL_ID: "--transactional-id", CLUSTER: "--cluster"}
_OPERATION_NAME = {
    "READ": "Read", "WRITE": "Write", "DESCRIBE": "Describe", "DESCRIBE_CONFIGS": "DescribeConfigs",
    "IDEMPOTENT_WRITE": "IdempotentWrite",
}


class AclPlanError(ValueError):
    """The requested principals or prefixes would make an unsafe or ambiguous ACL set."""


@dataclass(frozen=True, order=True)
class AclEntry:
    """One ALLOW grant: `principal` may do `operation` on the resource (type, name, pattern type)."""

    principal: str
    resource_type: str
    name: str
    pattern_type: str
    operation: str
    permission: str = "ALLOW"
    host: str = "*"


@dataclass(frozen=True)
class AclRequest:
    writer_principals: tuple[str, ...]
    coordinator_principals: tuple[str, ...]
    topic_prefix: str = "deltacoord"
    group_id: str | None = None
    transactional_id_prefix: str | None = None
    writer_group_prefixes: tuple[str, ...] = DEFAULT_WRITER_GROUP_PREFIXES
    reader_principals: tuple[str, ...] = ()
    reader_group_prefixes: tuple[str, ...] = DEFAULT_READER_GROUP_PREFIXES
    idempotent_write_acl: bool = False
    #: Relays (`deltacoord relay run`) propose and read replies for a host's writers: they get the writers' grants.
    relay_principals: tuple[str, ...] = ()

    @property
    def coordinator_group(self) -> str:
        return self.group_id or f"{self.topic_prefix}-coordinator"

    @property
    def txn_prefix(self) -> str:
        return self.transactional_id_prefix or f"{self.topic_prefix}-coordinator"


def coordinator_groups(group_id: str) -> tuple[str, str]:
    """The consumer groups a coordinator uses: its own and the one `read_decisions` rebuilds state with."""
    return (group_id, f"{group_id}-recovery")


def transactional_id_acl_prefix(transactional_id_prefix: str, topics: Topics) -> str:
    """The PREFIXED resource covering `CoordinatorSettings.transactional_id(p)` for every partition p."""
    return f"{transactional_id_prefix}-{topics.proposals}-"


def _check_principal(p: str) -> str:
    kind, sep, name = p.partition(":")
    if not sep or not kind or not name:
        raise AclPlanError(f"principal {p!r} must look like Type:name, e.g. User:writer")
    return p


def _check_prefixes(req: AclRequest) -> None:
    groups = coordinator_groups(req.coordinator_group)
    for prefix in (*req.writer_group_prefixes, *(req.reader_group_prefixes if req.reader_principals else ())):
        if not prefix:
            raise AclPlanError("an empty group prefix would grant READ on every consumer group")
        for g in groups:
            if g.startswith(prefix):
                raise AclPlanError(
                    f"group prefix {prefix!r} covers the coordinator's consumer group {g!r}: writers and readers "
                    "must not be able to join or commit offsets in it; choose distinct group ids"
                )
    both = set((*req.writer_principals, *req.relay_principals, *req.reader_principals)) & set(req.coordinator_principals)
    if both:
        raise AclPlanError(f"{sorted(both)} are both coordinator principals and writer, relay or reader principals: "
                           "use separate principals (only coordinators may write the commits topic)")


def plan_acls(req: AclRequest) -> list[AclEntry]:
    """Every grant the deployment needs, and nothing more, in a stable order."""
    if not (req.writer_principals or req.coordinator_principals or req.reader_principals or req.relay_principals):
        raise AclPlanError("no principals: pass at least one writer, relay, coordinator or reader principal")
    for p in (*req.writer_principals, *req.relay_principals, *req.coordinator_principals, *req.reader_principals):
        _check_principal(p)
    _check_prefixes(req)
    topics = Topics.with_prefix(req.topic_prefix)
    out: list[AclEntry] = []

    def grant(principal: str, rtype: str, name: str, pattern: str, *ops: str) -> None:
        out.extend(AclEntry(principal, rtype, name, pattern, op) for op in ops)

    for w in dict.fromkeys((*req.writer_principals, *req.relay_principals)):
        grant(w, TOPIC, topics.proposals, LITERAL, "WRITE", "DESCRIBE")
        grant(w, TOPIC, topics.commits, LITERAL, "READ", "DESCRIBE")
        grant(w, TOPIC, topics.replies, LITERAL, "READ", "DESCRIBE")
        for gp in req.writer_group_prefixes:
            grant(w, GROUP, gp, PREFIXED, "READ")
        # The check that a coordinator serves the partition describes the coordinators' group (never joins it).
        grant(w, GROUP, req.coordinator_group, LITERAL, "DESCRIBE")
        if req.idempotent_write_acl:
            grant(w, CLUSTER, CLUSTER_NAME, LITERAL, "IDEMPOTENT_WRITE")
    for c in req.coordinator_principals:
        grant(c, TOPIC, topics.proposals, LITERAL, "READ", "DESCRIBE")
        grant(c, TOPIC, topics.commits, LITERAL, "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS")
        grant(c, TOPIC, topics.dead_letters, LITERAL, "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")
        grant(c, TOPIC, topics.replies, LITERAL, "WRITE", "DESCRIBE")
        for g in coordinator_groups(req.coordinator_group):
            grant(c, GROUP, g, LITERAL, "READ", "DESCRIBE")
        grant(c, TRANSACTIONAL_ID, transactional_id_acl_prefix(req.txn_prefix, topics), PREFIXED, "WRITE", "DESCRIBE")
        if req.idempotent_write_acl:
            grant(c, CLUSTER, CLUSTER_NAME, LITERAL, "IDEMPOTENT_WRITE")
    for r in req.reader_principals:
        grant(r, TOPIC, topics.commits, LITERAL, "READ", "DESCRIBE")
        for gp in req.reader_group_prefixes:
            grant(r, GROUP, gp, PREFIXED, "READ")
    return out


def _grouped(entries: Iterable[AclEntry]) -> list[tuple[tuple[str, str, str, str, str, str], list[str]]]:
    """Entries merged per (principal, host, permission, resource): one command each, order kept."""
    groups: dict[tuple[str, str, str, str, str, str], list[str]] = {}
    for e in entries:
        key = (e.principal, e.host, e.permission, e.resource_type, e.name, e.pattern_type)
        ops = groups.setdefault(key, [])
        if e.operation not in ops:
            ops.append(e.operation)
    return list(groups.items())


def command_args(entries: Iterable[AclEntry], bootstrap_server: str, command_config: str | None = None,
                 executable: str = "kafka-acls.sh") -> list[list[str]]:
    """The argv of each `kafka-acls.sh --add` command granting `entries`."""
    out: list[list[str]] = []
    for (principal, host, permission, rtype, name, pattern), ops in _grouped(entries):
        argv = [executable, "--bootstrap-server", bootstrap_server]
        if command_config:
            argv += ["--command-config", command_config]
        side = "allow" if permission == "ALLOW" else "deny"
        argv += ["--add", f"--{side}-principal", principal, f"--{side}-host", host]
        for op in ops:
            argv += ["--operation", _OPERATION_NAME[op]]
        argv.append(_RESOURCE_FLAG[rtype])
        if rtype != CLUSTER:
            argv.append(name)
            argv += ["--resource-pattern-type", pattern.lower()]
        out.append(argv)
    return out


def render_commands(entries: Iterable[AclEntry], bootstrap_server: str, command_config: str | None = None,
                    executable: str = "kafka-acls.sh") -> str:
    """Shell lines (safely quoted), one command per principal and resource."""
    return "\n".join(shlex.join(a) for a in command_args(entries, bootstrap_server, command_config, executable)) + "\n"
