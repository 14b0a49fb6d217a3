"""Listing and parsing `_delta_log`, `_last_checkpoint`, and the deletion-vector formats."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltacoord.reader.checkpoint import iter_checkpoint_batches, read_checkpoint_actions
from deltacoord.reader.deletion_vectors import (
    DeletionVectorError,
    decode_roaring64,
    dv_file_bytes,
    dv_file_path,
    encode_roaring64,
    keep_mask,
    read_deletion_vector,
    uuid_from_z85,
    z85_decode,
    z85_encode,
)
from deltacoord.reader.log import (
    CorruptLogError,
    TableNotFoundError,
    VersionNotFoundError,
    list_log,
    log_segment,
    parse_commit_lines,
    read_commit_info,
    read_last_checkpoint,
    resolve_data_path,
    table_root,
)
from deltacoord.schemas.action_arrow import (
    CHECKPOINT_SCHEMA,
    actions_to_record_batch,
    checkpoint_schema_json,
    conform_batch,
    file_key_strings,
    string_array,
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

SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


def _log(root: Path) -> Path:
    d = root / "_delta_log"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _touch(d: Path, name: str, data: bytes = b"") -> Path:
    p = d / name
    p.write_bytes(data)
    return p


# --------------------------------------------------------------------------- roots and paths


def test_table_root_plain_path_and_file_uri(tmp_path: Path) -> None:
    assert table_root(str(tmp_path)) == tmp_path
    assert table_root(tmp_path) == tmp_path
    assert table_root(f"file://{tmp_path}") == tmp_path
    assert table_root("file:///data/my%20table") == Path("/data/my table")
    assert table_root("file:/data/t") == Path("/data/t")
    with pytest.raises(ValueError, match="only local"):
        table_root("s3://bucket/t")


def test_resolve_data_path_decodes_uri_encoding(tmp_path: Path) -> None:
    assert resolve_data_path(tmp_path, "p=a%20b/part-0.parquet") == tmp_path / "p=a b" / "part-0.parquet"
    assert resolve_data_path(tmp_path, "file:///abs/x.parquet") == Path("/abs/x.parquet")
    assert resolve_data_path(tmp_path, "/abs/y.parquet") == Path("/abs/y.parquet")


# --------------------------------------------------------------------------- listing


def test_list_log_classifies_files(tmp_path: Path) -> None:
    d = _log(tmp_path)
    for v in range(6):
        _touch(d, f"{v:020d}.json")
    _touch(d, f"{2:020d}.checkpoint.parquet")
    _touch(d, f"{4:020d}.checkpoint.0000000001.0000000002.parquet")
    _touch(d, f"{4:020d}.checkpoint.0000000002.0000000002.parquet")
    _touch(d, f"{5:020d}.checkpoint.0000000001.0000000003.parquet")  # incomplete: ignored
    _touch(d, f"{3:020d}.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json")
    _touch(d, f".{1:020d}.json.crc")
    _touch(d, f"{1:020d}.crc")
    _touch(d, f".{6:020d}.checkpoint.parquet.abc.tmp")
    _touch(d, f"{0:020d}.{3:020d}.compacted.json")
    (d / "_staged_commits").mkdir()
    _touch(d / "_staged_commits", f"{6:020d}.1234.json")

    listing = list_log(tmp_path)
    assert sorted(listing.commits) == [0, 1, 2, 3, 4, 5]
    assert sorted(listing.checkpoints) == [2, 3, 4]
    assert listing.latest_version == 5
    cp = listing.best_checkpoint(5)
    assert cp is not None and cp.version == 4 and cp.kind == "multipart" and cp.num_parts == 2
    assert [p.name.split(".")[2] for p in cp.paths] == ["0000000001", "0000000002"]
    assert listing.best_checkpoint(3) is not None and listing.best_checkpoint(3).kind == "v2"  # type: ignore[union-attr]
    assert listing.best_checkpoint(1) is None
    assert [c.version for c in listing.checkpoint_candidates(4)] == [4, 3, 2]


def test_list_log_missing_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        list_log(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError for callers
        list_log(tmp_path / "nope")


def test_log_segment_selection_and_errors(tmp_path: Path) -> None:
    d = _log(tmp_path)
    for v in range(5):
        _touch(d, f"{v:020d}.json")
    _touch(d, f"{2:020d}.checkpoint.parquet")
    listing = list_log(tmp_path)

    seg = log_segment(listing)
    assert seg.version == 4 and seg.checkpoint is not None and seg.checkpoint.version == 2
    assert [v for v, _ in seg.commits] == [3, 4]
    seg = log_segment(listing, 1)
    assert seg.checkpoint is None and [v for v, _ in seg.commits] == [0, 1]
    seg = log_segment(listing, 2)
    assert seg.checkpoint is not None and seg.commits == ()
    seg = log_segment(listing, 4, use_checkpoint=False)
    assert seg.checkpoint is None and [v for v, _ in seg.commits] == [0, 1, 2, 3, 4]
    with pytest.raises(VersionNotFoundError, match="latest version"):
        log_segment(listing, 5)

    # commits before the checkpoint cleaned up: older versions are gone, newer still load
    (d / f"{0:020d}.json").unlink()
    (d / f"{1:020d}.json").unlink()
    listing = list_log(tmp_path)
    assert log_segment(listing, 3).checkpoint is not None
    with pytest.raises(VersionNotFoundError, match=r"earliest available commit: 2"):
        log_segment(listing, 1)

    # a hole after the checkpoint is corruption
    (d / f"{3:020d}.json").unlink()
    with pytest.raises(CorruptLogError, match=r"00000000000000000003\.json"):
        log_segment(list_log(tmp_path), 4)


def test_empty_log_is_not_a_table(tmp_path: Path) -> None:
    _log(tmp_path)
    with pytest.raises(TableNotFoundError):
        log_segment(list_log(tmp_path))


# --------------------------------------------------------------------------- _last_checkpoint


def test_read_last_checkpoint_spark_style(tmp_path: Path) -> None:
    d = _log(tmp_path)
    spark = {
        "version": 10,
        "size": 13,
        "sizeInBytes": 16479,
        "numOfAddFiles": 6,
        "checkpointSchema": checkpoint_schema_json(),
        "checksum": "6872b3692f168925bdd80e3f92163949",
    }
    (d / "_last_checkpoint").write_text(json.dumps(spark))
    lc = read_last_checkpoint(tmp_path)
    assert lc is not None
    assert (lc.version, lc.size, lc.size_in_bytes, lc.num_of_add_files) == (10, 13, 16479, 6)
    assert lc.checkpoint_schema is not None and lc.checkpoint_schema["type"] == "struct"
    assert lc.extra == {"checksum": "6872b3692f168925bdd80e3f92163949"}
    assert lc.to_json() == spark


def test_read_last_checkpoint_missing_or_corrupt(tmp_path: Path) -> None:
    d = _log(tmp_path)
    assert read_last_checkpoint(tmp_path) is None
    (d / "_last_checkpoint").write_text("{not json")
    assert read_last_checkpoint(tmp_path) is None
    (d / "_last_checkpoint").write_text('{"size": 3}')
    assert read_last_checkpoint(tmp_path) is None


def test_checkpoint_schema_json_matches_spark_golden_field_names() -> None:
    js = checkpoint_schema_json()
    names = [f["name"] for f in js["fields"]]
    assert names == ["txn", "add", "remove", "metaData", "protocol", "domainMetadata"]
    add = next(f for f in js["fields"] if f["name"] == "add")["type"]
    assert [f["name"] for f in add["fields"]] == [
        "path", "partitionValues", "size", "modificationTime", "dataChange", "tags", "deletionVector",
        "baseRowId", "defaultRowCommitVersion", "stats",
    ]
    pv = add["fields"][1]["type"]
    assert pv == {"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True}


# --------------------------------------------------------------------------- commits


def test_parse_commit_lines_skips_unknown_actions_and_blank_lines() -> None:
    text = "\n".join(
        [
            json.dumps({"commitInfo": {"timestamp": 5, "inCommitTimestamp": 7, "operation": "WRITE"}}),
            json.dumps({"someFutureAction": {"x": 1}}),
            "",
            json.dumps({"checkpointMetadata": {"version": 1}}),
            json.dumps({"txn": {"appId": "a", "version": 3}}),
        ]
    )
    actions = parse_commit_lines(text)
    assert isinstance(actions[0], CommitInfo) and actions[0].in_commit_timestamp == 7
    assert actions[1] == SetTransaction("a", 3)
    assert len(actions) == 2


def test_parse_commit_lines_rejects_bad_lines() -> None:
    with pytest.raises(CorruptLogError, match="line 1 is not JSON"):
        parse_commit_lines("{oops")
    with pytest.raises(CorruptLogError, match="line 2"):
        parse_commit_lines('{"txn":{"appId":"a","version":1}}\n{"add":{"path":"x"}}')
    with pytest.raises(CorruptLogError, match="single-key"):
        parse_commit_lines('{"txn":{},"add":{}}')


def test_read_commit_info(tmp_path: Path) -> None:
    d = _log(tmp_path)
    p = d / f"{0:020d}.json"
    p.write_bytes(commit_to_json_lines([Protocol(1, 2), CommitInfo({"timestamp": 9, "operation": "X"})]))
    ci = read_commit_info(p)
    assert ci is not None and ci.operation == "X"
    p.write_bytes(commit_to_json_lines([Protocol(1, 2)]))
    assert read_commit_info(p) is None


# --------------------------------------------------------------------------- checkpoint Arrow helpers


def _sample_actions() -> list[object]:
    dv = DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 6, offset=4)
    return [
        Protocol(3, 7, ("deletionVectors",), ("deletionVectors", "domainMetadata")),
        Metadata(id="t", schema_string=SCHEMA, partition_columns=("p",), configuration={"k": "v"}, created_time=1),
        SetTransaction("app", 4, 99),
        DomainMetadata("d", '{"a":1}'),
        AddFile("p=1/a.parquet", {"p": "1"}, 10, 20, True, stats='{"numRecords":3}', tags={"t": "x"}),
        AddFile("p=1/a.parquet", {"p": "1"}, 10, 20, True, deletion_vector=dv),
        RemoveFile("p=2/b.parquet", 123, True, True, {"p": None}, 5, stats='{"numRecords":1}'),
    ]


def test_actions_roundtrip_through_checkpoint_parquet(tmp_path: Path) -> None:
    actions = _sample_actions()
    batch = actions_to_record_batch(actions)  # type: ignore[arg-type]
    assert batch.schema == CHECKPOINT_SCHEMA
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_batches([batch]), path)
    # pyarrow writes Spark's physical layout: optional groups, MAP key_value, LIST list/element
    text = str(pq.ParquetFile(path).schema)
    assert "repeated group field_id=-1 key_value" in text and "optional binary field_id=-1 element" in text
    back = list(read_checkpoint_actions([path], batch_rows=2))
    by_type: dict[str, list[object]] = {}
    for a in back:
        by_type.setdefault(type(a).__name__, []).append(a)
    assert by_type["Protocol"] == [actions[0]]
    assert by_type["Metadata"] == [actions[1]]
    assert by_type["SetTransaction"] == [actions[2]]
    assert by_type["DomainMetadata"] == [actions[3]]
    adds = by_type["AddFile"]
    assert {a.key() for a in adds} == {actions[4].key(), actions[5].key()}  # type: ignore[attr-defined]
    assert all(not a.data_change for a in adds)  # type: ignore[attr-defined]
    (rm,) = by_type["RemoveFile"]
    assert rm.stats is None and rm.partition_values == {"p": None} and not rm.data_change  # type: ignore[attr-defined]


def test_protocol_feature_lists_non_null_in_checkpoint_form() -> None:
    b = actions_to_record_batch([Protocol(3, 7)])
    assert b.column(CHECKPOINT_SCHEMA.get_field_index("protocol")).to_pylist()[0] == {
        "minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [], "writerFeatures": [],
    }
    b = actions_to_record_batch([Protocol(1, 2)])
    assert b.column(CHECKPOINT_SCHEMA.get_field_index("protocol")).to_pylist()[0]["readerFeatures"] is None


def test_conform_batch_handles_foreign_checkpoint_layouts() -> None:
    # delta-rs style: non-null fields, extra add.clusteringProvider, extra sidecar column, different order
    add_t = pa.struct([
        pa.field("path", pa.string(), nullable=False),
        pa.field("partitionValues", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("modificationTime", pa.int64(), nullable=False),
        pa.field("dataChange", pa.bool_(), nullable=False),
        pa.field("stats", pa.string()),
        pa.field("clusteringProvider", pa.string()),
    ])
    add = pa.array([{"path": "a", "partitionValues": [], "size": 1, "modificationTime": 2, "dataChange": True, "stats": "{}",
                     "clusteringProvider": None}, None], type=add_t)
    side = pa.array([None, {"path": "s"}], type=pa.struct([("path", pa.string())]))
    batch = pa.RecordBatch.from_arrays([side, add], names=["sidecar", "add"])
    out = conform_batch(batch, CHECKPOINT_SCHEMA)
    assert out.schema == CHECKPOINT_SCHEMA
    row = out.column(1).to_pylist()[0]
    assert row["path"] == "a" and row["stats"] == "{}" and row["deletionVector"] is None
    assert out.column(1).to_pylist()[1] is None
    assert out.column(0).null_count == 2


def test_file_key_strings_include_dv_unique_id() -> None:
    dv = DeletionVector("u", "xyz", 4, 1, offset=7)
    inline = DeletionVector("i", "abcde", 4, 1)
    b = actions_to_record_batch(
        [AddFile("a", {}, 1, 1, True), AddFile("a", {}, 1, 1, True, deletion_vector=dv),
         AddFile("b", {}, 1, 1, True, deletion_vector=inline)],
        columns=["add"],
    )
    keys = file_key_strings(b.column(0)).to_pylist()
    assert keys == ["a", "a\x00uxyz@7", "b\x00iabcde"]
    assert dv.unique_id() == "uxyz@7" and inline.unique_id() == "iabcde"


def test_string_array() -> None:
    assert string_array(["a", "", "ünï"]).to_pylist() == ["a", "", "ünï"]
    assert string_array([]).to_pylist() == []


def test_iter_checkpoint_batches_bounded_and_projected(tmp_path: Path) -> None:
    adds = [AddFile(f"f{i}", {}, i, i, True) for i in range(25)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_batches([actions_to_record_batch([Protocol(1, 2), *adds])]), path, row_group_size=10)
    batches = list(iter_checkpoint_batches([path], ["add"], batch_rows=7))
    assert all(b.num_rows <= 7 for b in batches)
    assert sum(b.num_rows - b.column(0).null_count for b in batches) == 25
    assert batches[0].schema.names == ["add"]


# --------------------------------------------------------------------------- deletion vectors

# Deletion-vector files written by Delta Spark 3.x (golden table `log-replay-dv-key-cases` of
# delta-io/delta, Apache-2.0): 50 rows, DELETE id=0, then id=7, then id=14; row index == id.
SPARK_DV_FILES = {
    "37d10da3-70a1-4730-bc58-3b44f9617505": (
        "h{&8fAg]=QYJvl-}c!yH", 34, [0],
        "0100000022d1d339640100000000000000000000003a3000000100000000000000100000000000f7a6b4b5",
    ),
    "3d8a467a-2fbd-4d35-8e3a-775894a30576": (
        "j=hZPftg7qJYIw^L+Oz9", 36, [0, 7],
        "0100000024d1d339640100000000000000000000003a30000001000000000001001000000000000700b4e435c8",
    ),
    "d12e7d16-e46d-48c9-8a71-b222c26dfc3b": (
        "^jP?.<zvDfIGb{C.FPij", 38, [0, 7, 14],
        "0100000026d1d339640100000000000000000000003a300000010000000000020010000000000007000e00fd54c000",
    ),
}


def test_spark_written_dv_files_decode(tmp_path: Path) -> None:
    for uid, (z85, size, rows, hexdata) in SPARK_DV_FILES.items():
        assert str(uuid_from_z85(z85)) == uid
        (tmp_path / f"deletion_vector_{uid}.bin").write_bytes(bytes.fromhex(hexdata))
        dv = DeletionVector("u", z85, size, len(rows), offset=1)
        assert dv_file_path(tmp_path, dv) == tmp_path / f"deletion_vector_{uid}.bin"
        assert read_deletion_vector(tmp_path, dv).tolist() == rows


def test_protocol_md_inline_example_decodes() -> None:
    dv = DeletionVector("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", 40, 6)
    assert read_deletion_vector(Path("."), dv).tolist() == [3, 4, 7, 11, 18, 29]


def test_dv_path_with_random_prefix(tmp_path: Path) -> None:
    dv = DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 6, offset=4)
    assert dv_file_path(tmp_path, dv) == tmp_path / "ab" / "deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert dv_file_path(tmp_path, DeletionVector("p", "file:///x/dv.bin", 1, 1)) == Path("/x/dv.bin")


def test_z85_roundtrip() -> None:
    data = bytes(range(256))
    assert z85_decode(z85_encode(data)) == data
    assert z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"  # the Z85 spec's test vector
    with pytest.raises(DeletionVectorError):
        z85_decode("abcd")


@pytest.mark.parametrize(
    "rows",
    [
        [5],
        [0, 1, 2, 65535, 65536, 70000],
        list(range(0, 20000, 3)),  # > 4096 in one container: bitmap container
        [1, 2**32 + 7, 2**33, 2**40 + 1],  # several 64-bit buckets
    ],
)
def test_roaring_roundtrip(rows: list[int], tmp_path: Path) -> None:
    data = encode_roaring64(rows)
    assert decode_roaring64(data).tolist() == sorted(set(rows))
    inline = DeletionVector("i", z85_encode(data), len(data), len(set(rows)))
    assert read_deletion_vector(tmp_path, inline).tolist() == sorted(set(rows))
    blob, offsets = dv_file_bytes([b"", data])  # second DV in the file: non-trivial offset
    (tmp_path / "dv.bin").write_bytes(blob)
    on_disk = DeletionVector("p", str(tmp_path / "dv.bin"), len(data), len(set(rows)), offset=offsets[1])
    assert read_deletion_vector(tmp_path, on_disk).tolist() == sorted(set(rows))


def test_roaring_run_containers_decode() -> None:
    # hand-built per the RoaringFormatSpec: cookie 12347 with one run container [10..14] and [100..101]
    # plus one array container (key 1) holding 65536+3
    n = 2
    bm = struct.pack("<I", 12347 | ((n - 1) << 16))
    bm += bytes([0b01])  # container 0 is a run container
    bm += struct.pack("<HHHH", 0, 6, 1, 0)  # keys/cardinality-1 (7 values; 1 value)
    # n < 4 with runs: no offset header
    bm += struct.pack("<H", 2) + struct.pack("<HHHH", 10, 4, 100, 1)
    bm += struct.pack("<H", 3)
    data = struct.pack("<i", 1681511377) + struct.pack("<q", 1) + struct.pack("<I", 0) + bm
    assert decode_roaring64(data).tolist() == [10, 11, 12, 13, 14, 100, 101, 65539]


def test_dv_validation_errors(tmp_path: Path) -> None:
    data = encode_roaring64([1, 2])
    blob, offs = dv_file_bytes([data])
    bad = bytearray(blob)
    bad[-1] ^= 0xFF
    (tmp_path / "dv.bin").write_bytes(bytes(bad))
    with pytest.raises(DeletionVectorError, match="CRC"):
        read_deletion_vector(tmp_path, DeletionVector("p", str(tmp_path / "dv.bin"), len(data), 2, offset=offs[0]))
    with pytest.raises(DeletionVectorError, match="expected"):
        read_deletion_vector(tmp_path, DeletionVector("p", str(tmp_path / "dv.bin"), len(data) + 1, 2, offset=offs[0]))
    with pytest.raises(DeletionVectorError, match="descriptor says 3"):
        read_deletion_vector(tmp_path, DeletionVector("i", z85_encode(data), len(data), 3))
    with pytest.raises(DeletionVectorError, match="does not exist"):
        read_deletion_vector(tmp_path, DeletionVector("p", str(tmp_path / "missing.bin"), len(data), 2, offset=1))
    with pytest.raises(DeletionVectorError, match="magic"):
        decode_roaring64(b"\x00" * 16)
    assert zlib.crc32(data) == struct.unpack(">I", blob[-4:])[0]


def test_keep_mask() -> None:
    m = keep_mask(5, np.array([0, 3, 9], dtype=np.uint64))
    assert m.tolist() == [False, True, True, False, True]


@pytest.mark.parametrize("odd", ["\u2028", "\u2029", "\x85"])
def test_commit_lines_split_on_newline_only(odd: str) -> None:
    """Our commits write non-ASCII raw; a path holding a character that `str.splitlines` splits on still reads back."""
    from deltacoord.reader.log import parse_commit_lines
    from deltacoord.schemas.actions import AddFile, Protocol, commit_to_json_lines, parse_commit

    add = AddFile(f"d=1/a{odd}b.parquet", {"d": f"x{odd}"}, 10, 0, True)
    data = commit_to_json_lines([Protocol(1, 2), add]).replace(b"\n", b"\r\n", 1)
    assert odd.encode() in data  # written raw, not escaped
    assert parse_commit(data)[1] == add
    assert parse_commit_lines(data)[1] == add
