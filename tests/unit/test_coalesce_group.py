"""A coalescing group keeps its version's commit as it grows: after every join it is exactly `merge` of the
parts so far (summed metrics, each proposal's commitInfo, row ids with the shared version, the last
high-water mark), whatever the parts' metrics hold; and the table a coalesced batch leaves is the one its
versions make applied one by one."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.coordinator.rules.coalesce import Group, merge
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, DomainMetadata, SetTransaction, commit_to_json_lines
from deltacoord.schemas.row_tracking import DOMAIN
from tests.unit.builders import NOW, TABLE_ID, Harness, add, proposal, txn

_METRIC = st.one_of(st.integers(0, 50), st.integers(0, 50).map(str), st.sampled_from(["x", "", None, True, 1.5]))
_METRICS = st.one_of(st.dictionaries(st.sampled_from(["numFiles", "numOutputRows", "numOutputBytes"]), _METRIC,
                                     max_size=3),
                     st.sampled_from([None, "not a map", ["a"]]))


@st.composite
def _part(draw: Any, i: int) -> tuple[Action, ...]:
    values: dict[str, Any] = {"operation": "WRITE", "txnId": f"p{i}", "timestamp": 1_000 + i,
                              "operationParameters": {"mode": "Append"}}
    metrics = draw(_METRICS)
    if metrics is not None:
        values["operationMetrics"] = metrics
    out: list[Action] = [CommitInfo(values)]
    for j in range(draw(st.integers(1, 3))):
        out.append(AddFile(path=f"p{i}-{j}.parquet", partition_values={}, size=10, modification_time=1, data_change=True,
                           base_row_id=100 * i + j if draw(st.booleans()) else None,
                           default_row_commit_version=7 if draw(st.booleans()) else None))
    if draw(st.booleans()):
        out.append(SetTransaction(f"app-{i}", i, None))
    if draw(st.booleans()):
        out.append(DomainMetadata(DOMAIN, f'{{"rowIdHighWaterMark":{i}}}', False))
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 12), version=st.integers(1, 1_000))
def test_each_join_returns_the_merge_of_the_parts_so_far(data: st.DataObject, n: int, version: int) -> None:
    parts = [data.draw(_part(i)) for i in range(n)]
    g = Group.open(version, 0, parts[0])
    for k, part in enumerate(parts[1:], start=2):
        size = g.takes(part)
        assert size == len(commit_to_json_lines(part))
        got = g.join(part, size)
        assert got == merge(version, parts[:k])
        assert commit_to_json_lines(got) == commit_to_json_lines(merge(version, parts[:k]))


def _seen(s: TableState, ids: list[str], paths: list[str]) -> dict[str, Any]:
    """What the rules can observe of a table after a batch."""
    return {"version": s.version, "apps": dict(s.app_versions), "count": s.live_file_count,
            "live": [s.is_live(add(p)) for p in paths], "txns": [s.committed_version_of(i) for i in ids],
            "ict": s.last_ict, "ts": s.last_commit_timestamp, "window": s.window_size,
            "winners": [(w.version, w.app_ids, w.quiet, w.num_file_actions) for w in s.winners_since(0)]}


@settings(max_examples=40, deadline=None)
@given(apps=st.lists(st.sampled_from(["", "", "a", "b", "c"]), min_size=1, max_size=100))
def test_a_coalesced_batch_leaves_the_table_as_its_versions_applied_one_by_one(apps: list[str]) -> None:
    """Groups (ended by a repeated app id or the bound on a group) made on a fork of the table before each
    group's version: the state after the batch is the state of its versions applied in order."""
    h = Harness()
    ps = [proposal(0, [add(f"f{i}.parquet"), *([txn(a, i)] if a else [])], operation="WRITE",
                   operation_parameters={"mode": "Append"}) for i, a in enumerate(apps)]
    live = {TABLE_ID: h.state}
    decisions, overlay = decide_batch(live, ps, NOW + 60_000, busy={TABLE_ID})
    assert all(d.committed for d in decisions)
    expected = Harness()
    for d in decisions:
        if d.holds_version:
            assert d.version is not None
            expected.state.apply(d.version, d.actions)
    seen = _seen(overlay.tables[TABLE_ID], [p.proposal_id for p in ps], [f"f{i}.parquet" for i in range(len(ps))])
    assert seen == _seen(expected.state, [p.proposal_id for p in ps], [f"f{i}.parquet" for i in range(len(ps))])
    overlay.apply_to(live)
    assert _seen(h.state, [p.proposal_id for p in ps], [f"f{i}.parquet" for i in range(len(ps))]) == seen
    if len(apps) >= 2 and (apps[0] != apps[1] or not apps[0]):
        assert decisions[1].coalesced_into == ps[0].proposal_id
