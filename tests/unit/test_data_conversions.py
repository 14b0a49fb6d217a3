"""Pure conversions of data as users give it: decimals, the target file size and the `--schema` text."""

from __future__ import annotations

from decimal import Decimal

import click
import pyarrow as pa
import pytest

from deltacoord.cli.schema import arrow_type_of, parse_schema
from deltacoord.writer import staging
from deltacoord.writer.decimals import to_decimal
from deltacoord.writer.staging import SchemaError

D10_2 = pa.decimal128(10, 2)


@pytest.mark.parametrize(("values", "want"), [
    (pa.chunked_array([[1, None, -99_999_999]], pa.int64()), [Decimal("1.00"), None, Decimal("-99999999.00")]),
    (pa.chunked_array([[0.1, 0.29, 1e7]], pa.float64()), [Decimal("0.10"), Decimal("0.29"), Decimal("10000000.00")]),
    (pa.chunked_array([["3", " 4.5 ", "-0.01", None]]), [Decimal("3.00"), Decimal("4.50"), Decimal("-0.01"), None]),
    (pa.chunked_array([[Decimal("1.5")]], pa.decimal128(5, 1)), [Decimal("1.50")]),
    (pa.chunked_array([[Decimal("1.500")]], pa.decimal128(5, 3)), [Decimal("1.50")]),  # trailing zeros are exact
])
def test_exact_values_become_decimals(values: pa.ChunkedArray, want: list[Decimal | None]) -> None:
    out = to_decimal("c", values, D10_2)
    assert out.type == D10_2 and out.to_pylist() == want


@pytest.mark.parametrize(("values", "why"), [
    (pa.chunked_array([[1, 100_000_000]], pa.int64()), "the value 100000000 needs more than 8 digits before the point"),
    (pa.chunked_array([[0.5, 0.125]], pa.float64()), "the value 0.125 has more than 2 digits after the point"),
    (pa.chunked_array([[float("inf")]], pa.float64()), "the value inf is not a finite number"),
    (pa.chunked_array([["1", "one"]]), "the value 'one' is not a number"),
    (pa.chunked_array([[Decimal("1.001")]], pa.decimal128(5, 3)), "has more than 2 digits after the point"),
])
def test_values_the_column_cannot_hold_are_refused_naming_the_first(values: pa.ChunkedArray, why: str) -> None:
    with pytest.raises(SchemaError) as ei:
        to_decimal("price", values, D10_2)
    assert str(ei.value).startswith("column 'price' is decimal(10,2) but ") and why in str(ei.value)


def test_the_target_file_size_property() -> None:
    assert staging.target_file_size({}) == staging.TARGET_FILE_SIZE
    assert staging.target_file_size({"delta.targetFileSize": "134217728"}) == 128 << 20
    assert staging.target_file_size({"delta.targetFileSize": "64mb"}) == 64 << 20
    assert staging.target_file_size({"delta.targetFileSize": "1GB"}) == 1 << 30
    for bad in ("", "0", "big", "-5mb", "12tb"):
        with pytest.raises(SchemaError, match=r"delta\.targetFileSize"):
            staging.target_file_size({"delta.targetFileSize": bad})


def test_files_of_about_equal_size_within_the_target() -> None:
    t = pa.table({"v": pa.array(range(1000), pa.int64())})  # 8,000 bytes
    assert staging._rows_per_file(t, 10_000, None) == 1000
    assert staging._rows_per_file(t, 3_000, None) == 334  # three files, not 375+375+250
    assert staging._rows_per_file(t, 10_000, 100) == 100


def test_spark_ddl_and_the_short_form_give_the_same_schema() -> None:
    ddl = parse_schema("id BIGINT NOT NULL, amount DECIMAL(10,2), ts TIMESTAMP, `odd name` STRING COMMENT 'it''s: x'")
    short = parse_schema("id:long not null,amount:decimal(10,2),ts:timestamp,odd name:string")
    assert ddl.types == short.types and ddl.names == short.names
    assert [f.nullable for f in ddl] == [False, True, True, True]
    assert ddl.field("odd name").metadata == {b"comment": b"it's: x"}


@pytest.mark.parametrize(("text", "want"), [
    ("TIMESTAMP_NTZ", pa.timestamp("us")),
    ("NUMERIC(5, 1)", pa.decimal128(5, 1)),
    ("DECIMAL", pa.decimal128(10, 0)),
    ("ARRAY<BIGINT>", pa.list_(pa.field("element", pa.int64()))),
    ("MAP<STRING, ARRAY<INT>>", pa.map_(pa.string(), pa.field("value", pa.list_(pa.field("element", pa.int32()))))),
    ("STRUCT<a: INT NOT NULL, b STRING>", pa.struct([pa.field("a", pa.int32(), nullable=False), ("b", pa.string())])),
])
def test_type_names(text: str, want: pa.DataType) -> None:
    assert arrow_type_of(text) == want


@pytest.mark.parametrize(("spec", "message"), [
    ("id", "expected 'name TYPE' (or name:type)"),
    ("id BIGINT, id INT", "duplicate columns ['id']"),
    ("s VARCHAR(5)", "deltacoord does not enforce CHAR/VARCHAR lengths; use STRING"),
    ("m MAP<STRING>", "needs a key type and a value type"),
    ("a ARRAY<INT", "ends with '>'"),
    ("x HUGEINT", "unknown type 'HUGEINT'"),
])
def test_schema_text_errors_name_the_column_and_the_fix(spec: str, message: str) -> None:
    with pytest.raises(click.BadParameter) as ei:
        parse_schema(spec)
    assert message in ei.value.format_message()


def test_s3a_settings_reach_the_store_the_storage_options_name() -> None:
    from deltacoord.spark import s3a_settings

    local = s3a_settings({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "us-east-1",
                          "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ALLOW_HTTP": "true"})
    assert local == {"fs.s3a.endpoint": "http://127.0.0.1:9000", "fs.s3a.path.style.access": "true",
                     "fs.s3a.connection.ssl.enabled": "false", "fs.s3a.endpoint.region": "us-east-1",
                     "fs.s3a.access.key": "k", "fs.s3a.secret.key": "s",
                     "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
    aws = s3a_settings({"aws_region": "eu-west-1", "aws_access_key_id": "k", "aws_secret_access_key": "s",
                        "aws_session_token": "t"})
    assert aws["fs.s3a.session.token"] == "t" and "fs.s3a.endpoint" not in aws
    assert aws["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    assert s3a_settings({"AWS_REGION": "eu-west-1"}) == {"fs.s3a.endpoint.region": "eu-west-1"}  # the default chain
