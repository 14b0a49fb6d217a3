"""Deletion vectors end to end: real broker, real coordinator, our reader and delta-rs reading every version.

With `delta.enableDeletionVectors=true`, DELETE, UPDATE and MERGE mark the rows
they remove in a deletion vector (inline in the log when small, else a
`deletion_vector_<uuid>.bin` file) instead of rewriting the file; UPDATE and
MERGE write the changed rows to new files. On an unpartitioned table the
coordinator resolves concurrent DV updates of one file row by row: disjoint
rows both commit (the later with the union of both vectors), the same row
conflicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from deltacoord.reader.deletion_vectors import read_deletion_vector
from deltacoord.reader.log import commit_key
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import AddFile, RemoveFile, parse_commit
from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    DeltaConcurrentModificationException,
)
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.test_writer_operations import SCHEMA, Env, data, parquet_count, rows, running_env

pytestmark = pytest.mark.kafka

DV = {"delta.enableDeletionVectors": "true"}


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def one_file(env: Env, path: Path, n: int = 10, properties: dict[str, str] | None = None, **kwargs: Any) -> Table:
    """An unpartitioned DV table whose rows 0..n-1 (value 'v') are in one data file."""
    t = env.table(path, **kwargs)
    t.create(SCHEMA, properties={**DV, **(properties or {})})
    t.append(data(list(range(n)), "2024-01-01", "v"))
    return t


def delta_rs_agrees(env: Env, t: Table) -> int:
    """delta-rs (its DataFusion scan, which applies deletion vectors) reads every version with our reader's rows."""
    env.settle()
    latest = Snapshot.load(t.uri).version
    for v in range(latest + 1):
        ours = rows(Snapshot.load(t.uri, version=v).to_pyarrow())
        dt = DeltaTable(str(t.root), version=v)
        theirs = pa.table(QueryBuilder().register("t", dt).execute("SELECT id, date, value FROM t").read_all())
        assert rows(theirs) == ours, f"version {v} differs between delta-rs and deltacoord"
    return latest + 1


def commit_actions(t: Table, version: int) -> list[Any]:
    t.wait_published(version)
    return parse_commit(t.storage.get(commit_key(version)))


def dv_pairs(t: Table, version: int) -> list[tuple[RemoveFile, AddFile]]:
    """The (remove, add) pairs of one commit that replace a file's deletion vector."""
    acts = commit_actions(t, version)
    adds = {a.path: a for a in acts if isinstance(a, AddFile)}
    return [(r, adds[r.path]) for r in acts if isinstance(r, RemoveFile) and r.path in adds]


def deleted_rows(t: Table, add: AddFile) -> list[int]:
    assert add.deletion_vector is not None
    return [int(x) for x in read_deletion_vector(t.storage, add.deletion_vector)]


def test_create_with_deletion_vectors_sets_the_protocol(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "proto")
    t.create(SCHEMA, properties=DV)
    p = t.snapshot().protocol
    assert (p.min_reader_version, p.min_writer_version) == (3, 7)
    assert "deletionVectors" in (p.reader_features or ()) and "deletionVectors" in (p.writer_features or ())


def test_enabling_deletion_vectors_upgrades_the_protocol(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "upgrade")
    t.create(SCHEMA)
    t.append(data([1, 2, 3], "2024-01-01", "v"))
    t.set_properties(DV)
    p = t.snapshot().protocol
    assert (p.min_reader_version, p.min_writer_version) == (3, 7)
    assert {"appendOnly", "invariants", "deletionVectors"} <= set(p.writer_features or ())
    files = parquet_count(t)
    v = t.delete("id = 2").version
    assert parquet_count(t) == files, "a DELETE on a DV table rewrites no file"
    assert rows(t) == [(1, "2024-01-01", "v"), (3, "2024-01-01", "v")]
    assert dv_pairs(t, v)
    delta_rs_agrees(env, t)


def test_delete_update_merge_write_deletion_vectors(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "ops")
    files = parquet_count(t)
    v = t.delete("id IN (1, 3)").version
    assert parquet_count(t) == files
    [(rm, add)] = dv_pairs(t, v)
    assert rm.deletion_vector is None and add.deletion_vector is not None
    assert add.deletion_vector.storage_type == "i" and deleted_rows(t, add) == [1, 3]
    stats = json.loads(add.stats or "{}")
    assert stats["numRecords"] == 10 and stats["tightBounds"] is False

    v = t.update("id = 5", {"value": "'u'"}).version
    [(rm, add)] = dv_pairs(t, v)
    assert rm.deletion_vector == dv_pairs(t, v - 1)[0][1].deletion_vector
    assert deleted_rows(t, add) == [1, 3, 5]
    new = [a for a in commit_actions(t, v) if isinstance(a, AddFile) and a.path != add.path]
    assert len(new) == 1 and json.loads(new[0].stats or "{}")["numRecords"] == 1, "only the updated row is rewritten"

    src = pa.table({"id": [7, 8, 100], "date": ["2024-01-01"] * 3, "value": ["m", "d", "new"]}, schema=SCHEMA)
    t.merge(src, ["id"], when_matched_update="*", when_matched_delete="s.value = 'd'", when_not_matched_insert="*")
    expect = [(i, "2024-01-01", "v") for i in (0, 2, 4, 6, 9)] + [(5, "2024-01-01", "u"), (7, "2024-01-01", "m"),
                                                                    (100, "2024-01-01", "new")]
    assert rows(t) == sorted(expect)
    assert delta_rs_agrees(env, t) == 5


def test_large_deletion_vector_goes_to_a_file(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "file", n=20000, dv_inline_max_bytes=64)
    v = t.delete("id < 15000").version
    [(_rm, add)] = dv_pairs(t, v)
    assert add.deletion_vector is not None and add.deletion_vector.storage_type == "u"
    assert any(o.key.startswith("deletion_vector_") and o.key.endswith(".bin") for o in t.storage.list())
    v = t.delete("id >= 15000 AND id < 19990").version
    [(_rm, add)] = dv_pairs(t, v)
    assert deleted_rows(t, add) == list(range(19990))
    assert sorted(r[0] for r in rows(t)) == list(range(19990, 20000))
    delta_rs_agrees(env, t)


def test_deleting_every_row_removes_the_file(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "all", n=4)
    t.delete("id < 2")
    v = t.delete("id >= 2").version
    acts = commit_actions(t, v)
    assert not [a for a in acts if isinstance(a, AddFile)] and len([a for a in acts if isinstance(a, RemoveFile)]) == 1
    assert rows(t) == []
    assert Snapshot.load(t.uri).files() == []
    delta_rs_agrees(env, t)


# -- row-level concurrency ----------------------------------------------------------------------
def test_two_deletes_of_different_rows_of_one_file_both_commit(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "dd")
    snap = t.snapshot()
    first = t.delete("id = 2", snapshot=snap)
    second = t.delete("id = 7", snapshot=snap)
    assert second.version == first.version + 1
    [(rm, add)] = dv_pairs(t, second.version)
    assert rm.deletion_vector == dv_pairs(t, first.version)[0][1].deletion_vector, "rebased on the winner's vector"
    assert deleted_rows(t, add) == [2, 7]
    assert sorted(r[0] for r in rows(t)) == [0, 1, 3, 4, 5, 6, 8, 9]
    delta_rs_agrees(env, t)


def test_deletes_of_the_same_row_conflict(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "same")
    snap = t.snapshot()
    t.delete("id IN (2, 3)", snapshot=snap)
    with pytest.raises(ConcurrentDeleteDeleteException):
        t.delete("id IN (3, 4)", snapshot=snap)
    assert sorted(r[0] for r in rows(t)) == [0, 1, 4, 5, 6, 7, 8, 9]


def test_a_rejected_delete_leaves_no_deletion_vector_file(env: Env, tmp_path: Path) -> None:
    # Vectors go to files here (64-byte inline limit); the loser's file is deleted with its staged files.
    t = one_file(env, tmp_path / "orphan", n=2000, dv_inline_max_bytes=64)
    snap = t.snapshot()
    t.delete("id < 1500", snapshot=snap)
    kept = {o.key for o in t.storage.list() if o.key.startswith("deletion_vector_")}
    assert len(kept) == 1
    # File vectors fall back to the file-level rules (the rules read no files): a conflict either way.
    with pytest.raises(DeltaConcurrentModificationException):
        t.delete("id >= 1000 AND id < 1800", snapshot=snap)
    assert {o.key for o in t.storage.list() if o.key.startswith("deletion_vector_")} == kept
    assert sorted(r[0] for r in rows(t)) == list(range(1500, 2000))


def test_update_and_delete_of_different_rows_both_commit(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "ud")
    snap = t.snapshot()
    t.update("id = 1", {"value": "'u'"}, snapshot=snap)
    t.delete("id = 8", snapshot=snap)
    t.merge(pa.table({"id": [4], "date": ["2024-01-01"], "value": ["m"]}, schema=SCHEMA), "s.id = t.id AND t.id = 4",
            when_matched_update="*", snapshot=snap)
    expect = sorted([(i, "2024-01-01", "v") for i in (0, 2, 3, 5, 6, 7, 9)] + [(1, "2024-01-01", "u"), (4, "2024-01-01", "m")])
    assert rows(t) == expect
    delta_rs_agrees(env, t)


def test_update_whose_new_rows_match_a_concurrent_delete_conflicts(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "ua")
    snap = t.snapshot()
    t.update("id = 1", {"id": "50"}, snapshot=snap)
    with pytest.raises(ConcurrentAppendException):
        t.delete("id >= 50 OR id = 3", snapshot=snap)  # row 3 is in the shared file, the new row 50 elsewhere
