"""Every Delta writer feature, honoured or refused by name, on tables delta-rs builds.

delta-rs adds each feature it knows to a fresh table (`alter.add_feature`); a feature delta-rs cannot add
is added by one protocol commit written here. The writer must refuse, before staging anything, every
feature it cannot honour for the operation, naming it; the features it honours pass its check (their
behaviour is tested where it is built: append-only, deletion vectors, in-commit timestamps; invariants,
CHECK constraints and generated columns in test_write_constraints.py, and here on the tables of this list:
a row that breaks the rule is refused, one that keeps it is written; the change data feed and column
mapping are also written here, on the tables their cases build, after adopting them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, TableFeatures, write_deltalake

from deltacoord.reader.snapshot import Snapshot, UnsupportedTableFeatureError
from deltacoord.schemas.table_features import COORDINATED, FEATURES, writer_problems
from deltacoord.writer.constraints import ConstraintViolationError
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.test_writer_operations import Env, running_env

Make = Callable[[Path], None]


def _base(path: Path) -> DeltaTable:
    write_deltalake(str(path), pa.table({"id": pa.array([1, 2], pa.int64()), "s": pa.array(["a", "b"])}))
    return DeltaTable(str(path))


def _feature(name: str, then: Callable[[DeltaTable], None] | None = None) -> Make:
    def make(path: Path) -> None:
        dt = _base(path)
        dt.alter.add_feature(getattr(TableFeatures, name), allow_protocol_versions_increase=True)
        if then is not None:
            then(DeltaTable(str(path)))

    return make


def _protocol_commit(feature: str, reader: bool = False, properties: dict[str, str] | None = None) -> Make:
    """For features delta-rs cannot add: one commit raising the protocol to name `feature`."""

    def make(path: Path) -> None:
        dt = _base(path)
        p = dt.protocol()
        writer = sorted({*(p.writer_features or []), feature})
        readers = sorted({*(p.reader_features or []), feature}) if reader else p.reader_features
        proto: dict[str, object] = {"minReaderVersion": 3 if reader else p.min_reader_version, "minWriterVersion": 7,
                                    "writerFeatures": writer}
        if readers is not None:
            proto["readerFeatures"] = readers
        lines = [{"protocol": proto}]
        if properties:
            md = dt.metadata()
            lines.append({"metaData": {"id": md.id, "format": {"provider": "parquet", "options": {}},
                                       "schemaString": dt.schema().to_json(), "partitionColumns": md.partition_columns,
                                       "configuration": {**md.configuration, **properties}, "createdTime": 0}})
        lines.append({"commitInfo": {"operation": "UPGRADE PROTOCOL", "timestamp": 0}})
        (path / "_delta_log" / f"{dt.version() + 1:020d}.json").write_text("".join(json.dumps(x) + "\n" for x in lines))

    return make


def _column_metadata(key: str, value: str) -> Callable[[DeltaTable], None]:
    """Column `s` gets metadata delta-rs protects (delta.*): one metaData commit written here."""

    def then(dt: DeltaTable) -> None:
        md = dt.metadata()
        schema = json.loads(dt.schema().to_json())
        for f in schema["fields"]:
            if f["name"] == "s":
                f["metadata"] = {**f.get("metadata", {}), key: value}
        action = {"metaData": {"id": md.id, "format": {"provider": "parquet", "options": {}},
                               "schemaString": json.dumps(schema), "partitionColumns": md.partition_columns,
                               "configuration": md.configuration, "createdTime": 0}}
        log = Path(dt.table_uri.removeprefix("file://")) / "_delta_log"
        (log / f"{dt.version() + 1:020d}.json").write_text(
            json.dumps(action) + "\n" + json.dumps({"commitInfo": {"operation": "CHANGE COLUMN", "timestamp": 0}}) + "\n")

    return then


def _column_mapping(mode: str) -> Make:
    """Column mapping turned on as Delta turns it on for an existing table: each column gets an id and keeps its
    name as its physical name (one protocol and metaData commit written here; delta-rs cannot)."""

    def make(path: Path) -> None:
        dt = _base(path)
        md = dt.metadata()
        schema = json.loads(dt.schema().to_json())
        for i, f in enumerate(schema["fields"], start=1):
            f["metadata"] = {**f.get("metadata", {}), "delta.columnMapping.id": i, "delta.columnMapping.physicalName": f["name"]}
        config = {**md.configuration, "delta.columnMapping.mode": mode, "delta.columnMapping.maxColumnId": str(len(schema["fields"]))}
        lines = [{"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}},
                 {"metaData": {"id": md.id, "format": {"provider": "parquet", "options": {}}, "schemaString": json.dumps(schema),
                               "partitionColumns": md.partition_columns, "configuration": config, "createdTime": 0}},
                 {"commitInfo": {"operation": "SET TBLPROPERTIES", "timestamp": 0}}]
        (path / "_delta_log" / f"{dt.version() + 1:020d}.json").write_text("".join(json.dumps(x) + "\n" for x in lines))

    return make


_CDF = _feature("ChangeDataFeed", lambda dt: dt.alter.set_table_properties({"delta.enableChangeDataFeed": "true"}))

#: feature -> (how the table is built, operation, the outcome: None = honoured, else a phrase of the refusal)
CASES: dict[str, tuple[Make, str, str | None]] = {
    "appendOnly": (_feature("AppendOnly"), "WRITE", None),
    "invariants": (_feature("Invariants"), "WRITE", None),
    "invariants with a column invariant": (
        _feature("Invariants", _column_metadata("delta.invariants", json.dumps({"expression": {"expression": "s IS NOT NULL"}}))),
        "WRITE", None),  # behaviour: test_write_constraints.py
    "checkConstraints": (_feature("CheckConstraints"), "WRITE", None),
    "checkConstraints with a constraint": (
        _feature("CheckConstraints", lambda dt: dt.alter.add_constraint({"id_positive": "id > 0"})), "WRITE", None),
    "changeDataFeed on, append": (_CDF, "WRITE", None),
    "changeDataFeed on, delete": (_CDF, "DELETE", None),
    "changeDataFeed on, update": (_CDF, "UPDATE", None),
    "changeDataFeed on, merge": (_CDF, "MERGE", None),
    "generatedColumns": (_feature("GeneratedColumns"), "WRITE", None),
    "generatedColumns with a generated column": (
        _feature("GeneratedColumns", _column_metadata("delta.generationExpression", "upper(s)")), "WRITE", None),
    "identityColumns": (_feature("IdentityColumns"), "WRITE", None),
    "identityColumns with an identity column": (
        _feature("IdentityColumns", _column_metadata("delta.identity.start", "1")), "WRITE", None),
    "columnMapping (mode none)": (_feature("ColumnMapping"), "WRITE", None),
    "columnMapping (name mode)": (_column_mapping("name"), "WRITE", None),
    "columnMapping (id mode)": (_column_mapping("id"), "WRITE", None),
    "columnMapping (a mode PROTOCOL.md does not define)": (_protocol_commit("columnMapping", reader=True, properties={
        "delta.columnMapping.mode": "names", "delta.columnMapping.maxColumnId": "2"}), "WRITE", "column mapping mode"),
    "deletionVectors": (_feature("DeletionVectors"), "DELETE", None),
    "rowTracking": (_feature("RowTracking"), "WRITE", None),
    "timestampNtz": (_feature("TimestampWithoutTimezone"), "WRITE", None),
    "domainMetadata": (_feature("DomainMetadata"), "WRITE", None),
    "v2Checkpoint": (_feature("V2Checkpoint"), "WRITE", None),
    "icebergCompatV1": (_feature("IcebergCompatV1"), "WRITE", "Iceberg"),
    "icebergCompatV2": (_protocol_commit("icebergCompatV2"), "WRITE", "Iceberg"),
    "clustering": (_protocol_commit("clustering"), "WRITE", None),
    "vacuumProtocolCheck": (_protocol_commit("vacuumProtocolCheck", reader=True), "WRITE", None),
    "typeWidening": (_protocol_commit("typeWidening", reader=True), "WRITE", None),
    "inCommitTimestamp": (_protocol_commit("inCommitTimestamp"), "WRITE", None),
    "allowColumnDefaults": (_protocol_commit("allowColumnDefaults"), "WRITE", "default values"),
    "catalogManaged": (_protocol_commit("catalogManaged", reader=True), "WRITE", "through its catalog"),
    "variantType": (_feature("VariantType"), "WRITE", None),
    "an unknown feature": (_protocol_commit("someFutureFeature"), "WRITE", "does not know"),
    COORDINATED: (_protocol_commit(COORDINATED), "WRITE", None),  # the project's own: its writer commits through it
}


#: Honoured rules on the rows of a write: case -> (a row that breaks it, a phrase of the refusal, a row that keeps it).
ROW_RULES: dict[str, tuple[pa.Table, str, pa.Table]] = {
    "invariants with a column invariant": (
        pa.table({"id": pa.array([3], pa.int64()), "s": pa.array([None], pa.string())}),
        "CHECK constraint EXPRESSION(s IS NOT NULL) (s IS NOT NULL) violated by row with values:\n - s : None",
        pa.table({"id": pa.array([3], pa.int64()), "s": ["c"]})),
    "checkConstraints with a constraint": (
        pa.table({"id": pa.array([-3], pa.int64()), "s": ["c"]}),
        "CHECK constraint id_positive (id > 0) violated by row with values:\n - id : -3",
        pa.table({"id": pa.array([3], pa.int64()), "s": ["c"]})),
    "generatedColumns with a generated column": (
        pa.table({"id": pa.array([3], pa.int64()), "s": ["c"]}),  # s is generated from itself: upper(s) <> 'c'
        "CHECK constraint Generated Column (`s` <=> (upper(s))) violated by row with values:\n - s : c",
        pa.table({"id": pa.array([3], pa.int64()), "s": ["C"]})),
}


@pytest.mark.parametrize("case", list(ROW_RULES), ids=list(ROW_RULES))
def test_an_honoured_row_rule_refuses_a_breaking_row_and_writes_a_keeping_one(case: str, tmp_path: Path,
                                                                               kafka_bootstrap: str) -> None:
    make, _operation, refusal = CASES[case]
    assert refusal is None
    path = tmp_path / "t"
    make(path)
    bad, phrase, good = ROW_RULES[case]
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        adopted = t.adopt().version
        before = sorted(p.name for p in path.glob("*.parquet"))
        with pytest.raises(ConstraintViolationError) as e:
            t.append(bad)
        assert phrase in str(e.value)
        assert sorted(p.name for p in path.glob("*.parquet")) == before, "nothing is staged for a refused write"
        assert t.append(good).version == adopted + 2  # adopted + 1 adds the deltacoord-coordinated writer feature
        t.release()
    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]


def test_every_known_writer_feature_has_a_case() -> None:
    covered = {name.split(" ")[0] for name in CASES}
    missing = [f for f in FEATURES if f not in covered and not f.endswith("-preview")]
    assert not missing, f"writer features without a case: {missing}"


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_writer_feature_is_honoured_or_refused_by_name(case: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    make, operation, refusal = CASES[case]
    path = tmp_path / "t"
    make(path)
    snap = Snapshot.load(str(path))
    feature = case.split(" ")[0] if case != "an unknown feature" else "someFutureFeature"
    problems = writer_problems(snap.protocol, snap.metadata, operation)
    if refusal is None:
        assert problems == [], problems
        return
    assert [f for f, _ in problems] == [feature], problems
    assert refusal in problems[0][1]
    before = sorted(p.name for p in path.glob("*.parquet"))
    with Table(path, kafka_bootstrap) as t, pytest.raises(UnsupportedTableFeatureError,
                                                          match=f"writer feature {feature}:") as e:
        if operation == "DELETE":
            t.delete("id = 1")
        else:
            t.append(pa.table({"id": pa.array([3], pa.int64()), "s": pa.array(["c"])}))
    assert refusal in str(e.value)
    assert sorted(p.name for p in path.glob("*.parquet")) == before, "nothing is staged for a refused write"


def _cdc_actions(path: Path, version: int) -> list[dict[str, object]]:
    lines = [json.loads(x) for x in (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]
    return [x["cdc"] for x in lines if "cdc" in x]


def _feed(path: Path, version: int) -> list[tuple[object, ...]]:
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version).read_all())
    return sorted((r["id"], r["s"], r["_change_type"]) for r in feed.to_pylist())


def _cdf_append(t: Table, path: Path) -> None:
    v = t.append(pa.table({"id": pa.array([3], pa.int64()), "s": pa.array(["c"])})).version
    assert _cdc_actions(path, v) == [] and _feed(path, v) == [(3, "c", "insert")]


def _cdf_delete(t: Table, path: Path) -> None:
    v = t.delete("id = 1").version
    assert len(_cdc_actions(path, v)) == 1 and _feed(path, v) == [(1, "a", "delete")]


def _cdf_update(t: Table, path: Path) -> None:
    v = t.update("id = 2", {"s": "'B'"}).version
    assert len(_cdc_actions(path, v)) == 1
    assert _feed(path, v) == [(2, "B", "update_postimage"), (2, "b", "update_preimage")]


def _cdf_merge(t: Table, path: Path) -> None:
    v = t.merge(pa.table({"id": pa.array([1, 9], pa.int64()), "s": ["A", "i"]}), ["id"], when_matched_update="*",
                when_not_matched_insert="*").version
    assert len(_cdc_actions(path, v)) == 1
    assert _feed(path, v) == [(1, "A", "update_postimage"), (1, "a", "update_preimage"), (9, "i", "insert")]


def _mapped_append(t: Table, path: Path) -> None:
    """The mapped table's columns keep their names as physical names: the new file has them with field ids."""
    v = t.append(pa.table({"id": pa.array([3], pa.int64()), "s": pa.array(["c"])})).version
    add = next(json.loads(x)["add"] for x in (path / "_delta_log" / f"{v:020d}.json").read_text().splitlines()
               if "add" in json.loads(x))
    schema = pq.ParquetFile(path / add["path"]).schema_arrow
    assert [(f.name, (f.metadata or {}).get(b"PARQUET:field_id")) for f in schema] == [("id", b"1"), ("s", b"2")]
    got = pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT id, s FROM t").read_all())
    assert sorted(tuple(r.values()) for r in got.to_pylist()) == [(1, "a"), (2, "b"), (3, "c")]


#: Honoured cases whose behaviour is checked here on the table the case builds (adopted, then written).
BEHAVIOUR: dict[str, Callable[[Table, Path], None]] = {
    "changeDataFeed on, append": _cdf_append,
    "changeDataFeed on, delete": _cdf_delete,
    "changeDataFeed on, update": _cdf_update,
    "changeDataFeed on, merge": _cdf_merge,
    "columnMapping (name mode)": _mapped_append,
    "columnMapping (id mode)": _mapped_append,
}


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


@pytest.mark.parametrize("case", list(BEHAVIOUR), ids=list(BEHAVIOUR))
def test_an_honoured_feature_behaves_as_delta_specifies(case: str, tmp_path: Path, env: Env) -> None:
    make, _operation, refusal = CASES[case]
    assert refusal is None
    path = tmp_path / "t"
    make(path)
    t = env.table(path)
    t.adopt()
    BEHAVIOUR[case](t, path)
