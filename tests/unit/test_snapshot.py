"""Snapshot log replay, time travel and data reads, checked against delta-rs (`deltalake`) as the peer."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

import deltacoord.reader.snapshot as snapmod
from deltacoord.reader.deletion_vectors import dv_file_bytes, encode_roaring64, z85_encode
from deltacoord.reader.log import CorruptLogError, VersionNotFoundError, resolve_data_path, table_root
from deltacoord.reader.snapshot import (
    Snapshot,
    UnsupportedTableFeatureError,
    delta_type_to_arrow,
    parse_partition_value,
)
from deltacoord.schemas.actions import (
    AddFile,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    commit_to_json_lines,
)

UTC = dt.UTC


def _data(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "s": pa.array([f"s{i}" if i % 7 else None for i in ids], pa.string()),
            "x": pa.array([i / 4 for i in ids], pa.float64()),
            "b": pa.array([i % 2 == 0 for i in ids], pa.bool_()),
            "d": pa.array([dt.date(2024, 1, 1 + i % 28) for i in ids], pa.date32()),
            "ts": pa.array([dt.datetime(2024, 1, 1, i % 24, tzinfo=UTC) for i in ids], pa.timestamp("us", tz="UTC")),
            "dec": pa.array([decimal.Decimal(i) / 100 for i in ids], pa.decimal128(10, 2)),
            "p": pa.array([None if i % 5 == 0 else f"v{i % 3}" for i in ids], pa.string()),
            "q": pa.array([i % 2 for i in ids], pa.int32()),
        }
    )


def _build_history(path: Path, partitioned: bool) -> int:
    """A delta-rs table with appends, deletes, an overwrite, app txns and two checkpoints; returns the last version."""
    part = ["p", "q"] if partitioned else None
    write_deltalake(path, _data(0, 20), partition_by=part)  # v0
    write_deltalake(path, _data(100, 10), mode="append")  # v1
    DeltaTable(path).delete("id < 5")  # v2
    DeltaTable(path).create_checkpoint()  # checkpoint at v2
    write_deltalake(
        path, _data(200, 6), mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id="stream-1", version=3)]),
    )  # v3
    write_deltalake(path, _data(300, 15), mode="overwrite")  # v4
    DeltaTable(path).delete("id > 310")  # v5
    write_deltalake(
        path, _data(400, 8), mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id="stream-1", version=9),
                                                             Transaction(app_id="stream-2", version=1)]),
    )  # v6
    DeltaTable(path).create_checkpoint()  # checkpoint at v6
    write_deltalake(path, _data(500, 4), mode="append")  # v7
    DeltaTable(path).delete("s IS NULL")  # v8
    return DeltaTable(path).version()


def _sorted_rows(t: pa.Table) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = t.sort_by([("id", "ascending")]).to_pylist()
    return rows


def _their_table(path: Path, version: int | None = None) -> pa.Table:
    dtab = DeltaTable(path) if version is None else DeltaTable(path, version=version)
    return pa.table(dtab.to_pyarrow_table())


def _their_files(path: Path, version: int) -> set[str]:
    return {os.path.normpath(u.removeprefix("file://")) for u in DeltaTable(path, version=version).file_uris()}


def _our_files(s: Snapshot) -> set[str]:
    return {os.path.normpath(str(resolve_data_path(s.root, p))) for p in s.file_paths()}


def assert_same_as_delta_rs(path: Path, version: int) -> Snapshot:
    ours = Snapshot.load(path, version=version)
    assert ours.version == version
    assert _our_files(ours) == _their_files(path, version)
    assert {os.path.normpath(str(resolve_data_path(ours.root, f.path))) for f in ours.files()} == _our_files(ours)
    mine = ours.to_pyarrow()
    theirs = _their_table(path, version)
    assert mine.schema.names == theirs.schema.names
    theirs = theirs.cast(mine.schema)
    assert mine.schema == ours.schema()
    assert _sorted_rows(mine) == _sorted_rows(theirs)
    return ours


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    out = {}
    for name, partitioned in (("plain", False), ("partitioned", True)):
        p = tmp_path_factory.mktemp(name) / "table"
        out[name] = (p, _build_history(p, partitioned))
    return out


@pytest.mark.parametrize("kind", ["plain", "partitioned"])
def test_every_version_matches_delta_rs(histories: dict[str, tuple[Path, int]], kind: str) -> None:
    path, last = histories[kind]
    assert last == 8
    for v in range(last + 1):
        assert_same_as_delta_rs(path, v)
    latest = Snapshot.load(path)
    assert latest.version == last
    assert latest.segment.checkpoint is not None and latest.segment.checkpoint.version == 6
    assert [v for v, _ in latest.segment.commits] == [7, 8]


@pytest.mark.parametrize("kind", ["plain", "partitioned"])
def test_metadata_protocol_txns_history(histories: dict[str, tuple[Path, int]], kind: str) -> None:
    path, _last = histories[kind]
    s = Snapshot.load(path)
    d = DeltaTable(path)
    assert s.metadata.id == str(d.metadata().id)
    assert s.partition_columns == (["p", "q"] if kind == "partitioned" else [])
    assert s.properties() == dict(d.metadata().configuration)
    assert (s.protocol.min_reader_version, s.protocol.min_writer_version) == (
        d.protocol().min_reader_version, d.protocol().min_writer_version)
    assert s.app_versions == {"stream-1": 9, "stream-2": 1}
    assert d.transaction_version("stream-1") == 9
    assert Snapshot.load(path, version=3).app_versions == {"stream-1": 3}
    assert Snapshot.load(path, version=2).app_versions == {}
    hist = s.history()
    theirs = d.history()
    assert [(h["version"], h.get("operation")) for h in hist] == [(h["version"], h.get("operation")) for h in theirs]
    assert [h["version"] for h in s.history(limit=3)] == [8, 7, 6]
    assert [h["version"] for h in Snapshot.load(path, version=4).history()] == [4, 3, 2, 1, 0]


def test_partition_values_typed_and_null(histories: dict[str, tuple[Path, int]]) -> None:
    path, _ = histories["partitioned"]
    s = Snapshot.load(path, version=1)
    t = s.to_pyarrow()
    assert t.schema.field("q").type == pa.int32() and t.schema.field("p").type == pa.string()
    assert t.filter(pc.field("p").is_null()).num_rows == sum(1 for i in [*range(20), *range(100, 110)] if i % 5 == 0)
    # partition values in the log are strings, null for the Hive default partition
    pv = {tuple(sorted(f.partition_values.items())) for f in s.files()}
    assert (("p", None), ("q", "0")) in pv


def test_columns_and_filters(histories: dict[str, tuple[Path, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = histories["partitioned"]
    s = Snapshot.load(path, version=1)
    full = _their_table(path, 1).cast(s.schema())

    def check(flt: Any, expr: pc.Expression, columns: list[str] | None = None) -> None:
        got = s.to_pyarrow(columns=columns, filter=flt)
        exp = full.filter(expr)
        if columns is not None:
            assert got.schema.names == columns
            exp = exp.select(columns)
        key = "id" if columns is None or "id" in columns else columns[0]
        assert sorted(got.to_pylist(), key=lambda r: str(r[key])) == sorted(exp.to_pylist(), key=lambda r: str(r[key]))

    check([("p", "=", "v1")], pc.field("p") == "v1")
    check([("q", "=", 1), ("id", ">", 104)], (pc.field("q") == 1) & (pc.field("id") > 104))
    check([[("p", "=", "v1")], [("p", "=", "v2"), ("q", "=", 0)]],
          (pc.field("p") == "v1") | ((pc.field("p") == "v2") & (pc.field("q") == 0)))
    check([("p", "in", ["v0", "v2"])], pc.field("p").isin(["v0", "v2"]))
    check([("p", "not in", ["v0"])], ~pc.field("p").isin(["v0"]))
    check("p = 'v1' AND q = 1", (pc.field("p") == "v1") & (pc.field("q") == 1), columns=["id", "p"])
    check("p IS NULL", pc.field("p").is_null())
    check("p IS NOT NULL AND NOT q = 0", pc.field("p").is_valid() & (pc.field("q") != 0))
    check("q = 0 OR id BETWEEN 3 AND 8", (pc.field("q") == 0) | ((pc.field("id") >= 3) & (pc.field("id") <= 8)))
    check("d >= DATE '2024-01-10' AND x < 26", (pc.field("d") >= pa.scalar(dt.date(2024, 1, 10))) & (pc.field("x") < 26))
    check("ts = '2024-01-01 03:00:00'", pc.field("ts") == pa.scalar(dt.datetime(2024, 1, 1, 3, tzinfo=UTC), pa.timestamp("us", "UTC")))
    check([("dec", ">", decimal.Decimal("1.05"))], pc.field("dec") > pa.scalar(decimal.Decimal("1.05"), pa.decimal128(10, 2)))
    check([("b", "=", True)], pc.field("b") == True, columns=["b", "id"])  # noqa: E712

    # partition-only conjuncts prune files before they are opened
    opened: list[Path] = []
    real = snapmod.read_data_file

    def spy(path_: Path, *a: Any, **k: Any) -> pa.Table:
        opened.append(path_)
        return real(path_, *a, **k)

    monkeypatch.setattr(snapmod, "read_data_file", spy)
    s.to_pyarrow(filter="p = 'v1' AND q = 1 AND id > 0")
    assert opened and all("p=v1" in str(p) and "q=1" in str(p) for p in opened)
    opened.clear()
    s.to_pyarrow(filter="p = 'v1' OR id = 3")  # a data column inside OR: no pruning possible
    assert len(opened) == s.num_files
    with pytest.raises(ValueError, match="unknown column"):
        s.to_pyarrow(filter=[("nope", "=", 1)])


def test_schema_types() -> None:
    assert delta_type_to_arrow("decimal(12,3)") == pa.decimal128(12, 3)
    assert delta_type_to_arrow("timestamp_ntz") == pa.timestamp("us")
    assert delta_type_to_arrow({"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}) == pa.map_(
        pa.string(), pa.int64())
    arr = delta_type_to_arrow({"type": "array", "elementType": "integer", "containsNull": False})
    assert arr.value_field.nullable is False
    with pytest.raises(UnsupportedTableFeatureError):
        delta_type_to_arrow("interval")
    assert parse_partition_value("2024-01-01 10:00:00.5", pa.timestamp("us", "UTC")) == dt.datetime(2024, 1, 1, 10, 0, 0, 500000, tzinfo=UTC)
    assert parse_partition_value("1970-01-01T00:00:00.123456Z", pa.timestamp("us", "UTC")) == dt.datetime(1970, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert parse_partition_value("", pa.int32()) is None
    assert parse_partition_value("true", pa.bool_()) is True


def test_time_travel_by_file_mtime(tmp_path: Path) -> None:
    path = tmp_path / "t"
    for i in range(4):
        write_deltalake(path, _data(i * 10, 3), mode="append")
    base = 1_700_000_000_000
    for v in range(4):
        t = (base + v * 10_000) / 1000
        os.utime(path / "_delta_log" / f"{v:020d}.json", (t, t))
    assert Snapshot.load(path, version=2).timestamp == base + 20_000
    assert Snapshot.load(path, timestamp=base + 25_000).version == 2
    assert Snapshot.load(path, timestamp=base + 20_000).version == 2
    assert Snapshot.load(path, timestamp=base + 19_999).version == 1
    assert Snapshot.load(path, timestamp=dt.datetime.fromtimestamp((base + 5_000) / 1000, tz=UTC)).version == 0
    assert Snapshot.load(path, timestamp=dt.datetime.fromtimestamp((base + 15_000) / 1000, tz=UTC).isoformat()).version == 1
    assert Snapshot.load(path, timestamp=base + 10**9).version == 3  # after the latest commit: latest
    with pytest.raises(VersionNotFoundError, match="before the earliest"):
        Snapshot.load(path, timestamp=base - 1)
    # non-monotonic mtimes are monotonised (commit 2 older on disk than commit 1)
    t = (base + 5_000) / 1000
    os.utime(path / "_delta_log" / f"{2:020d}.json", (t, t))
    assert Snapshot.load(path, timestamp=base + 10_001).version == 2  # commit 2 counts as previous + 1 ms
    assert Snapshot.load(path, timestamp=base + 10_000).version == 1
    assert Snapshot.load(path, timestamp=base + 9_999).version == 0
    with pytest.raises(ValueError, match="not both"):
        Snapshot.load(path, version=1, timestamp=base)


def _write_commit(path: Path, version: int, actions: list[Any], mtime_ms: int | None = None) -> None:
    d = path / "_delta_log"
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{version:020d}.json"
    f.write_bytes(commit_to_json_lines(actions))
    if mtime_ms is not None:
        os.utime(f, (mtime_ms / 1000, mtime_ms / 1000))


SCHEMA_ID = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


def test_in_commit_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "ict"
    proto = Protocol(1, 7, None, ("inCommitTimestamp", "appendOnly"))
    md = Metadata(id="t", schema_string=SCHEMA_ID, configuration={"delta.enableInCommitTimestamps": "true"})
    _write_commit(path, 0, [CommitInfo({"timestamp": 1, "inCommitTimestamp": 1_000_000}), proto, md], mtime_ms=9_000_000)
    _write_commit(path, 1, [CommitInfo({"timestamp": 1, "inCommitTimestamp": 2_000_000})], mtime_ms=8_000_000)
    _write_commit(path, 2, [CommitInfo({"timestamp": 1, "inCommitTimestamp": 3_000_000})], mtime_ms=7_000_000)
    assert [Snapshot.load(path, version=v).timestamp for v in range(3)] == [1_000_000, 2_000_000, 3_000_000]
    assert Snapshot.load(path, timestamp=2_500_000).version == 1
    assert Snapshot.load(path, timestamp=3_000_000).version == 2
    with pytest.raises(VersionNotFoundError):
        Snapshot.load(path, timestamp=999_999)


def test_in_commit_timestamps_enabled_later(tmp_path: Path) -> None:
    path = tmp_path / "ict2"
    md = Metadata(id="t", schema_string=SCHEMA_ID)
    _write_commit(path, 0, [CommitInfo({"timestamp": 1}), Protocol(1, 2), md], mtime_ms=100_000)
    _write_commit(path, 1, [CommitInfo({"timestamp": 1})], mtime_ms=200_000)
    md2 = Metadata(id="t", schema_string=SCHEMA_ID, configuration={
        "delta.enableInCommitTimestamps": "true",
        "delta.inCommitTimestampEnablementVersion": "2",
        "delta.inCommitTimestampEnablementTimestamp": "300000",
    })
    _write_commit(path, 2, [CommitInfo({"timestamp": 1, "inCommitTimestamp": 300_000}), Protocol(1, 7, None, ("inCommitTimestamp",)), md2],
                  mtime_ms=900_000)
    _write_commit(path, 3, [CommitInfo({"timestamp": 1, "inCommitTimestamp": 400_000})], mtime_ms=800_000)
    assert Snapshot.load(path, version=1).timestamp == 200_000  # before enablement: mtime
    assert Snapshot.load(path, version=3).timestamp == 400_000
    assert Snapshot.load(path, timestamp=150_000).version == 0
    assert Snapshot.load(path, timestamp=250_000).version == 1
    assert Snapshot.load(path, timestamp=350_000).version == 2
    assert Snapshot.load(path, timestamp=450_000).version == 3


def test_domain_metadata_and_txn_reconciliation(tmp_path: Path) -> None:
    path = tmp_path / "dm"
    md = Metadata(id="t", schema_string=SCHEMA_ID)
    _write_commit(path, 0, [Protocol(1, 7, None, ("domainMetadata",)), md, DomainMetadata("a", "1"), DomainMetadata("b", "x"),
                            SetTransaction("app", 5, 10)])
    _write_commit(path, 1, [DomainMetadata("a", "2"), DomainMetadata("b", "x", removed=True), SetTransaction("app", 3, 11)])
    s0 = Snapshot.load(path, version=0)
    assert s0.domains == {"a": "1", "b": "x"} and s0.app_versions == {"app": 5}
    s1 = Snapshot.load(path)
    assert s1.domains == {"a": "2"}  # removed tombstone drops the domain
    assert s1.app_versions == {"app": 3}  # the latest txn wins, even with a lower version
    assert s1.files() == [] and s1.num_files == 0
    assert s1.to_pyarrow().num_rows == 0


def test_file_key_includes_deletion_vector(tmp_path: Path) -> None:
    """Replay keys files by (path, DV id): add+remove of the same path with different DVs coexist."""
    path = tmp_path / "keys"
    md = Metadata(id="t", schema_string=SCHEMA_ID)
    dv1 = DeletionVector("i", z85_encode(encode_roaring64([0])), len(encode_roaring64([0])), 1)
    a0 = AddFile("f.parquet", {}, 1, 1, True)
    a1 = AddFile("f.parquet", {}, 1, 1, True, deletion_vector=dv1)
    _write_commit(path, 0, [Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), md, a0])
    _write_commit(path, 1, [a1, a0.to_remove(5)])
    s = Snapshot.load(path)
    assert [f.key() for f in s.files()] == [a1.key()]
    assert [r.key() for r in s.tombstones()] == [a0.key()]


def _write_ids_file(path: Path, name: str, n: int, col: str = "id") -> int:
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({col: pa.array(range(n), pa.int64())}), path / name)
    return (path / name).stat().st_size


def test_deletion_vectors_spark_replay_cases(tmp_path: Path) -> None:
    """Rebuilds Delta Spark's golden table `log-replay-dv-key-cases` (same DV files and descriptors)."""
    from tests.unit.test_reader_log import SPARK_DV_FILES

    path = tmp_path / "dvs"
    size = _write_ids_file(path, "part-0.parquet", 50)
    for uid, (_z, _s, _rows, hexdata) in SPARK_DV_FILES.items():
        (path / f"deletion_vector_{uid}.bin").write_bytes(bytes.fromhex(hexdata))
    md = Metadata(id="t", schema_string=SCHEMA_ID, configuration={"delta.enableDeletionVectors": "true"})
    base = AddFile("part-0.parquet", {}, size, 1, True, stats='{"numRecords":50}')
    _write_commit(path, 0, [Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), md, base])
    prev = base
    for v, (z85, sz, rows, _h) in enumerate(SPARK_DV_FILES.values(), start=1):
        dv = DeletionVector("u", z85, sz, len(rows), offset=1)
        new = AddFile("part-0.parquet", {}, size, 1, True, stats='{"numRecords":50}', deletion_vector=dv)
        _write_commit(path, v, [new, prev.to_remove(1000 + v)])
        prev = new
    for v, deleted in enumerate([[], [0], [0, 7], [0, 7, 14]]):
        s = Snapshot.load(path, version=v)
        assert s.num_files == 1
        got = sorted(s.to_pyarrow().column("id").to_pylist())
        assert got == [i for i in range(50) if i not in deleted]
    assert Snapshot.load(path).to_pyarrow(filter="id < 10").column("id").to_pylist() == [1, 2, 3, 4, 5, 6, 8, 9]


def test_deletion_vectors_inline_and_relative_with_prefix(tmp_path: Path) -> None:
    """A delta-rs table whose file later gets DVs (inline, then a `u` DV with a random prefix dir)."""
    path = tmp_path / "dv2"
    write_deltalake(path, _data(0, 30), partition_by=["q"])
    before = Snapshot.load(path)
    f0 = next(f for f in before.files() if f.partition_values["q"] == "0")
    rows0 = pq.read_table(resolve_data_path(before.root, f0.path)).column("id").to_pylist()
    inline_rows = [1, 3]
    data = encode_roaring64(inline_rows)
    dv_i = DeletionVector("i", z85_encode(data), len(data), len(inline_rows))
    add_i = AddFile(f0.path, f0.partition_values, f0.size, 1, True, stats=f0.stats, deletion_vector=dv_i)
    _write_commit(path, 1, [Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), f0.to_remove(10), add_i])
    u_rows = [0, 1, 3, 8]
    blob, offs = dv_file_bytes([encode_roaring64([2]), encode_roaring64(u_rows)])
    import uuid as _uuid

    u = _uuid.uuid4()
    (path / "xy").mkdir()
    (path / "xy" / f"deletion_vector_{u}.bin").write_bytes(blob)
    dv_u = DeletionVector("u", "xy" + z85_encode(u.bytes), len(encode_roaring64(u_rows)), len(u_rows), offset=offs[1])
    add_u = AddFile(f0.path, f0.partition_values, f0.size, 1, True, stats=f0.stats, deletion_vector=dv_u)
    _write_commit(path, 2, [add_i.to_remove(20), add_u])
    all_ids = sorted(_data(0, 30).column("id").to_pylist())
    for v, deleted_idx in ((0, []), (1, inline_rows), (2, u_rows)):
        deleted = {rows0[i] for i in deleted_idx}
        got = sorted(Snapshot.load(path, version=v).to_pyarrow().column("id").to_pylist())
        assert got == [i for i in all_ids if i not in deleted], v


def test_column_mapping_name_mode(tmp_path: Path) -> None:
    path = tmp_path / "cm"
    schema = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {
            "delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-1a"}},
        {"name": "info", "type": {"type": "struct", "fields": [
            {"name": "name", "type": "string", "nullable": True, "metadata": {
                "delta.columnMapping.id": 3, "delta.columnMapping.physicalName": "col-3c"}}]},
         "nullable": True, "metadata": {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "col-2b"}},
        {"name": "part", "type": "integer", "nullable": True, "metadata": {
            "delta.columnMapping.id": 4, "delta.columnMapping.physicalName": "col-4d"}},
    ]}
    path.mkdir()
    pq.write_table(pa.table({"col-1a": pa.array([1, 2], pa.int64()),
                             "col-2b": pa.array([{"col-3c": "a"}, {"col-3c": "b"}])}), path / "f1.parquet")
    pq.write_table(pa.table({"col-1a": pa.array([3], pa.int64())}), path / "f2.parquet")  # column added later
    md = Metadata(id="t", schema_string=json.dumps(schema), partition_columns=("part",),
                  configuration={"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "4"})
    _write_commit(path, 0, [Protocol(2, 5), md,
                            AddFile("f1.parquet", {"col-4d": "7"}, 1, 1, True),
                            AddFile("f2.parquet", {"col-4d": None}, 1, 1, True)])
    s = Snapshot.load(path)
    t = s.to_pyarrow()
    assert t.schema.names == ["id", "info", "part"]
    assert sorted(t.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "info": {"name": "a"}, "part": 7},
        {"id": 2, "info": {"name": "b"}, "part": 7},
        {"id": 3, "info": None, "part": None},
    ]
    assert s.to_pyarrow(columns=["id"], filter="part = 7").column("id").to_pylist() == [1, 2]
    md_id = Metadata(id="t", schema_string=json.dumps(schema), partition_columns=("part",),
                     configuration={"delta.columnMapping.mode": "id"})
    _write_commit(path, 1, [md_id])
    # Id mode reads too; these files carry no Parquet field ids, so columns match by physical name.
    assert sorted(Snapshot.load(path).to_pyarrow().to_pylist(), key=lambda r: r["id"])[0] == {"id": 1, "info": {"name": "a"}, "part": 7}


def test_unsupported_reader_feature(tmp_path: Path) -> None:
    path = tmp_path / "feat"
    _write_commit(path, 0, [Protocol(3, 7, ("someFutureFeature",), ("someFutureFeature",)),
                            Metadata(id="t", schema_string=SCHEMA_ID)])
    s = Snapshot.load(path)  # metadata and file lists are still readable
    assert s.num_files == 0
    with pytest.raises(UnsupportedTableFeatureError, match="someFutureFeature"):
        s.to_pyarrow()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_multi_part_checkpoint_and_spark_last_checkpoint(histories: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    src, _ = histories["partitioned"]
    path = _copy(src, tmp_path / "mp")
    expected = Snapshot.load(path, version=7)
    log = path / "_delta_log"
    classic = log / f"{6:020d}.checkpoint.parquet"
    table = pq.read_table(classic)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), log / f"{6:020d}.checkpoint.0000000001.0000000002.parquet")
    pq.write_table(table.slice(half), log / f"{6:020d}.checkpoint.0000000002.0000000002.parquet")
    classic.unlink()
    from deltacoord.schemas.action_arrow import checkpoint_schema_json

    (log / "_last_checkpoint").write_text(json.dumps({
        "version": 6, "size": table.num_rows, "parts": 2, "sizeInBytes": 1, "numOfAddFiles": 1,
        "checkpointSchema": checkpoint_schema_json(), "checksum": "00000000000000000000000000000000",
    }))
    s = Snapshot.load(path, version=7)
    assert s.segment.checkpoint is not None and s.segment.checkpoint.kind == "multipart"
    assert _our_files(s) == _our_files(expected)
    assert _sorted_rows(s.to_pyarrow()) == _sorted_rows(expected.to_pyarrow())
    assert_same_as_delta_rs(path, 7)
    # an incomplete multi-part checkpoint is ignored: replay falls back to the v2 checkpoint
    (log / f"{6:020d}.checkpoint.0000000002.0000000002.parquet").unlink()
    s = Snapshot.load(path, version=7)
    assert s.segment.checkpoint is not None and s.segment.checkpoint.version == 2
    assert _our_files(s) == _our_files(expected)


def test_unreadable_checkpoint_falls_back(histories: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    src, _ = histories["plain"]
    path = _copy(src, tmp_path / "bad")
    expected = _our_files(Snapshot.load(path))
    (path / "_delta_log" / f"{6:020d}.checkpoint.parquet").write_bytes(b"not parquet")
    s = Snapshot.load(path)
    assert s.segment.checkpoint is not None and s.segment.checkpoint.version == 2
    assert _our_files(s) == expected
    # with no checkpoint and commit 0 gone, the version cannot be rebuilt
    (path / "_delta_log" / f"{2:020d}.checkpoint.parquet").write_bytes(b"")
    (path / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(CorruptLogError, match="cannot read checkpoint"):
        Snapshot.load(path)


def test_uri_forms(histories: dict[str, tuple[Path, int]]) -> None:
    path, last = histories["plain"]
    assert Snapshot.load(f"file://{path}").version == last
    assert table_root(f"file://{path}") == path
    assert Snapshot.load(str(path), version=1).num_files == Snapshot.load(path, version=1).num_files


def test_remove_then_readd_same_path(tmp_path: Path) -> None:
    path = tmp_path / "readd"
    md = Metadata(id="t", schema_string=SCHEMA_ID)
    size = _write_ids_file(path, "a.parquet", 3)
    a = AddFile("a.parquet", {}, size, 1, True)
    _write_commit(path, 0, [Protocol(1, 2), md, a])
    _write_commit(path, 1, [a.to_remove(5)])
    _write_commit(path, 2, [RemoveFile("never-added.parquet", 6, True)])
    _write_commit(path, 3, [a])
    assert [Snapshot.load(path, version=v).num_files for v in range(4)] == [1, 0, 0, 1]
    assert sorted(r.path for r in Snapshot.load(path, version=2).tombstones()) == ["a.parquet", "never-added.parquet"]
    assert Snapshot.load(path, version=3).tombstones() == [RemoveFile("never-added.parquet", 6, True)]
    assert Snapshot.load(path).to_pyarrow().column("id").to_pylist() == [0, 1, 2]


def test_building_actions_pauses_the_cyclic_gc_and_restores_its_state() -> None:
    import gc

    import pyarrow as pa

    from deltacoord.schemas.action_arrow import adds_from_struct
    from deltacoord.schemas.actions import without_cyclic_gc

    with without_cyclic_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with without_cyclic_gc():
            pass
        assert not gc.isenabled(), "a collector the caller disabled stays disabled"
    finally:
        gc.enable()
    arr = pa.array([{"path": "a.parquet", "partitionValues": [("d", "1")], "size": 1, "modificationTime": 0, "dataChange": True}],
                   type=pa.struct([("path", pa.string()), ("partitionValues", pa.map_(pa.string(), pa.string())),
                                   ("size", pa.int64()), ("modificationTime", pa.int64()), ("dataChange", pa.bool_())]))
    (add,) = adds_from_struct(arr)
    assert add.path == "a.parquet" and add.partition_values == {"d": "1"} and gc.isenabled()


def test_a_timestamp_in_seconds_is_refused_with_the_milliseconds_to_give(tmp_path: Path) -> None:
    """time.time() is seconds; read as milliseconds it named January 1970 and found no version."""
    path = tmp_path / "t"
    write_deltalake(path, _data(0, 3), mode="append")
    with pytest.raises(ValueError, match=r"looks like seconds since the epoch.*pass 1795000000000"):
        Snapshot.load(path, timestamp=1_795_000_000.0)
    with pytest.raises(VersionNotFoundError, match=r"timestamp 5 ms \(1970-01-01T00:00:00.005\+00:00\) is before"):
        Snapshot.load(path, timestamp=5)


def test_pruning_agrees_with_the_coordinators_matcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader prunes as the writer and the coordinator do (`partitions.prune`): a file whose partition value
    cannot be evaluated is kept (possibly matching), so the reader raises naming it rather than drop its rows."""
    from deltacoord.schemas.expressions.partitions import prune

    path = tmp_path / "bad-partition"
    path.mkdir()
    schema = {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                           for n, t in (("id", "long"), ("p", "string"), ("q", "integer"))]}
    md = Metadata(id="t", schema_string=json.dumps(schema), partition_columns=("p", "q"))
    files = [AddFile("a1.parquet", {"p": "a", "q": "1"}, 1, 1, True),
             AddFile("a2.parquet", {"p": "a", "q": "2"}, 1, 1, True),
             AddFile("b.parquet", {"p": "b", "q": "oops"}, 1, 1, True)]
    for i, f in enumerate(files):
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), path / f.path)
    _write_commit(path, 0, [Protocol(1, 2), md, *files])
    s = Snapshot.load(path)
    opened: list[str] = []
    real = snapmod.read_data_file

    def spy(obj: Any, *a: Any, **k: Any) -> pa.Table:
        opened.append(str(obj))
        return real(obj, *a, **k)

    monkeypatch.setattr(snapmod, "read_data_file", spy)
    # condition -> the files both keep; None: rows of every kept file are returned, ids as listed
    cases: dict[str, tuple[set[str], list[int] | None]] = {
        "p = 'a'": ({"a1.parquet", "a2.parquet"}, [0, 1]),
        "p = 'a' AND q = 2": ({"a2.parquet"}, [1]),
        "p = 'b'": ({"b.parquet"}, None),
        "q = 1": ({"a1.parquet", "b.parquet"}, None),  # 'oops' cannot be compared: possibly 1
        "q > 1 AND p <> 'b'": ({"a2.parquet", "b.parquet"}, None),
        "q IS NULL": ({"b.parquet"}, None),
    }
    for where, (expected, ids) in cases.items():
        kept = {f.path for f in prune(files, where, md, lambda f: f.partition_values)}
        assert kept == expected, where
        opened.clear()
        if ids is None:  # the unparsable file is kept: reading it cannot make its partition column, so it raises
            with pytest.raises(ValueError, match=r"b\.parquet has partition value 'oops' for column 'q'"):
                s.to_pyarrow(filter=where)
            assert not opened
        else:
            assert sorted(s.to_pyarrow(filter=where).column("id").to_pylist()) == ids
            assert sorted(o.rsplit("/", 1)[-1] for o in opened) == sorted(kept), where
