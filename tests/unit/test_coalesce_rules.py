"""Commit coalescing, pure: which accepted commits of a batch share a version, and the version they make."""

from __future__ import annotations

import json

from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.coordinator.rules.coalesce import MAX_COALESCED, merge
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import (
    COALESCED_KEY,
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    SetTransaction,
    commit_to_json_lines,
)
from deltacoord.schemas.messages import Decision, Outcome, Proposal
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.row_tracking import DOMAIN
from tests.unit.builders import NOW, TABLE_ID, Harness, add, metadata, proposal, protocol, remove, txn


def _stats(n: int) -> str:
    return json.dumps({"numRecords": n})


def _append(rv: int, path: str, *extra: Action, n: int = 3, metrics: dict[str, str] | None = None) -> Proposal:
    ci = None if metrics is None else {"engineInfo": "deltacoord-tests", "operationMetrics": metrics}
    p = proposal(rv, [add(path, stats=_stats(n)), *extra], operation="WRITE", commit_info=ci,
                 operation_parameters={"mode": "Append", "path": path})
    return p


def _decide(h: Harness, proposals: list[Proposal], busy: bool = True) -> list[Decision]:
    live = {TABLE_ID: h.state}
    decisions, overlay = decide_batch(live, proposals, NOW + 60_000, busy={TABLE_ID} if busy else frozenset())
    overlay.apply_to(live)
    return decisions


def test_appends_of_a_busy_table_share_one_version_the_leader_holds() -> None:
    h = Harness()
    ps = [_append(0, f"f{i}.parquet", metrics={"numFiles": "1", "numOutputRows": str(i + 1)}) for i in range(4)]
    ds = _decide(h, ps)
    assert [d.version for d in ds] == [1, 1, 1, 1]
    assert ds[0].coalesced_into is None and [d.coalesced_into for d in ds[1:]] == [ps[0].proposal_id] * 3
    assert all(d.outcome is Outcome.COMMITTED and d.holds_version == (i == 0) for i, d in enumerate(ds))
    assert all(d.actions == () for d in ds[1:])
    ci = ds[0].actions[0]
    assert isinstance(ci, CommitInfo)
    assert ci.txn_ids == tuple(p.proposal_id for p in ps)
    assert [c["operationParameters"]["path"] for c in ci.values[COALESCED_KEY]] == [f"f{i}.parquet" for i in range(4)]
    assert ci.values["operationMetrics"] == {"numFiles": "4", "numOutputRows": "10"}
    assert ci.is_blind_append
    assert [a.path for a in ds[0].actions if isinstance(a, AddFile)] == [f"f{i}.parquet" for i in range(4)]
    # The state knows every proposal id at the shared version (a redelivery is answered, not committed again).
    assert h.state.version == 1
    assert all(h.state.committed_version_of(p.proposal_id) == 1 for p in ps)
    again = _decide(h, [ps[2]])
    assert again[0].duplicate_of == 1
    # The next batch goes on from the shared version.
    assert _decide(h, [_append(1, "g.parquet")])[0].version == 2


def test_an_idle_table_keeps_one_version_per_commit() -> None:
    h = Harness()
    ds = _decide(h, [_append(0, f"f{i}.parquet") for i in range(3)], busy=False)
    assert [d.version for d in ds] == [1, 2, 3]
    assert all(d.holds_version for d in ds)


def test_coalescing_off_keeps_one_version_per_commit() -> None:
    h = Harness(config={"deltacoord.coalesce": "false"})
    ds = _decide(h, [_append(0, f"f{i}.parquet") for i in range(3)])
    assert [d.version for d in ds] == [1, 2, 3]


def test_a_bad_coalesce_value_is_refused_with_its_name() -> None:
    h = Harness()
    bad = proposal(0, [metadata(config={"deltacoord.coalesce": "sometimes"})], operation="SET TBLPROPERTIES",
                   changes_data=False)
    d = _decide(h, [bad])[0]
    assert d.reason_code == ReasonCode.BAD_TABLE_PROPERTY and "deltacoord.coalesce" in (d.error_message or "")


def test_streaming_appends_of_distinct_app_ids_coalesce_and_one_app_id_twice_does_not() -> None:
    h = Harness()
    ps = [_append(0, "a1.parquet", txn("app-a", 1)), _append(0, "b1.parquet", txn("app-b", 1)),
          _append(0, "a2.parquet", txn("app-a", 2)), _append(0, "blind.parquet")]
    ds = _decide(h, ps)
    # app-a again cannot share the version holding app-a: it starts the next one, which the blind append joins.
    assert [d.version for d in ds] == [1, 1, 2, 2]
    txns = [a for a in ds[0].actions if isinstance(a, SetTransaction)]
    assert [(t.app_id, t.version) for t in txns] == [("app-a", 1), ("app-b", 1)]
    assert h.state.app_versions["app-a"] == 2 and h.state.app_versions["app-b"] == 1
    # A stale app-id version is still refused against the coalesced state.
    stale = _decide(h, [_append(2, "late.parquet", txn("app-b", 1))])[0]
    assert stale.outcome is Outcome.REJECTED


def test_what_may_not_share_a_version_ends_the_group() -> None:
    h = Harness(files=[add("old.parquet"), add("keep.parquet")])
    ps = [
        _append(1, "f0.parquet"),
        _append(1, "f1.parquet"),
        proposal(1, [remove("old.parquet")], operation="DELETE"),  # a remove
        _append(1, "f2.parquet"),
        proposal(1, [add("f4.parquet", stats=_stats(1))], read_files=[add("keep.parquet")]),  # read something
        _append(1, "f3.parquet"),
        proposal(1, [metadata(config={"x": "1"})], operation="SET TBLPROPERTIES", changes_data=False),  # metadata
    ]
    ds = _decide(h, ps)
    assert [d.version for d in ds] == [2, 2, 3, 4, 5, 6, 7]
    assert [d.coalesced_into is not None for d in ds] == [False, True] + [False] * 5


def test_a_group_is_bounded() -> None:
    h = Harness()
    ds = _decide(h, [_append(0, f"f{i}.parquet") for i in range(MAX_COALESCED + 3)])
    assert [d.version for d in ds] == [1] * MAX_COALESCED + [2, 2, 2]


def test_row_ids_stay_per_file_with_the_shared_version_and_one_high_water_mark() -> None:
    proto = protocol(3, 7)
    proto = type(proto)(3, 7, (), ("domainMetadata", "rowTracking"))
    h = Harness(proto=proto, config={"delta.enableRowTracking": "true"})
    ds = _decide(h, [_append(0, "a.parquet", n=5), _append(0, "b.parquet", n=7), _append(0, "c.parquet", n=2)])
    adds = [a for a in ds[0].actions if isinstance(a, AddFile)]
    assert [(a.base_row_id, a.default_row_commit_version) for a in adds] == [(0, 1), (5, 1), (12, 1)]
    marks = [a for a in ds[0].actions if isinstance(a, DomainMetadata)]
    assert len(marks) == 1 and marks[0].domain == DOMAIN and json.loads(marks[0].configuration) == {"rowIdHighWaterMark": 13}


def test_ict_and_timestamp_are_the_leaders() -> None:
    h = Harness(config={"delta.enableInCommitTimestamps": "true"})
    ds = _decide(h, [_append(0, "a.parquet"), _append(0, "b.parquet")])
    ci = ds[0].actions[0]
    assert isinstance(ci, CommitInfo) and ci.in_commit_timestamp is not None
    assert ci.in_commit_timestamp > (h.state.winners_since(0)[0].in_commit_timestamp or 0) - 1
    assert [list(c) for c in ci.values[COALESCED_KEY]] and all("inCommitTimestamp" not in c for c in ci.values[COALESCED_KEY])


def test_merge_is_deterministic_bytes() -> None:
    parts = [(CommitInfo({"txnId": "a", "operation": "WRITE", "timestamp": 5}), add("x.parquet")),
             (CommitInfo({"txnId": "b", "operation": "STREAMING UPDATE", "timestamp": 6}), add("y.parquet"), txn("s", 3))]
    assert commit_to_json_lines(merge(4, parts)) == commit_to_json_lines(merge(4, list(parts)))
    ci = merge(4, parts)[0]
    assert isinstance(ci, CommitInfo) and ci.timestamp == 5 and ci.operation == "WRITE"
    assert ci.values[COALESCED_KEY] == [{"txnId": "a", "operation": "WRITE"},
                                        {"txnId": "b", "operation": "STREAMING UPDATE"}]


def test_a_state_rebuilt_from_a_coalesced_version_knows_every_proposal() -> None:
    h = Harness()
    ps = [_append(0, "a.parquet"), _append(0, "b.parquet")]
    ds = _decide(h, ps)
    s = TableState.empty(TABLE_ID, h.state.table_uri)
    s.apply(0, [CommitInfo({"txnId": "c"}), protocol(), metadata()])
    s.apply(1, ds[0].actions)
    assert [s.committed_version_of(p.proposal_id) for p in ps] == [1, 1]


def test_decisions_written_before_coalesced_into_still_decode() -> None:
    """Records on the commits topic from before coalescing decode with `coalesced_into` null."""
    from fastavro.schema import parse_schema

    from deltacoord.schemas.codec import DECISION_SCHEMA, decode_decision, encode_decision
    from tests.unit.test_codec import COMMITTED, body_record, single_object
    from tests.unit.test_staged_commits import HISTORY

    (old,) = [f for f in HISTORY.glob("CommitDecision.*.json")
              if '"stagedCommit"' in f.read_text() and '"coalescedInto"' not in f.read_text()]
    record = body_record(encode_decision(COMMITTED), DECISION_SCHEMA)
    record.pop("coalescedInto")
    data = single_object(parse_schema(json.loads(old.read_text())), record)
    assert data[2:10].hex() == old.name.split(".")[1]
    assert decode_decision(data) == COMMITTED and decode_decision(data).coalesced_into is None
    member = Decision(COMMITTED.table_id, COMMITTED.table_uri, "m", Outcome.COMMITTED, version=COMMITTED.version,
                      coalesced_into=COMMITTED.proposal_id)
    assert decode_decision(encode_decision(member)) == member and not member.holds_version
