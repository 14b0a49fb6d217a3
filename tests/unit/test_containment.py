"""Pure parts of containment: stable file-key hashes, state snapshots, decided ids, faults contained per table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deltacoord.coordinator.kafka.control import HALT, RESUME, control_kind, halt_record, resume_record
from deltacoord.coordinator.kafka.state_snapshots import (
    PartitionSnapshot,
    SnapshotError,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
)
from deltacoord.coordinator.rules import batch as batch_module
from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.coordinator.rules.state import TableState, key_hash
from deltacoord.schemas.actions import CommitInfo
from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.reasons import ReasonCode
from tests.unit.builders import (
    DOMAINS_PROTOCOL,
    NOW,
    TABLE_ID,
    TABLE_URI,
    Harness,
    add,
    domain,
    metadata,
    proposal,
    protocol,
    remove,
    txn,
)


def test_file_key_hashes_are_the_same_in_every_process() -> None:
    """Snapshots persist the hashes: Python's salted str hash would differ in the next process."""
    here = [key_hash("date=2024-01-01/part-0.parquet", None), key_hash("x.parquet", "dv-1")]
    code = ("from deltacoord.coordinator.rules.state import key_hash; "
            "print(key_hash('date=2024-01-01/part-0.parquet', None), key_hash('x.parquet', 'dv-1'))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=Path(__file__).resolve().parents[2])
    assert [int(x) for x in other.stdout.split()] == here
    assert here[0] != here[1] and key_hash("x.parquet", None) != here[1]


def _state() -> TableState:
    h = Harness(["date"], proto=DOMAINS_PROTOCOL)
    h.must_commit(proposal(h.head, [add(f"date=d/f{i}.parquet", date="2024-01-01") for i in range(50)]))
    h.must_commit(proposal(h.head, [remove("date=d/f3.parquet", date="2024-01-01"), txn("app", 7), domain("dom")]))
    return h.state


def _snapshot(st: TableState, decided: list[Decision]) -> PartitionSnapshot:
    return PartitionSnapshot(commits_topic="c", partition=0, offset=42, last=(41, "p-last"), tables=[st.export()],
                             halted={"t2": ("s3://b/t2", "why")}, decided=decided, republish_from={TABLE_ID: (40, 2)},
                             created_ms=NOW, proposals_next=77)


def test_a_snapshot_restores_what_the_rules_see_of_a_table(tmp_path: Path) -> None:
    st = _state()
    rejected = Decision(TABLE_ID, TABLE_URI, "p-1", Outcome.REJECTED, error_type="InvalidProposalError",
                        error_message="no", reason_code="UNKNOWN_TABLE", decided_at_ms=NOW)
    store = SnapshotStore(str(tmp_path / "state"), {}, "c", 0)
    store.write(_snapshot(st, [rejected]))
    [snap] = store.newest()
    assert (snap.offset, snap.last, snap.halted, snap.republish_from) == (42, (41, "p-last"), {"t2": ("s3://b/t2", "why")},
                                                                         {TABLE_ID: (40, 2)})
    assert snap.proposals_next == 77  # where the proposals consumer resumes, with the records after the snapshot
    assert snap.decided == [rejected]
    back = TableState.from_export(snap.tables[0])
    assert (back.version, back.metadata, back.protocol, dict(back.app_versions), dict(back.domains)) == (
        st.version, st.metadata, st.protocol, dict(st.app_versions), dict(st.domains))
    assert back.live_file_count == st.live_file_count == 49
    assert back.is_live(add("date=d/f1.parquet", date="2024-01-01")) and not back.is_live(add("date=d/f3.parquet", date="2024-01-01"))
    txn_ids = [t for t, _v in st.export().txn_ids]
    assert len(txn_ids) == 3  # the redelivery index: creation and the two commits
    assert [back.committed_version_of(t) for t in txn_ids] == [st.committed_version_of(t) for t in txn_ids] == [0, 1, 2]
    # Deciding goes on from the restored state: a new file is added, a removed one is gone.
    h = Harness()
    h.state = back
    assert h.decide(proposal(back.version, [add("date=d/new.parquet", date="2024-01-01")])).__class__.__name__ == "Accepted"


def test_a_snapshot_written_before_proposal_offsets_were_recorded_reads_as_offset_zero() -> None:
    """Snapshots of an older coordinator have no `proposals_next`: 0, so the group's committed offset decides."""
    import json
    import struct

    from deltacoord.coordinator.kafka.state_snapshots import MAGIC

    data = encode_snapshot(_snapshot(_state(), []))
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    doc = json.loads(data[start:start + n])
    del doc["proposals_next"]
    head = json.dumps(doc, separators=(",", ":")).encode()
    old = b"".join([MAGIC, struct.pack("<Q", len(head)), head, data[start + n:]])
    assert decode_snapshot(old).proposals_next == 0


def test_a_damaged_snapshot_is_refused_and_skipped(tmp_path: Path) -> None:
    data = encode_snapshot(_snapshot(_state(), []))
    with pytest.raises(SnapshotError):
        decode_snapshot(data[:-16])  # truncated hashes
    with pytest.raises(SnapshotError):
        decode_snapshot(b"something else")
    store = SnapshotStore(str(tmp_path), {}, "c", 0)
    store.storage.put("c/0/00000000000000000050.state", data[: len(data) // 2])
    store.write(_snapshot(_state(), []))  # offset 42
    assert [s.offset for s in store.newest()] == [42], "the damaged newer one is skipped"


def test_only_the_newest_snapshots_are_kept(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path), {}, "c", 0)
    st = _state()
    for offset in (10, 20, 30, 40, 50):
        snap = _snapshot(st, [])
        snap.offset = offset
        store.write(snap)
    assert store.offsets() == [30, 40, 50]


def test_decided_ids_keep_the_first_decision_within_count_and_age() -> None:
    ids = DecidedIds(limit=3, max_age_ms=1_000)

    def d(pid: str, at: int, outcome: Outcome = Outcome.REJECTED) -> Decision:
        return Decision(TABLE_ID, TABLE_URI, pid, outcome, version=5 if outcome is Outcome.COMMITTED else None,
                        reason_code="X", error_message="m" * 10_000, decided_at_ms=at)

    ids.remember(d("a", 100))
    ids.remember(d("a", 101, Outcome.COMMITTED))  # a later decision of the same id does not replace the first
    first = ids.get(TABLE_ID, "a")
    assert first is not None and first.outcome is Outcome.REJECTED and len(first.error_message or "") == 500
    for pid, at in (("b", 200), ("c", 300), ("e", 400)):
        ids.remember(d(pid, at))
    assert ids.get(TABLE_ID, "a") is None and len(ids) == 3  # by count
    ids.remember(d("f", 1_350))
    assert ids.get(TABLE_ID, "b") is None and ids.get(TABLE_ID, "e") is not None  # by age: older than 1_350 - 1_000
    assert ids.get("another table", "e") is None


def test_a_repeated_proposal_id_is_answered_with_its_first_decision() -> None:
    h = Harness()
    ahead = proposal(h.head + 5, [add("a.parquet")])  # rejected: it read a version that does not exist
    [first], _ = decide_batch({TABLE_ID: h.state}, [ahead], NOW)
    assert first.reason_code == ReasonCode.READ_VERSION_AHEAD
    ids = DecidedIds()
    ids.remember(first)
    for _ in range(5):  # the table moves on: deciding `ahead` again now would commit it
        h.must_commit(proposal(h.head, [add(f"x{h.head}.parquet")]))
    decisions, overlay = decide_batch({TABLE_ID: h.state}, [ahead, ahead], NOW + 10, earlier=ids.get)
    assert [(d.outcome, d.reason_code, d.error_message) for d in decisions] == [
        (Outcome.REJECTED, first.reason_code, first.error_message)] * 2
    assert not overlay.commits
    ok = proposal(h.head, [add("b.parquet")])
    decisions, _ = decide_batch({TABLE_ID: h.state}, [ok, ok], NOW)
    assert decisions[0].committed and decisions[1].duplicate_of == decisions[0].version


def test_a_fault_deciding_one_table_halts_that_table_only(monkeypatch: pytest.MonkeyPatch) -> None:
    good = Harness()
    bad_state = TableState.empty("bad", "s3://lake/bad")
    bad_state.apply(0, [CommitInfo({"operation": "CREATE TABLE"}), protocol(), metadata()])
    decide = batch_module.decide

    def faulty(state: TableState, p: Any, now_ms: int) -> Any:
        if p.table_id == "bad":
            raise KeyError("a bug")
        return decide(state, p, now_ms)

    monkeypatch.setattr(batch_module, "decide", faulty)
    first_good = proposal(good.head, [add("g1.parquet")])
    on_bad = proposal(0, [add("b.parquet")], table_id="bad", table_uri="s3://lake/bad")
    second_good = proposal(good.head, [add("g2.parquet")])
    decisions, overlay = decide_batch({TABLE_ID: good.state, "bad": bad_state}, [first_good, on_bad, second_good], NOW)
    assert [d.committed for d in decisions] == [True, False, True]
    assert decisions[1].reason_code == ReasonCode.TABLE_HALTED and "KeyError" in (decisions[1].error_message or "")
    assert list(overlay.halts) == ["bad"] and [c.table_id for c in overlay.commits] == [TABLE_ID, TABLE_ID]


def test_control_records_are_recognised_and_nothing_else_is() -> None:
    h = halt_record(TABLE_ID, TABLE_URI, "x" * 10_000, 4, NOW)
    r = resume_record(TABLE_ID, TABLE_URI, 4, NOW)
    assert (control_kind(h), control_kind(r)) == (HALT, RESUME)
    assert h.reason_code == "TABLE_HALTED" and len(h.error_message or "") == 4000 and h.winning_version == 4
    rejection = Decision(TABLE_ID, TABLE_URI, "p", Outcome.REJECTED, error_type="TableHalted", reason_code="TABLE_HALTED")
    assert control_kind(rejection) is None  # a proposal's rejection, whatever its type name
