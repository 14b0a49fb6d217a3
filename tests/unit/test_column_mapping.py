"""Column mapping on write (`deltacoord.writer.column_mapping`) and protocol raising (`deltacoord.writer.protocols`), without a table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.writer import column_mapping, protocols, staging
from deltacoord.writer.column_mapping import ID_KEY, Layout

PHYSICAL = "delta.columnMapping.physicalName"
NESTED = pa.schema([
    ("id", pa.int64()),
    ("p", pa.string()),
    ("items", pa.list_(pa.struct([("k", pa.string()), ("v", pa.int64())]))),
    ("m", pa.map_(pa.string(), pa.struct([("x", pa.int32())]))),
])


def mapped(mode: str = "name") -> tuple[Metadata, dict[str, object]]:
    schema = json.loads(staging.schema_string(NESTED))
    top = column_mapping.assign_ids(schema["fields"], 1)
    md = Metadata(id="t", schema_string=json.dumps(schema), partition_columns=("p",),
                  configuration={"delta.columnMapping.mode": mode, column_mapping.MAX_ID_PROPERTY: str(top - 1)})
    return md, schema


def test_every_field_at_every_level_gets_an_id_and_a_physical_name() -> None:
    _md, schema = mapped()
    # id, p, items, items.k, items.v, m, m.x: through arrays and map values too
    assert column_mapping.max_id(schema) == 7
    text = json.dumps(schema)
    assert text.count(ID_KEY) == 7 and text.count(PHYSICAL) == 7
    # Fields that have an id keep it; the next ones continue after the highest.
    extra = [{"name": "e", "type": "long", "nullable": True, "metadata": {}}]
    assert column_mapping.assign_ids(extra, 8) == 9 and extra[0]["metadata"][ID_KEY] == 8


def test_files_carry_physical_names_field_ids_and_physically_keyed_stats(tmp_path: Path) -> None:
    md, schema = mapped("id")
    layout = Layout.of(md, NESTED)
    data = pa.table({"id": [1, 2], "p": ["a", "a"], "items": [[{"k": "q", "v": 1}], None],
                     "m": [[("z", {"x": 5})], []]}, schema=NESTED)
    (add,) = staging.write_data_files(tmp_path, data, ["p"], layout=layout)
    fields = {f["name"]: f["metadata"] for f in schema["fields"]}  # type: ignore[index]
    phys = {n: m[PHYSICAL] for n, m in fields.items()}
    assert add.partition_values == {phys["p"]: "a"} and add.path.startswith(f"{phys['p']}=a/")
    stats = json.loads(add.stats or "{}")
    assert stats["minValues"] == {phys["id"]: 1} and set(stats["nullCount"]) == {phys["id"], phys["items"], phys["m"]}
    pf = pq.ParquetFile(tmp_path / add.path)
    arrow = pf.schema_arrow
    assert arrow.names == [phys["id"], phys["items"], phys["m"]]
    assert [int(f.metadata[b"PARQUET:field_id"]) for f in arrow] == [fields["id"][ID_KEY], fields["items"][ID_KEY],
                                                                      fields["m"][ID_KEY]]
    element = arrow.field(phys["items"]).type.value_type
    k_meta = schema["fields"][2]["type"]["elementType"]["fields"][0]["metadata"]  # type: ignore[index]
    assert element.field(0).name == k_meta[PHYSICAL] and int(element.field(0).metadata[b"PARQUET:field_id"]) == k_meta[ID_KEY]
    # The values are the data's, under the physical names.
    row = pf.read().to_pylist()[0]
    assert row[phys["id"]] == 1 and list(row[phys["items"]][0].values()) == ["q", 1]


def test_change_data_files_land_under_change_data_per_partition(tmp_path: Path) -> None:
    changes = pa.table({"id": [1, 2], "p": ["a", None], staging.CHANGE_TYPE: ["delete", "insert"]})
    cdc = staging.write_cdc_files(tmp_path, changes, ["p"])
    assert sorted((c.partition_values["p"] or "", c.path.split("/")[1]) for c in cdc) == [
        ("", "p=__HIVE_DEFAULT_PARTITION__"), ("a", "p=a")]
    for c in cdc:
        assert c.path.startswith("_change_data/") and not c.data_change
        assert c.size == (tmp_path / c.path).stat().st_size
        assert pq.read_table(tmp_path / c.path).column_names == ["id", staging.CHANGE_TYPE]


@pytest.mark.parametrize(("before", "after"), [
    (Protocol(1, 2), Protocol(2, 5)),
    (Protocol(2, 6), Protocol(2, 6)),
    (Protocol(1, 7, writer_features=("appendOnly",)), Protocol(2, 7, writer_features=("appendOnly", "columnMapping"))),
    (Protocol(3, 7, reader_features=("deletionVectors",), writer_features=("deletionVectors",)),
     Protocol(3, 7, reader_features=("deletionVectors", "columnMapping"), writer_features=("deletionVectors", "columnMapping"))),
])
def test_column_mapping_raises_the_protocol_as_delta_does(before: Protocol, after: Protocol) -> None:
    assert column_mapping.with_feature(before) == after


@pytest.mark.parametrize(("before", "after"), [
    (Protocol(1, 2), Protocol(1, 4)),
    (Protocol(1, 7, writer_features=("appendOnly",)), Protocol(1, 7, writer_features=("appendOnly", "changeDataFeed"))),
    (Protocol(3, 7, reader_features=("deletionVectors",), writer_features=("deletionVectors",)),
     Protocol(3, 7, reader_features=("deletionVectors",), writer_features=("deletionVectors", "changeDataFeed"))),
])
def test_the_change_data_feed_raises_the_protocol_as_delta_does(before: Protocol, after: Protocol) -> None:
    assert protocols.with_change_data_feed(before) == after


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"delta\.columnMapping\.mode='names': give one of none, name, id"):
        column_mapping.check_mode("names")


def test_data_skipping_reads_physically_keyed_stats(tmp_path: Path) -> None:
    from deltacoord.schemas.expressions.scan import files_read

    md, _schema = mapped("name")
    data = pa.table({"id": [1, 2], "p": ["a", "a"], "items": [None, None], "m": [None, None]}, schema=NESTED)
    adds = staging.write_data_files(tmp_path, data, ["p"], layout=Layout.of(md, NESTED))
    assert files_read(adds, "id = 99", md, NESTED) == []
    assert files_read(adds, "id = 2", md, NESTED) == adds
