"""State snapshots: a restart reads the newest snapshot plus the records after it, not the whole history.

A partition's state is the fold of its commits-topic records (`recovery`).
Every `snapshot_every_records` records the coordinator writes, between two
batches, what that fold holds at the offset it covers: each table's
`TableStateExport` (head, protocol, metadata, app ids, domains, the live-file
hashes, the txnId index; not the winners window), the halts, the released
tables, the decided-ids
window, and per table the offset of the oldest ratified version the publisher
had not published yet (so a restart republishes it). A restart loads the
newest readable snapshot and folds only the records from its offset on, so
its cost follows the state, not the history (rejections before the snapshot
are never read again).

Snapshots are objects under `state_root` (a local directory or an object-store
prefix, with the coordinator's storage options):
`<state_root>/<commits topic>/<partition>/<offset, 20 digits>.state`, written
whole (a PUT, or a rename on local disks), the newest `KEEP` kept. A snapshot
is used only if the record just before its offset is still the one it names
(the topic was not recreated); anything unreadable is skipped with a warning
and recovery falls back to an older snapshot or to the whole topic. Without
`state_root` there are no snapshots.

Format: a magic line, an 8-byte length, a JSON document, then the live-file
hash arrays (little-endian int64) it points into.

`PartitionSnapshots` is a partition loop's side: it counts the records its
transactions wrote, exports the states between two batches when a snapshot is
due, and writes it in a thread.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deltacoord.coordinator.delta_log.publisher import Publisher
from deltacoord.coordinator.kafka.partition_tables import PartitionTables
from deltacoord.coordinator.rules.state import TableStateExport
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import parse_commit_lines
from deltacoord.schemas.actions import DomainMetadata, Metadata, Protocol, commit_to_json_lines
from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.storage.table import StorageError, TableStorage

log = logging.getLogger(__name__)

MAGIC = b"DELTACOORD-STATE-1\n"
#: Snapshots kept per partition (older ones are deleted after a new one is written).
KEEP = 3


class SnapshotError(ValueError):
    """A snapshot that cannot be read (truncated, another format, inconsistent)."""


@dataclass
class PartitionSnapshot:
    """A partition's state at a commits-topic offset: every record before `offset` is folded into it."""

    commits_topic: str
    partition: int
    offset: int
    #: (offset, proposal id) of the last record folded, to recognise the topic; None when nothing was.
    last: tuple[int, str] | None
    tables: list[TableStateExport] = field(default_factory=list)
    halted: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Tables released to uncoordinated writers -> (table uri, version released at).
    released: dict[str, tuple[str, int]] = field(default_factory=dict)
    decided: list[Decision] = field(default_factory=list)
    #: Table id -> (commits-topic offset, version) of the oldest ratified version that was not published yet.
    republish_from: dict[str, tuple[int, int]] = field(default_factory=dict)
    created_ms: int = 0
    #: The proposals offset the folded records consumed up to (their highest `deltacoord.next_offset`).
    proposals_next: int = 0


def _decision_row(d: Decision) -> list[Any]:
    return [d.table_id, d.table_uri, d.proposal_id, d.outcome.value, d.version, d.error_type, d.error_message,
            d.reason_code, d.winning_version, d.decided_at_ms]


def _decision_of(r: Sequence[Any]) -> Decision:
    return Decision(table_id=r[0], table_uri=r[1], proposal_id=r[2], outcome=Outcome(r[3]), version=r[4], error_type=r[5],
                    error_message=r[6], reason_code=r[7], winning_version=r[8], decided_at_ms=r[9])


def encode_snapshot(s: PartitionSnapshot) -> bytes:
    blobs: list[bytes] = []
    at = 0
    tables = []
    for t in s.tables:
        raw = np.ascontiguousarray(t.live_hashes, dtype="<i8").tobytes()
        actions = [a for a in (t.protocol, t.metadata) if a is not None] + list(t.domains)
        tables.append({
            "table_id": t.table_id, "table_uri": t.table_uri, "version": t.version,
            "actions": commit_to_json_lines(actions).decode("utf-8") if actions else "",
            "app_versions": dict(t.app_versions), "last_ict": t.last_ict, "last_commit_timestamp": t.last_commit_timestamp,
            "creation_operation": t.creation_operation, "live": [at, len(raw)], "txn_ids": [list(x) for x in t.txn_ids],
        })
        blobs.append(raw)
        at += len(raw)
    doc = {
        "commits_topic": s.commits_topic, "partition": s.partition, "offset": s.offset,
        "last": list(s.last) if s.last is not None else None, "created_ms": s.created_ms, "tables": tables,
        "halted": {k: list(v) for k, v in s.halted.items()}, "decided": [_decision_row(d) for d in s.decided],
        "released": {k: list(v) for k, v in s.released.items()},
        "republish_from": {k: list(v) for k, v in s.republish_from.items()}, "proposals_next": s.proposals_next,
    }
    head = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    return b"".join([MAGIC, struct.pack("<Q", len(head)), head, *blobs])


def decode_snapshot(data: bytes) -> PartitionSnapshot:
    try:
        if not data.startswith(MAGIC):
            raise SnapshotError("not a deltacoord state snapshot (bad magic)")
        (n,) = struct.unpack_from("<Q", data, len(MAGIC))
        start = len(MAGIC) + 8
        doc = json.loads(data[start:start + n])
        blobs = memoryview(data)[start + n:]
        tables = []
        for t in doc["tables"]:
            off, length = t["live"]
            if off + length > len(blobs) or length % 8:
                raise SnapshotError(f"table {t['table_id']}: live-file hashes out of bounds (truncated snapshot?)")
            actions = parse_commit_lines(t["actions"], source="snapshot") if t["actions"] else []
            tables.append(TableStateExport(
                table_id=t["table_id"], table_uri=t["table_uri"], version=int(t["version"]),
                protocol=next((a for a in actions if isinstance(a, Protocol)), None),
                metadata=next((a for a in actions if isinstance(a, Metadata)), None),
                app_versions={str(k): int(v) for k, v in t["app_versions"].items()},
                domains=tuple(a for a in actions if isinstance(a, DomainMetadata)),
                last_ict=t["last_ict"], last_commit_timestamp=t["last_commit_timestamp"],
                creation_operation=t["creation_operation"],
                live_hashes=np.frombuffer(blobs[off:off + length], dtype="<i8").astype(np.int64),
                txn_ids=tuple((str(a), int(b)) for a, b in t["txn_ids"])))
        last = doc["last"]
        return PartitionSnapshot(
            commits_topic=doc["commits_topic"], partition=int(doc["partition"]), offset=int(doc["offset"]),
            last=(int(last[0]), str(last[1])) if last else None, tables=tables,
            halted={k: (v[0], v[1]) for k, v in doc["halted"].items()}, decided=[_decision_of(r) for r in doc["decided"]],
            released={k: (str(v[0]), int(v[1])) for k, v in doc.get("released", {}).items()},
            republish_from={k: (int(v[0]), int(v[1])) for k, v in doc["republish_from"].items()}, created_ms=int(doc["created_ms"]),
            proposals_next=int(doc.get("proposals_next", 0)))
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:
        raise SnapshotError(f"unreadable snapshot: {type(e).__name__}: {e}") from e


class SnapshotStore:
    """The snapshots of one commits partition under `state_root`."""

    def __init__(self, state_root: str, storage_options: Mapping[str, str], commits_topic: str, partition: int) -> None:
        self.storage = TableStorage(state_root, storage_options)
        self.prefix = f"{commits_topic}/{partition}"

    def _key(self, offset: int) -> str:
        return f"{self.prefix}/{offset:020d}.state"

    def offsets(self) -> list[int]:
        """Offsets of the stored snapshots, oldest first."""
        out = []
        try:
            keys = self.storage.list_keys(self.prefix)
        except (FileNotFoundError, NotADirectoryError):
            return []
        for key, _ in keys:
            name = key.rsplit("/", 1)[-1]
            if name.endswith(".state") and name[:-6].isdigit():
                out.append(int(name[:-6]))
        return sorted(out)

    def write(self, snap: PartitionSnapshot) -> int:
        """Store `snap`, then delete all but the newest `KEEP`; returns its size in bytes."""
        data = encode_snapshot(snap)
        self.storage.put(self._key(snap.offset), data)
        for old in self.offsets()[:-KEEP]:
            try:
                self.storage.delete(self._key(old))
            except (OSError, StorageError) as e:
                log.warning("cannot delete the old state snapshot %s: %s", self._key(old), e)
        return len(data)

    def newest(self, at_most: int | None = None) -> list[PartitionSnapshot]:
        """Readable snapshots, newest first, with offsets up to `at_most` (the topic's end)."""
        out = []
        for offset in reversed(self.offsets()):
            if at_most is not None and offset > at_most:
                log.warning("ignoring state snapshot %s: beyond the end of the commits topic (%d)", self._key(offset), at_most)
                continue
            try:
                out.append(decode_snapshot(self.storage.get(self._key(offset))))
            except (SnapshotError, OSError, StorageError) as e:
                log.warning("ignoring state snapshot %s: %s", self._key(offset), e)
        return out



class PartitionSnapshots:
    """When a partition loop writes a state snapshot, and what it covers: the commits-topic offset the states
    cover, the last record folded, the records since the last snapshot, and where recent versions were recorded."""

    def __init__(self, settings: CoordinatorSettings, partition: int) -> None:
        self.settings = settings
        self.partition = partition
        self._store = (SnapshotStore(settings.state_root, settings.storage_options, settings.topics.commits, partition)
                       if settings.state_root else None)
        self.commits_end = 0
        self._last_record: tuple[int, str] | None = None
        self._since_snapshot = 0
        self._recorded_at: deque[tuple[str, int, int]] = deque(maxlen=max(2 * settings.snapshot_every_records, 1000))
        self._thread: threading.Thread | None = None
        self._requested = False
        #: State snapshots written by this partition coordinator (for tests and logs).
        self.written = 0

    def recovered(self, end_offset: int, last: tuple[int, str] | None, records_since: int) -> None:
        """Recovery folded the commits partition up to `end_offset`, `records_since` of them after the snapshot."""
        self.commits_end = end_offset
        self._last_record = last
        self._since_snapshot = records_since
        self._recorded_at.clear()

    def recorded_at(self, table_id: str, version: int, offset: int) -> None:
        """Version `version` of the table was recorded at `offset` of the commits partition."""
        self._recorded_at.append((table_id, version, offset))

    def note_recorded(self, delivered: Sequence[tuple[Decision | None, int]]) -> None:
        """After a transaction committed: the offsets its commits-topic records got."""
        for d, offset in delivered:
            self.commits_end = max(self.commits_end, offset + 1)
            self._since_snapshot += 1
            if d is None:
                continue
            if self._last_record is None or offset > self._last_record[0]:
                self._last_record = (offset, d.proposal_id)
            if d.holds_version:
                assert d.version is not None
                self._recorded_at.append((d.table_id, d.version, offset))

    def forget(self, table_id: str) -> None:
        """A dropped table: a snapshot must not send recovery back to where its versions were recorded."""
        kept = [r for r in self._recorded_at if r[0] != table_id]
        self._recorded_at.clear()
        self._recorded_at.extend(kept)

    def maybe_write(self, tables: PartitionTables, publisher: Publisher, proposals_next: int, force: bool = False) -> bool:
        """Write a state snapshot when `snapshot_every_records` records were recorded since the last (or `force`).

        The states are exported here, between batches; encoding and writing happen in a thread. False
        when none was started (not due, one still being written, or a version not yet published is too
        old to find again).
        """
        force = force or self._requested
        if self._store is None or not (force or self._since_snapshot >= self.settings.snapshot_every_records):
            return False
        if self._thread is not None and self._thread.is_alive():
            return False
        republish: dict[str, tuple[int, int]] = {}
        halted = publisher.halted_tables()
        for tid, st in tables.states.items():
            published = publisher.published_version(tid)
            if tid in halted or published >= st.version:
                continue
            at = next((off for t, v, off in self._recorded_at if t == tid and v == published + 1), None)
            if at is None:
                log.info("partition %d: no state snapshot now: version %d of %s is not published yet and was recorded "
                         "too long ago", self.partition, published + 1, tid)
                self._since_snapshot = self.settings.snapshot_every_records // 2
                return False
            republish[tid] = (at, published + 1)
        snap = PartitionSnapshot(
            commits_topic=self.settings.topics.commits, partition=self.partition, offset=self.commits_end,
            last=self._last_record, tables=[st.export() for st in tables.states.values()],
            halted={tid: (tables.states[tid].table_uri, why) for tid, why in halted.items() if tid in tables.states},
            released=dict(tables.released), decided=list(tables.decided), republish_from=republish,
            created_ms=int(time.time() * 1000), proposals_next=proposals_next)
        self._since_snapshot = 0
        self._requested = False
        store = self._store

        def write() -> None:
            t0 = time.monotonic()
            try:
                size = store.write(snap)
            except Exception as e:  # a snapshot is an optimisation: the next one tries again
                log.warning("partition %d: writing the state snapshot at offset %d failed: %s", self.partition,
                            snap.offset, e)
                return
            log.info("partition %d: state snapshot at offset %d written (%d tables, %d bytes) in %.2fs", self.partition,
                     snap.offset, len(snap.tables), size, time.monotonic() - t0)
            self.written += 1

        self._thread = threading.Thread(target=write, name=f"deltacoord-snapshot-{self.partition}", daemon=True)
        self._thread.start()
        return True

    def request(self) -> None:
        """Have the deciding thread write a snapshot at its next turn (from another thread: the states are its own)."""
        self._requested = True

    def wait(self, timeout_s: float = 60.0) -> None:
        """Wait for the snapshot being written, if any."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)


def now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["KEEP", "PartitionSnapshot", "PartitionSnapshots", "SnapshotError", "SnapshotStore", "decode_snapshot",
           "encode_snapshot"]
