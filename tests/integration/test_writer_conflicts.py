"""Delta's conflicts arising from real concurrent writer operations started from one snapshot.

Each test runs two operations that both read the same snapshot (`snapshot=`),
commits them in a fixed order through the real coordinator, and asserts the
exact exception Delta's ConflictChecker would raise for the loser (checks run
protocol -> metadata -> app ids -> appends -> delete-read -> delete-delete,
first failure wins), that a rejection leaves no staged files, and that
delta-rs reads every resulting version like our reader does. The module runs
once with its tables in local directories and once on the local S3 server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import retry
from tests.conftest import TablePlace, make_place
from tests.integration.test_writer_operations import SCHEMA, Env, data, rows, running_env


@pytest.fixture(scope="module", params=["local", "s3"])
def env(request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One coordinator for the module's tests, serving local directories, then a bucket of the S3 server."""
    place: TablePlace = make_place(request, request.param, tmp_path_factory.mktemp("tables"))
    with running_env(kafka_bootstrap, place) as e:
        yield e

D1, D2 = "2024-01-01", "2024-01-02"


def two_partitions(env: Env, path: Path, properties: dict[str, str] | None = None) -> Table:
    """A table with partitions D1 (ids 1, 2 in two files) and D2 (id 3)."""
    t = env.table(path)
    t.create(SCHEMA, partition_by=["date"], properties=properties)
    t.append(data([1], D1, "a"))
    t.append(data([2], D1, "b"))
    t.append(data([3], D2, "c"))
    return t


def test_two_updates_on_one_partition_concurrent_append(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "uu")
    snap = t.snapshot()
    win = t.update(f"date = '{D1}' AND id = 1", {"value": "'w'"}, snapshot=snap)
    # The loser read D1 and also a file the winner removed; appends are checked first.
    with pytest.raises(ConcurrentAppendException) as ei:
        t.update(f"date = '{D1}' AND id = 2", {"value": "'l'"}, snapshot=snap)
    assert ei.value.winning_version == win.version
    assert f"date={D1}" in str(ei.value)
    # The exception's fields are filled in, as Delta's are: the table and the winning operation.
    assert ei.value.table == t.uri and ei.value.winning_operation == "UPDATE", vars(ei.value)
    assert env.orphans(t) == set()
    assert rows(t) == [(1, D1, "w"), (2, D1, "b"), (3, D2, "c")]
    env.assert_delta_rs_agrees(t)


def test_partition_disjoint_update_and_delete_both_commit(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "disjoint")
    snap = t.snapshot()
    u = t.update(f"date = '{D1}'", {"value": "'u'"}, snapshot=snap)
    d = t.delete(f"date = '{D2}' AND id = 3", snapshot=snap)
    assert (u.version, d.version) == (snap.version + 1, snap.version + 2)
    h = t.history(1)[0]
    assert h["readVersion"] == snap.version and h["operation"] == "DELETE"
    assert rows(t) == [(1, D1, "u"), (2, D1, "u")]
    # declarations are precise: the DELETE scanned only D2's file, not the pruned D1 files
    env.assert_delta_rs_agrees(t)


def test_delete_vs_optimize(env: Env, tmp_path: Path) -> None:
    # OPTIMIZE loses to a DELETE that removed a file it compacted: SnapshotIsolation skips the
    # append check, so it is the delete-read check that fires.
    t = two_partitions(env, tmp_path / "opt1")
    snap = t.snapshot()
    t.delete("id = 1", snapshot=snap)
    with pytest.raises(ConcurrentDeleteReadException) as ei:
        t.optimize(where=f"date = '{D1}'", snapshot=snap)
    assert f"date={D1}" in str(ei.value)
    assert env.orphans(t) == set()
    assert rows(t) == [(2, D1, "b"), (3, D2, "c")]
    env.assert_delta_rs_agrees(t)

    # DELETE after OPTIMIZE: OPTIMIZE removed both files the DELETE read, but its compacted file
    # (dataChange=false) lies in the partition the DELETE's predicate selects, and Delta counts
    # every added file of a non-blind winner in the append check, which runs before delete-read.
    t = two_partitions(env, tmp_path / "opt2")
    snap = t.snapshot()
    opt = t.optimize(snapshot=snap)
    assert opt.metrics["numRemovedFiles"] == 2
    with pytest.raises(ConcurrentAppendException):
        t.delete(f"date = '{D1}' AND id = 1", snapshot=snap)
    # A transaction that read those files without a partition predicate (nothing for the append
    # check to match) gets the delete-read conflict.
    files = [a for a in snap.files() if a.partition_values["date"] == D1]
    tx = t.begin(snap)
    tx.read_files_from(files)
    tx.remove(files[0])
    with pytest.raises(ConcurrentDeleteReadException) as ei2:
        tx.commit("DELETE")
    assert ei2.value.winning_version == opt.version
    assert rows(t) == [(1, D1, "a"), (2, D1, "b"), (3, D2, "c")]
    env.assert_delta_rs_agrees(t)


def test_data_skipping_narrows_what_a_delete_reads(env: Env, tmp_path: Path) -> None:
    # ids 1 and 2 sit in two files of partition D1. DELETE id = 1 and DELETE id = 2 from one
    # snapshot: with min/max skipping each reads only its own file (as Delta's scan would), and
    # the winner adds nothing, so the loser has neither an append nor a delete-read conflict.
    t = two_partitions(env, tmp_path / "skip")
    snap = t.snapshot()
    a = t.delete("id = 1", snapshot=snap)
    b = t.delete("id = 2", snapshot=snap)
    assert b.version == a.version + 1
    assert rows(t) == [(3, D2, "c")]
    env.assert_delta_rs_agrees(t)

    # A DELETE whose condition the removed file's stats cannot rule out did read it: conflict.
    t = two_partitions(env, tmp_path / "noskip")
    snap = t.snapshot()
    win = t.delete("id = 2", snapshot=snap)
    with pytest.raises(ConcurrentDeleteReadException) as ei:
        t.delete("id <= 2", snapshot=snap)
    assert ei.value.winning_version == win.version
    assert env.orphans(t) == set()
    assert rows(t) == [(1, D1, "a"), (3, D2, "c")]


def test_two_deletes_of_one_file(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "dd")
    snap = t.snapshot()
    (f3,) = [a for a in snap.files() if a.partition_values["date"] == D2]
    # Two whole-partition DELETEs: each read the file, so delete-read fires before delete-delete.
    t.delete(f"date = '{D2}'", snapshot=snap)
    with pytest.raises(ConcurrentDeleteReadException):
        t.delete(f"date = '{D2}'", snapshot=snap)
    # Two removals of one file that declare no read of it: delete-delete.
    snap = t.snapshot()
    (f1, _f2) = [a for a in snap.files() if a.partition_values["date"] == D1]
    first, second = t.begin(snap), t.begin(snap)
    first.remove(f1)
    second.remove(f1)
    v = first.commit("DELETE").version
    with pytest.raises(ConcurrentDeleteDeleteException) as ei:
        second.commit("DELETE")
    assert ei.value.winning_version == v and f"date={D1}" in str(ei.value)
    assert f3.path not in t.snapshot().file_paths()
    assert rows(t) == [(2, D1, "b")]
    env.assert_delta_rs_agrees(t)


def test_blind_append_vs_schema_change(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "schema")
    other = env.table(tmp_path / "schema")  # a second writer with its own cached snapshot
    snap = t.snapshot()
    other.append(data([9], D1, "warm"))  # caches a pre-change snapshot in `other`
    r = t.add_columns([pa.field("score", pa.float64())], snapshot=snap)
    with pytest.raises(MetadataChangedException) as ei:
        t.append(data([4], D2, "x"), snapshot=snap)
    assert ei.value.winning_version == r.version
    # the other writer's cached snapshot is stale: it conflicts once, then a retry reads afresh
    attempts: list[int] = []
    res = retry(lambda: other.append(data([5], D2, "y")), on_retry=lambda n, e: attempts.append(n), base_delay_s=0.01)
    assert attempts == [1] and res.version == r.version + 1
    assert env.orphans(t) == set()
    assert rows(t) == [(1, D1, "a", None), (2, D1, "b", None), (3, D2, "c", None), (5, D2, "y", None), (9, D1, "warm", None)]
    env.assert_delta_rs_agrees(t)


def test_two_pipelines_sharing_an_app_id(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "txn")
    p1, p2 = env.table(tmp_path / "txn"), env.table(tmp_path / "txn")
    snap = t.snapshot()
    p1.append(data([10], D1, "p1"), app_id="etl", app_version=1, snapshot=snap)
    calls: list[int] = []

    def second() -> object:
        calls.append(1)
        return p2.append(data([11], D1, "p2"), app_id="etl", app_version=1, snapshot=snap)

    with pytest.raises(ConcurrentTransactionException):
        retry(second)
    assert calls == [1]  # not retryable: raised at once
    # the same batch run again later is recognised as already committed
    assert p2.append(data([11], D1, "p2"), app_id="etl", app_version=1).already_committed
    assert env.orphans(t) == set()
    assert (10, D1, "p1") in rows(t) and (11, D1, "p2") not in rows(t)
    env.assert_delta_rs_agrees(t)


def test_two_concurrent_creators(env: Env, tmp_path: Path) -> None:
    path = tmp_path / "create"
    a, b = env.table(path), env.table(path)
    assert not a.exists() and not b.exists()  # both writers see an empty directory
    tx_a = a.begin_create(SCHEMA, partition_by=["date"])
    tx_b = b.begin_create(SCHEMA)
    assert tx_a.commit("CREATE TABLE", changes_data=False).version == 0
    with pytest.raises(ProtocolChangedException) as ei:
        tx_b.commit("CREATE TABLE", changes_data=False)
    assert ei.value.winning_version == 0
    assert "multiple writers are writing to an empty directory" in str(ei.value)
    assert not ProtocolChangedException.retryable
    assert a.snapshot().partition_columns == ["date"]
    env.assert_delta_rs_agrees(a)


@pytest.mark.parametrize("level", ["WriteSerializable", "Serializable"])
def test_isolation_level_update_vs_blind_append(env: Env, tmp_path: Path, level: str) -> None:
    t = two_partitions(env, tmp_path / level, properties={"delta.isolationLevel": level})
    snap = t.snapshot()
    t.append(data([7], D1, "blind"), snapshot=snap)  # a blind append into the partition UPDATE reads
    if level == "Serializable":
        with pytest.raises(ConcurrentAppendException):
            t.update(f"date = '{D1}'", {"value": "'u'"}, snapshot=snap)
        assert rows(t) == [(1, D1, "a"), (2, D1, "b"), (3, D2, "c"), (7, D1, "blind")]
    else:
        t.update(f"date = '{D1}'", {"value": "'u'"}, snapshot=snap)
        assert t.history(1)[0]["isolationLevel"] == "WriteSerializable"
        assert rows(t) == [(1, D1, "u"), (2, D1, "u"), (3, D2, "c"), (7, D1, "blind")]
    assert env.orphans(t) == set()
    env.assert_delta_rs_agrees(t)


def test_merges_into_disjoint_partitions(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "merge")
    snap = t.snapshot()
    # The Databricks example: explicit partition literals in ON make the merges disjoint.
    t.merge(data([1, 5], D1, "m1"), f"s.id = t.id AND t.date = '{D1}'", when_matched_update="*",
            when_not_matched_insert="*", snapshot=snap)
    t.merge(data([3, 6], D2, "m2"), f"s.id = t.id AND t.date = '{D2}'", when_matched_update="*",
            when_not_matched_insert="*", snapshot=snap)
    assert rows(t) == [(1, D1, "m1"), (2, D1, "b"), (3, D2, "m2"), (5, D1, "m1"), (6, D2, "m2")]
    # Without the literal, MERGE reads the whole table and conflicts with either.
    snap = t.snapshot()
    t.merge(data([2], D1, "x"), ["id"], when_matched_update="*", snapshot=snap)
    with pytest.raises(ConcurrentAppendException):
        t.merge(data([3], D2, "y"), ["id"], when_matched_update="*", snapshot=snap)
    assert env.orphans(t) == set()
    env.assert_delta_rs_agrees(t)


def test_retry_reruns_a_conflicting_update(env: Env, tmp_path: Path) -> None:
    t = two_partitions(env, tmp_path / "retry")
    stale = t.snapshot()
    t.update(f"date = '{D1}'", {"value": "'first'"})
    snapshots = iter([stale])  # first attempt from the stale snapshot, then fresh ones
    conflicts: list[DeltaConcurrentModificationException] = []
    r = retry(lambda: t.update(f"date = '{D1}' AND id = 1", {"value": "'second'"}, snapshot=next(snapshots, None)),
              on_retry=lambda n, e: conflicts.append(e), base_delay_s=0.01)
    assert [type(e) for e in conflicts] == [ConcurrentAppendException]
    assert r.version == stale.version + 2
    assert rows(t) == [(1, D1, "second"), (2, D1, "first"), (3, D2, "c")]
    assert env.orphans(t) == set()
    env.assert_delta_rs_agrees(t)
