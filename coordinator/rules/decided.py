"""Decided proposal ids: each proposal id is decided once, and a repeat gets the first answer.

A proposal can reach the coordinator again: a writer resending after a lost
reply, Kafka redelivering after a crash, or someone replaying a recorded (even
signed) proposal later, hoping that the table changed so that a rejection
turns into a commit. `DecidedIds` remembers the decisions of a partition's
proposals by (table id, proposal id) so that a repeat is answered with the
first decision (a commit as `duplicate_of` its version) instead of being
decided again.

The window is bounded, by count (`limit`) and by age (`max_age_ms` from the
decision time): a repeat older than both is decided as new. The count is
shared fairly among the partition's tables: over the limit, the table holding
the most ids loses its oldest. So a flood of proposals on one table (junk on a
table without writer keys, say) evicts that table's own ids, never the ids of
a quieter table, whose rejected signed proposal a replay could otherwise get
decided again; a table loses ids to others' traffic only while it holds more
than they do. Committed proposals are also recognised for longer by each table's txnId
index (`TableState`), so a replay outside this window can at worst be
rejected again, or be answered with its original commit. Each entry keeps the
decision without its actions (about 200 bytes), so the default 50,000 ids cost
about 10 MB per partition. The window is part of the state snapshot
(`deltacoord.coordinator.kafka.state_snapshots`) and rebuilt from the commits topic after it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.reasons import ReasonCode

DEFAULT_DECIDED_IDS_LIMIT = 50_000
DEFAULT_DECIDED_IDS_MAX_AGE_MS = 7 * 24 * 3600 * 1000
#: Longer error messages are cut when remembered (the full one is on the commits topic).
MAX_REMEMBERED_MESSAGE = 500


class DecidedIds:
    """(table id, proposal id) -> the first decision, at most `limit` (the largest table's oldest go first), at
    most `max_age_ms` old."""

    __slots__ = ("_entries", "_heap", "_tables", "limit", "max_age_ms")

    def __init__(self, limit: int = DEFAULT_DECIDED_IDS_LIMIT, max_age_ms: int = DEFAULT_DECIDED_IDS_MAX_AGE_MS) -> None:
        if limit < 0 or max_age_ms < 0:
            raise ValueError("the decided-ids window's limit and age must be 0 or more")
        self.limit = limit
        self.max_age_ms = max_age_ms
        #: Every entry, oldest first (age eviction, iteration).
        self._entries: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        #: Each table's proposal ids, oldest first (count eviction).
        self._tables: dict[str, OrderedDict[str, None]] = {}
        #: (-size, table id) as sizes were when pushed; stale pairs are skipped when popped.
        self._heap: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, table_id: str, proposal_id: str) -> Decision | None:
        return self._entries.get((table_id, proposal_id))

    def held_by(self, table_id: str) -> int:
        """How many ids of `table_id` the window holds."""
        ids = self._tables.get(table_id)
        return 0 if ids is None else len(ids)

    def remember(self, d: Decision, now_ms: int | None = None) -> None:
        """Keep `d` as the first decision of its proposal id (a later one for the same id is ignored); a refusal
        for failed authentication claims no id (`deltacoord.coordinator.rules.batch.claims_its_id`)."""
        if self.limit == 0 or d.reason_code == ReasonCode.WRITER_NOT_AUTHENTICATED:
            return
        key = (d.table_id, d.proposal_id)
        if key in self._entries:
            return
        msg = d.error_message
        self._entries[key] = Decision(
            table_id=d.table_id, table_uri=d.table_uri, proposal_id=d.proposal_id, outcome=d.outcome,
            version=d.version if d.outcome is Outcome.COMMITTED else None, error_type=d.error_type,
            error_message=msg[:MAX_REMEMBERED_MESSAGE] if msg else msg, reason_code=d.reason_code,
            winning_version=d.winning_version, decided_at_ms=d.decided_at_ms)
        ids = self._tables.setdefault(d.table_id, OrderedDict())
        ids[d.proposal_id] = None
        heapq.heappush(self._heap, (-len(ids), d.table_id))
        self.evict(d.decided_at_ms if now_ms is None else now_ms)

    def _drop(self, table_id: str, proposal_id: str) -> None:
        del self._entries[(table_id, proposal_id)]
        ids = self._tables[table_id]
        del ids[proposal_id]
        if ids:
            heapq.heappush(self._heap, (-len(ids), table_id))
        else:
            del self._tables[table_id]

    def _largest(self) -> str:
        """The table holding the most ids (ties: any of them)."""
        while True:
            neg, table_id = self._heap[0]
            ids = self._tables.get(table_id)
            if ids is not None and len(ids) == -neg:
                return table_id
            heapq.heappop(self._heap)

    def evict(self, now_ms: int) -> None:
        """Drop the largest table's oldest entries beyond the limit, and entries older than `max_age_ms` at
        `now_ms`."""
        while len(self._entries) > self.limit:
            table_id = self._largest()
            self._drop(table_id, next(iter(self._tables[table_id])))
        oldest = now_ms - self.max_age_ms
        while self._entries:
            first = next(iter(self._entries.values()))
            if first.decided_at_ms >= oldest:
                break
            self._drop(first.table_id, first.proposal_id)
        if len(self._heap) > 4 * len(self._tables) + 64:  # stale pairs pile up: rebuild
            self._heap = [(-len(ids), t) for t, ids in self._tables.items()]
            heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[Decision]:
        """The remembered decisions, oldest first (for the state snapshot)."""
        return iter(list(self._entries.values()))

    def extend(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.remember(d)


__all__ = ["DEFAULT_DECIDED_IDS_LIMIT", "DEFAULT_DECIDED_IDS_MAX_AGE_MS", "DecidedIds"]
