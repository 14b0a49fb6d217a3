"""Multi-table transactions in the pure batch decision: every part accepted, or every part rejected with the
reason of the part that failed; never coalesced; a redelivery answered as decided."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import AddFile, CommitInfo
from deltacoord.schemas.deletion_vectors import inline_descriptor, inline_rows
from deltacoord.schemas.messages import SIBLING_REJECTED, Decision, MultiTable, Proposal
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


def _isolated(tid: str, isolation: str) -> TableState:
    s = TableState.empty(tid, f"s3://lake/{tid}")
    s.apply(0, [CommitInfo({"operation": "CREATE TABLE", "txnId": f"c-{tid}"}), protocol(),
                metadata(isolation=isolation)])
    s.apply(1, [CommitInfo({"operation": "WRITE", "txnId": f"w-{tid}"}), add("seed.parquet")])
    return s


def _blind_append(tid: str, path: str) -> Proposal:
    return _part(tid, 1, add(path), operation_parameters={"mode": "Append"})


def _rewrite(tid: str) -> Proposal:
    """An UPDATE of the whole table at version 1: reads every row, rewrites the seed file."""
    return _part(tid, 1, remove("seed.parquet"), add(f"new-{tid[-1]}.parquet"), operation="UPDATE",
                 predicates=["true"], read_files=[add("seed.parquet")])


def _refused_by_a_or_committed(da: Decision, db: Decision, txid: str, error_type: str | None,
                               versions: tuple[int, int]) -> None:
    """With `error_type`, A's part failed with it and B's was rejected as its sibling; else both committed at
    `versions`."""
    if error_type is not None:
        assert not da.committed and not db.committed
        assert da.error_type == error_type and da.table_id == A, da
        assert db.error_message is not None and db.error_message.startswith(f"{SIBLING_REJECTED} {txid}"), db
    else:
        assert (da.committed, da.version, db.committed, db.version) == (True, versions[0], True, versions[1]), (da, db)


@pytest.mark.parametrize(("a_level", "refused"), [("Serializable", True), ("WriteSerializable", False)])
def test_each_part_is_decided_by_its_own_tables_isolation_level(a_level: str, refused: bool) -> None:
    """The same winners (a blind append on each table) and the same parts: a part on a Serializable table
    conflicts with the blind append it did not read, one on a WriteSerializable table does not (Delta's
    exemption of blind appends), so the transaction fails only when A is Serializable, with A's conflict."""
    live = {A: _isolated(A, a_level), B: _isolated(B, "WriteSerializable")}
    winners = [_blind_append(A, "wa.parquet"), _blind_append(B, "wb.parquet")]
    parts = _tx("t5", _rewrite(A), _rewrite(B))
    decisions, _ = decide_batch(live, [*winners, *parts], NOW)
    assert all(d.committed for d in decisions[:2])
    _refused_by_a_or_committed(*decisions[2:], "t5", "ConcurrentAppendException" if refused else None, (3, 3))


def test_a_part_on_a_deletion_vector_table_gets_row_level_concurrency() -> None:
    """A's part deletes row 7 of the file whose row 2 a concurrent winner deleted: on A (deletion vectors) the
    rows differ, so the part commits, rebased to the union of both vectors, and so does the transaction."""
    seed = add("part-0.parquet", stats=json.dumps({"numRecords": 10, "minValues": {"x": 0}, "maxValues": {"x": 9}}))
    a = TableState.empty(A, f"s3://lake/{A}")
    a.apply(0, [CommitInfo({"operation": "CREATE TABLE", "txnId": "c-a"}), protocol(),
                metadata(config={"delta.enableDeletionVectors": "true"})])
    a.apply(1, [CommitInfo({"operation": "WRITE", "txnId": "w-a"}), seed])
    live = {A: a, B: _table(B)}

    def delete_row(row: int) -> Proposal:
        marked = AddFile(seed.path, seed.partition_values, seed.size, seed.modification_time, True, seed.stats,
                         deletion_vector=inline_descriptor(np.array([row], np.uint64)))
        return _part(A, 1, seed.to_remove(0), marked, operation="DELETE", predicates=[f"x = {row}"],
                     read_files=[seed])

    parts = _tx("t6", delete_row(7), _part(B, 1, add("b1.parquet")))
    decisions, overlay = decide_batch(live, [delete_row(2), *parts], NOW)
    assert [(d.table_id, d.committed, d.version) for d in decisions] == [(A, True, 2), (A, True, 3), (B, True, 2)]
    a_commit = next(c for c in overlay.commits if c.table_id == A and c.version == 3)
    dv = next(x for x in a_commit.actions if isinstance(x, AddFile)).deletion_vector
    assert dv is not None and inline_rows(dv).tolist() == [2, 7]


@pytest.mark.parametrize(("profile", "refused"), [("delta", False), ("maxcompute", True)])
def test_each_part_is_decided_by_its_own_tables_conflict_profile(profile: str, refused: bool) -> None:
    """Two appends into one unpartitioned table that both read version 1: Delta commits both (blind appends never
    conflict), MaxCompute's table fails the later INSERT INTO. A's part follows A's profile and fails the whole
    transaction only on the MaxCompute table, with MaxCompute's exception naming A."""
    config = {"deltacoord.conflictProfile": profile} if profile != "delta" else {}
    a = TableState.empty(A, f"s3://lake/{A}")
    a.apply(0, [CommitInfo({"operation": "CREATE TABLE", "txnId": "c-a"}), protocol(), metadata(config=config)])
    a.apply(1, [CommitInfo({"operation": "WRITE", "txnId": "w-a"}), add("seed.parquet")])
    live = {A: a, B: _table(B)}
    parts = _tx("t7", _blind_append(A, "a1.parquet"), _blind_append(B, "b1.parquet"))
    decisions, _ = decide_batch(live, [_blind_append(A, "wa.parquet"), *parts], NOW)
    assert decisions[0].committed
    _refused_by_a_or_committed(*decisions[1:], "t7", "ConcurrentJobException" if refused else None, (3, 2))
