"""Multi-table transactions in the pure batch decision: every part accepted, or every part rejected with the
reason of the part that failed; never coalesced; a redelivery answered as decided."""

from __future__ import annotations

import dataclasses

from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import CommitInfo
from deltacoord.schemas.messages import SIBLING_REJECTED, MultiTable, Proposal
from tests.unit.builders import NOW, add, metadata, proposal, protocol, remove

A, B = "g::a", "g::b"


def _table(tid: str) -> TableState:
    s = TableState.empty(tid, f"s3://lake/{tid}")
    s.apply(0, [CommitInfo({"operation": "CREATE TABLE", "txnId": f"c-{tid}"}), protocol(), metadata()])
    s.apply(1, [CommitInfo({"operation": "WRITE", "txnId": f"w-{tid}"}), add("seed.parquet")])
    return s


def _live() -> dict[str, TableState]:
    return {A: _table(A), B: _table(B)}


def _tx(txid: str, *parts: Proposal) -> list[Proposal]:
    tables = tuple(p.table_id for p in parts)
    return [dataclasses.replace(p, transaction=MultiTable(txid, tables)) for p in parts]


def _part(tid: str, read_version: int, *actions: object, **kw: object) -> Proposal:
    return proposal(read_version, actions, table_id=tid, table_uri=f"s3://lake/{tid}", **kw)  # type: ignore[arg-type]


def test_every_part_accepted_gets_its_own_version_on_its_own_table() -> None:
    live = _live()
    parts = _tx("t1", _part(A, 1, add("a1.parquet")), _part(B, 1, add("b1.parquet")))
    decisions, overlay = decide_batch(live, parts, NOW)
    assert [(d.table_id, d.committed, d.version) for d in decisions] == [(A, True, 2), (B, True, 2)]
    assert live[A].version == 1 and live[B].version == 1, "the live states are not touched"
    overlay.apply_to(live)
    assert live[A].version == 2 and live[B].version == 2


def test_a_conflicting_part_rejects_the_whole_transaction_and_the_batch_goes_on_without_it() -> None:
    live = _live()
    winner = _part(B, 1, remove("seed.parquet"), operation="DELETE", read_files=[add("seed.parquet")])
    loser = _tx("t2", _part(A, 1, add("a1.parquet")),
                _part(B, 1, remove("seed.parquet"), operation="DELETE", read_files=[add("seed.parquet")]))
    after = _part(A, 1, add("a2.parquet"))
    decisions, overlay = decide_batch(live, [winner, *loser, after], NOW)
    w, la, lb, af = decisions
    assert w.committed and w.version == 2
    assert not la.committed and not lb.committed
    assert lb.error_type == "ConcurrentDeleteReadException" and lb.winning_version == 2, lb
    assert la.error_type == lb.error_type and la.error_message is not None
    assert la.error_message.startswith(f"{SIBLING_REJECTED} t2") and B in la.error_message
    assert af.committed and af.version == 2, "A's part was undone: the next commit of A takes version 2"
    assert [(c.table_id, c.version) for c in overlay.commits] == [(B, 2), (A, 2)]


def test_a_part_is_never_coalesced_with_blind_appends_around_it() -> None:
    live = _live()
    before = _part(A, 1, add("x1.parquet"))
    parts = _tx("t3", _part(A, 1, add("a1.parquet")), _part(B, 1, add("b1.parquet")))
    after = _part(A, 1, add("x2.parquet"))
    decisions, _ = decide_batch(live, [before, *parts, after], NOW, busy={A, B})
    assert [(d.table_id, d.version, d.coalesced_into) for d in decisions] == [
        (A, 2, None), (A, 3, None), (B, 2, None), (A, 4, None)]


def test_a_redelivered_transaction_is_answered_with_its_first_decisions() -> None:
    live = _live()
    parts = _tx("t4", _part(A, 1, add("a1.parquet")), _part(B, 1, add("b1.parquet")))
    first, overlay = decide_batch(live, parts, NOW)
    overlay.apply_to(live)
    again, overlay2 = decide_batch(live, parts, NOW)
    assert [(d.committed, d.duplicate_of) for d in again] == [(True, 2), (True, 2)]
    assert not overlay2.commits
    by_id = {d.proposal_id: d for d in first}
    rep, _ = decide_batch(live, parts, NOW, earlier=lambda t, p: by_id.get(p))
    assert [(d.committed, d.duplicate_of) for d in rep] == [(True, 2), (True, 2)]
