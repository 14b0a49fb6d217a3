"""Where messages go: topic names, the table-to-partition mapping and message headers.

A table's proposals and decisions live on the same partition index of the
proposals and commits topics. The partition is murmur2(table id) like Kafka's
Java default partitioner, so clients in any language agree on it; a table id
`<group>::<name>` is hashed by its group instead, so a table group shares one
partition (multi-table transactions, docs/transactions.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

#: Header carrying the proposal id on proposals and decisions, so a writer can
#: skip other writers' decisions without decoding them.
H_PROPOSAL_ID = "deltacoord.proposal_id"
H_TABLE_ID = "deltacoord.table_id"
#: On decisions: the committed version (decimal text) or absent for rejections.
H_VERSION = "deltacoord.version"
H_OUTCOME = "deltacoord.outcome"
#: On dead letters: why the message could not be decided.
H_ERROR = "deltacoord.error"
H_SOURCE = "deltacoord.source"
#: On dead letters: the full size of the raw message (decimal text) and its SHA-256 (hex);
#: the value holds at most a bounded prefix of it.
H_RAW_SIZE = "deltacoord.raw_size"
H_RAW_SHA256 = "deltacoord.raw_sha256"
#: On proposals: the name of the writer key that signed the value, and the Ed25519 signature (64 bytes).
H_SIGNER = "deltacoord.signer"
H_SIGNATURE = "deltacoord.signature"
#: On proposals: the replies-topic partition (decimal text) where the writer reads its answers. Absent: the
#: writer reads its decision from the commits topic (older writers) and gets no publication notice.
H_REPLY_PARTITION = "deltacoord.reply_partition"
#: On proposals: when the writer wants its answer. Absent or `published`: one reply once the version is in
#: `_delta_log` (a rejection at once); `ratified`: the decision at once, once it is recorded in Kafka.
H_WAIT = "deltacoord.wait"
WAIT_RATIFIED = b"ratified"
WAIT_PUBLISHED = b"published"
#: On replies (sent after the coordinator's transaction commits; their value is the decision without its
#: actions): `decision` (ratified; nothing more will come), `published` (ratified and in `_delta_log`),
#: `unpublished` (ratified, but its table's publication halted; H_ERROR says why).
H_KIND = "deltacoord.kind"
#: On replies: when the coordinator consumed the proposal, committed its transaction and (kind `published`)
#: published the version, as `name=epoch-ms` pairs joined by `;` (where a commit's time went).
H_TIMES = "deltacoord.times"
KIND_DECISION = b"decision"
KIND_PUBLISHED = b"published"
KIND_UNPUBLISHED = b"unpublished"
#: On control records of the commits topic (`halt`, `resume`, `adopt`, `release`) and on an operator's
#: `resume`, `adopt` or `release` request on the proposals topic: what the record does. Decisions of
#: proposals never carry it.
H_CONTROL = "deltacoord.control"
#: On the commits-topic records of a coordinator's transaction: the proposals offset its batch consumed up
#: to (exclusive), recorded atomically with its decisions. Recovery resumes from the highest one (or the
#: group's committed offset, if higher), so most transactions need no offset commit of their own.
H_NEXT_OFFSET = "deltacoord.next_offset"
#: Control requests that hand a table to the coordinator, take it back or make it forget the table (`deltacoord
#: table adopt|release|drop`): a proposal (no actions) with header `deltacoord.control` and a proposal id
#: `CONTROL_PREFIX<kind>:<uuid>`, answered by a control record of that id (`error_type` `TableAdopted` /
#: `TableReleased` / `TableDropped`) or a rejection.
CONTROL_ADOPT, CONTROL_RELEASE, CONTROL_DROP = "adopt", "release", "drop"
CONTROL_PREFIX = "deltacoord-control:"
ADOPTED_ERROR_TYPE, RELEASED_ERROR_TYPE, DROPPED_ERROR_TYPE = "TableAdopted", "TableReleased", "TableDropped"
#: A drop request's operation parameter: "true" when the coordinator deletes the table's files too.
DROP_DELETE_FILES = "deleteFiles"


class _HasHeaders(Protocol):
    def headers(self) -> Any: ...


def header(msg: _HasHeaders, name: str) -> bytes | None:
    """The first value of header `name` on a Kafka message, as bytes (None if absent)."""
    for k, v in msg.headers() or ():
        if k == name:
            return v.encode() if isinstance(v, str) else v
    return None


@dataclass(frozen=True)
class Topics:
    """The topics of one deltacoord deployment, named from a prefix.

    `replies` carries each writer's own decisions and publication notices, on a reply partition the
    writer names in its proposals, so a writer never fetches other writers' decisions.
    """

    proposals: str
    commits: str
    dead_letters: str
    replies: str = ""

    def __post_init__(self) -> None:
        if not self.replies:
            object.__setattr__(self, "replies", self.commits.rsplit(".", 1)[0] + ".replies" if "." in self.commits
                               else self.commits + ".replies")

    @staticmethod
    def with_prefix(prefix: str = "deltacoord") -> Topics:
        return Topics(f"{prefix}.proposals", f"{prefix}.commits", f"{prefix}.deadletters", f"{prefix}.replies")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as in the Java client's `Utils.murmur2`), a signed 32-bit int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (data[i4] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8) + ((data[i4 + 2] & 0xFF) << 16) + ((data[i4 + 3] & 0xFF) << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rem = length % 4
    tail = length4 * 4
    if rem == 3:
        h ^= (data[tail + 2] & 0xFF) << 16
    if rem >= 2:
        h ^= (data[tail + 1] & 0xFF) << 8
    if rem >= 1:
        h ^= data[tail] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


#: Separates a table group from the rest of a table id: `<group>::<name>` is routed by `<group>`, so every table of a
#: group is serialised by one partition and a multi-table transaction can change them together (docs/transactions.md).
GROUP_SEPARATOR = "::"


#: What a group name is made of: never a URI's scheme or host (`s3://[::1]/t` names no group).
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def table_group(table_id: str) -> str | None:
    """The group a table id names (`<group>::<name>`, the group of letters, digits, `_`, `.` and `-`), or None for a
    table routed by its own id."""
    group, sep, rest = table_id.partition(GROUP_SEPARATOR)
    return group if sep and rest and _GROUP_NAME.fullmatch(group) else None


def grouped_table_id(group: str, name: str) -> str:
    """The id of table `name` in table group `group`: routed by the group, so the group's tables share a partition."""
    if not _GROUP_NAME.fullmatch(group) or not name:
        raise ValueError(f"table group {group!r} / name {name!r}: a group is 1 to 200 letters, digits, '_', '.' or "
                         "'-' (e.g. 'ledger'), and the name is not empty")
    return f"{group}{GROUP_SEPARATOR}{name}"


def spans_partitions_message(transaction_id: str, homes: Mapping[str, int], num_partitions: int) -> str:
    """Why a multi-table transaction over tables of several partitions is refused, and how to group them."""
    where = ", ".join(f"{t} -> {p}" for t, p in homes.items())
    return (f"multi-table transaction {transaction_id} spans proposals partitions ({where}, of {num_partitions}); one "
            f"coordinator partition must serialise every table of a transaction. Put the tables in one table group: "
            f"table ids '<group>{GROUP_SEPARATOR}<name>' (deltacoord.grouped_table_id) route by the group")


def partition_for(table_id: str, num_partitions: int) -> int:
    """The proposals/commits partition serialising `table_id` (Java default partitioner on the routing key: the
    table's group when its id names one, else the id itself)."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    key = table_group(table_id) or table_id
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % num_partitions
