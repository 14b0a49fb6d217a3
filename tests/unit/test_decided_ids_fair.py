"""The decided-ids window shares its count fairly among a partition's tables.

The window is per partition. Before, its count bound dropped the partition's oldest ids,
so a flood of proposals on one table (junk on a table without writer keys) pushed a quieter
table's ids out, and a replay of that table's rejected signed proposal was then decided
again. Now the table holding the most ids loses its oldest.
"""

from __future__ import annotations

import random

from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.reasons import ReasonCode


def _d(table: str, pid: str, at: int = 1_000, outcome: Outcome = Outcome.REJECTED,
       reason: str | None = ReasonCode.READ_VERSION_AHEAD) -> Decision:
    return Decision(table, f"file:///t/{table}", pid, outcome, version=3 if outcome is Outcome.COMMITTED else None,
                    reason_code=reason, error_message="m", decided_at_ms=at)


def test_a_flood_on_one_table_evicts_its_own_ids_not_a_quieter_tables() -> None:
    ids = DecidedIds(limit=10, max_age_ms=10**9)
    ids.remember(_d("keyed", "signed-rejected"))
    ids.remember(_d("keyed", "signed-committed", outcome=Outcome.COMMITTED, reason=None))
    for i in range(1_000):
        ids.remember(_d("open", f"junk-{i}"))
    assert ids.get("keyed", "signed-rejected") is not None
    assert ids.get("keyed", "signed-committed") is not None
    assert len(ids) == 10 and ids.held_by("open") == 8
    assert ids.get("open", "junk-999") is not None and ids.get("open", "junk-991") is None, "the newest are kept"


def test_a_table_loses_ids_to_its_own_traffic() -> None:
    ids = DecidedIds(limit=4, max_age_ms=10**9)
    for i in range(6):
        ids.remember(_d("a", f"p{i}"))
    assert [d.proposal_id for d in ids] == ["p2", "p3", "p4", "p5"]


def test_age_still_evicts_across_tables_and_failed_authentication_claims_nothing() -> None:
    ids = DecidedIds(limit=100, max_age_ms=1_000)
    ids.remember(_d("a", "old", at=0))
    ids.remember(_d("b", "forged", at=1_500, reason=ReasonCode.WRITER_NOT_AUTHENTICATED))
    assert ids.get("a", "old") is not None and ids.get("b", "forged") is None
    ids.remember(_d("b", "new", at=1_500))
    assert ids.get("a", "old") is None and ids.held_by("a") == 0
    assert [d.proposal_id for d in ids] == ["new"]


def test_randomized_a_table_holding_at_most_its_share_keeps_every_id() -> None:
    """With N tables, a table whose ids never exceed limit // N is never the largest when the window is over its
    limit, so it keeps every id; and the window never holds more than the limit."""
    rng = random.Random(7)
    for _round in range(30):
        limit, n = rng.randint(4, 60), rng.randint(2, 6)
        share = limit // n
        ids = DecidedIds(limit=limit, max_age_ms=10**9)
        quiet = {t: [f"{t}-{i}" for i in range(rng.randint(0, share))] for t in range(1, n)}
        sent: list[tuple[str, str]] = []
        for t, pids in quiet.items():
            sent += [(f"t{t}", p) for p in pids]
        sent += [("t0", f"flood-{i}") for i in range(rng.randint(limit, 5 * limit))]
        rng.shuffle(sent)
        for k, (table, pid) in enumerate(sent):
            ids.remember(_d(table, pid, at=k))
            assert len(ids) <= limit
        for t, pids in quiet.items():
            for p in pids:
                assert ids.get(f"t{t}", p) is not None, (limit, n, t, p)
        assert sum(ids.held_by(f"t{t}") for t in range(n)) == len(ids) == len(list(ids))


def test_signed_ids_are_kept_apart_and_stay_apart_through_a_snapshot() -> None:
    """A keyed table's ids (signed proposals) are not evicted by any amount of other traffic, even spread over
    more tables than the limit; reloaded from a snapshot with the tables' keys, they stay apart."""
    ids = DecidedIds(limit=10, max_age_ms=10**9)
    for i in range(8):
        ids.remember(_d("keyed", f"s{i}"), signed=True)
    for i in range(500):
        ids.remember(_d(f"junk-{i}", "p"))
    assert ids.held_by("keyed") == 8 and len(ids) == 18
    again = DecidedIds(limit=10, max_age_ms=10**9)
    again.extend(ids, signed=lambda table_id: table_id == "keyed")
    for i in range(500, 600):
        again.remember(_d(f"junk-{i}", "p"))
    assert [d.proposal_id for d in again if d.table_id == "keyed"] == [f"s{i}" for i in range(8)]
    for i in range(8, 12):  # only signed traffic counts against signed ids
        again.remember(_d("keyed", f"s{i}"), signed=True)
    assert again.get("keyed", "s1") is None and again.get("keyed", "s2") is not None and again.held_by("keyed") == 10
