"""A coalescing group keeps its version's commit as it grows: after every join it is exactly `merge` of the
parts so far (summed metrics, each proposal's commitInfo, row ids with the shared version, the last
high-water mark), whatever the parts' metrics hold; and the table a coalesced batch leaves is the one its
versions make applied one by one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.coordinator.rules.coalesce import Group, merge
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import (
    COALESCED_KEY,
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Protocol,
    SetTransaction,
    commit_to_json_lines,
)
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.row_tracking import DOMAIN
from tests.unit.builders import NOW, TABLE_ID, TABLE_URI, Harness, add, metadata, proposal, protocol, removal_of, txn

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
        got, _added = g.join(part, size)
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


# -- a join grows the table's version in place: the state the old way made, fork + apply of the merged commit ----

_TABLES: dict[str, tuple[Protocol, dict[str, str], tuple[str, ...], dict[str, int]]] = {
    "plain": (protocol(), {}, (), {}),
    "partitioned, small window and txn index": (protocol(), {}, ("country",),
                                                {"max_window_commits": 3, "max_window_files": 8, "txn_index_limit": 5}),
    "row tracking, in-commit timestamps": (
        Protocol(3, 7, (), ("domainMetadata", "rowTracking", "inCommitTimestamp")),
        {"delta.enableRowTracking": "true", "delta.enableInCommitTimestamps": "true"}, (), {}),
    "deletion vectors (row-level)": (Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)),
                                     {"delta.enableDeletionVectors": "true"}, (), {}),
}
_SEEDS = [f"seed-{i}.parquet" for i in range(4)]


def _stats(n: int) -> str:
    return json.dumps({"numRecords": n, "minValues": {"x": 0}, "maxValues": {"x": n}, "nullCount": {"x": 0}})


def _table(kind: str) -> TableState:
    """The same table at version 1 (created, then seed files) each call, proposal ids included."""
    proto, config, partition_by, bounds = _TABLES[kind]
    st = TableState.empty(TABLE_ID, TABLE_URI, **bounds)
    ict = {"inCommitTimestamp": NOW} if "delta.enableInCommitTimestamps" in config else {}
    st.apply(0, (CommitInfo({"timestamp": NOW, **ict, "operation": "CREATE TABLE", "txnId": "create"}), proto,
                 metadata(partition_by, config=config)))
    seeds = [add(p, stats=_stats(2), **({"country": "fr"} if partition_by else {})) for p in _SEEDS]
    st.apply(1, (CommitInfo({"timestamp": NOW + 1, **({"inCommitTimestamp": NOW + 1} if ict else {}),
                             "operation": "WRITE", "txnId": "seed", "isBlindAppend": True}), *seeds))
    return st


#: One step of a batch: an append of 1-3 files (in one of two partitions), the same with a txn of an app id
#: (a repeated app id ends the group), a delete of a seed file (never shares a version: it ends the group), or an
#: append whose writer set keys the coordinator owns in a coalesced version (`coalescedCommits`, an add's
#: `defaultRowCommitVersion`): the table is then made again from the live state at the join.
_STEP = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.sampled_from(["fr", "de"])),
    st.tuples(st.just("stream"), st.integers(1, 2), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("delete"), st.integers(0, len(_SEEDS) - 1), st.just("")),
    st.tuples(st.just("odd writer"), st.integers(1, 2), st.sampled_from(["ci", "version"])),
)


def _proposals(steps: list[tuple[str, int, str]], partitioned: bool) -> list[Proposal]:
    out = []
    for i, (kind, n, arg) in enumerate(steps):
        pid = f"p{i:03d}"
        parts = {"country": arg if kind == "append" else "fr"} if partitioned else {}
        files: list[Action] = [add(f"{pid}-{j}.parquet", stats=_stats(j + 1), **parts) for j in range(n)]
        ci: dict[str, Any] = {"engineInfo": "deltacoord-tests", "txnId": pid,
                              "operationMetrics": {"numFiles": str(n), "numOutputRows": str(n)}}
        if kind == "stream":
            files.append(txn(arg, i))
        elif kind == "delete":
            seed = add(_SEEDS[n], **({"country": "fr"} if partitioned else {}))
            out.append(proposal(1, [removal_of(seed)], operation="DELETE", predicates=["true"], read_files=[seed],
                                proposal_id=pid))
            continue
        elif kind == "odd writer" and arg == "ci":
            ci[COALESCED_KEY] = [{"txnId": f"ghost-{i}"}]
        elif kind == "odd writer":
            files = [replace(f, default_row_commit_version=99) if isinstance(f, AddFile) else f for f in files]
        out.append(proposal(1, files, operation="STREAMING UPDATE" if kind == "stream" else "WRITE", commit_info=ci,
                            operation_parameters={"mode": "Append"}, proposal_id=pid))
    return out


def _observed(s: TableState, ids: list[str], paths: list[str]) -> dict[str, Any]:
    """Everything the rules can read of a table: head, protocol, metadata, app ids, domains, timestamps, live
    files, the proposal ids it knows, and the winners window whole (each version's summary, the marked ones)."""
    oldest = s.oldest_retained_version
    winners = s.winners_since(oldest - 1)
    return {"version": s.version, "protocol": s.protocol, "metadata": s.metadata, "schema": s.partition_schema,
            "apps": dict(s.app_versions), "domains": dict(s.domains), "ict": s.last_ict,
            "ts": s.last_commit_timestamp, "creation": s.creation_operation, "count": s.live_file_count,
            "live": [s.is_live(add(p)) for p in paths], "txns": [s.committed_version_of(i) for i in ids],
            "oldest": oldest, "window": s.window_size, "winners": list(winners),
            "marked": [w.version for w in winners.marked()]}


def _exported(s: TableState) -> dict[str, Any]:
    e = s.export()
    return {**{f: getattr(e, f) for f in ("version", "protocol", "metadata", "app_versions", "domains", "last_ict",
                                         "last_commit_timestamp", "creation_operation", "txn_ids")},
            "live_hashes": e.live_hashes.tolist()}


def _check_incremental_joins(kind: str, steps: list[tuple[str, int, str]]) -> int:
    """After every proposal of the batch, the table the overlay holds (its newest version grown in place by
    each join) reads as the one the old way made: a fork of the table before that version, with the version's
    whole commit applied; and `apply_to` leaves the live table as its versions applied in order. Returns how
    many commits joined a version."""
    partitioned = bool(_TABLES[kind][2])
    ps = _proposals(steps, partitioned)
    ids = ["create", "seed", *(p.proposal_id for p in ps), *(f"ghost-{i}" for i in range(len(ps)))]
    paths = [*_SEEDS, *(a.path for p in ps for a in p.actions if isinstance(a, AddFile))]
    live = {TABLE_ID: _table(kind)}
    now = NOW + 60_000
    decisions: list[Decision] = []
    for m in range(1, len(ps) + 1):
        decisions, overlay = decide_batch(live, ps[:m], now, busy={TABLE_ID})
        versions = [d for d in decisions if d.holds_version]
        if not versions:
            continue
        base = live[TABLE_ID].fork()  # the old way: the table before the newest version, forked again
        for d in versions[:-1]:
            assert d.version is not None
            base.apply(d.version, d.actions)
        old_way = base.fork()
        assert versions[-1].version is not None
        old_way.apply(versions[-1].version, versions[-1].actions)
        assert _observed(overlay.tables[TABLE_ID], ids, paths) == _observed(old_way, ids, paths), (kind, m)
    expected = _table(kind)
    for d in decisions:
        if d.holds_version:
            assert d.version is not None
            expected.apply(d.version, d.actions)
    overlay.apply_to(live)
    assert _observed(live[TABLE_ID], ids, paths) == _observed(expected, ids, paths)
    assert _exported(live[TABLE_ID]) == _exported(expected)
    return sum(1 for d in decisions if d.coalesced_into is not None)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(_TABLES)), steps=st.lists(_STEP, min_size=1, max_size=16))
def test_a_join_grows_the_version_in_place_as_the_old_way_made_it(kind: str, steps: list[tuple[str, int, str]]) -> None:
    _check_incremental_joins(kind, steps)


def test_joins_of_every_kind_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property above on fixed batches where appends, streaming appends and odd writers do join: every join
    grows the version in place (a writer's own `coalescedCommits` is refused by validation, so it never leads)."""
    grown: list[bool] = []
    extend = TableState.extend

    def counted(self: TableState, version: int, commit_info: CommitInfo, actions: Sequence[Action]) -> None:
        try:
            extend(self, version, commit_info, actions)
        except ValueError:
            grown.append(False)
            raise
        grown.append(True)

    monkeypatch.setattr(TableState, "extend", counted)
    batches = [[("append", 2, "fr"), ("stream", 1, "a"), ("append", 3, "de"), ("stream", 2, "b"), ("stream", 1, "a"),
                ("append", 1, "fr"), ("delete", 0, ""), ("odd writer", 1, "ci"), ("append", 2, "fr"),
                ("stream", 1, "c"), ("odd writer", 2, "version"), ("append", 1, "de")],
               [("odd writer", 2, "version"), ("append", 1, "fr"), ("append", 1, "de"), ("stream", 1, "a")]]
    for kind in _TABLES:
        assert sum(_check_incremental_joins(kind, steps) for steps in batches) >= 6, kind
    assert len(grown) >= 20 and all(grown), grown
