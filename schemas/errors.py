"""Exceptions shared by writers, readers and the coordinator.

Conflict classes carry Delta Lake's names so users recognise them from Delta's
documentation. `retryable` says whether re-running the whole operation (read a
fresh snapshot, redo the work, propose again) may succeed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from deltacoord.schemas.reasons import ReasonCode


def format_partition(partition_values: Mapping[str, str | None] | None, partition_columns: tuple[str, ...] | list[str]) -> str | None:
    """Delta's partition hint, e.g. `[date=2024-01-01, country=US]`; None if unpartitioned."""
    if not partition_columns or not partition_values:
        return None
    parts = []
    for col in partition_columns:
        v = partition_values.get(col)
        parts.append(f"{col}={'null' if v is None else v}")
    return "[" + ", ".join(parts) + "]"


class DeltaCoordError(Exception):
    """Base of every error this project raises on purpose."""


class DeltaConcurrentModificationException(DeltaCoordError):
    """A commit lost to a concurrent winning commit.

    Attributes name the winning commit so the message and callers can say what
    conflicted: its version, its operation and (when known) the partition.
    """

    retryable: ClassVar[bool] = True
    error_class: ClassVar[str] = "DELTA_CONCURRENT_MODIFICATION"

    def __init__(
        self,
        message: str | None = None,
        *,
        winning_version: int | None = None,
        winning_operation: str | None = None,
        partition: str | None = None,
        table: str | None = None,
    ) -> None:
        self.winning_version = winning_version
        self.winning_operation = winning_operation
        self.partition = partition
        self.table = table
        super().__init__(message or self.default_message())

    @classmethod
    def conflict_type(cls) -> str:
        """Class name without the 'Exception' suffix, as Delta reports it."""
        return cls.__name__.removesuffix("Exception")

    def default_message(self) -> str:
        return f"{type(self).__name__}: transaction conflict at version {self.winning_version}."

    def _table(self) -> str:
        return f" to table {self.table}" if self.table else ""

    def _in_partition(self) -> str:
        return f" in the partition {self.partition}" if self.partition else ""


class ConcurrentAppendException(DeltaConcurrentModificationException):
    """Files were added to data this transaction read."""

    error_class = "DELTA_CONCURRENT_APPEND"

    def default_message(self) -> str:
        return (
            f"ConcurrentAppendException: Files were added{self._in_partition()}{self._table()} by a concurrent "
            f"update ({self.winning_operation or 'TRANSACTION'} committed at version {self.winning_version}). "
            "The concurrent operation added data that should have been read by this operation. Please try the operation again."
        )


class ConcurrentDeleteReadException(DeltaConcurrentModificationException):
    """A file this transaction read was deleted concurrently."""

    error_class = "DELTA_CONCURRENT_DELETE_READ"

    def default_message(self) -> str:
        return (
            f"ConcurrentDeleteReadException: This transaction attempted to read one or more files that were deleted"
            f"{self._in_partition()} by a concurrent update ({self.winning_operation or 'TRANSACTION'} committed at "
            f"version {self.winning_version}). Please try the operation again."
        )


class ConcurrentDeleteDeleteException(DeltaConcurrentModificationException):
    """A file this transaction deletes was deleted concurrently."""

    error_class = "DELTA_CONCURRENT_DELETE_DELETE"

    def default_message(self) -> str:
        return (
            f"ConcurrentDeleteDeleteException: This transaction attempted to delete one or more files that were deleted"
            f"{self._in_partition()} by a concurrent update ({self.winning_operation or 'TRANSACTION'} committed at "
            f"version {self.winning_version}). Please try the operation again."
        )


class MetadataChangedException(DeltaConcurrentModificationException):
    """The table's metadata (schema, partitioning, properties) changed concurrently."""

    error_class = "DELTA_METADATA_CHANGED"

    def default_message(self) -> str:
        return (
            f"MetadataChangedException: The metadata of the Delta table{self._table()} has been changed by a concurrent "
            f"update ({self.winning_operation or 'TRANSACTION'} committed at version {self.winning_version}). "
            "Please try the operation again."
        )


class ProtocolChangedException(DeltaConcurrentModificationException):
    """The table's protocol changed concurrently (or two writers created it)."""

    retryable = False
    error_class = "DELTA_PROTOCOL_CHANGED"

    def default_message(self) -> str:
        hint = (
            " This happens when multiple writers are writing to an empty directory. "
            "Creating the table ahead of time will avoid this conflict."
            if self.winning_version == 0
            else ""
        )
        return (
            "ProtocolChangedException: The protocol version of the Delta table has been changed by a concurrent update "
            f"({self.winning_operation or 'TRANSACTION'} committed at version {self.winning_version}).{hint}"
        )


class ConcurrentTransactionException(DeltaConcurrentModificationException):
    """Another writer committed with an app id this transaction depends on."""

    retryable = False
    error_class = "DELTA_CONCURRENT_TRANSACTION"

    def default_message(self) -> str:
        return (
            "ConcurrentTransactionException: This error occurs when multiple streaming queries are using the same "
            "checkpoint to write into this table. Did you run multiple instances of the same streaming query at the "
            f"same time? (winning commit at version {self.winning_version})"
        )


class ConcurrentWriteException(DeltaConcurrentModificationException):
    """A generic concurrent write (used where Delta has no finer class)."""

    error_class = "DELTA_CONCURRENT_WRITE"


class ConcurrentJobException(DeltaConcurrentModificationException):
    """MaxCompute's conflict table (`deltacoord.conflictProfile = maxcompute`) fails the later-finishing job.

    Not a Delta class: the table's rules are MaxCompute's job-by-job table, and
    the message names both job types and the cell that failed.
    """

    error_class = "DELTACOORD_CONCURRENT_JOB"

    def default_message(self) -> str:
        return (
            f"ConcurrentJobException: a concurrent job ({self.winning_operation or 'TRANSACTION'} committed at version "
            f"{self.winning_version}) finished first{self._in_partition()}{self._table()}; the table's maxcompute "
            "conflict profile fails the later-finishing job. Please try the operation again."
        )


#: Every conflict class by Delta's name, for decoding decisions.
CONFLICT_CLASSES: dict[str, type[DeltaConcurrentModificationException]] = {
    c.__name__: c
    for c in (
        ConcurrentAppendException,
        ConcurrentDeleteReadException,
        ConcurrentDeleteDeleteException,
        MetadataChangedException,
        ProtocolChangedException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        ConcurrentJobException,
    )
}


class InvalidProposalError(DeltaCoordError):
    """A proposal that can never commit: malformed, unsafe or against the protocol.

    `reason` is a stable machine-readable code (`deltacoord.schemas.reasons.ReasonCode`;
    a code this version does not know, read from a newer coordinator's
    decision, stays text).
    """

    retryable: ClassVar[bool] = False

    def __init__(self, reason: ReasonCode | str, message: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")


class BadFilePathError(InvalidProposalError, ValueError):
    """An action's file path holds a control character (reason BAD_FILE_PATH); the writer raises it before it
    sends anything, the coordinator refuses such a proposal with the same code."""

    def __init__(self, message: str) -> None:
        super().__init__(ReasonCode.BAD_FILE_PATH, message)


class DecodeError(DeltaCoordError):
    """Bytes that are not a valid message of a known schema."""


class EncodeError(DeltaCoordError, ValueError):
    """A message that cannot be encoded: a field of the wrong type or out of range."""


def unknown_outcome_hint(proposal_id: str, table: str) -> str:
    """How to learn an unknown outcome and how to retry without committing twice (`table`: its path or URI)."""
    return (f"Look it up with: deltacoord table lookup {table} {proposal_id}   (Python: Table.lookup_decision({proposal_id!r})). "
            f"To retry safely, repeat the same operation with this proposal id: proposal_id={proposal_id!r} in Python, "
            f"--proposal-id {proposal_id} on the command line; the coordinator decides a proposal id once, so the retry "
            "cannot commit twice (a plain re-run could)")


class CommitOutcomeUnknownError(DeltaCoordError):
    """No decision arrived in time: the proposal may still commit.

    Never treat this as a failure: look the proposal up by id on the commits
    topic (`deltacoord table lookup` or `Table.lookup_decision(proposal_id)`),
    or retry the operation with the same `proposal_id`, which commits at most once.
    """

    def __init__(self, proposal_id: str, table_id: str, timeout_s: float, table_uri: str | None = None, *,
                 why: str | None = None) -> None:
        self.proposal_id = proposal_id
        self.table_id = table_id
        #: What happened, without the advice (front ends print their own way to look it up and retry).
        self.summary = (f"proposal {proposal_id} on table {table_id}: {why}; the outcome is unknown (it may still "
                        "commit)." if why else
                        f"no decision for proposal {proposal_id} on table {table_id} within {timeout_s:.1f}s; the "
                        "outcome is unknown (it may still commit).")
        super().__init__(f"{self.summary} {unknown_outcome_hint(proposal_id, table_uri or table_id)}")


class CommitNotPublishedError(DeltaCoordError):
    """The commit is ratified (durable in Kafka, it will not be undone) but `_delta_log/<version>.json` was not
    published in time, or the table's publication is halted: Delta readers do not see it yet.

    Not a failure of the commit: never retry it (that would commit the data twice). Readers that read
    through deltacoord (`Snapshot.load(..., ratified=...)`, `Table.snapshot(ratified=True)`) see it already.
    """

    def __init__(self, table_id: str, version: int, why: str) -> None:
        self.table_id = table_id
        self.version = version
        self.why = why
        super().__init__(f"version {version} of table {table_id} is committed in Kafka but not published to "
                         f"_delta_log: {why}")


class ProposalNotSentError(DeltaCoordError):
    """The proposal never reached Kafka (refused by the client or the broker before it was written),
    so it cannot commit: its staged files were deleted and a retry is safe."""


class TopicNotFoundError(ProposalNotSentError):
    """A topic of deltacoord is not on the cluster: most often the topic prefix differs from the coordinator's
    (the message names the prefixes the cluster has), or no coordinator ever ran there."""

    def __init__(self, topic: str, bootstrap_servers: str, prefixes: list[str]) -> None:
        self.topic = topic
        self.prefixes = prefixes
        if prefixes:
            hint = (f"this cluster has deltacoord topics with the prefix {', '.join(repr(p) for p in prefixes)}: pass "
                    "it as --topic-prefix (Python: topic_prefix=, or DELTACOORD_TOPIC_PREFIX)")
        else:
            hint = ("it has no deltacoord topics at all: start a coordinator (it creates them) or run "
                    "`deltacoord topics create`")
        super().__init__(f"topic {topic} not found on {bootstrap_servers}; {hint}")


def kafka_principal(conf: Mapping[str, Any]) -> str:
    """The principal a client with settings `conf` is to the brokers (Kafka's default principal builder)."""
    protocol = str(conf.get("security.protocol", "PLAINTEXT")).upper()
    if protocol.startswith("SASL") and conf.get("sasl.username"):
        return f"User:{conf['sasl.username']}"
    if protocol == "SSL":
        return "the principal of its TLS certificate (User:<its distinguished name>)"
    return "User:ANONYMOUS (no sasl.username)"


class KafkaAccessDeniedError(ProposalNotSentError):
    """The brokers' authorizer refused this client an operation: no ACL grants it to its principal. Nothing was
    written, so nothing can commit and a retry is safe once the ACL is there."""

    def __init__(self, conf: Mapping[str, Any], operation: str, resource: str, role: str = "writer") -> None:
        self.principal = kafka_principal(conf)
        self.operation = operation
        self.resource = resource
        super().__init__(
            f"Kafka at {conf.get('bootstrap.servers', '?')} refused {self.principal} {operation} on {resource}: no ACL "
            f"grants it. Grant the {role}s' ACLs (`deltacoord acls --apply --{role}-principal "
            f"{self.principal.split(' ')[0]} ...`), or connect as a principal that has them (sasl.username)")


class NoCoordinatorError(ProposalNotSentError):
    """No live coordinator is assigned the table's proposals partition: the proposal was not sent (it would wait
    for a decision nobody makes), so nothing can commit and a retry is safe."""

    def __init__(self, topic: str, partition: int, group_id: str, bootstrap_servers: str, topic_prefix: str) -> None:
        self.topic = topic
        self.partition = partition
        self.group_id = group_id
        super().__init__(
            f"no coordinator serves partition {partition} of topic {topic} (no live member of the consumer group "
            f"{group_id} is assigned it); nothing was proposed, so retrying is safe. Start a coordinator: "
            f"deltacoord coordinator run --bootstrap-servers {bootstrap_servers} --topic-prefix {topic_prefix} "
            f"(it takes the partition within seconds). Coordinators running under another group id: set the writers' "
            f"DELTACOORD_GROUP_ID to it; coordinators given a static --partitions list are invisible to this check: set "
            f"DELTACOORD_COORDINATOR_CHECK=0 (Python: coordinator_check=False)."
        )


class TableHaltedError(DeltaCoordError):
    """The coordinator stopped publishing a table: `_delta_log` disagrees with Kafka."""


class ClientClosedError(DeltaCoordError, RuntimeError):
    """A client (a `CoordinatorClient`, a `CommitStream`) was used after `close`: make a new one. A RuntimeError
    too, as it was before it had a name."""


class ProposalUnconfirmedError(DeltaCoordError, RuntimeError):
    """Kafka, or the host's relay, did not confirm a proposal's delivery: it may or may not be written. A writer
    reports it as a `CommitOutcomeUnknownError` (this error its cause)."""


class RelayRefusedError(DeltaCoordError, RuntimeError):
    """A relay answered at its socket but refused the connection (the message says why: most often another
    topic prefix)."""


class CommitsPartitionBlockedError(DeltaCoordError, RuntimeError):
    """A transaction of another producer stays open on a commits partition, so `read_committed` readers cannot
    pass it: an operator aborts it (the message gives the command), then starts the coordinator again."""
