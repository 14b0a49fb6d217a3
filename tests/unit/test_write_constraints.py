"""The write-time rules (`deltacoord.writer.constraints`) and a new table's protocol (`deltacoord.writer.table_protocol`), pure."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from deltacoord.coordinator.rules.table_features import check_constraints_error
from deltacoord.coordinator.rules.validate import proposal_error
from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.schemas.expressions.syntax import ExpressionError
from deltacoord.writer import staging
from deltacoord.writer.constraints import ConstraintViolationError, WriteRules, fill_and_check
from deltacoord.writer.table_protocol import ProtocolRequestError, new_table, with_column_mapping
from tests.unit.builders import Harness, metadata, proposal, protocol

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("s", pa.string(), metadata={"delta.invariants": json.dumps({"expression": {"expression": "s IS NOT NULL"}})}),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("d", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"}),
    pa.field("u", pa.string(), metadata={"delta.generationExpression": "upper(s)"}),
])
TS = dt.datetime(2024, 3, 4, 5, 6, tzinfo=dt.UTC)


GENERATING = Protocol(1, 4)


def _rules(configuration: dict[str, str] | None = None, protocol: Protocol = GENERATING) -> WriteRules:
    md = Metadata(id="t", schema_string=staging.schema_string(SCHEMA), configuration=configuration or {})
    return WriteRules.of(protocol, md)


def _rows(ids: list[int | None], s: list[str | None], **extra: list[object]) -> pa.Table:
    n = len(ids)
    cols = {"id": pa.array(ids, pa.int64()), "s": pa.array(s, pa.string()), "ts": pa.array([TS] * n, SCHEMA.field("ts").type)}
    for f in ("d", "u"):
        cols[f] = pa.array(extra.get(f, [None] * n), SCHEMA.field(f).type)
    return pa.table(cols)


def test_rules_are_read_from_the_schema_and_the_properties() -> None:
    rules = _rules({"delta.constraints.id_positive": "id > 0"})
    assert rules.not_null == (("id",),)
    assert [(c.name, c.expression) for c in rules.checks] == [("EXPRESSION(s IS NOT NULL)", "s IS NOT NULL"),
                                                             ("id_positive", "id > 0")]
    assert [(g.column, g.expression) for g in rules.generated] == [("d", "CAST(ts AS DATE)"), ("u", "upper(s)")]


def test_generation_expressions_need_the_feature() -> None:
    """Without generatedColumns in the protocol Delta ignores the expressions (the columns are ordinary)."""
    assert _rules(protocol=Protocol(1, 3)).generated == ()
    assert len(_rules(protocol=Protocol(1, 7, writer_features=("generatedColumns",))).generated) == 2


def test_generated_columns_are_computed_when_omitted() -> None:
    out = fill_and_check(_rules(), _rows([1, 2], ["a", "b"]), ["id", "s", "ts"])
    assert out.column("d").to_pylist() == [TS.date()] * 2
    assert out.column("u").to_pylist() == ["A", "B"]


def test_a_supplied_generated_column_must_equal_its_expression() -> None:
    ok = _rows([1], ["a"], d=[TS.date()], u=["A"])
    assert fill_and_check(_rules(), ok, ok.column_names).column("u").to_pylist() == ["A"]
    bad = _rows([1], ["a"], d=[TS.date()], u=["x"])
    with pytest.raises(ConstraintViolationError, match=r"CHECK constraint Generated Column \(`u` <=> \(upper\(s\)\)\) "
                                                      r"violated by row with values:\n - s : a\n - u : x") as e:
        fill_and_check(_rules(), bad, bad.column_names)
    assert e.value.constraint == "Generated Column" and e.value.row == {"s": "a", "u": "x"}


def test_not_null_names_the_column() -> None:
    with pytest.raises(ConstraintViolationError, match=r"NOT NULL constraint violated for column: id\.") as e:
        fill_and_check(_rules(), _rows([1, None], ["a", "b"]), ["id", "s", "ts"])
    assert e.value.reason == "CONSTRAINT_VIOLATED"


def test_not_null_fields_of_a_struct_are_checked_where_the_struct_is_there() -> None:
    point = pa.struct([pa.field("x", pa.int64(), nullable=False), pa.field("y", pa.int64())])
    schema = pa.schema([pa.field("p", point)])
    rules = WriteRules.of(Protocol(1, 2), Metadata(id="t", schema_string=staging.schema_string(schema)))
    assert rules.not_null == (("p", "x"),)
    ok = pa.table({"p": pa.array([{"x": 1, "y": None}, None], point)})
    fill_and_check(rules, ok, ["p"])
    bad = pa.table({"p": pa.array([{"x": 1, "y": 2}, {"x": None, "y": 3}], point)})
    with pytest.raises(ConstraintViolationError, match=r"NOT NULL constraint violated for column: p\.x\. 1 written"):
        fill_and_check(rules, bad, ["p"])


def test_an_invariant_is_checked_as_delta_names_it() -> None:
    with pytest.raises(ConstraintViolationError, match=r"CHECK constraint EXPRESSION\(s IS NOT NULL\) \(s IS NOT NULL\) "
                                                      r"violated by row with values:\n - s : None"):
        fill_and_check(_rules(), _rows([1, 2], ["a", None]), ["id", "s", "ts"])


def test_a_check_that_is_null_is_violated_as_in_delta() -> None:
    """Delta's CheckDeltaInvariant fails a row whose CHECK is false or NULL (unlike SQL's WHERE)."""
    rules = _rules({"delta.constraints.short": "length(s) < 3"})
    fill_and_check(rules, _rows([1], ["ab"]), ["id", "s", "ts"])
    with pytest.raises(ConstraintViolationError, match=r"CHECK constraint short \(length\(s\) < 3\) violated by row with "
                                                      r"values:\n - s : abc") as e:
        fill_and_check(rules, _rows([1, 2], ["ab", "abc"]), ["id", "s", "ts"])
    assert e.value.expression == "length(s) < 3"
    nullable = WriteRules.of(Protocol(1, 3), Metadata(id="t", schema_string=staging.schema_string(pa.schema([("x", pa.int64())])),
                                                      configuration={"delta.constraints.x_pos": "x > 0"}))
    with pytest.raises(ConstraintViolationError, match=r"CHECK constraint x_pos \(x > 0\) violated by row with values:\n - x : None"):
        fill_and_check(nullable, pa.table({"x": pa.array([1, None], pa.int64())}), ["x"])


def test_an_expression_this_writer_cannot_evaluate_names_the_constraint() -> None:
    rules = _rules({"delta.constraints.odd": "sha2(s, 256) <> ''"})
    with pytest.raises(ExpressionError, match="CHECK constraint odd cannot be evaluated by this writer"):
        fill_and_check(rules, _rows([1], ["a"]), ["id", "s", "ts"])


def test_a_malformed_invariant_is_a_clear_error() -> None:
    md = Metadata(id="t", schema_string=json.dumps({"type": "struct", "fields": [
        {"name": "s", "type": "string", "nullable": True, "metadata": {"delta.invariants": "s > 1"}}]}))
    with pytest.raises(ExpressionError, match=r"column 's': delta.invariants is not"):
        WriteRules.of(Protocol(1, 2), md)


def _schema(*fields: pa.Field) -> str:
    return staging.schema_string(pa.schema(list(fields)))


PLAIN = _schema(pa.field("id", pa.int64()))


@pytest.mark.parametrize(("schema", "properties", "features", "protocol", "expected"), [
    (PLAIN, {}, [], None, Protocol(1, 2)),
    (PLAIN, {"delta.constraints.a": "id > 0"}, [], None, Protocol(1, 3)),
    (_schema(pa.field("g", pa.int64(), metadata={"delta.generationExpression": "1"})), {}, [], None, Protocol(1, 4)),
    (PLAIN, {"delta.enableChangeDataFeed": "true"}, [], None, Protocol(1, 4)),
    (PLAIN, {"delta.enableDeletionVectors": "true"}, [], None,
     Protocol(3, 7, ("deletionVectors",), ("appendOnly", "invariants", "deletionVectors"))),
    (PLAIN, {"delta.enableInCommitTimestamps": "true"}, [], None,
     Protocol(1, 7, None, ("appendOnly", "invariants", "inCommitTimestamp"))),
    (PLAIN, {}, ["checkConstraints"], None, Protocol(1, 7, None, ("appendOnly", "invariants", "checkConstraints"))),
    (PLAIN, {"delta.feature.domainMetadata": "supported"}, [], None,
     Protocol(1, 7, None, ("appendOnly", "invariants", "domainMetadata"))),
    (PLAIN, {"delta.constraints.a": "id > 0"}, [], Protocol(1, 7, None, ("domainMetadata",)),
     Protocol(1, 7, None, ("domainMetadata", "checkConstraints"))),
    (PLAIN, {"delta.minWriterVersion": "4"}, [], None, Protocol(1, 4)),
])
def test_a_new_tables_protocol(schema: str, properties: dict[str, str], features: list[str], protocol: Protocol | None,
                               expected: Protocol) -> None:
    new = new_table(schema, properties, features, protocol)
    assert new.protocol == expected
    assert not any(k.startswith(("delta.feature.", "delta.min")) for k in new.configuration)


def test_a_bad_protocol_request_is_named() -> None:
    with pytest.raises(ProtocolRequestError, match=r"delta\.feature\.x='no'"):
        new_table(PLAIN, {"delta.feature.x": "no"})
    with pytest.raises(ProtocolRequestError, match="minimum writer version must be from 1 to 7, got 8"):
        new_table(PLAIN, {}, protocol=Protocol(1, 8))


def test_the_coordinator_refuses_check_constraints_without_the_feature() -> None:
    """A metaData action with `delta.constraints.*` needs checkConstraints in the protocol the commit leaves."""
    with_check = proposal(0, [metadata(config={"delta.constraints.id_positive": "id > 0"})], operation="ADD CONSTRAINT")
    for proto in (protocol(1, 2), Protocol(1, 7, None, ("appendOnly", "invariants")), None):
        err = check_constraints_error(proto, with_check)
        assert err is not None and err.reason == "MISSING_TABLE_FEATURE", proto
        assert "id_positive" in str(err) and "checkConstraints writer feature" in str(err)
    for proto in (protocol(1, 3), protocol(1, 6), Protocol(1, 7, None, ("checkConstraints",))):
        assert check_constraints_error(proto, with_check) is None
    assert check_constraints_error(protocol(1, 2), proposal(0, [metadata()])) is None
    h = Harness()
    err = proposal_error(h.state, with_check)
    assert err is not None and err.reason == "MISSING_TABLE_FEATURE"
    assert proposal_error(h.state, proposal(0, [protocol(1, 3), *with_check.actions], operation="ADD CONSTRAINT")) is None


def test_a_column_mapping_table_gets_ids_and_physical_names_at_create() -> None:
    point = pa.struct([pa.field("x", pa.int64())])
    schema_string, config = with_column_mapping(_schema(pa.field("id", pa.int64()), pa.field("p", point)),
                                                {"delta.columnMapping.mode": "name"})
    fields = json.loads(schema_string)["fields"]
    metas = [fields[0]["metadata"], fields[1]["metadata"], fields[1]["type"]["fields"][0]["metadata"]]
    assert [m["delta.columnMapping.id"] for m in metas] == [1, 2, 3]
    assert all(m["delta.columnMapping.physicalName"].startswith("col-") for m in metas)
    assert len({m["delta.columnMapping.physicalName"] for m in metas}) == 3
    assert config == {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "3"}
    assert new_table(schema_string, config).protocol == Protocol(2, 5)
    assert with_column_mapping(PLAIN, {}) == (PLAIN, {})


def test_the_spark_sinks_tasks_apply_the_rules() -> None:
    """Spark executors conform each batch with the table's rules the plan carries (`deltacoord.writer.spark_sink.StagePlan`)."""
    from deltacoord.writer.constraints import Check, Generated
    from deltacoord.writer.spark_sink import StagePlan

    schema = pa.schema([pa.field("id", pa.int64()), pa.field("g", pa.int64())])
    plan = StagePlan("/nowhere", schema, (), rules=WriteRules(checks=(Check("id_positive", "id > 0"),),
                                                              generated=(Generated("g", "id * 2"),)))
    assert plan.conform(pa.table({"id": pa.array([1, 2], pa.int64())})).column("g").to_pylist() == [2, 4]
    with pytest.raises(ConstraintViolationError, match=r"CHECK constraint id_positive \(id > 0\)"):
        plan.conform(pa.table({"id": pa.array([-1], pa.int64())}))
