"""Decided proposal ids: each proposal id is decided once, and a repeat gets the first answer.

A proposal can reach the coordinator again: a writer resending after a lost
reply, Kafka redelivering after a crash, or someone replaying a recorded (even
signed) proposal later, hoping that the table changed so that a rejection
turns into a commit. `DecidedIds` remembers the decisions of a partition's
proposals by (table id, proposal id) so that a repeat is answered with the
first decision (a commit as `duplicate_of` its version) instead of being
decided again.

The window is bounded, by count and by age (`max_age_ms` from the decision
time): a repeat older than both is decided as new. The ids of tables that
register writer keys are kept apart from the others', each share holding up to
`limit` ids: on a keyed table every remembered id is a signed proposal's (a
message that fails authentication claims none), and a replay of a rejected
signed proposal is the one repeat that could turn into a commit (on an open
table anyone can send any proposal anew). So no traffic on tables without keys
- junk sent to any number of unknown or open table ids - can push a signed
proposal's id out; only the keyed tables' own signed traffic counts against
them. Within each share the count is shared fairly among tables: over the
limit, the table holding the most ids loses its oldest, so a flood on one table
evicts that table's own ids, and a table loses ids to others' traffic only while
it holds more than they do. Committed proposals are also recognised for longer
by each table's txnId index (`TableState`), so a replay outside this window
can at worst be rejected again, or be answered with its original commit. Each
entry keeps the decision without its actions (about 200 bytes), so the default
50,000 ids per share cost about 10 MB each per partition. The window is part of
the state snapshot (`deltacoord.coordinator.kafka.state_snapshots`) and rebuilt
from the commits topic after it; a table's ids go to the share its writer keys
choose when they are remembered.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.reasons import ReasonCode

DEFAULT_DECIDED_IDS_LIMIT = 50_000
DEFAULT_DECIDED_IDS_MAX_AGE_MS = 7 * 24 * 3600 * 1000
#: Longer error messages are cut when remembered (the full one is on the commits topic).
MAX_REMEMBERED_MESSAGE = 500


class _Pool:
    """One share of the window: (table id, proposal id) -> decision, at most `limit`, the largest table's oldest
    going first."""

    __slots__ = ("entries", "heap", "limit", "tables")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Every entry, oldest first (age eviction, iteration).
        self.entries: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        #: Each table's proposal ids, oldest first (count eviction).
        self.tables: dict[str, OrderedDict[str, None]] = {}
        #: (-size, table id) as sizes were when pushed; stale pairs are skipped when popped.
        self.heap: list[tuple[int, str]] = []

    def add(self, d: Decision) -> None:
        self.entries[(d.table_id, d.proposal_id)] = d
        ids = self.tables.setdefault(d.table_id, OrderedDict())
        ids[d.proposal_id] = None
        heapq.heappush(self.heap, (-len(ids), d.table_id))

    def drop(self, table_id: str, proposal_id: str) -> None:
        del self.entries[(table_id, proposal_id)]
        ids = self.tables[table_id]
        del ids[proposal_id]
        if ids:
            heapq.heappush(self.heap, (-len(ids), table_id))
        else:
            del self.tables[table_id]

    def _largest(self) -> str:
        """The table holding the most ids (ties: any of them)."""
        while True:
            neg, table_id = self.heap[0]
            ids = self.tables.get(table_id)
            if ids is not None and len(ids) == -neg:
                return table_id
            heapq.heappop(self.heap)

    def evict(self, oldest_ms: int) -> None:
        """Drop the largest table's oldest entries beyond the limit, and entries decided before `oldest_ms`."""
        while len(self.entries) > self.limit:
            table_id = self._largest()
            self.drop(table_id, next(iter(self.tables[table_id])))
        while self.entries:
            first = next(iter(self.entries.values()))
            if first.decided_at_ms >= oldest_ms:
                break
            self.drop(first.table_id, first.proposal_id)
        if len(self.heap) > 4 * len(self.tables) + 64:  # stale pairs pile up: rebuild
            self.heap = [(-len(ids), t) for t, ids in self.tables.items()]
            heapq.heapify(self.heap)


class DecidedIds:
    """(table id, proposal id) -> the first decision, at most `limit` of tables with writer keys and `limit` of the
    others (in each, the largest table's oldest go first), at most `max_age_ms` old."""

    __slots__ = ("_pools", "limit", "max_age_ms")

    def __init__(self, limit: int = DEFAULT_DECIDED_IDS_LIMIT, max_age_ms: int = DEFAULT_DECIDED_IDS_MAX_AGE_MS) -> None:
        if limit < 0 or max_age_ms < 0:
            raise ValueError("the decided-ids window's limit and age must be 0 or more")
        self.limit = limit
        self.max_age_ms = max_age_ms
        #: The ids of tables that register writer keys (signed proposals), and the others'.
        self._pools = (_Pool(limit), _Pool(limit))

    def __len__(self) -> int:
        return sum(len(pool.entries) for pool in self._pools)

    def get(self, table_id: str, proposal_id: str) -> Decision | None:
        key = (table_id, proposal_id)
        signed, other = self._pools
        return signed.entries.get(key) or other.entries.get(key)

    def held_by(self, table_id: str) -> int:
        """How many ids of `table_id` the window holds."""
        return sum(len(pool.tables.get(table_id, ())) for pool in self._pools)

    def remember(self, d: Decision, now_ms: int | None = None, *, signed: bool = False) -> None:
        """Keep `d` as the first decision of its proposal id (a later one for the same id is ignored); a refusal
        for failed authentication claims no id (`deltacoord.coordinator.rules.batch.claims_its_id`). `signed`:
        the table registers writer keys (`deltacoord.coordinator.rules.authentication.registers_writer_keys`),
        so every id it remembers is a signed proposal's, kept apart from the other tables' traffic."""
        if self.limit == 0 or d.reason_code == ReasonCode.WRITER_NOT_AUTHENTICATED:
            return
        if self.get(d.table_id, d.proposal_id) is not None:
            return
        msg = d.error_message
        self._pools[0 if signed else 1].add(Decision(
            table_id=d.table_id, table_uri=d.table_uri, proposal_id=d.proposal_id, outcome=d.outcome,
            version=d.version if d.outcome is Outcome.COMMITTED else None, error_type=d.error_type,
            error_message=msg[:MAX_REMEMBERED_MESSAGE] if msg else msg, reason_code=d.reason_code,
            winning_version=d.winning_version, decided_at_ms=d.decided_at_ms))
        self.evict(d.decided_at_ms if now_ms is None else now_ms)

    def evict(self, now_ms: int) -> None:
        """In each share, drop the largest table's oldest entries beyond the limit; and entries older than
        `max_age_ms` at `now_ms`."""
        for pool in self._pools:
            pool.evict(now_ms - self.max_age_ms)

    def __iter__(self) -> Iterator[Decision]:
        """The remembered decisions, each share's oldest first (for the state snapshot)."""
        signed, other = self._pools
        return iter([*signed.entries.values(), *other.entries.values()])

    def extend(self, decisions: Iterable[Decision], signed: Callable[[str], bool] = lambda _table_id: False) -> None:
        """Remember `decisions` in order; `signed(table id)`: whether the table registers writer keys."""
        for d in decisions:
            self.remember(d, signed=signed(d.table_id))


__all__ = ["DEFAULT_DECIDED_IDS_LIMIT", "DEFAULT_DECIDED_IDS_MAX_AGE_MS", "DecidedIds"]
