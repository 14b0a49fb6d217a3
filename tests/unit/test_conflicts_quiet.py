"""Skipping quiet winners never changes a decision.

`conflicts.check` only walks winners that can fail the proposal (see
`conflicts._relevant`). These tests build random histories of winning commits
and random proposals, and compare every decision with the one made walking all
winners, as Delta's ConflictChecker does.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules import conflicts
from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.schemas.actions import DomainMetadata, SetTransaction
from deltacoord.schemas.messages import Proposal
from tests.unit.builders import Harness, add, insert_op, metadata, proposal, protocol, removal_of

SEED = [add(f"seed-{i}.parquet", part=i % 2) for i in range(4)]

WINNER_KINDS = ["blind", "blind_txn_a", "blind_txn_b", "read_append", "delete", "metadata", "protocol", "domain"]
CURRENT_KINDS = ["blind", "blind_reads_a", "dml", "whole_table", "metadata", "domain", "compaction"]


def _winner(h: Harness, kind: str, i: int) -> None:
    f = add(f"w-{i}.parquet", part=i % 2)
    if kind == "blind":
        h.commit_raw([f], blind=True)
    elif kind.startswith("blind_txn"):
        h.commit_raw([SetTransaction(kind[-1], i, None), f], blind=True)
    elif kind == "read_append":
        h.commit_raw([f], operation="MERGE", blind=False)
    elif kind == "delete":
        h.commit_raw([removal_of(SEED[i % len(SEED)])], operation="DELETE", blind=False)
    elif kind == "metadata":
        h.commit_raw([metadata(["part"], config={"k": str(i)})], operation="SET TBLPROPERTIES")
    elif kind == "protocol":
        h.commit_raw([protocol(1, 3)], operation="UPGRADE PROTOCOL")
    else:
        h.commit_raw([DomainMetadata("d", "{}", False)], operation="DOMAIN")


def _current(kind: str, read_version: int) -> Proposal:
    new = add("cur.parquet", part=0)
    if kind == "blind":
        return insert_op(read_version, [new])
    if kind == "blind_reads_a":
        return proposal(read_version, [SetTransaction("a", 99, None), new], app_ids=["a"])
    if kind == "dml":
        return proposal(read_version, [removal_of(SEED[0]), new], operation="DELETE", predicates=["part = 0"],
                        read_files=[SEED[0], SEED[2]])
    if kind == "whole_table":
        return proposal(read_version, [new], operation="MERGE", whole_table=True)
    if kind == "metadata":
        return proposal(read_version, [metadata(["part"], config={"mine": "1"}), new], operation="REPLACE")
    if kind == "domain":
        return proposal(read_version, [DomainMetadata("d", "{}", False), new], operation="DOMAIN")
    return proposal(read_version, [removal_of(SEED[1], data_change=False), add("c.parquet", data_change=False, part=1)],
                    operation="OPTIMIZE", changes_data=False, read_files=[SEED[1]])


def _outcome(r: object) -> tuple[object, ...]:
    if isinstance(r, Accepted):
        return ("accepted", r.version)
    assert isinstance(r, Rejected)
    return ("rejected", type(r.error).__name__, r.winning_version)


def _decide_both(isolation: str, winners: Sequence[str], current: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    h = Harness(["part"], isolation=isolation, files=SEED)
    read_version = h.head
    for i, kind in enumerate(winners):
        _winner(h, kind, i)
    p = _current(current, read_version)
    fast = _outcome(h.decide(p))
    with monkeypatch.context() as m:
        m.setattr(conflicts, "_relevant", lambda _cur, ws: ws)
        full = _outcome(h.decide(p))
    return fast, full


@settings(max_examples=300, deadline=None)
@given(
    isolation=st.sampled_from(["Serializable", "WriteSerializable"]),
    winners=st.lists(st.sampled_from(WINNER_KINDS), max_size=12),
    current=st.sampled_from(CURRENT_KINDS),
)
def test_skipping_quiet_winners_gives_the_full_scan_decision(isolation: str, winners: list[str], current: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        fast, full = _decide_both(isolation, winners, current, mp)
    assert fast == full


def test_blind_append_far_behind_the_head_checks_only_the_loud_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(["part"], files=SEED)
    read_version = h.head
    for i in range(500):
        _winner(h, "blind", i)
    _winner(h, "metadata", 500)
    seen: list[int] = []
    real = conflicts._check_winner

    def spy(cur: object, w: conflicts.WinningCommit, table: str) -> None:
        seen.append(w.version)
        real(cur, w, table)  # type: ignore[arg-type]

    monkeypatch.setattr(conflicts, "_check_winner", spy)
    r = h.decide(insert_op(read_version, [add("late.parquet", part=0)]))
    assert isinstance(r, Rejected) and type(r.error).__name__ == "MetadataChangedException"
    assert r.winning_version == h.head
    assert seen == [h.head]


def test_a_winner_setting_the_app_id_read_is_not_skipped() -> None:
    h = Harness(["part"], files=SEED)
    read_version = h.head
    _winner(h, "blind_txn_b", 0)
    _winner(h, "blind_txn_a", 1)
    r = h.decide(_current("blind_reads_a", read_version))
    assert isinstance(r, Rejected) and type(r.error).__name__ == "ConcurrentTransactionException"
    assert r.winning_version == h.head


def test_quiet_flag_follows_the_commit() -> None:
    h = Harness(["part"], files=SEED)
    expected = {"blind": True, "blind_txn_a": True, "read_append": False, "delete": False, "metadata": False,
                "protocol": False, "domain": False}
    for i, kind in enumerate(expected):
        _winner(h, kind, i)
    flags = [w.quiet for w in h.state.winners_since(h.head - len(expected))]
    assert flags == list(expected.values())

