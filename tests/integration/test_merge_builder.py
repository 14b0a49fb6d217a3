"""MERGE in delta-rs's builder form (`Table.merge(source, on).when_...().execute()`), end to end: real broker,
real coordinator, delta-rs reading every version.

The builder runs the keyword form's implementation (`deltacoord.writer.merge.merge_clauses`): on the same input
both give the same rows, metrics and commitInfo; clauses act in the order given, the first whose predicate
holds taking a row, as in Delta.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.writer.merge import TableMerger
from deltacoord.writer.table import MergeError, Table
from tests.conftest import TablePlace
from tests.integration.test_deletion_vectors import delta_rs_agrees
from tests.integration.test_writer_operations import SCHEMA, Env, data, rows, running_env

#: Source rows naming what should happen to them: U(pdate), D(elete), I(nsert), X (nothing).
CHANGES = pa.table({"id": [1, 2, 3, 5, 6], "value": ["A", None, "C", "E", "F"], "op": ["U", "D", "X", "I", "D"]})


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def _table(env: Env, path: Path, properties: dict[str, str] | None = None) -> Table:
    """A table holding ids 1-4 on 2024-01-01, values a-d."""
    t = env.table(path)
    t.create(SCHEMA, properties=properties)
    t.append(data([1, 2, 3], "2024-01-01", ["a", "b", "c"]))
    t.append(data([4], "2024-01-01", "d"))
    return t


def _parameters(t: Table) -> dict[str, list[dict[str, str]]]:
    p = t.history(1)[0]["operationParameters"]
    return {k: json.loads(p[k]) for k in ("matchedPredicates", "notMatchedPredicates")}


def test_each_clause_kind_with_and_without_a_predicate(env: Env, tmp_path: Path) -> None:
    t = _table(env, tmp_path / "kinds")
    merger = t.merge(CHANGES, "s.id = t.id")
    assert isinstance(merger, TableMerger)
    r = (merger.when_matched_delete("s.op = 'D'")
         .when_matched_update({"value": "s.value"}, predicate="s.op = 'U'")
         .when_not_matched_insert({"id": "s.id", "date": "'2024-01-02'", "value": "s.value"}, predicate="s.op = 'I'")
         .execute())
    assert r.operation == "MERGE" and not r.noop
    # 1 updated, 2 deleted, 3 matched by no clause (kept as it was), 5 inserted, 6 (a delete of no row) ignored.
    assert (r.metrics["numTargetRowsUpdated"], r.metrics["numTargetRowsDeleted"],
            r.metrics["numTargetRowsInserted"]) == (1, 1, 1)
    assert rows(t) == [(1, "2024-01-01", "A"), (3, "2024-01-01", "c"), (4, "2024-01-01", "d"), (5, "2024-01-02", "E")]
    assert _parameters(t) == {
        "matchedPredicates": [{"actionType": "delete", "predicate": "s.op = 'D'"},
                              {"actionType": "update", "predicate": "s.op = 'U'"}],
        "notMatchedPredicates": [{"actionType": "insert", "predicate": "s.op = 'I'"}]}

    # The _all forms and clauses without a predicate: every matched row updated from the source, every other inserted.
    upsert = data([4, 7], "2024-01-03", ["D", "G"])
    r = t.merge(upsert, ["id"]).when_matched_update_all().when_not_matched_insert_all().execute()
    assert (r.metrics["numTargetRowsUpdated"], r.metrics["numTargetRowsInserted"]) == (1, 1)
    assert rows(t) == [(1, "2024-01-01", "A"), (3, "2024-01-01", "c"), (4, "2024-01-03", "D"), (5, "2024-01-02", "E"),
                       (7, "2024-01-03", "G")]
    assert _parameters(t) == {"matchedPredicates": [{"actionType": "update"}],
                              "notMatchedPredicates": [{"actionType": "insert"}]}

    # An unconditional delete; as in Delta it may match one target row several times.
    r = t.merge(pa.table({"id": [3, 3, 5]}), ["id"]).when_matched_delete().execute()
    assert r.metrics["numTargetRowsDeleted"] == 2
    assert rows(t) == [(1, "2024-01-01", "A"), (4, "2024-01-03", "D"), (7, "2024-01-03", "G")]
    # Any other clause needs one source row per target row.
    with pytest.raises(MergeError, match="MULTIPLE_SOURCE_ROWS_MATCHED"):
        t.merge(data([7, 7], "x", ["y", "z"]), ["id"]).when_matched_update_all().execute()
    assert env.orphans(t) == set()
    assert env.assert_delta_rs_agrees(t) == 6


def test_the_first_clause_whose_predicate_holds_acts(env: Env, tmp_path: Path) -> None:
    t = _table(env, tmp_path / "order")
    both = pa.table({"id": [1, 2, 8, 9], "value": ["A", "B", "H", "I"], "op": ["U", "D", "I", "D"]})
    # Update first: id 1 (op U) is updated, though the delete's predicate holds for it too; id 2 (op D) deleted.
    t.merge(both, "s.id = t.id") \
        .when_matched_update({"value": "'updated'"}, predicate="s.op = 'U'") \
        .when_matched_delete("s.op IN ('U', 'D')") \
        .when_not_matched_insert({"id": "s.id", "date": "'first'", "value": "s.value"}, predicate="s.op = 'I'") \
        .when_not_matched_insert({"id": "s.id", "date": "'second'", "value": "s.value"}) \
        .execute()
    assert rows(t) == [(1, "2024-01-01", "updated"), (3, "2024-01-01", "c"), (4, "2024-01-01", "d"),
                       (8, "first", "H"), (9, "second", "I")]

    # The same clauses the other way round: the delete now takes id 1 as well; the unconditional insert takes all.
    again = pa.table({"id": [1, 3, 10], "value": ["A", "C", "J"], "op": ["U", "U", "I"]})
    r = t.merge(again, "s.id = t.id") \
        .when_matched_delete("s.id = 1") \
        .when_matched_update({"value": "'updated'"}, predicate="s.op = 'U'") \
        .when_not_matched_insert({"id": "s.id", "date": "'second'", "value": "s.value"}, predicate="s.op != 'X'") \
        .when_not_matched_insert({"id": "s.id", "date": "'first'", "value": "s.value"}) \
        .execute()
    assert (r.metrics["numTargetRowsDeleted"], r.metrics["numTargetRowsUpdated"], r.metrics["numTargetRowsInserted"]) \
        == (1, 1, 1)
    assert rows(t) == [(3, "2024-01-01", "updated"), (4, "2024-01-01", "d"), (8, "first", "H"), (9, "second", "I"),
                       (10, "second", "J")]

    # Only the last clause of a kind may go without a predicate (it would leave nothing for the ones after it).
    for merger in (t.merge(again, ["id"]).when_matched_update_all().when_matched_delete("s.op = 'D'"),
                   t.merge(again, ["id"]).when_not_matched_insert_all().when_not_matched_insert_all("s.op = 'I'")):
        with pytest.raises(ValueError, match=r"only the last WHEN (NOT )?MATCHED clause may omit its predicate"):
            merger.execute()
    assert t.history(1)[0]["operation"] == "MERGE" and t.snapshot().version == 4  # the refused mergers proposed nothing
    assert env.assert_delta_rs_agrees(t) == 5


def test_several_update_clauses_on_a_deletion_vector_table(env: Env, tmp_path: Path) -> None:
    """Each update clause writes its own rows; with deletion vectors the touched rows are marked deleted."""
    t = _table(env, tmp_path / "dv", {"delta.enableDeletionVectors": "true"})
    src = pa.table({"id": [1, 3, 4], "kind": ["low", "gone", "high"]})  # row 2 untouched: its file gets a vector
    r = t.merge(src, ["id"]) \
        .when_matched_update({"value": "'low'"}, predicate="s.kind = 'low'") \
        .when_matched_delete("s.kind = 'gone'") \
        .when_matched_update({"value": "UPPER(t.value)"}) \
        .execute()
    assert (r.metrics["numTargetRowsUpdated"], r.metrics["numTargetRowsDeleted"]) == (2, 1)
    assert rows(t) == [(1, "2024-01-01", "low"), (2, "2024-01-01", "b"), (4, "2024-01-01", "D")]
    assert any(a.deletion_vector is not None for a in t.snapshot().files())
    assert delta_rs_agrees(env, t) == 4  # delta-rs's DataFusion scan applies the vectors


@pytest.mark.parametrize("case", ["change feed", "upsert by key names", "nothing to change"])
def test_the_builder_and_the_keyword_form_give_the_same_result(env: Env, tmp_path: Path, case: str) -> None:
    keyword = _table(env, tmp_path / "keyword")
    built = _table(env, tmp_path / "built")
    if case == "change feed":
        on, insert = "s.id = t.id", {"id": "s.id", "date": "'2024-01-02'", "value": "s.value"}
        a = keyword.merge(CHANGES, on, when_matched_delete="s.op = 'D'", when_matched_update={"value": "s.value"},
                          when_not_matched_insert=insert, when_not_matched_insert_if="s.op != 'D'")
        b = built.merge(CHANGES, on).when_matched_delete("s.op = 'D'").when_matched_update({"value": "s.value"}) \
            .when_not_matched_insert(insert, predicate="s.op != 'D'").execute()
    elif case == "upsert by key names":
        upsert = data([2, 4, 9], "2024-01-05", ["B", "D", "I"])
        a = keyword.merge(upsert, ["id"], when_matched_update="*", when_not_matched_insert="*")
        b = built.merge(upsert, ["id"]).when_matched_update_all().when_not_matched_insert_all().execute()
    else:
        absent = pa.table({"id": [99]})
        a = keyword.merge(absent, ["id"], when_matched_delete=True)
        b = built.merge(absent, ["id"]).when_matched_delete().execute()
    assert (b.version, b.operation, dict(b.metrics), b.noop, b.already_committed) == \
           (a.version, a.operation, dict(a.metrics), a.noop, a.already_committed)
    assert rows(built) == rows(keyword)
    ours, theirs = built.history(1)[0], keyword.history(1)[0]
    assert ours["operation"] == theirs["operation"]
    assert ours.get("operationParameters") == theirs.get("operationParameters")
    assert ours.get("operationMetrics") == theirs.get("operationMetrics")
    assert env.assert_delta_rs_agrees(built) == env.assert_delta_rs_agrees(keyword)


def test_a_merger_executes_once(env: Env, tmp_path: Path) -> None:
    t = _table(env, tmp_path / "once")
    merger = t.merge(data([5], "2024-01-02", "e"), ["id"]).when_not_matched_insert_all()
    first = merger.execute()
    assert first.metrics["numTargetRowsInserted"] == 1
    with pytest.raises(ValueError, match="executed already"):
        merger.execute()
    assert t.snapshot().version == first.version  # the refused second run proposed nothing
    assert rows(t) == [(1, "2024-01-01", "a"), (2, "2024-01-01", "b"), (3, "2024-01-01", "c"), (4, "2024-01-01", "d"),
                       (5, "2024-01-02", "e")]
    env.assert_delta_rs_agrees(t)
