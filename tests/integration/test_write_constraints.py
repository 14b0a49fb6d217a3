"""NOT NULL columns, invariants, CHECK constraints and generated columns, honoured on tables delta-rs builds.

delta-rs creates each table (its own constraints and generated columns); the coordinator adopts it and our
writer appends, overwrites, updates and merges: every row it writes is checked (a violating write fails
before anything is committed, naming the constraint, its expression and an offending row), generated
columns are computed where the data omits them. After a release, delta-rs reads what we wrote and its own
writes are still checked the same way: the table stays whole for other engines.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from deltalake import DeltaTable, Field, Schema, write_deltalake
from deltalake.exceptions import DeltaError

from deltacoord.cli.tables import register
from deltacoord.reader.snapshot import Snapshot, UnsupportedTableFeatureError
from deltacoord.schemas.actions import Protocol
from deltacoord.schemas.expressions.syntax import ExpressionError
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.writer.constraints import ConstraintViolationError
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.test_writer_operations import assert_delta_rs_agrees

pytestmark = pytest.mark.kafka


@contextmanager
def adopted(path: Path, kafka_bootstrap: str) -> Iterator[Table]:
    """The delta-rs table at `path` under a coordinator for the block, released to other writers at its end."""
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        t.adopt()
        yield t
        t.release()


def _parquet(path: Path) -> list[str]:
    return sorted(p.name for p in path.rglob("*.parquet"))


def _rows(path: Path, *columns: str) -> list[tuple[Any, ...]]:
    t = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(tuple(r[c] for c in columns) for r in t.to_pylist())


def _ids(ids: list[int | None], s: list[str | None]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "s": pa.array(s, pa.string())})


def _fails(path: Path, match: str) -> Any:
    """Expect ConstraintViolationError matching `match`, and that no file was left behind."""

    class _Check:
        def __enter__(self) -> None:
            self.before = _parquet(path)
            self.raises = pytest.raises(ConstraintViolationError, match=re.compile(match, re.DOTALL))
            self.raises.__enter__()

        def __exit__(self, *exc: Any) -> bool:
            handled = self.raises.__exit__(*exc)
            assert _parquet(path) == self.before, "a refused write leaves no file behind"
            return bool(handled)

    return _Check()


def test_check_constraints_and_not_null_are_enforced_on_every_write(kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    DeltaTable.create(str(path), schema=Schema([Field("id", "long", nullable=False), Field("s", "string")]))
    write_deltalake(str(path), _ids([1, 2], ["a", "b"]), mode="append")
    DeltaTable(str(path)).alter.add_constraint({"id_positive": "id > 0"})
    DeltaTable(str(path)).alter.add_constraint({"s_not_bad": "s <> 'bad'"})
    with adopted(path, kafka_bootstrap) as t:
        v = t.append(_ids([3], ["c"])).version
        with _fails(path, r"CHECK constraint id_positive \(id > 0\) violated by row with values:\n - id : -5"):
            t.append(_ids([4, -5], ["d", "e"]))
        with _fails(path, r"NOT NULL constraint violated for column: id\."):
            t.append(_ids([None], ["n"]))
        # As Delta: a CHECK that is NULL for a row fails it too (s <> 'bad' is NULL when s is NULL; delta-rs
        # stored it as s != 'bad').
        with _fails(path, r"CHECK constraint s_not_bad \(s != 'bad'\) violated by row with values:\n - s : None"):
            t.append(_ids([6], [None]))
        with _fails(path, r"CHECK constraint id_positive .* - id : -2"):
            t.update("id = 2", {"id": "0 - id"})
        with _fails(path, r"CHECK constraint s_not_bad .* - s : bad"):
            t.merge(_ids([1], ["bad"]), ["id"], when_matched_update={"s": "s.s"})
        with _fails(path, r"CHECK constraint id_positive .* - id : -9"):
            t.merge(_ids([-9], ["x"]), ["id"], when_not_matched_insert="*")
        with _fails(path, r"CHECK constraint id_positive .* - id : -1"):
            t.overwrite(_ids([-1], ["o"]))
        assert t.update("id = 2", {"s": "'B'"}).version == v + 1
        assert t.merge(_ids([1, 7], ["A", "g"]), ["id"], when_matched_update="*", when_not_matched_insert="*").version == v + 2
        assert assert_delta_rs_agrees(t) == v + 3
    assert _rows(path, "id", "s") == [(1, "A"), (2, "B"), (3, "c"), (7, "g")]
    # delta-rs still finds the constraints on the table we wrote, and still enforces them.
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(str(path), _ids([-3], ["z"]), mode="append")
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(str(path), _ids([8], ["bad"]), mode="append")
    write_deltalake(str(path), _ids([8], ["h"]), mode="append")
    assert _rows(path, "id")[-1] == (8,)


def test_generated_columns_are_computed_or_verified(kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "t"
    DeltaTable.create(str(path), schema=Schema([
        Field("id", "long", nullable=False), Field("s", "string"),
        Field("g", "string", metadata={"delta.generationExpression": "upper(s)"})]))
    write_deltalake(str(path), _ids([1], ["a"]), mode="append")  # delta-rs computes g
    with adopted(path, kafka_bootstrap) as t:
        t.append(_ids([2], ["b"]))  # g omitted: computed
        t.append(pa.table({"id": pa.array([3], pa.int64()), "s": ["c"], "g": ["C"]}))  # supplied and right
        with _fails(path, r"CHECK constraint Generated Column \(`g` <=> \(upper\(s\)\)\) violated by row with values:\n"
                          r" - g : x\n - s : d"):
            t.append(pa.table({"id": pa.array([4], pa.int64()), "s": ["d"], "g": ["x"]}))
        t.update("id = 1", {"s": "'a2'"})  # g follows s
        t.merge(_ids([2, 5], ["b2", "e"]), ["id"], when_matched_update={"s": "s.s"}, when_not_matched_insert="*")
        assert_delta_rs_agrees(t)
    assert _rows(path, "id", "s", "g") == [(1, "a2", "A2"), (2, "b2", "B2"), (3, "c", "C"), (5, "e", "E")]
    write_deltalake(str(path), _ids([6], ["f"]), mode="append")  # delta-rs goes on computing it the same way
    assert _rows(path, "id", "g")[-1] == (6, "F")
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(str(path), pa.table({"id": pa.array([7], pa.int64()), "s": ["g"], "g": ["no"]}), mode="append")


INVARIANT = json.dumps({"expression": {"expression": "s IS NOT NULL"}})


def test_create_with_features_constraints_and_generated_columns(kafka_bootstrap: str, tmp_path: Path) -> None:
    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        pa.field("s", pa.string(), metadata={"delta.invariants": INVARIANT}),
        pa.field("g", pa.int64(), metadata={"delta.generationExpression": "id * 10"}),
    ])
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics):
        with Table(tmp_path / "t", kafka_bootstrap, topics=topics) as t:
            t.create(schema, constraints={"id_positive": "id > 0"}, features=["changeDataFeed"],
                     properties={"delta.appendOnly": "false"})
            snap = Snapshot.load(str(tmp_path / "t"))
            assert snap.protocol == Protocol(1, 7, None, ("appendOnly", "invariants", "changeDataFeed", "checkConstraints",
                                                          "generatedColumns", COORDINATED))
            assert snap.metadata.configuration == {"delta.appendOnly": "false", "delta.constraints.id_positive": "id > 0"}
            t.append(_ids([1, 2], ["a", "b"]))
            with _fails(tmp_path / "t", r"CHECK constraint EXPRESSION\(s IS NOT NULL\) \(s IS NOT NULL\)"):
                t.append(_ids([3], [None]))
            assert _rows(tmp_path / "t", "id", "s", "g") == [(1, "a", 10), (2, "b", 20)]
            t.release()  # for delta-rs to write it below: the features left are writer version 4's
            assert Snapshot.load(str(tmp_path / "t")).protocol == Protocol(1, 4)
        with Table(tmp_path / "legacy", kafka_bootstrap, topics=topics) as t:
            t.create(pa.schema([pa.field("id", pa.int64())]), constraints={"id_positive": "id > 0"})
            # As Delta: CHECK alone gives (1, 3); with deltacoord's own writer feature, its features listed at 7.
            assert Snapshot.load(str(tmp_path / "legacy")).protocol == Protocol(
                1, 7, None, ("appendOnly", "invariants", "checkConstraints", COORDINATED))
        with Table(tmp_path / "parted", kafka_bootstrap, topics=topics) as t:  # partitioned by a generated column
            t.create(pa.schema([pa.field("id", pa.int64()), pa.field("ts", pa.timestamp("us", tz="UTC")),
                                pa.field("day", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"})]),
                     partition_by=["day"])
            noon = dt.datetime(2024, 6, 1, 12, tzinfo=dt.UTC)
            t.append(pa.table({"id": pa.array([1, 2], pa.int64()),
                               "ts": pa.array([noon, noon + dt.timedelta(days=1)], pa.timestamp("us", tz="UTC"))}))
            parted = DeltaTable(str(tmp_path / "parted"))
            adds = pa.table(parted.get_add_actions(flatten=True))
            assert sorted(str(d) for d in adds.column("partition.day").to_pylist()) == ["2024-06-01", "2024-06-02"]
            assert sorted((r["id"], r["day"]) for r in parted.to_pyarrow_table().to_pylist()) == [
                (1, dt.date(2024, 6, 1)), (2, dt.date(2024, 6, 2))]
        with Table(tmp_path / "refused", kafka_bootstrap, topics=topics) as t:
            for features, props, named in ((["allowColumnDefaults"], {}, "writer feature allowColumnDefaults"),
                                           ([], {"delta.enableIcebergCompatV2": "true"}, "writer feature icebergCompatV2"),
                                           (["someFutureFeature"], {}, "writer feature someFutureFeature")):
                with pytest.raises(UnsupportedTableFeatureError, match=f"cannot create this table: {named}"):
                    t.create(pa.schema([pa.field("id", pa.int64())]), features=features, properties=props)
            with pytest.raises(ExpressionError, match="sha2"):
                t.create(pa.schema([pa.field("id", pa.int64())]), constraints={"odd": "sha2(id, 256) <> ''"})
            assert not t.exists()
    # delta-rs reads the table we created and enforces what it declares.
    path = tmp_path / "t"
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 2
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(str(path), _ids([-1], ["x"]), mode="append")
    with pytest.raises(DeltaError, match="failed validation"):
        write_deltalake(str(path), _ids([5], [None]), mode="append")
    write_deltalake(str(path), _ids([4], ["d"]), mode="append")
    assert _rows(path, "id", "g")[-1] == (4, 40)


def test_the_cli_creates_a_table_with_features_constraints_and_generated_columns(kafka_bootstrap: str,
                                                                                 tmp_path: Path) -> None:
    cli = click.Group("deltacoord")
    register(cli)
    topics = fresh_topics(kafka_bootstrap)
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", topics.proposals.removesuffix(".proposals")]
    path = str(tmp_path / "t")

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, ["table", *args, *kafka])

    with coordinator_thread(kafka_bootstrap, topics):
        created = run("create", path, "--schema", "id:long not null,ts:timestamp,"
                      "day:date generated always as (CAST(ts AS DATE)),big:boolean generated always as (id > 10)",
                      "--constraint", "id_positive=id > 0", "--property", "delta.enableChangeDataFeed=true",
                      "--feature", "changeDataFeed")
        assert created.exit_code == 0, created.output
        snap = Snapshot.load(path)
        assert snap.protocol == Protocol(1, 7, None, ("appendOnly", "invariants", "changeDataFeed", "checkConstraints",
                                                      "generatedColumns", COORDINATED))
        assert snap.metadata.configuration == {"delta.enableChangeDataFeed": "true", "delta.constraints.id_positive": "id > 0"}
        fields = {f["name"]: f for f in snap.metadata.schema()["fields"]}
        assert fields["id"]["nullable"] is False
        assert fields["day"]["metadata"] == {"delta.generationExpression": "CAST(ts AS DATE)"}
        rows = json.dumps([{"id": 1, "ts": "2024-05-06T07:08:09Z"}, {"id": 11, "ts": "2024-05-07T00:00:00Z"}])
        assert run("append", path, "--json-rows", rows).exit_code == 0
        bad = run("append", path, "--json-rows", json.dumps([{"id": -1, "ts": "2024-05-06T07:08:09Z"}]))
        assert bad.exit_code == 1 and "CHECK constraint id_positive (id > 0) violated by row with values" in bad.output
        refused = run("create", str(tmp_path / "u"), "--schema", "id:long", "--feature", "allowColumnDefaults")
        assert refused.exit_code == 1 and "writer feature allowColumnDefaults" in refused.output
        versions = run("create", str(tmp_path / "v"), "--schema", "id:long", "--min-writer-version", "4")
        assert versions.exit_code == 0 and Snapshot.load(str(tmp_path / "v")).protocol == Protocol(1, 7, None, (
            "appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns", COORDINATED))
    got = sorted((r["id"], r["day"].isoformat(), r["big"]) for r in DeltaTable(path).to_pyarrow_table().to_pylist())
    assert got == [(1, "2024-05-06", False), (11, "2024-05-07", True)]
