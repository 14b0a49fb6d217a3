"""Mistakes a new user makes get errors they can act on: type mismatches named like Spark's, no terminal
escape codes, no silent casts that change what a value means."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.schemas.expressions.arrow import compile_filter, evaluate
from deltacoord.schemas.expressions.syntax import ExpressionError, parse
from deltacoord.writer.client import CoordinatorClient, check_kafka_keywords
from deltacoord.writer.operations import check_assignable
from deltacoord.writer.staging import SchemaError
from deltacoord.writer.table import Table, TableExistsError

ROWS = pa.table({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["1", "b"]), "ok": pa.array([True, False]),
                 "amount": pa.array([1.5, 2.0])})


def _filter(text: str) -> int:
    return ROWS.filter(compile_filter(text, ROWS.schema)).num_rows


@pytest.mark.parametrize(("text", "kind", "names"), [
    ("id = name", "BINARY_OP_DIFF_TYPES", ["id (bigint)", "name (string)"]),
    ("name + 1 > 2", "BINARY_OP_WRONG_TYPE", ["name (string)"]),
    ("ok + 1 = 2", "BINARY_OP_WRONG_TYPE", ["ok (boolean)"]),
    ("(id > 1) = amount", "BINARY_OP_DIFF_TYPES", ["amount (double)"]),
])
def test_type_mismatches_are_named_like_spark(text: str, kind: str, names: list[str]) -> None:
    with pytest.raises(ExpressionError) as e:
        _filter(text)
    msg = str(e.value)
    assert f"[DATATYPE_MISMATCH.{kind}]" in msg and text.split(" ")[0] in msg
    for n in names:
        assert n in msg, msg
    assert "Arrow" not in msg and "kernel" not in msg


def test_compatible_operands_still_evaluate() -> None:
    assert _filter("id + amount > 3") == 1
    assert _filter("(id > 1) = ok") == 0
    assert _filter("name = 'b'") == 1
    assert _filter("id BETWEEN 1 AND amount") == 2


def test_string_column_against_a_number_casts_and_a_bad_value_is_named() -> None:
    ok_rows = pa.table({"name": pa.array(["1", "3"])})
    assert ok_rows.filter(compile_filter("name > 2", ok_rows.schema)).num_rows == 1
    with pytest.raises(ExpressionError, match=r"\[CAST_INVALID_INPUT\].*'b'"):
        evaluate("name > 2", ROWS)


@pytest.mark.parametrize("text", ["id = = 1", "id IN (1,", "id = 'x", "foo(", "id = 1 1"])
def test_parse_errors_carry_no_terminal_escape_codes(text: str) -> None:
    with pytest.raises(ExpressionError) as e:
        parse(text)
    assert not re.search(r"\x1b\[", str(e.value)) and "does not parse" in str(e.value)


@pytest.mark.parametrize(("given", "target"), [
    (pa.int64(), pa.string()), (pa.string(), pa.int64()), (pa.float64(), pa.bool_()), (pa.bool_(), pa.int32()),
    (pa.binary(), pa.string()), (pa.int64(), pa.date32()),
])
def test_writes_refuse_casts_that_change_meaning(given: pa.DataType, target: pa.DataType) -> None:
    with pytest.raises(SchemaError, match="does not cast between"):
        check_assignable("c", given, target)


@pytest.mark.parametrize(("given", "target"), [
    (pa.int32(), pa.int64()), (pa.string(), pa.large_string()), (pa.null(), pa.string()),
    (pa.string(), pa.date32()), (pa.date32(), pa.timestamp("us", tz="UTC")),
    (pa.list_(pa.int64()), pa.list_(pa.int32())), (pa.struct([("a", pa.int64())]), pa.struct([("a", pa.int32())])),
])
def test_writes_accept_casts_within_a_family(given: pa.DataType, target: pa.DataType) -> None:
    check_assignable("c", given, target)


def test_table_exists_error_names_itself_once() -> None:
    msg = f"{type(TableExistsError('file:///t')).__name__}: {TableExistsError('file:///t')}"
    assert msg.count("TableExistsError") == 1 and "file:///t" in msg


@pytest.mark.parametrize(("keyword", "meant"), [("bootstrap_server", "bootstrap_servers"), ("topic_prefx", "topic_prefix"),
                                                ("storage_option", "storage_options"), ("writer_nmae", "writer_name")])
def test_a_misspelt_table_keyword_is_named_with_what_was_meant(tmp_path: Path, keyword: str, meant: str) -> None:
    """It used to reach librdkafka as a setting of that name ('No such configuration property')."""
    with pytest.raises(TypeError) as e:
        Table(tmp_path / "t", "127.0.0.1:9", **{keyword: "x"})
    msg = str(e.value)
    assert f"Table() got an unexpected keyword argument {keyword!r}; did you mean {meant!r}?" in msg, msg
    assert "security.protocol" in msg


def test_a_misspelt_client_keyword_is_named_too() -> None:
    with pytest.raises(TypeError, match=r"CoordinatorClient\(\) got an unexpected keyword argument 'relays'; did you "
                                        r"mean 'relay'\?"):
        CoordinatorClient("127.0.0.1:9", relays="/run/relay.sock")


def test_a_metadata_failure_before_staging_says_nothing_was_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that answers the probe, then fails the partition count (killed and restarting), is a refusal
    before anything was sent: a writer told a raw KafkaException cannot know that a retry is safe (a clean-clone
    CI run's four-writer fault test caught one)."""
    from confluent_kafka import KafkaError, KafkaException

    from deltacoord.schemas import kafka_logs
    from deltacoord.schemas.errors import ProposalNotSentError

    def transport_failure(*_a: object, **_k: object) -> int:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))

    monkeypatch.setattr(kafka_logs, "probe", lambda *_a, **_k: None)
    client = CoordinatorClient("127.0.0.1:9", coordinator_check=False, relay="")
    try:
        monkeypatch.setattr(client, "_partition_count", transport_failure)
        with pytest.raises(ProposalNotSentError, match=r"nothing was sent for table t1: Kafka did not answer .*"
                                                       r"transport failure.*a retry is safe"):
            client.ensure_coordinator("t1")
    finally:
        client.close()


@pytest.mark.parametrize("setting", [{"debug": "broker"}, {"acks": "all"}, {"security.protocol": "PLAINTEXT"}])
def test_kafka_settings_without_a_dot_still_pass(setting: dict[str, str]) -> None:
    """librdkafka's own dotless names (debug, acks) are settings, not misspelt keywords."""
    check_kafka_keywords(CoordinatorClient.__init__, setting)


def test_a_rejection_names_its_reason_code_once() -> None:
    """The coordinator's message already begins with the code; the writer's error used to repeat it."""
    from deltacoord.coordinator.locations import TableLocations
    from deltacoord.schemas.messages import Decision, Outcome
    from deltacoord.writer.transaction import error_from_decision

    refused = TableLocations.of(("s3://lake/tables",), {}, {})._verdict("s3://other/t")
    assert isinstance(refused, Exception)
    d = Decision("s3://other/t", "s3://other/t", "p-1", Outcome.REJECTED, error_type=type(refused).__name__,
                 error_message=str(refused), reason_code=str(refused.reason), decided_at_ms=1)  # type: ignore[attr-defined]
    text = str(error_from_decision(d))
    assert text.startswith("TABLE_OUTSIDE_ROOTS: table s3://other/t") and text.count("TABLE_OUTSIDE_ROOTS") == 1, text


@pytest.mark.parametrize(("text", "says"), [
    ("id =", "= has nothing after it (column 4)"), ("value >", "> has nothing after it (column 7)"),
    ("a AND", "AND has nothing after it (column 5)"), ("x BETWEEN 1", "BETWEEN needs both bounds"),
])
def test_an_incomplete_expression_is_told_in_sql_words_not_the_parsers(text: str, says: str) -> None:
    with pytest.raises(ExpressionError) as e:
        parse(text)
    msg = str(e.value)
    assert says in msg and "sqlglot" not in msg and "<class" not in msg, msg


def test_a_control_character_in_a_table_uri_or_an_action_path_is_refused_before_sending(tmp_path: Path) -> None:
    """The writer refuses what the coordinator would (BAD_TABLE_URI, BAD_FILE_PATH), naming the character, with
    ValueErrors raised before anything is proposed."""
    from deltacoord.schemas.actions import AddFile
    from deltacoord.schemas.errors import BadFilePathError
    from deltacoord.schemas.reasons import ReasonCode
    from deltacoord.writer.transaction import Transaction

    for uri in (f"file://{tmp_path}/ctl\nline", f"{tmp_path}/nel\x85line", f"file://{tmp_path}/c1%C2%9Fx"):
        with pytest.raises(ValueError, match=r"control character, U\+00(0A|85|9F)"):
            Table(uri, "127.0.0.1:9")
    t = Table(tmp_path / "t", "127.0.0.1:9", coordinator_check=False)
    try:
        staged = t.root / "ok.parquet"
        t.root.mkdir()
        staged.write_bytes(b"x")
        tx = Transaction(t, 0)
        tx.stage([AddFile("ok.parquet", {}, 1, 0, True)])
        tx.add(AddFile("ctl\nline.parquet", {}, 1, 0, True))
        with pytest.raises(ValueError) as e:
            tx.commit("WRITE")
        assert isinstance(e.value, BadFilePathError) and e.value.reason == ReasonCode.BAD_FILE_PATH
        assert "'ctl\\nline.parquet' holds a raw control character, U+000A" in str(e.value)
        assert "nothing was sent" in str(e.value)
        assert not tx.proposed and not staged.exists()  # the staged file is deleted, as for any failure before sending
    finally:
        t.close()
