"""Tests of the Avro wire contract: schemas/avro/*.avsc and schemas/codec.py."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, load_schema, parse_schema, to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltacoord.schemas import codec
from deltacoord.schemas.actions import (
    Action,
    AddCDCFile,
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
from deltacoord.schemas.codec import (
    DECISION_FINGERPRINT,
    DECISION_SCHEMA,
    PROPOSAL_FINGERPRINT,
    PROPOSAL_SCHEMA,
    EncodeError,
    decode_decision,
    decode_proposal,
    encode_decision,
    encode_proposal,
    register_writer_schema,
    unregister_writer_schema,
)
from deltacoord.schemas.errors import DecodeError
from deltacoord.schemas.messages import Decision, FileRead, Outcome, Proposal, StagedActions

AVRO_DIR = Path(codec.__file__).with_name("avro")
FIXTURES = Path(__file__).with_name("fixtures")
NS = "io.deltacoord.v1"

# ---------------------------------------------------------------------------
# Sample values
# ---------------------------------------------------------------------------

STATS = '{"numRecords":3,"minValues":{"id":1,"name":"Zoë"},"maxValues":{"id":9,"name":"日本"},"nullCount":{"id":0}}'
DV_ON_DISK = DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 36, 3, offset=1, max_row_index=41)
DV_INLINE = DeletionVector("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", 40, 6)

ACTIONS: dict[str, Action] = {
    "add-minimal": AddFile("part-0.parquet", {}, 10, 1_700_000_000_000, True),
    "add-full": AddFile(
        "date=2024-01-01/part-0001-ünï.snappy.parquet",
        {"date": "2024-01-01", "country": None, "emoji": "🦆"},
        2**40,
        1_700_000_000_123,
        False,
        stats=STATS,
        tags={"INSERTION_TIME": "1700000000000000", "ZCUBE_ID": ""},
        deletion_vector=DV_ON_DISK,
        base_row_id=0,
        default_row_commit_version=7,
        clustering_provider="liquid",
    ),
    "add-empty-tags-inline-dv": AddFile("p.parquet", {"k": ""}, 0, 0, True, tags={}, deletion_vector=DV_INLINE),
    "remove-minimal": RemoveFile("part-0.parquet", None, True),
    "remove-full": RemoveFile(
        "date=2024-01-01/part-0001.parquet",
        1_700_000_000_999,
        True,
        extended_file_metadata=True,
        partition_values={"date": "2024-01-01", "country": None},
        size=123,
        stats=STATS,
        tags={"a": "b"},
        deletion_vector=DV_ON_DISK,
        base_row_id=10,
        default_row_commit_version=2,
    ),
    "remove-empty-maps": RemoveFile("x.parquet", 5, False, extended_file_metadata=False, partition_values={}, tags={}),
    "cdc": AddCDCFile("_change_data/cdc-0.parquet", {"date": None}, 77),
    "cdc-full": AddCDCFile("_change_data/cdc-1.parquet", {}, 78, data_change=True, tags={"t": "v"}),
    "metadata-minimal": Metadata("0b6c-uuid", '{"type":"struct","fields":[]}'),
    "metadata-full": Metadata(
        "1c9d-uuid",
        '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}',
        partition_columns=("date", "country"),
        configuration={"delta.enableChangeDataFeed": "true", "comment": "ünïcödé"},
        name="events",
        description="all the events",
        format_provider="parquet",
        format_options={"compression": "zstd"},
        created_time=1_700_000_000_000,
    ),
    "protocol-legacy": Protocol(1, 2),
    "protocol-features": Protocol(
        3, 7, reader_features=("deletionVectors",), writer_features=("deletionVectors", "rowTracking")
    ),
    "protocol-empty-features": Protocol(3, 7, reader_features=(), writer_features=()),
    "txn": SetTransaction("stream-42", 9, last_updated=1_700_000_000_000),
    "txn-minimal": SetTransaction("app", -1),
    "domain": DomainMetadata("delta.clustering", '{"clusteringColumns":[["id"]]}'),
    "domain-removed": DomainMetadata("user.x", "", removed=True),
    "commit-info": CommitInfo(
        {
            "timestamp": 1_700_000_000_000,
            "inCommitTimestamp": 1_700_000_000_001,
            "operation": "MERGE",
            "operationParameters": {"predicate": '["(id = 1)"]', "matchedPredicates": '[{"actionType":"update"}]'},
            "readVersion": 4,
            "isolationLevel": "WriteSerializable",
            "isBlindAppend": False,
            "operationMetrics": {"numTargetRowsUpdated": "1"},
            "engineInfo": "Apache-Spark/4.2.0 Delta-Lake/4.4.0",
            "txnId": "a7f5-üñí",
            "nested": {"z": [1, 2.5, None, True, {"deep": "日本"}], "a": -0.0, "big": 2**70},
        }
    ),
}

# Sentinels that survive a round trip but are easy to get wrong.
NONE_VS_EMPTY: list[tuple[Action, str, Any]] = [
    (ACTIONS["add-minimal"], "tags", None),
    (ACTIONS["add-empty-tags-inline-dv"], "tags", {}),
    (ACTIONS["remove-minimal"], "partition_values", None),
    (ACTIONS["remove-empty-maps"], "partition_values", {}),
    (ACTIONS["protocol-legacy"], "reader_features", None),
    (ACTIONS["protocol-empty-features"], "reader_features", ()),
]

COMMIT_INFO = CommitInfo({"timestamp": 1_700_000_000_000, "operation": "WRITE", "isBlindAppend": True, "txnId": "p-1"})


def make_proposal(*actions: Action, **overrides: Any) -> Proposal:
    fields: dict[str, Any] = {
        "table_id": "tbl-1",
        "table_uri": "s3://bucket/tables/events",
        "proposal_id": "p-1",
        "read_version": 4,
        "operation": "WRITE",
        "changes_data": True,
        "actions": actions or (ACTIONS["add-minimal"],),
        "commit_info": COMMIT_INFO,
    }
    fields.update(overrides)
    return Proposal(**fields)


FULL_PROPOSAL = make_proposal(
    *(a for a in ACTIONS.values() if not isinstance(a, CommitInfo)),
    commit_info=ACTIONS["commit-info"],
    read_predicates=("date = '2024-01-01'", "country IS NULL"),
    read_files=(FileRead("date=2024-01-01/a.parquet", {"date": "2024-01-01", "c": None}), FileRead("b.parquet")),
    read_whole_table=True,
    read_app_ids=("stream-42", "stream-43"),
    writer="deltacoord-writer/0.1 host=ü",
    operation_parameters={"mode": "Append", "partitionBy": '["date"]'},
)
COMMITTED = Decision(
    "tbl-1",
    "s3://bucket/tables/events",
    "p-1",
    Outcome.COMMITTED,
    version=5,
    actions=(ACTIONS["commit-info"], ACTIONS["add-full"], ACTIONS["remove-full"]),
    decided_at_ms=1_700_000_000_500,
)
REJECTED = Decision(
    "tbl-1",
    "s3://bucket/tables/events",
    "p-2",
    Outcome.REJECTED,
    error_type="ConcurrentAppendException",
    error_message="Files were added to the partition [date=2024-01-01] by a concurrent update (WRITE at version 5).",
    reason_code=None,
    winning_version=5,
)
DUPLICATE = Decision("t", "u", "p-1", Outcome.COMMITTED, version=5, duplicate_of=5, actions=(COMMIT_INFO,))
INVALID = Decision("t", "u", "p-3", Outcome.REJECTED, reason_code="PATH_ESCAPES_TABLE", error_message="../x")


def single_object(schema: Any, record: dict[str, Any]) -> bytes:
    """Encode `record` with fastavro directly, as an independent writer would."""
    parsed = parse_schema(schema)
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
    out = io.BytesIO()
    out.write(b"\xc3\x01" + fp)
    fastavro.schemaless_writer(out, parsed, record)
    return out.getvalue()


def body_record(data: bytes, schema: Any) -> dict[str, Any]:
    record = fastavro.schemaless_reader(io.BytesIO(data[10:]), schema, None, True, True)
    assert isinstance(record, dict)
    return record


def canonical_json(schema: Any) -> Any:
    """A mutable, self-contained copy of a schema (its parsing canonical form)."""
    return json.loads(to_parsing_canonical_form(schema))


@pytest.fixture
def registered() -> Iterator[Callable[[str, Any], bytes]]:
    """Register writer schemas for one test only."""
    added: list[bytes] = []

    def register(message: str, schema: Any) -> bytes:
        fp = register_writer_schema(message, schema)  # type: ignore[arg-type]
        added.append(fp)
        return fp

    yield register
    for fp in added:
        if fp not in (PROPOSAL_FINGERPRINT, DECISION_FINGERPRINT):
            unregister_writer_schema(fp)


# ---------------------------------------------------------------------------
# The .avsc files
# ---------------------------------------------------------------------------


def _avsc_files() -> list[Path]:
    return sorted(AVRO_DIR.glob("*.avsc"))


def _avsc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((AVRO_DIR / f"{NS}.{name}.avsc").read_text(encoding="utf-8"))
    return data


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.capitalize() for p in rest)


def test_only_avsc_files_in_schema_dir() -> None:
    assert {p.suffix for p in AVRO_DIR.iterdir() if p.is_file()} == {".avsc"}


@pytest.mark.parametrize("path", _avsc_files(), ids=lambda p: p.name)
def test_avsc_is_one_documented_named_type(path: Path) -> None:
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(schema, dict)
    assert schema["namespace"] == NS
    assert path.name == f"{NS}.{schema['name']}.avsc"
    assert schema["type"] in ("record", "enum")
    assert schema["doc"].strip()
    for f in schema.get("fields", []):
        assert f.get("doc", "").strip(), f"{schema['name']}.{f['name']} has no doc"
        # Nested types are references by full name, never inline definitions.
        assert "name" not in json.dumps(f["type"]), f"{schema['name']}.{f['name']} defines a nested named type"


def test_every_avsc_is_loaded_in_dependency_order() -> None:
    used = {name for files in codec._SCHEMA_FILES.values() for name in files}
    assert {p.name for p in _avsc_files()} == {f"{NS}.{n}.avsc" for n in used}
    for files in codec._SCHEMA_FILES.values():
        for i, name in enumerate(files):
            refs = set(re.findall(rf'"{re.escape(NS)}\.(\w+)"', json.dumps(_avsc(name))))
            assert refs <= set(files[:i]), f"{name} references {refs - set(files[:i])} before loading them"


def test_named_schemas_load_with_parse_schema() -> None:
    named: dict[str, Any] = {}
    for name in codec._SCHEMA_FILES["CommitProposal"]:
        parse_schema(_avsc(name), named_schemas=named)
    assert f"{NS}.CommitProposal" in named


MAPPED: list[tuple[type, str, dict[str, str]]] = [
    (DeletionVector, "DeletionVectorDescriptor", {}),
    (AddFile, "AddFile", {}),
    (RemoveFile, "RemoveFile", {}),
    (AddCDCFile, "AddCDCFile", {}),
    (Metadata, "Metadata", {}),
    (Protocol, "Protocol", {}),
    (SetTransaction, "SetTransaction", {}),
    (DomainMetadata, "DomainMetadata", {}),
    (CommitInfo, "CommitInfo", {"values": "valuesJson"}),
    (FileRead, "FileRead", {}),
    (StagedActions, "StagedActions", {}),
    (Proposal, "CommitProposal", {"staged": "stagedActions"}),
    (Decision, "CommitDecision", {"staged": "stagedCommit"}),
]


@pytest.mark.parametrize(("cls", "record", "renamed"), MAPPED, ids=[m[1] for m in MAPPED])
def test_avro_fields_map_dataclass_fields_exactly(cls: type, record: str, renamed: dict[str, str]) -> None:
    """Same fields in the same order, no more, no less.

    Nullable fields are ["null", X] with default null; other fields have an
    Avro default exactly when the dataclass has one.
    """
    fields = {f["name"]: f for f in _avsc(record)["fields"]}
    dc_fields = dataclasses.fields(cls)
    assert list(fields) == [renamed.get(f.name, _camel(f.name)) for f in dc_fields]
    for f in dc_fields:
        avro = fields[renamed.get(f.name, _camel(f.name))]
        where = f"{record}.{avro['name']}"
        nullable = "None" in str(f.type)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert ("default" in avro) == (has_default or nullable), where
        assert isinstance(avro["type"], list) == nullable, where
        if nullable:
            assert avro["type"][0] == "null" and len(avro["type"]) == 2 and avro["default"] is None, where
            assert f.default in (None, dataclasses.MISSING), where
        elif f.default is not dataclasses.MISSING:
            default = f.default.value if isinstance(f.default, Outcome) else f.default
            assert avro["default"] == (list(default) if isinstance(default, tuple) else default)


def test_outcome_enum_matches_python_enum() -> None:
    schema = _avsc("Outcome")
    assert schema["type"] == "enum"
    assert schema["symbols"] == [o.value for o in Outcome]
    assert "default" not in schema


def test_action_union_covers_every_action_class() -> None:
    branches = _avsc("Action")["fields"][0]["type"]
    assert branches == [f"{NS}.{cls.__name__}" for cls in codec._ACTION_WRITERS]
    assert set(codec._ACTION_READERS) == set(branches)


@pytest.mark.parametrize(
    ("schema", "fp"),
    [(PROPOSAL_SCHEMA, PROPOSAL_FINGERPRINT), (DECISION_SCHEMA, DECISION_FINGERPRINT)],
    ids=["proposal", "decision"],
)
def test_canonical_form_is_self_contained(schema: Any, fp: bytes) -> None:
    """Every named type is defined before use, so other Avro implementations parse it alone."""
    canonical = to_parsing_canonical_form(schema)
    reparsed = parse_schema(json.loads(canonical), named_schemas={})
    assert to_parsing_canonical_form(reparsed) == canonical
    assert codec.schema_fingerprint(reparsed) == fp


# ---------------------------------------------------------------------------
# Single-object encoding: byte layout
# ---------------------------------------------------------------------------


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO (Rabin) as written in the Avro specification."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


def test_crc64_reference_vector() -> None:
    # Avro's own test vector: fingerprint64("null") == 7195948357588979594 (as a signed Java long).
    assert crc64_avro(b'"null"') == 7195948357588979594
    assert fingerprint('"null"', "CRC-64-AVRO") == (7195948357588979594).to_bytes(8, "little").hex()


@pytest.mark.parametrize(
    ("encode", "obj", "message", "schema"),
    [
        (encode_proposal, FULL_PROPOSAL, "CommitProposal", ("FileRead", "CommitProposal")),
        (encode_decision, COMMITTED, "CommitDecision", ("Outcome", "CommitDecision")),
    ],
    ids=["proposal", "decision"],
)
def test_single_object_layout(encode: Callable[[Any], bytes], obj: Any, message: str, schema: tuple[str, ...]) -> None:
    data = encode(obj)
    assert data[:2] == b"\xc3\x01"
    # Independent load: fastavro's FlatDictRepository resolves references by <full name>.avsc.
    independent = load_schema(str(AVRO_DIR / f"{NS}.{message}.avsc"))
    canonical = to_parsing_canonical_form(independent)
    assert data[2:10] == bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    assert data[2:10] == crc64_avro(canonical.encode()).to_bytes(8, "little")
    # The body is plain Avro binary: fastavro alone reads it and re-encodes it identically.
    record = body_record(data, independent)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, independent, record)
    assert out.getvalue() == data[10:]


def test_proposal_and_decision_fingerprints_differ() -> None:
    assert PROPOSAL_FINGERPRINT != DECISION_FINGERPRINT
    assert encode_proposal(make_proposal())[2:10] == PROPOSAL_FINGERPRINT
    assert encode_decision(REJECTED)[2:10] == DECISION_FINGERPRINT


def test_commit_info_travels_as_compact_json_text() -> None:
    data = encode_proposal(make_proposal(commit_info=ACTIONS["commit-info"]))
    text = body_record(data, PROPOSAL_SCHEMA)["commitInfo"]["valuesJson"]
    assert text == json.dumps(dict(ACTIONS["commit-info"].values), separators=(",", ":"), ensure_ascii=False)  # type: ignore[union-attr]
    assert "日本" in text


# ---------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ACTIONS))
def test_every_action_round_trips_in_a_decision(name: str) -> None:
    action = ACTIONS[name]
    decision = dataclasses.replace(COMMITTED, actions=(COMMIT_INFO, action))
    back = decode_decision(encode_decision(decision))
    assert back == decision
    assert type(back.actions[1]) is type(action)
    # The Delta commit file is byte-identical.
    assert commit_to_json_lines(back.actions) == commit_to_json_lines(decision.actions)


@pytest.mark.parametrize("name", [n for n, a in ACTIONS.items() if not isinstance(a, CommitInfo)])
def test_every_action_round_trips_in_a_proposal(name: str) -> None:
    proposal = make_proposal(ACTIONS[name])
    assert decode_proposal(encode_proposal(proposal)) == proposal


@pytest.mark.parametrize(("action", "attr", "expected"), NONE_VS_EMPTY)
def test_none_and_empty_stay_distinct(action: Action, attr: str, expected: Any) -> None:
    back = decode_decision(encode_decision(dataclasses.replace(COMMITTED, actions=(action,)))).actions[0]
    value = getattr(back, attr)
    assert value == expected
    assert (value is None) == (expected is None)


def test_deletion_vector_descriptor_round_trips() -> None:
    back = decode_proposal(encode_proposal(make_proposal(ACTIONS["add-full"], ACTIONS["add-empty-tags-inline-dv"])))
    first, second = back.actions
    assert isinstance(first, AddFile) and isinstance(second, AddFile)
    assert first.deletion_vector == DV_ON_DISK
    assert first.key() == ACTIONS["add-full"].key()  # type: ignore[union-attr]
    assert second.deletion_vector == DV_INLINE
    assert second.deletion_vector is not None and second.deletion_vector.offset is None


def test_full_proposal_round_trips() -> None:
    back = decode_proposal(encode_proposal(FULL_PROPOSAL))
    assert back == FULL_PROPOSAL
    assert isinstance(back.actions, tuple) and isinstance(back.read_files, tuple)
    assert isinstance(back.read_predicates, tuple) and isinstance(back.read_app_ids, tuple)
    assert back.read_files[1].partition_values == {}
    assert back.is_blind_append == FULL_PROPOSAL.is_blind_append


def test_minimal_proposal_round_trips_with_defaults() -> None:
    proposal = make_proposal(read_version=-1, changes_data=False)
    back = decode_proposal(encode_proposal(proposal))
    assert back == proposal
    assert back.writer is None and back.operation_parameters == {} and back.read_files == ()


@pytest.mark.parametrize(
    "decision", [COMMITTED, REJECTED, DUPLICATE, INVALID], ids=["committed", "rejected", "duplicate", "invalid"]
)
def test_decisions_round_trip(decision: Decision) -> None:
    back = decode_decision(encode_decision(decision))
    assert back == decision
    assert back.outcome is decision.outcome


def test_commit_info_round_trips_byte_for_byte() -> None:
    info = ACTIONS["commit-info"]
    back = decode_decision(encode_decision(dataclasses.replace(COMMITTED, actions=(info,)))).actions[0]
    assert isinstance(back, CommitInfo)
    assert list(back.values) == list(info.values)  # type: ignore[union-attr]
    assert commit_to_json_lines([back]) == commit_to_json_lines([info])
    assert back.txn_id == "a7f5-üñí" and back.operation == "MERGE" and back.in_commit_timestamp == 1_700_000_000_001


def test_decode_accepts_bytes_like() -> None:
    data = encode_proposal(FULL_PROPOSAL)
    assert decode_proposal(bytearray(data)) == FULL_PROPOSAL  # type: ignore[arg-type]
    assert decode_proposal(memoryview(data)) == FULL_PROPOSAL  # type: ignore[arg-type]


def test_encoding_is_deterministic() -> None:
    assert encode_proposal(FULL_PROPOSAL) == encode_proposal(decode_proposal(encode_proposal(FULL_PROPOSAL)))
    assert encode_decision(COMMITTED) == encode_decision(decode_decision(encode_decision(COMMITTED)))


# ---------------------------------------------------------------------------
# Property-based round trips
# ---------------------------------------------------------------------------

longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=12)
opt = st.none
str_maps = st.dictionaries(texts, texts, max_size=3)
partition_values = st.dictionaries(texts, st.none() | texts, max_size=3)
dvs = st.builds(DeletionVector, texts, texts, longs, longs, opt() | longs, opt() | longs)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)
commit_infos = st.builds(CommitInfo, st.dictionaries(texts, json_values, max_size=5))
actions = st.one_of(
    st.builds(
        AddFile,
        texts,
        partition_values,
        longs,
        longs,
        st.booleans(),
        opt() | texts,
        opt() | str_maps,
        opt() | dvs,
        opt() | longs,
        opt() | longs,
        opt() | texts,
    ),
    st.builds(
        RemoveFile,
        texts,
        opt() | longs,
        st.booleans(),
        opt() | st.booleans(),
        opt() | partition_values,
        opt() | longs,
        opt() | texts,
        opt() | str_maps,
        opt() | dvs,
        opt() | longs,
        opt() | longs,
    ),
    st.builds(AddCDCFile, texts, partition_values, longs, st.booleans(), opt() | str_maps),
    st.builds(
        Metadata,
        texts,
        texts,
        st.lists(texts, max_size=3).map(tuple),
        str_maps,
        opt() | texts,
        opt() | texts,
        texts,
        str_maps,
        opt() | longs,
    ),
    st.builds(
        Protocol,
        longs,
        longs,
        opt() | st.lists(texts, max_size=3).map(tuple),
        opt() | st.lists(texts, max_size=3).map(tuple),
    ),
    st.builds(SetTransaction, texts, longs, opt() | longs),
    st.builds(DomainMetadata, texts, texts, st.booleans()),
    commit_infos,
)
proposals = st.builds(
    Proposal,
    texts,
    texts,
    texts,
    longs,
    texts,
    st.booleans(),
    st.lists(actions, max_size=4).map(tuple),
    commit_infos,
    st.lists(texts, max_size=3).map(tuple),
    st.lists(st.builds(FileRead, texts, partition_values), max_size=3).map(tuple),
    st.booleans(),
    st.lists(texts, max_size=3).map(tuple),
    opt() | texts,
    str_maps,
)
decisions = st.builds(
    Decision,
    texts,
    texts,
    texts,
    st.sampled_from(Outcome),
    opt() | longs,
    st.lists(actions, max_size=4).map(tuple),
    opt() | texts,
    opt() | texts,
    opt() | texts,
    opt() | longs,
    opt() | longs,
    longs,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(proposals)
def test_random_proposals_round_trip(proposal: Proposal) -> None:
    back = decode_proposal(encode_proposal(proposal))
    assert back == proposal
    assert commit_to_json_lines([back.commit_info, *back.actions]) == commit_to_json_lines(
        [proposal.commit_info, *proposal.actions]
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decisions)
def test_random_decisions_round_trip(decision: Decision) -> None:
    back = decode_decision(encode_decision(decision))
    assert back == decision
    assert commit_to_json_lines(back.actions) == commit_to_json_lines(decision.actions)


# ---------------------------------------------------------------------------
# Rejections
# ---------------------------------------------------------------------------

VALID = encode_proposal(make_proposal(ACTIONS["add-full"]))


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b"", "too short: 0 byte"),
        (b"\xc3", "too short: 1 byte"),
        (b"\xc3\x01", "too short: 2 byte"),
        (VALID[:9], "too short: 9 byte"),
        (VALID[:10], "too short: 10 byte"),
        (b'{"tableId":"t"}', r"not Avro single-object encoded: marker is '7b22'"),
        (
            b"\x00\x00\x00\x00\x07" + VALID[10:],
            r"not Avro single-object encoded: marker is '0000'",
        ),  # Confluent framing
        (b"\xc3\x02" + VALID[2:], r"marker is 'c302'"),
        (b"\x01", "not Avro single-object encoded"),
    ],
    ids=[
        "empty",
        "one-byte",
        "marker-only",
        "9-bytes",
        "header-only",
        "json",
        "confluent",
        "marker-version",
        "bad-first-byte",
    ],
)
def test_rejects_bad_framing(data: bytes, pattern: str) -> None:
    with pytest.raises(DecodeError, match=pattern):
        decode_proposal(data)


def test_rejects_non_bytes() -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        decode_proposal(None)  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="expected bytes, got str"):
        decode_decision("c301")  # type: ignore[arg-type]


def test_rejects_unknown_fingerprint_and_shows_it_in_hex() -> None:
    data = b"\xc3\x01" + bytes.fromhex("0123456789abcdef") + VALID[10:]
    with pytest.raises(DecodeError, match=r"unknown writer schema fingerprint 0123456789abcdef") as e:
        decode_proposal(data)
    assert PROPOSAL_FINGERPRINT.hex() in str(e.value)


def test_rejects_the_other_message_type() -> None:
    with pytest.raises(DecodeError, match="written with a CommitProposal schema"):
        decode_decision(VALID)
    with pytest.raises(DecodeError, match="written with a CommitDecision schema"):
        decode_proposal(encode_decision(COMMITTED))


def test_rejects_every_truncation() -> None:
    for n in range(11, len(VALID)):
        with pytest.raises(DecodeError, match="truncated") as e:
            decode_proposal(VALID[:n])
        assert "while reading CommitProposal." in str(e.value)


def test_truncation_names_the_field() -> None:
    proposal = make_proposal(table_id="x" * 50)
    with pytest.raises(DecodeError, match=r"truncated: a string of length 50 .* while reading CommitProposal\.tableId"):
        decode_proposal(encode_proposal(proposal)[:30])


def test_rejects_trailing_bytes() -> None:
    with pytest.raises(DecodeError, match=r"3 trailing byte\(s\) after the body"):
        decode_proposal(VALID + b"\x00\x00\x00")


def test_rejects_garbage_body() -> None:
    with pytest.raises(DecodeError, match="does not decode") as e:
        decode_proposal(VALID[:10] + b"\xff" * 40)
    assert "garbage" in str(e.value)


def test_rejects_invalid_utf8_and_names_the_field() -> None:
    record = body_record(VALID, PROPOSAL_SCHEMA)
    record["operation"] = "WRITE"
    data = single_object(PROPOSAL_SCHEMA, record)
    bad = data.replace(b"WRITE", b"WR\xffTE")
    with pytest.raises(DecodeError, match=r"invalid UTF-8 .* CommitProposal\.operation"):
        decode_proposal(bad)


def test_rejects_union_branch_out_of_range() -> None:
    data = encode_proposal(make_proposal(ACTIONS["txn-minimal"]))
    empty = encode_proposal(make_proposal(actions=()))
    pos = next(i for i in range(10, len(data)) if data[i] != empty[i])  # the action array's block count
    assert data[pos : pos + 2] == b"\x02\x0a"  # one item; branch 5 (SetTransaction), zigzag-encoded
    bad = data[: pos + 1] + b"\x10" + data[pos + 2 :]  # branch 8: the union has 0..7
    with pytest.raises(
        DecodeError, match=r"union branch index 8 out of range 0\.\.7 .* CommitProposal\.actions\[0\]\.action"
    ):
        decode_proposal(bad)


def test_rejects_enum_symbol_out_of_range() -> None:
    data = encode_decision(REJECTED)
    record = body_record(data, DECISION_SCHEMA)
    prefix = single_object(DECISION_SCHEMA, {**record, "outcome": "COMMITTED"})
    # The enum index follows the three strings: REJECTED is index 1 (0x02); write 5 (0x0a).
    pos = next(i for i in range(10, len(data)) if data[i] != prefix[i])
    assert data[pos] == 0x02 and prefix[pos] == 0x00
    with pytest.raises(DecodeError, match=r"enum index 5 out of range .* CommitDecision\.outcome"):
        decode_decision(data[:pos] + b"\x0a" + data[pos + 1 :])


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[1, 2]", "must be a JSON object, got list"),
        ("{", "not valid JSON"),
        ('"x"', "must be a JSON object, got str"),
        ("[" * 100_000, "not valid JSON"),
    ],
    ids=["list", "broken", "string", "deep"],
)
def test_rejects_commit_info_that_is_not_a_json_object(text: str, pattern: str) -> None:
    record = body_record(VALID, PROPOSAL_SCHEMA)
    record["commitInfo"] = {"valuesJson": text}
    with pytest.raises(DecodeError, match=pattern):
        decode_proposal(single_object(PROPOSAL_SCHEMA, record))
    # Inside the action list the message names the action.
    decision = body_record(encode_decision(COMMITTED), DECISION_SCHEMA)
    decision["actions"][0] = {"action": (f"{NS}.CommitInfo", {"valuesJson": text})}
    with pytest.raises(DecodeError, match=r"actions\[0\]: commitInfo\.valuesJson"):
        decode_decision(single_object(DECISION_SCHEMA, decision))


def test_conversion_rejects_a_union_branch_that_is_not_a_known_action(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(codec._ACTION_READERS, f"{NS}.DomainMetadata")
    data = encode_proposal(make_proposal(ACTIONS["add-minimal"], ACTIONS["domain"]))
    with pytest.raises(
        DecodeError,
        match=r"actions\[1\]: union branch 'io\.deltacoord\.v1\.DomainMetadata' is not a known Delta action",
    ):
        decode_proposal(data)


def test_rejects_writer_schema_missing_a_required_field(registered: Callable[[str, Any], bytes]) -> None:
    """A writer schema without readVersion (no default) cannot be read: the error names the field."""
    writer = canonical_json(PROPOSAL_SCHEMA)
    writer["fields"] = [f for f in writer["fields"] if f["name"] != "readVersion"]
    registered("CommitProposal", writer)
    record = body_record(VALID, PROPOSAL_SCHEMA)
    del record["readVersion"]
    with pytest.raises(
        DecodeError, match=r"CommitProposal\.readVersion: required field \(long, no default\) is missing"
    ):
        decode_proposal(single_object(writer, record))


def test_rejects_writer_schema_with_a_field_of_the_wrong_type(registered: Callable[[str, Any], bytes]) -> None:
    writer = canonical_json(PROPOSAL_SCHEMA)
    add = writer["fields"][6]["type"]["items"]["fields"][0]["type"][0]
    assert add["name"] == f"{NS}.AddFile"
    next(f for f in add["fields"] if f["name"] == "size")["type"] = "string"
    registered("CommitProposal", writer)
    record = body_record(VALID, PROPOSAL_SCHEMA)
    record["actions"][0]["action"][1]["size"] = "1234"
    with pytest.raises(
        DecodeError,
        match=r"CommitProposal\.actions\[\]\.action<AddFile>\.size: wrong type: the writer has string, the reader needs long",
    ):
        decode_proposal(single_object(writer, record))


def test_rejects_a_newer_writers_unknown_action_but_reads_its_known_ones(
    registered: Callable[[str, Any], bytes],
) -> None:
    writer = canonical_json(PROPOSAL_SCHEMA)
    union = writer["fields"][6]["type"]["items"]["fields"][0]["type"]
    union.append({"type": "record", "name": f"{NS}.Sidecar", "fields": [{"name": "path", "type": "string"}]})
    registered("CommitProposal", writer)
    record = body_record(VALID, PROPOSAL_SCHEMA)
    assert decode_proposal(single_object(writer, record)) == decode_proposal(VALID)
    record["actions"].append({"action": (f"{NS}.Sidecar", {"path": "_sidecars/x.parquet"})})
    with pytest.raises(
        DecodeError, match=r"union branch record Sidecar has no counterpart .* CommitProposal\.actions\[1\]\.action"
    ):
        decode_proposal(single_object(writer, record))


def test_rejects_a_newer_writers_unknown_outcome(registered: Callable[[str, Any], bytes]) -> None:
    writer = canonical_json(DECISION_SCHEMA)
    outcome = next(f for f in writer["fields"] if f["name"] == "outcome")["type"]
    outcome["symbols"].append("DEFERRED")
    registered("CommitDecision", writer)
    record = body_record(encode_decision(REJECTED), DECISION_SCHEMA)
    assert decode_decision(single_object(writer, record)) == REJECTED
    record["outcome"] = "DEFERRED"
    with pytest.raises(
        DecodeError, match=r"enum symbol 'DEFERRED' is unknown to the reader .* CommitDecision\.outcome"
    ):
        decode_decision(single_object(writer, record))


def test_register_rejects_misuse(registered: Callable[[str, Any], bytes]) -> None:
    assert registered("CommitProposal", canonical_json(PROPOSAL_SCHEMA)) == PROPOSAL_FINGERPRINT
    with pytest.raises(ValueError, match="already registered for CommitProposal"):
        register_writer_schema("CommitDecision", canonical_json(PROPOSAL_SCHEMA))
    with pytest.raises(ValueError, match="unknown message"):
        register_writer_schema("Nope", canonical_json(PROPOSAL_SCHEMA))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="current schema"):
        unregister_writer_schema(PROPOSAL_FINGERPRINT)


# ---------------------------------------------------------------------------
# Encoding rejections
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"size": "12"}, r"AddFile\.size is <12> of type <class 'str'> expected long"),
        ({"size": 5.5}, r"AddFile\.size is <5\.5>"),
        ({"size": 2**63}, r"AddFile\.size"),
        ({"data_change": "yes"}, r"AddFile\.dataChange .* expected boolean"),
        ({"path": None}, r"AddFile\.path"),
        ({"partition_values": {"k": 1}}, "partitionValues"),
        ({"path": "\ud800"}, "surrogates not allowed"),
    ],
)
def test_encode_rejects_wrong_types(change: dict[str, Any], pattern: str) -> None:
    bad = dataclasses.replace(ACTIONS["add-minimal"], **change)
    with pytest.raises(EncodeError, match=pattern):
        encode_proposal(make_proposal(bad))


def test_encode_rejects_non_actions_and_bad_commit_info() -> None:
    with pytest.raises(EncodeError, match=r"actions\[0\] is not a Delta action: str"):
        encode_proposal(make_proposal("add"))  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="not JSON-serialisable"):
        encode_proposal(make_proposal(commit_info=CommitInfo({"s": {1, 2}})))
    with pytest.raises(EncodeError, match="must be an Outcome"):
        encode_decision(dataclasses.replace(REJECTED, outcome="REJECTED"))  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="expected a Proposal"):
        encode_proposal(COMMITTED)  # type: ignore[arg-type]
    assert isinstance(EncodeError("x"), ValueError)


# ---------------------------------------------------------------------------
# Schema evolution
# ---------------------------------------------------------------------------

V0_SCHEMA = json.loads((FIXTURES / "CommitProposal.v0.avsc").read_text(encoding="utf-8"))


def v0_record() -> dict[str, Any]:
    return {
        "tableId": "tbl-0",
        "tableUri": "file:///tmp/t0",
        "proposalId": "p-0",
        "readVersion": 11,
        "operation": "DELETE",
        "changesData": True,
        "actions": [
            {
                "action": (
                    f"{NS}.AddFile",
                    {
                        "path": "a.parquet",
                        "partitionValues": {"d": None},
                        "size": 5,
                        "modificationTime": 6,
                        "dataChange": True,
                        "stats": STATS,
                        "tags": None,
                    },
                )
            },
            {
                "action": (
                    f"{NS}.RemoveFile",
                    {
                        "path": "b.parquet",
                        "deletionTimestamp": 7,
                        "dataChange": True,
                        "extendedFileMetadata": True,
                        "partitionValues": {"d": "x"},
                        "size": 8,
                        "tags": {},
                    },
                )
            },
            {
                "action": (
                    f"{NS}.Metadata",
                    {
                        "id": "m",
                        "schemaString": "{}",
                        "partitionColumns": ["d"],
                        "configuration": {"k": "v"},
                        "formatProvider": "parquet",
                    },
                )
            },
            {
                "action": (
                    f"{NS}.Protocol",
                    {"minReaderVersion": 1, "minWriterVersion": 2, "readerFeatures": None, "writerFeatures": None},
                )
            },
            {"action": (f"{NS}.SetTransaction", {"appId": "app", "version": 3, "lastUpdated": None})},
        ],
        "commitInfo": {"valuesJson": '{"timestamp":1,"operation":"DELETE","txnId":"p-0"}'},
        "readPredicates": ["d = 'x'"],
        "readFiles": [{"path": "b.parquet"}],
    }


def test_older_writer_decodes_with_defaults(registered: Callable[[str, Any], bytes]) -> None:
    data = single_object(V0_SCHEMA, v0_record())
    with pytest.raises(DecodeError, match="unknown writer schema fingerprint"):
        decode_proposal(data)  # not known until registered
    fp = registered("CommitProposal", json.dumps(V0_SCHEMA))
    assert data[2:10] == fp != PROPOSAL_FINGERPRINT
    assert codec.known_writer_schemas()[fp].incompatibility is None

    p = decode_proposal(data)
    assert p == Proposal(
        table_id="tbl-0",
        table_uri="file:///tmp/t0",
        proposal_id="p-0",
        read_version=11,
        operation="DELETE",
        changes_data=True,
        actions=(
            AddFile("a.parquet", {"d": None}, 5, 6, True, stats=STATS),
            RemoveFile("b.parquet", 7, True, extended_file_metadata=True, partition_values={"d": "x"}, size=8, tags={}),
            Metadata("m", "{}", partition_columns=("d",), configuration={"k": "v"}),
            Protocol(1, 2),
            SetTransaction("app", 3),
        ),
        commit_info=CommitInfo({"timestamp": 1, "operation": "DELETE", "txnId": "p-0"}),
        read_predicates=("d = 'x'",),
        read_files=(FileRead("b.parquet", {}),),
    )
    # Fields the old writer did not have take the reader's defaults.
    assert p.read_whole_table is False and p.read_app_ids == () and p.writer is None and p.operation_parameters == {}
    add = p.actions[0]
    assert (
        isinstance(add, AddFile)
        and add.deletion_vector is None
        and add.base_row_id is None
        and add.clustering_provider is None
    )
    assert isinstance(p.actions[3], Protocol) and type(p.actions[3].min_reader_version) is int  # int promoted to long
    # A re-encode uses the current schema.
    assert encode_proposal(p)[2:10] == PROPOSAL_FINGERPRINT


def test_older_writer_truncated_still_raises_decode_error(registered: Callable[[str, Any], bytes]) -> None:
    registered("CommitProposal", V0_SCHEMA)
    data = single_object(V0_SCHEMA, v0_record())
    for n in range(11, len(data)):
        with pytest.raises(DecodeError):
            decode_proposal(data[:n])


def test_newer_writer_with_an_extra_field_is_read(registered: Callable[[str, Any], bytes]) -> None:
    writer = canonical_json(PROPOSAL_SCHEMA)
    writer["fields"].insert(4, {"name": "priority", "type": "int"})
    registered("CommitProposal", writer)
    record = body_record(VALID, PROPOSAL_SCHEMA)
    record["priority"] = 3
    assert decode_proposal(single_object(writer, record)) == decode_proposal(VALID)


# ---------------------------------------------------------------------------
# Fuzzing: nothing but DecodeError ever escapes
# ---------------------------------------------------------------------------

SEEDS = [
    encode_proposal(FULL_PROPOSAL),
    encode_proposal(make_proposal()),
    encode_decision(COMMITTED),
    encode_decision(REJECTED),
]
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decodes_or_rejects(data: bytes) -> None:
    for decode in (decode_proposal, decode_decision):
        try:
            result = decode(data)
        except DecodeError as e:
            assert str(e)
        else:
            assert isinstance(result, (Proposal, Decision))


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    decodes_or_rejects(data)


@FUZZ
@given(st.sampled_from(SEEDS), st.binary(max_size=300))
def test_fuzz_random_body_after_valid_header(seed: bytes, body: bytes) -> None:
    decodes_or_rejects(seed[:10] + body)


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_fuzz_truncations(seed: bytes, data: st.DataObject) -> None:
    n = data.draw(st.integers(0, len(seed) - 1))
    with pytest.raises(DecodeError):
        (decode_proposal if seed[2:10] == PROPOSAL_FINGERPRINT else decode_decision)(seed[:n])


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_fuzz_bit_flips(seed: bytes, data: st.DataObject) -> None:
    flips = data.draw(st.lists(st.integers(0, len(seed) * 8 - 1), min_size=1, max_size=4))
    mutated = bytearray(seed)
    for bit in flips:
        mutated[bit // 8] ^= 1 << (bit % 8)
    decodes_or_rejects(bytes(mutated))


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_fuzz_splices(seed: bytes, data: st.DataObject) -> None:
    """Insert, delete or overwrite a run of bytes somewhere in a valid message."""
    start = data.draw(st.integers(0, len(seed)))
    end = data.draw(st.integers(start, min(len(seed), start + 8)))
    junk = data.draw(st.binary(max_size=8))
    decodes_or_rejects(seed[:start] + junk + seed[end:])


_ANY_VALUE = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.sampled_from(["COMMITTED", "REJECTED"]),
                       st.integers(), st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**31]),
                       st.floats(), st.just([]), st.just([1]), st.just({}), st.just(("a", 1)))


_PLAIN_BASE = {"tableId": "t", "tableUri": "file:///t", "proposalId": "p", "outcome": "COMMITTED", "version": 3,
               "actions": [], "errorType": None, "errorMessage": None, "reasonCode": None, "winningVersion": None,
               "duplicateOf": None, "decidedAtMs": 5, "stagedCommit": None, "coalescedInto": "q"}


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from([*_PLAIN_BASE, "-type"]), _ANY_VALUE, max_size=3),
       st.sets(st.sampled_from(list(_PLAIN_BASE)), max_size=1))
def test_a_record_passed_as_plainly_valid_is_one_fastavro_validates(changed: dict[str, Any], dropped: set[str]) -> None:
    """`_encode` skips fastavro's `validate` only for records it passes: never for one `validate` refuses."""
    record = {k: v for k, v in {**_PLAIN_BASE, **changed}.items() if k not in dropped}
    if codec._plainly_valid("CommitDecision", record):
        assert fastavro.validation.validate(record, codec.DECISION_SCHEMA, raise_errors=False)
    assert codec._plainly_valid("CommitDecision", dict(_PLAIN_BASE))


def _decisions() -> list[Decision]:
    base = Decision(table_id="t", table_uri="file:///t", proposal_id="p", outcome=Outcome.COMMITTED, version=3,
                    decided_at_ms=5)
    return [dataclasses.replace(base, coalesced_into="q"),
            dataclasses.replace(base, duplicate_of=3),
            dataclasses.replace(base, outcome=Outcome.REJECTED, version=None, error_type="E", error_message="m",
                                reason_code="R", winning_version=2),
            dataclasses.replace(base, version=2**63),  # out of a long's range: refused
            dataclasses.replace(base, proposal_id="\ud800"),  # a lone surrogate: valid, not encodable as UTF-8
            dataclasses.replace(base, decided_at_ms=True),  # a bool is not a long
            dataclasses.replace(base, reason_code=7)]  # type: ignore[arg-type]


@pytest.mark.parametrize("d", _decisions())
def test_a_plain_decision_encodes_or_fails_as_through_fastavros_validation(d: Decision,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bytes, or the same error, with the plain check as with fastavro's `validate` alone."""
    def outcome() -> bytes | str:
        try:
            return codec.encode_decision(d)
        except codec.EncodeError as e:
            return str(e)

    fast = outcome()
    assert codec._plainly_valid("CommitDecision", codec._decision_rec(d)) == (d.version != 2**63 and
                                                                             d.decided_at_ms is not True and
                                                                             d.reason_code != 7)
    monkeypatch.setattr(codec, "_plainly_valid", lambda message, record: False)
    assert fast == outcome()
