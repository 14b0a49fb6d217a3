"""The batch writer's operations end to end: real broker, real coordinator, delta-rs reading every version.

Also the writer-side guarantees that need no concurrency: exactly-once
appends, a rejected proposal leaves no staged files, and a decision that never
arrives is an unknown outcome (files kept), never a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import CommitOutcomeUnknownError, InvalidProposalError
from deltacoord.schemas.routing import Topics
from deltacoord.writer import staging
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import MergeError, Table, TableExistsError
from tests.conftest import TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string())])


@dataclass
class Env:
    bootstrap: str
    topics: Topics
    client: CoordinatorClient
    coordinator: Coordinator
    #: Where the tables live; a test's `tmp_path / name` is moved there (`TablePlace.of`).
    place: TablePlace
    handles: list[Table] = field(default_factory=list)

    def table(self, path: Path, **kwargs: Any) -> Table:
        t = Table(self.place.of(path), self.bootstrap, topics=self.topics, client=self.client,
                  storage_options=self.place.storage_options, **kwargs)
        self.handles.append(t)
        return t

    def settle(self) -> None:
        """Wait until every version any handle committed is in `_delta_log` (publication follows decisions)."""
        for h in self.handles:
            v = h.last_committed_version
            if v is not None:
                h.wait_published(v)

    def orphans(self, t: Table) -> set[str]:
        self.settle()
        return orphans(t)

    def assert_delta_rs_agrees(self, t: Table) -> int:
        self.settle()
        return assert_delta_rs_agrees(t)


@contextmanager
def running_env(kafka_bootstrap: str, place: TablePlace) -> Iterator[Env]:
    """One coordinator serving `place` and one client (what a module's tests share: startup is the slow part)."""
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, **place.coordinator_settings) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            yield Env(kafka_bootstrap, topics, client, coord, place)
        finally:
            client.close()


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One coordinator and one client for the whole module, tables in local directories."""
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


# -- helpers (also used by test_writer_conflicts) ---------------------------------------------
def rows(t: pa.Table | Table, version: int | None = None) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples in (id, date, value, ...) schema order, for exact comparison."""
    tbl = t.to_pyarrow(version) if isinstance(t, Table) else t
    return sorted(tuple(r.values()) for r in tbl.to_pylist())


def data(ids: list[int], date: str | list[str], value: str | list[str]) -> pa.Table:
    dates = date if isinstance(date, list) else [date] * len(ids)
    values = value if isinstance(value, list) else [value] * len(ids)
    return pa.table({"id": ids, "date": dates, "value": values}, schema=SCHEMA)


def assert_delta_rs_agrees(t: Table) -> int:
    """delta-rs reads every version with exactly the rows our reader reconstructs; returns the count."""
    latest = Snapshot.load(t.uri, storage_options=t.storage_options).version
    where = str(t.root) if t.storage.is_local else t.uri
    for v in range(latest + 1):
        ours = Snapshot.load(t.uri, version=v, storage_options=t.storage_options).to_pyarrow()
        theirs = DeltaTable(where, version=v, storage_options=t.storage_options or None).to_pyarrow_table()
        assert sorted(theirs.column_names) == sorted(ours.column_names), f"version {v}"
        key = sorted(ours.column_names)
        assert _keyed(theirs, key) == _keyed(ours, key), f"version {v} differs between delta-rs and deltacoord"
    return latest + 1


def _keyed(t: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r[c] for c in columns) for r in t.to_pylist()), key=repr)


def _data_files(t: Table) -> set[str]:
    return {o.key for o in t.storage.list() if o.key.endswith(".parquet") and not o.key.startswith("_delta_log/")}


def orphans(t: Table) -> set[str]:
    """Parquet files in the table's storage that no version of the log references (a rejection must leave none)."""
    referenced: set[str] = set()
    for key, _mtime in t.storage.list_keys("_delta_log"):
        if not key.endswith(".json"):
            continue
        for line in t.storage.get(key).decode().splitlines():
            add = json.loads(line).get("add")
            if add:
                referenced.add(unquote(add["path"]))
    return _data_files(t) - referenced


def parquet_count(t: Table) -> int:
    return len(_data_files(t))


# -- operations --------------------------------------------------------------------------------
def test_every_operation_with_rows_checked_and_delta_rs_reading_every_version(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "ops")
    assert t.create(SCHEMA, partition_by=["date"], properties={"delta.appendOnly": "false"}).version == 0
    with pytest.raises(TableExistsError):
        t.create(SCHEMA, partition_by=["date"])

    # appends from the three accepted inputs
    r = t.append(data([1, 2], ["2024-01-01", "2024-01-02"], ["a", "b"]))
    assert (r.version, r.metrics["numAddedFiles"], r.metrics["numOutputRows"]) == (1, 2, 2)
    assert t.append(pd.DataFrame({"id": [3], "date": ["2024-01-01"], "value": ["c"]})).version == 2
    reader = pa.RecordBatchReader.from_batches(SCHEMA, data([4], "2024-01-03", "d").to_batches())
    assert t.append(reader).version == 3
    assert rows(t) == [(1, "2024-01-01", "a"), (2, "2024-01-02", "b"), (3, "2024-01-01", "c"), (4, "2024-01-03", "d")]

    # overwrite with replace_where: only the selected partition is replaced
    with pytest.raises(InvalidProposalError, match="REPLACE_WHERE_MISMATCH"):
        t.overwrite(data([9], "2024-01-02", "x"), replace_where="date = '2024-01-01'")
    with pytest.raises(InvalidProposalError, match="BAD_REPLACE_WHERE"):
        t.overwrite(data([9], "2024-01-01", "x"), replace_where="id = 9")
    r = t.overwrite(data([10, 11], "2024-01-01", "r"), replace_where="date = '2024-01-01'")
    assert r.version == 4 and r.metrics["numRemovedFiles"] == 2
    assert rows(t) == [(2, "2024-01-02", "b"), (4, "2024-01-03", "d"), (10, "2024-01-01", "r"), (11, "2024-01-01", "r")]

    # delete / update with a data predicate and a partition predicate
    r = t.delete("id = 10")
    assert r.version == 5 and r.metrics["numDeletedRows"] == 1 and r.metrics["numCopiedRows"] == 1
    r = t.update("date = '2024-01-02'", {"value": "'B'", "id": "id + 100"})
    assert r.version == 6 and r.metrics["numUpdatedRows"] == 1
    assert rows(t) == [(4, "2024-01-03", "d"), (11, "2024-01-01", "r"), (102, "2024-01-02", "B")]
    noop = t.delete("id = 12345")
    assert noop.noop and noop.version == 6 and Snapshot.load(t.uri).version == 6

    # merge: upsert by key, SET * and expression assignments
    src = data([11, 20], ["2024-01-01", "2024-01-04"], ["m", "n"])
    r = t.merge(src, ["id"], when_matched_update="*", when_not_matched_insert="*")
    assert r.version == 7 and (r.metrics["numTargetRowsUpdated"], r.metrics["numTargetRowsInserted"]) == (1, 1)
    src2 = pa.table({"id": [4, 21], "v": ["x", "y"], "d": ["2024-01-03", "2024-01-05"]})
    r = t.merge(src2, "s.id = t.id", when_matched_update={"value": "t.value"},
                when_not_matched_insert={"id": "s.id", "date": "s.d", "value": "s.v"})
    assert r.version == 8
    assert rows(t) == [(4, "2024-01-03", "d"), (11, "2024-01-01", "m"), (20, "2024-01-04", "n"),
                       (21, "2024-01-05", "y"), (102, "2024-01-02", "B")]
    with pytest.raises(MergeError, match="MULTIPLE_SOURCE_ROWS_MATCHED"):
        t.merge(data([4, 4], "2024-01-03", ["p", "q"]), ["id"], when_matched_update="*")

    # optimize: several small files in one partition become one, data unchanged
    t.append(data([30], "2024-01-04", "o1"))
    t.append(data([31], "2024-01-04", "o2"))
    before = rows(t)
    files_before = [a for a in t.snapshot().files() if a.partition_values["date"] == "2024-01-04"]
    assert len(files_before) == 3
    r = t.optimize(where="date = '2024-01-04'")
    assert r.metrics["numRemovedFiles"] == 3 and r.metrics["numAddedFiles"] == 1
    assert rows(t) == before
    ci = t.history(1)[0]
    assert ci["operation"] == "OPTIMIZE" and ci["isolationLevel"] == "SnapshotIsolation"
    assert t.optimize(where="date = '2024-01-04'").noop

    # set_properties, add_columns, then appends and updates with the new column
    r = t.set_properties({"delta.logRetentionDuration": "interval 7 days"})
    assert t.snapshot().properties()["delta.logRetentionDuration"] == "interval 7 days"
    r = t.add_columns([pa.field("score", pa.float64())])
    assert t.snapshot().schema().names == ["id", "date", "value", "score"]
    # own metadata change must not make our own cached blind append conflict
    r = t.append(pa.table({"id": [40], "date": ["2024-01-06"], "value": ["s"], "score": [1.5]}))
    t.update("id = 4", {"score": "2.5"})
    got = {row["id"]: row["score"] for row in t.to_pyarrow().to_pylist()}
    assert got[40] == 1.5 and got[4] == 2.5 and got[11] is None

    # full overwrite: replaces everything
    r = t.overwrite(pa.table({"id": [1], "date": ["2024-02-01"], "value": ["z"], "score": [0.0]}))
    assert rows(t) == [(1, "2024-02-01", "z", 0.0)]

    # history: newest first, every version, with our operation metrics
    h = t.history()
    assert [e["version"] for e in h] == list(range(r.version, -1, -1))
    assert [e["operation"] for e in h[:3]] == ["WRITE", "UPDATE", "WRITE"]
    assert h[0]["operationParameters"]["mode"] == "Overwrite"
    assert h[-1]["operation"] == "CREATE TABLE"
    assert next(e for e in h if e["version"] == 5)["operationMetrics"]["numDeletedRows"] == "1"
    assert env.orphans(t) == set()
    assert env.assert_delta_rs_agrees(t) == r.version + 1


def test_unpartitioned_table_and_time_travel(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "flat")
    t.create(SCHEMA)
    t.append(data([1, 2, 3], "d", "v"))
    t.delete("id >= 2")
    t.merge(data([1, 5], "d", "w"), "t.id = s.id", when_matched_update={"value": "s.value"}, when_not_matched_insert="*")
    assert rows(t, 1) == [(1, "d", "v"), (2, "d", "v"), (3, "d", "v")]
    assert rows(t, 2) == [(1, "d", "v")]
    assert rows(t) == [(1, "d", "w"), (5, "d", "w")]
    assert env.assert_delta_rs_agrees(t) == 4


def test_exactly_once_appends(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "eo")
    t.create(SCHEMA, partition_by=["date"])
    r1 = t.append(data([1], "2024-01-01", "a"), app_id="etl", app_version=1)
    assert not r1.already_committed and r1.version == 1
    again = t.append(data([1], "2024-01-01", "a"), app_id="etl", app_version=1)
    assert again.already_committed and again.version == 1
    older = t.append(data([0], "2024-01-01", "a"), app_id="etl", app_version=0)
    assert older.already_committed
    assert t.append(data([2], "2024-01-01", "b"), app_id="etl", app_version=2).version == 2
    # another app id is independent
    assert not t.append(data([3], "2024-01-01", "c"), app_id="other", app_version=1).already_committed
    assert t.snapshot().app_versions == {"etl": 2, "other": 1}
    assert rows(t) == [(1, "2024-01-01", "a"), (2, "2024-01-01", "b"), (3, "2024-01-01", "c")]
    assert env.orphans(t) == set()
    env.assert_delta_rs_agrees(t)


def test_rejected_proposal_deletes_its_staged_files(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "rej")
    t.create(SCHEMA, partition_by=["date"])
    t.append(data([1], "2024-01-01", "a"))
    snap = t.snapshot()
    loser = t.begin(snap)
    loser.read_predicate("date = '2024-01-01'")
    adds = staging.write_data_files(t.root, data([2], "2024-01-01", "b"), ["date"])
    loser.stage(adds)
    staged = t.root / unquote(adds[0].path)
    assert staged.exists()
    t.update("date = '2024-01-01'", {"value": "'u'"}, snapshot=snap)  # winner adds a file loser should have read
    with pytest.raises(Exception, match="ConcurrentAppendException"):
        loser.commit("WRITE")
    assert not staged.exists()
    assert env.orphans(t) == set()
    assert rows(t) == [(1, "2024-01-01", "u")]
    env.assert_delta_rs_agrees(t)


def test_no_decision_is_an_unknown_outcome_and_keeps_files(env: Env, tmp_path: Path, kafka_bootstrap: str) -> None:
    path = tmp_path / "unknown"
    t = env.table(path)
    t.create(SCHEMA)
    t.append(data([1], "d", "a"))
    # The same table through topics no coordinator reads: the decision never comes. (The writer's check that a
    # coordinator serves the partition is off, as for coordinators with a static partition list, which it cannot see.)
    silent = fresh_topics(kafka_bootstrap)
    with Table(path, kafka_bootstrap, topics=silent, decision_timeout_s=1.5, coordinator_check=False) as lost:
        n_before = parquet_count(lost)
        with pytest.raises(CommitOutcomeUnknownError) as ei:
            lost.append(data([2], "d", "b"))
        pid = ei.value.proposal_id
        assert "unknown" in str(ei.value) and ei.value.table_id == lost.table_id
        assert re.search(rf"deltacoord table lookup \S*unknown {pid}", str(ei.value)), str(ei.value)
        assert f"proposal_id={pid!r}" in str(ei.value)
        # the proposal may still commit, so its files must still be there
        assert parquet_count(lost) == n_before + 1
        assert lost.lookup_decision(ei.value.proposal_id, timeout_s=5) is None
    assert rows(t) == [(1, "d", "a")]


def test_a_table_takes_its_kafka_settings_from_the_deltacoord_variables(env: Env, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's variables and defaults hold in Python too (docs/settings.md): no argument but the path."""
    monkeypatch.setenv("DELTACOORD_BOOTSTRAP_SERVERS", env.bootstrap)
    monkeypatch.setenv("DELTACOORD_TOPIC_PREFIX", env.topics.proposals.removesuffix(".proposals"))
    monkeypatch.setenv("DELTACOORD_TIMEOUT", "45")
    with Table(env.place.of(tmp_path / "vars"), storage_options=env.place.storage_options) as t:
        assert t.client.topics == env.topics and t.decision_timeout_s == 45
        assert t.create(SCHEMA).version == 0 and t.append(data([1], "d", "a")).version == 1
    prefix = env.topics.proposals.removesuffix(".proposals")
    with Table(env.place.of(tmp_path / "kw"), env.bootstrap, topic_prefix=prefix,
               storage_options=env.place.storage_options) as t:
        assert t.create(SCHEMA).version == 0


def test_lookup_decision_finds_a_committed_proposal(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "lookup")
    r = t.create(SCHEMA)
    d = t.lookup_decision(r.proposal_id, timeout_s=10)
    assert d is not None and d.committed and d.version == 0


def test_merge_applies_a_change_feed_with_delete_update_and_conditional_insert(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "cdc")
    t.create(SCHEMA)
    t.append(data([1, 2, 3], "2024-01-01", ["a", "b", "c"]))
    t.append(data([4], "2024-01-01", "d"))
    changes = pa.table({"id": [1, 2, 5, 6], "value": ["A", None, "E", None], "op": ["U", "D", "I", "D"]})
    r = t.merge(changes, "s.id = t.id", when_matched_delete="s.op = 'D'",
                when_matched_update={"value": "s.value"},
                when_not_matched_insert={"id": "s.id", "date": "'2024-01-02'", "value": "s.value"},
                when_not_matched_insert_if="s.op != 'D'")
    # 1 updated, 2 deleted, 5 inserted, 6 (a delete of a row that is not there) ignored; 3 copied; 4's file untouched
    assert (r.metrics["numTargetRowsUpdated"], r.metrics["numTargetRowsDeleted"], r.metrics["numTargetRowsInserted"],
            r.metrics["numTargetRowsCopied"]) == (1, 1, 1, 1)
    assert rows(t) == [(1, "2024-01-01", "A"), (3, "2024-01-01", "c"), (4, "2024-01-01", "d"), (5, "2024-01-02", "E")]
    h = t.history(1)[0]
    assert json.loads(h["operationParameters"]["matchedPredicates"]) == [
        {"actionType": "delete", "predicate": "s.op = 'D'"}, {"actionType": "update"}]

    # An unconditional delete may match one target row several times (Delta allows it for DELETE only).
    r = t.merge(pa.table({"id": [3, 3]}), ["id"], when_matched_delete=True)
    assert r.metrics["numTargetRowsDeleted"] == 1 and rows(t) == [(1, "2024-01-01", "A"), (4, "2024-01-01", "d"),
                                                                  (5, "2024-01-02", "E")]
    with pytest.raises(MergeError, match="MULTIPLE_SOURCE_ROWS_MATCHED"):
        t.merge(pa.table({"id": [4, 4], "op": ["D", "D"]}), "s.id = t.id", when_matched_delete="s.op = 'D'")
    # Matched-only MERGE: pairs no clause selects do not count as duplicates (Delta's rule).
    unchanged = t.merge(pa.table({"id": [4, 4], "op": ["U", "U"]}), "s.id = t.id", when_matched_delete="s.op = 'D'")
    assert unchanged.noop
    with pytest.raises(ValueError, match="unconditional"):
        t.merge(pa.table({"id": [4]}), ["id"], when_matched_delete=True, when_matched_update="*")
    noop = t.merge(pa.table({"id": [99]}), ["id"], when_matched_delete=True)
    assert noop.noop
    assert env.orphans(t) == set()
    env.assert_delta_rs_agrees(t)
