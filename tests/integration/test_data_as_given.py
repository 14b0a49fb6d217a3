"""Data as Delta users give it: decimals from JSON numbers and text, naive timestamps (timestamp_ntz), Spark
DDL schemas in the CLI, and large appends written as files of the table's target size.

Every table is read back by delta-rs, which must see the very values our reader sees.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltacoord.cli.tables import register
from deltacoord.reader.snapshot import Snapshot
from deltacoord.writer.staging import SchemaError
from tests.conftest import TablePlace
from tests.integration.test_writer_operations import Env, running_env

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def _cli(env: Env, *args: str) -> tuple[int, str]:
    group = click.Group("deltacoord")
    register(group)
    prefix = env.topics.proposals.removesuffix(".proposals")
    result = CliRunner().invoke(group, [*args, "--bootstrap-servers", env.bootstrap, "--topic-prefix", prefix])
    return result.exit_code, result.output


def _delta_rs(path: Path | str) -> list[dict[str, Any]]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


MONEY = pa.schema([pa.field("id", pa.int64()), pa.field("amount", pa.decimal128(10, 2))])


def test_decimals_from_integers_floats_and_text_are_exact(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "money")
    t.create(MONEY)
    t.append(pa.table({"id": [1, 2], "amount": [7, -3]}))
    t.append(pa.table({"id": [3, 4, 5], "amount": [10.5, 0.29, None]}))
    t.append(pa.table({"id": [6, 7], "amount": ["10.50", " 99999999.99 "]}))
    env.settle()
    want = {1: Decimal("7.00"), 2: Decimal("-3.00"), 3: Decimal("10.50"), 4: Decimal("0.29"), 5: None,
            6: Decimal("10.50"), 7: Decimal("99999999.99")}
    assert {r["id"]: r["amount"] for r in Snapshot.load(t.uri).to_pyarrow().to_pylist()} == want
    assert {r["id"]: r["amount"] for r in _delta_rs(t.root)} == want


@pytest.mark.parametrize(("amount", "why"), [
    ([1.234], "the value 1.234 has more than 2 digits after the point"),
    (["1.234"], "the value '1.234' has more than 2 digits after the point"),
    ([123456789], "the value 123456789 needs more than 8 digits before the point"),
    (["12x"], "the value '12x' is not a number"),
    ([float("nan")], "is not a finite number"),
])
def test_a_decimal_the_column_cannot_hold_exactly_is_refused_naming_it(env: Env, tmp_path: Path, amount: list[Any],
                                                                       why: str) -> None:
    t = env.table(tmp_path / "money")
    t.create(MONEY)
    with pytest.raises(SchemaError) as ei:
        t.append(pa.table({"id": [1] * len(amount), "amount": amount}))
    assert "column 'amount' is decimal(10,2)" in str(ei.value) and why in str(ei.value)
    assert "round the data first or widen the column" in str(ei.value)
    env.settle()
    assert Snapshot.load(t.uri).version == 0
    assert [p.name for p in t.root.iterdir() if p.suffix == ".parquet"] == []


def test_cli_json_rows_keep_every_digit_the_input_wrote(env: Env, tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    code, out = _cli(env, "table", "create", path, "--schema", "id BIGINT NOT NULL, amount DECIMAL(38,2), rate DOUBLE")
    assert code == 0, out
    rows = '[{"id": 1, "amount": 10.50, "rate": 0.5}, {"id": 3, "amount": 123456789012345678901234567.89, "rate": 1e-3},' \
           ' {"id": 4, "amount": 5}]'
    code, out = _cli(env, "table", "append", path, "--json-rows", rows)
    assert code == 0, out
    code, out = _cli(env, "table", "append", path, "--json-rows", '{"id": 2, "amount": "7.25", "rate": 2}')
    assert code == 0, out
    code, out = _cli(env, "table", "append", path, "--json-rows", '{"id": 5, "amount": 1.234}')
    assert code == 1 and out.count("\n") == 1, out
    assert "column 'amount' is decimal(38,2) but the value" in out and "more than 2 digits after the point" in out
    env.settle()
    want = [(1, Decimal("10.50"), 0.5), (2, Decimal("7.25"), 2.0), (3, Decimal("123456789012345678901234567.89"), 0.001),
            (4, Decimal("5.00"), None)]
    assert [(r["id"], r["amount"], r["rate"]) for r in _delta_rs(path)] == want
    assert Snapshot.load(path).version == 2


def test_naive_datetimes_make_a_timestamp_ntz_column_delta_rs_reads_as_written(env: Env, tmp_path: Path) -> None:
    frame = pd.DataFrame({"id": [1, 2, 3], "at": pd.to_datetime(["2024-03-10 02:30:00", "1999-12-31 23:59:59.123456",
                                                                    None], format="ISO8601")})
    t = env.table(tmp_path / "ntz")
    t.create(pa.Schema.from_pandas(frame, preserve_index=False), partition_by=())
    t.append(frame)
    env.settle()
    snap = Snapshot.load(t.uri)
    assert json.loads(snap.metadata.schema_string)["fields"][1]["type"] == "timestamp_ntz"
    assert "timestampNtz" in (snap.protocol.reader_features or []) and "timestampNtz" in (snap.protocol.writer_features or [])
    want = [dt.datetime(2024, 3, 10, 2, 30), dt.datetime(1999, 12, 31, 23, 59, 59, 123456), None]
    assert [r["at"] for r in sorted(snap.to_pyarrow().to_pylist(), key=lambda r: r["id"])] == want
    assert [r["at"] for r in _delta_rs(t.root)] == want
    (add,) = snap.files()
    stats = json.loads(add.stats or "{}")
    assert stats["minValues"]["at"] == "1999-12-31T23:59:59.123" and stats["maxValues"]["at"] == "2024-03-10T02:30:00.000"
    dl = DeltaTable(str(t.root))  # delta-rs prunes with those bounds: wall times, no zone
    assert dl.to_pyarrow_table(filters=[("at", ">", pd.Timestamp("2024-01-01"))]).column("id").to_pylist() == [1]


def test_a_ddl_schema_creates_the_types_spark_would(env: Env, tmp_path: Path) -> None:
    path = str(tmp_path / "ddl")
    ddl = ("id BIGINT NOT NULL COMMENT 'the key', n INT, small SMALLINT, price DECIMAL(12,3), ts TIMESTAMP, "
           "local TIMESTAMP_NTZ, tags ARRAY<STRING>, attrs MAP<STRING, DOUBLE>, `where` STRUCT<city: STRING, zip: INT>, "
           "day DATE GENERATED ALWAYS AS (CAST(ts AS DATE))")
    code, out = _cli(env, "table", "create", path, "--schema", ddl)
    assert code == 0, out
    env.settle()
    fields = {f["name"]: f for f in json.loads(Snapshot.load(path).metadata.schema_string)["fields"]}
    assert {k: f["type"] for k, f in fields.items() if isinstance(f["type"], str)} == {
        "id": "long", "n": "integer", "small": "short", "price": "decimal(12,3)", "ts": "timestamp",
        "local": "timestamp_ntz", "day": "date"}
    assert fields["tags"]["type"]["elementType"] == "string" and fields["attrs"]["type"]["valueType"] == "double"
    assert [f["name"] for f in fields["where"]["type"]["fields"]] == ["city", "zip"]
    assert fields["id"]["nullable"] is False and fields["id"]["metadata"]["comment"] == "the key"
    assert fields["day"]["metadata"]["delta.generationExpression"] == "CAST(ts AS DATE)"
    schema = DeltaTable(path).schema().to_arrow()
    assert [f.name for f in schema] == list(fields)
    code, out = _cli(env, "table", "create", str(tmp_path / "bad"), "--schema", "id BIGINT, name VARCHAR(10)")
    assert code == 2 and "column 'name'" in out and "use STRING" in out, out


def test_a_large_append_is_written_as_files_of_the_target_size(env: Env, tmp_path: Path) -> None:
    n = 1_000_000
    source = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array(range(n), pa.int64())}), source,
                   row_group_size=31_250)  # 32 row groups, streamed as many small batches
    path = str(tmp_path / "big")
    code, out = _cli(env, "table", "create", path, "--schema", "id BIGINT, v BIGINT")
    assert code == 0, out
    code, out = _cli(env, "table", "append", path, "--parquet", str(source))
    assert code == 0, out
    env.settle()
    (one,) = Snapshot.load(path).files()  # 16 MB of rows: one file, not one per batch
    assert json.loads(one.stats or "{}")["numRecords"] == n

    small = env.table(tmp_path / "small-files")
    small.create(pa.schema([("id", pa.int64()), ("v", pa.int64())]), properties={"delta.targetFileSize": "2mb"})
    small.append(pq.ParquetFile(source).iter_batches(batch_size=50_000))
    env.settle()
    files = Snapshot.load(small.uri).files()
    counts = sorted(json.loads(a.stats or "{}")["numRecords"] for a in files)
    # 16 MB of rows: seven files of 2 MiB of rows each (as Arrow holds them), then the rest
    assert len(counts) == 8 and sum(counts) == n and counts[0] < counts[1] and len(set(counts[1:])) == 1, counts
    assert counts[1] * 16 <= 2 * 1024 * 1024 < (counts[1] + 1) * 17, counts
    assert len(DeltaTable(str(small.root)).to_pyarrow_table()) == n
