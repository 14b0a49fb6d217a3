"""Why a proposal or an operation is refused: the stable reason codes of `InvalidProposalError`.

A rejected decision carries its code on the wire (`Decision.reason_code`);
writers and dashboards match on it, so a member's value never changes.
Conflicts are not here: they are reported by Delta's exception names.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    """Every reason a proposal (or a writer-side operation) can be refused for."""

    # -- validation of the proposal on its own (coordinator.rules.validate) --
    TABLE_MISMATCH = "TABLE_MISMATCH"
    UNKNOWN_TABLE = "UNKNOWN_TABLE"
    BAD_READ_VERSION = "BAD_READ_VERSION"
    READ_VERSION_AHEAD = "READ_VERSION_AHEAD"
    TXN_ID_MISMATCH = "TXN_ID_MISMATCH"
    BAD_PROPOSAL_ID = "BAD_PROPOSAL_ID"
    COMMIT_INFO_IN_ACTIONS = "COMMIT_INFO_IN_ACTIONS"
    UNKNOWN_ACTION = "UNKNOWN_ACTION"
    MULTIPLE_METADATA = "MULTIPLE_METADATA"
    MULTIPLE_PROTOCOL = "MULTIPLE_PROTOCOL"
    MISSING_METADATA = "MISSING_METADATA"
    MISSING_PROTOCOL = "MISSING_PROTOCOL"
    UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"
    DUPLICATE_APP_ID = "DUPLICATE_APP_ID"
    DUPLICATE_DOMAIN = "DUPLICATE_DOMAIN"
    DUPLICATE_FILE_ACTION = "DUPLICATE_FILE_ACTION"
    ADD_AND_REMOVE_SAME_FILE = "ADD_AND_REMOVE_SAME_FILE"
    NEGATIVE_SIZE = "NEGATIVE_SIZE"
    #: An added file's stats would break Delta readers: not a JSON object, a count that is not a 64-bit
    #: integer, a number that is not finite (`deltacoord.coordinator.rules.stats`).
    BAD_STATS = "BAD_STATS"
    PATH_ESCAPES_TABLE = "PATH_ESCAPES_TABLE"
    #: A file path of an action (add, remove, cdc) holds a control character (C0, DEL or C1), raw or
    #: percent-encoded: parsers drop or mangle them, so the path would name another file than it reads.
    BAD_FILE_PATH = "BAD_FILE_PATH"
    #: An added file's partition values name other columns than the table's, or one is not a value of its
    #: column's type (readers parse it for every scan).
    PARTITION_VALUES_MISMATCH = "PARTITION_VALUES_MISMATCH"
    #: An added file's deletion-vector descriptor is not one a Delta reader can read (storage type, Z85 text,
    #: negative sizes or offsets, a path outside the table).
    BAD_DELETION_VECTOR = "BAD_DELETION_VECTOR"
    BAD_ISOLATION_LEVEL = "BAD_ISOLATION_LEVEL"
    BAD_SCHEMA = "BAD_SCHEMA"
    APPEND_ONLY = "APPEND_ONLY"
    BAD_PREDICATE = "BAD_PREDICATE"
    STALE_TXN_VERSION = "STALE_TXN_VERSION"
    MALFORMED_PROPOSAL = "MALFORMED_PROPOSAL"
    COMMIT_INFO_TOO_DEEP = "COMMIT_INFO_TOO_DEEP"
    COMMIT_INFO_TOO_LARGE = "COMMIT_INFO_TOO_LARGE"
    #: `deltacoord.conflictProfile` names no known profile (`delta`, `maxcompute`).
    BAD_CONFLICT_PROFILE = "BAD_CONFLICT_PROFILE"
    #: A deltacoord table property holds a value it cannot take (`deltacoord.coalesce` is `true` or `false`).
    BAD_TABLE_PROPERTY = "BAD_TABLE_PROPERTY"
    #: On a `maxcompute` table, a data change whose MaxCompute job type cannot be derived from its operation.
    UNKNOWN_JOB_TYPE = "UNKNOWN_JOB_TYPE"
    #: The commit writes an action whose table feature the table's protocol lacks (domainMetadata without
    #: the `domainMetadata` writer feature; `deltacoord.coordinator.rules.table_features`).
    MISSING_TABLE_FEATURE = "MISSING_TABLE_FEATURE"
    #: On a row-tracking table, an added file whose stats give no numRecords: its rows cannot get row ids.
    MISSING_ROW_COUNT = "MISSING_ROW_COUNT"
    #: A commit that would hand out an identity column's value twice (a mark moved back, or appended values at
    #: or behind the mark, or beyond the mark the commit declares; `deltacoord.coordinator.rules.identity`).
    IDENTITY_VALUE_REUSED = "IDENTITY_VALUE_REUSED"
    # -- the door: the table's location, checked before anything is decided (coordinator.locations) --
    #: The table URI is not an absolute, normal location (empty, relative, `..`, encoded separators, NUL, ...).
    BAD_TABLE_URI = "BAD_TABLE_URI"
    #: The table lies outside the coordinator's `table_roots` (another bucket, another scheme, another directory).
    TABLE_OUTSIDE_ROOTS = "TABLE_OUTSIDE_ROOTS"
    # -- admission: the table as this coordinator knows it (coordinator.rules.admission) --
    TABLE_URI_MISMATCH = "TABLE_URI_MISMATCH"
    WRITER_NOT_ALLOWED = "WRITER_NOT_ALLOWED"
    TABLE_HALTED = "TABLE_HALTED"
    #: The table has registered writer keys and the proposal carries no valid signature by one of them.
    WRITER_NOT_AUTHENTICATED = "WRITER_NOT_AUTHENTICATED"
    #: The proposal sets `deltacoord.writerKeys` to a value that does not parse.
    BAD_WRITER_KEYS = "BAD_WRITER_KEYS"
    #: The table verifies added files (`deltacoord.verifyAddedFiles`) and one is missing or has another size.
    ADDED_FILE_MISSING = "ADDED_FILE_MISSING"
    #: The table's store could not be checked for a version written around the coordinator; retry.
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    # -- adoption and release of existing tables (`deltacoord table adopt|release`, coordinator.kafka.table_requests) --
    #: A proposal for a table this coordinator released: uncoordinated writers own it until it is adopted again.
    TABLE_RELEASED = "TABLE_RELEASED"
    #: Adopting a table the coordinator already decides (at another version than the request saw).
    TABLE_ALREADY_COORDINATED = "TABLE_ALREADY_COORDINATED"
    #: Adopting a table whose protocol declares a feature the coordinator and its writers cannot honour.
    UNSUPPORTED_TABLE_FEATURE = "UNSUPPORTED_TABLE_FEATURE"
    #: Adopting a table whose `_delta_log` cannot be read to its current version (corrupt, unreadable feature).
    UNREADABLE_TABLE = "UNREADABLE_TABLE"
    #: An adopt or drop request naming another version than the table's current one: older than the table's latest commits
    #: (delayed, or a captured request replayed), or read from another view of the store. Send a new request.
    STALE_CONTROL_REQUEST = "STALE_CONTROL_REQUEST"
    # -- one location, one table (`deltacoord.reader.claim`, checked by coordinator.kafka.batch_checks at a creation or adoption) --
    #: Creating or adopting a table at a location another table id holds (its claim, `_deltacoord/table.json`,
    #: names that id): two ids over one `_delta_log` would both ratify the same versions.
    TABLE_LOCATION_TAKEN = "TABLE_LOCATION_TAKEN"
    #: Creating a table (read version -1) where a Delta table the coordinator does not decide already exists
    #: (written by Spark, delta-rs, ...): adopt it instead.
    TABLE_EXISTS_UNCOORDINATED = "TABLE_EXISTS_UNCOORDINATED"
    # -- the Kafka edge: messages that are not a decodable proposal --
    UNDECODABLE = "UNDECODABLE"
    OVERSIZE = "OVERSIZE"
    #: A proposal carrying its actions by reference whose staged file is missing, altered (another digest or
    #: size) or not Delta JSON actions (`deltacoord.schemas.staged`).
    STAGED_COMMIT_INVALID = "STAGED_COMMIT_INVALID"
    #: The proposal arrived on a partition other than its table's (murmur2(table id) % partitions).
    WRONG_PARTITION = "WRONG_PARTITION"
    #: A multi-table transaction's tables are not all on one proposals partition (group them: docs/transactions.md).
    TRANSACTION_SPANS_PARTITIONS = "TRANSACTION_SPANS_PARTITIONS"
    #: A multi-table transaction that is not well formed (its tables and parts disagree, a table twice, ...).
    BAD_TRANSACTION = "BAD_TRANSACTION"
    #: Kafka refused to record the proposal's decision (e.g. larger than the commits topic's
    #: max.message.bytes); it was rejected with this code instead and skipped.
    UNRECORDABLE = "UNRECORDABLE"
    # -- writer-side refusals, raised before anything is proposed --
    BAD_EXPRESSION = "BAD_EXPRESSION"
    BAD_REPLACE_WHERE = "BAD_REPLACE_WHERE"
    REPLACE_WHERE_MISMATCH = "REPLACE_WHERE_MISMATCH"
    MULTIPLE_SOURCE_ROWS_MATCHED = "MULTIPLE_SOURCE_ROWS_MATCHED"
    #: A written row breaks a NOT NULL column, an invariant, a CHECK constraint or a generated column.
    CONSTRAINT_VIOLATED = "CONSTRAINT_VIOLATED"
    #: A rejected decision that names no code (only a newer coordinator could send one).
    REJECTED = "REJECTED"

    @classmethod
    def from_wire(cls, code: str) -> ReasonCode | str:
        """The member for a code read from a decision; a code this version does not know stays text."""
        try:
            return cls(code)
        except ValueError:
            return code


__all__ = ["ReasonCode"]
