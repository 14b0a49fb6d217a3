"""Fuzzing the proposal decoder (unit, no I/O).

Whatever bytes arrive, `decode_proposal` returns a Proposal or raises
DecodeError: nothing from fastavro, struct, json or the codecs escapes, and it
never hangs or allocates what a length prefix claims. Valid Avro with hostile
content (huge, control, bidi and astral strings, extreme integers, nested
commitInfo) decodes to exactly what was encoded. Whatever decodes re-encodes
to a message that decodes to the same proposal.
"""

from __future__ import annotations

import json
import random
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import to_parsing_canonical_form
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol, RemoveFile, SetTransaction
from deltacoord.schemas.codec import (
    DECISION_FINGERPRINT,
    HEADER_SIZE,
    PROPOSAL_FINGERPRINT,
    PROPOSAL_SCHEMA,
    SINGLE_OBJECT_MARKER,
    decode_proposal,
    encode_proposal,
    known_writer_schemas,
    register_writer_schema,
    unregister_writer_schema,
)
from deltacoord.schemas.errors import DecodeError
from deltacoord.schemas.messages import FileRead, Proposal
from tests.fuzz.hostile import TableCtx, hostile_bytes, hostile_proposal

CTX = TableCtx("file:///tmp/fuzz-table", "file:///tmp/fuzz-table", 3)
HEADER = SINGLE_OBJECT_MARKER + PROPOSAL_FINGERPRINT
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Any Unicode scalar value (Avro strings are UTF-8; lone surrogates cannot be encoded and are an EncodeError).
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=200)
SHORT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


def _decodes_or_decode_error(data: bytes) -> Proposal | None:
    """The only two allowed outcomes; a decoded proposal must survive a re-encode round trip."""
    try:
        p = decode_proposal(data)
    except DecodeError as e:
        assert str(e), "a DecodeError must say what is wrong"
        return None
    assert decode_proposal(encode_proposal(p)) == p
    return p


# --------------------------------------------------------------------------- garbage


@FUZZ
@given(st.binary(max_size=4096))
@example(b"")
@example(b"\xc3")
@example(SINGLE_OBJECT_MARKER)
@example(HEADER)
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    _decodes_or_decode_error(data)


@FUZZ
@given(st.binary(min_size=1, max_size=4096))
@example(b"\xfe\xff\xff\xff\x0f" + b"x" * 10)  # a string length of ~2**31 with 10 bytes left
@example(b"\x00" * 3 + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f")  # a varint longer than a long
@example(b"\x02\x02\x02\x00" + b"\x01" * 30)  # negative array block counts
def test_random_bodies_behind_a_valid_header_only_raise_decode_error(body: bytes) -> None:
    _decodes_or_decode_error(HEADER + body)


@FUZZ
@given(st.randoms(use_true_random=False))
def test_hostile_bytes_never_decode_except_lucky_bit_flips(rng: random.Random) -> None:
    data, kind = hostile_bytes(rng, CTX)
    p = _decodes_or_decode_error(data)
    if kind != "bit-flips":  # Avro has no checksum: a flipped bit can yield another valid message
        assert p is None, f"{kind} decoded: {p}"


# --------------------------------------------------------------------------- mutations of valid messages


@FUZZ
@given(st.randoms(use_true_random=False), st.data())
def test_every_truncation_is_a_decode_error(rng: random.Random, data: st.DataObject) -> None:
    msg = encode_proposal(hostile_proposal(rng, CTX)[0])
    cut = data.draw(st.integers(min_value=0, max_value=len(msg) - 1), label="cut")
    with pytest.raises(DecodeError):
        decode_proposal(msg[:cut])


def test_every_prefix_of_one_message_is_a_decode_error() -> None:
    msg = encode_proposal(hostile_proposal(random.Random(7), CTX)[0])
    for cut in range(len(msg)):
        with pytest.raises(DecodeError):
            decode_proposal(msg[:cut])


@FUZZ
@given(st.randoms(use_true_random=False), st.binary(min_size=8, max_size=8))
def test_unknown_fingerprints_are_a_decode_error(rng: random.Random, fp: bytes) -> None:
    msg = encode_proposal(hostile_proposal(rng, CTX)[0])
    if fp in known_writer_schemas() and fp != DECISION_FINGERPRINT:
        return  # the current (or a registered older) proposal schema: a different, valid reading
    with pytest.raises(DecodeError, match=r"unknown writer schema fingerprint|CommitDecision schema"):
        decode_proposal(SINGLE_OBJECT_MARKER + fp + msg[HEADER_SIZE:])


def test_a_decision_on_the_proposals_topic_is_a_decode_error() -> None:
    msg = encode_proposal(hostile_proposal(random.Random(3), CTX)[0])
    with pytest.raises(DecodeError, match="CommitDecision"):
        decode_proposal(SINGLE_OBJECT_MARKER + DECISION_FINGERPRINT + msg[HEADER_SIZE:])


@FUZZ
@given(st.randoms(use_true_random=False), st.lists(st.integers(min_value=0), min_size=1, max_size=16))
def test_bit_flips_decode_to_a_valid_message_or_raise_decode_error(rng: random.Random, flips: list[int]) -> None:
    data = bytearray(encode_proposal(hostile_proposal(rng, CTX)[0]))
    for f in flips:
        i = f % (len(data) * 8)
        data[i // 8] ^= 1 << (i % 8)
    _decodes_or_decode_error(bytes(data))


@FUZZ
@given(st.randoms(use_true_random=False), st.binary(min_size=1, max_size=64), st.data())
def test_spliced_bytes_only_raise_decode_error(rng: random.Random, junk: bytes, data: st.DataObject) -> None:
    msg = encode_proposal(hostile_proposal(rng, CTX)[0])
    at = data.draw(st.integers(min_value=HEADER_SIZE, max_value=len(msg)), label="at")
    replace = data.draw(st.booleans(), label="replace")
    spliced = msg[:at] + junk + msg[at + (len(junk) if replace else 0):]
    _decodes_or_decode_error(spliced)


# --------------------------------------------------------------------------- valid Avro, hostile content


@FUZZ
@given(st.randoms(use_true_random=False))
def test_hostile_proposals_round_trip_exactly(rng: random.Random) -> None:
    p, _reason = hostile_proposal(rng, CTX, huge=rng.choice([0, 0, 0, 100_000]))
    assert decode_proposal(encode_proposal(p)) == p


json_values = st.recursive(
    st.none() | st.booleans() | LONG | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(SHORT, children, max_size=4),
    max_leaves=30,
)


@st.composite
def proposals(draw: st.DrawFn) -> Proposal:
    """Arbitrary field contents (not just hostile-by-construction ones)."""
    pid = draw(TEXT)
    pv = st.dictionaries(SHORT, st.none() | TEXT, max_size=4)
    add = st.builds(AddFile, TEXT, pv, LONG, LONG, st.booleans(), st.none() | TEXT,
                    st.none() | st.dictionaries(SHORT, TEXT, max_size=3), st.none(), st.none() | LONG, st.none() | LONG,
                    st.none() | TEXT)
    remove = st.builds(RemoveFile, TEXT, st.none() | LONG, st.booleans(), st.none() | st.booleans(), st.none() | pv,
                       st.none() | LONG)
    ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
    protocol = st.builds(Protocol, ints, ints, st.none() | st.lists(SHORT, max_size=3).map(tuple),
                         st.none() | st.lists(SHORT, max_size=3).map(tuple))
    metadata = st.builds(Metadata, TEXT, TEXT, st.lists(SHORT, max_size=3).map(tuple),
                         st.dictionaries(SHORT, TEXT, max_size=3))
    txn = st.builds(SetTransaction, TEXT, LONG, st.none() | LONG)
    ci_values = st.dictionaries(SHORT, json_values, max_size=5)
    actions = draw(st.lists(add | remove | protocol | metadata | txn | ci_values.map(CommitInfo), max_size=6))
    return Proposal(
        table_id=draw(TEXT), table_uri=draw(TEXT), proposal_id=pid, read_version=draw(LONG), operation=draw(TEXT),
        changes_data=draw(st.booleans()), actions=tuple(actions), commit_info=CommitInfo(draw(ci_values)),
        read_predicates=tuple(draw(st.lists(TEXT, max_size=3))),
        read_files=tuple(draw(st.lists(st.builds(FileRead, TEXT, pv), max_size=3))),
        read_whole_table=draw(st.booleans()), read_app_ids=tuple(draw(st.lists(TEXT, max_size=3))),
        writer=draw(st.none() | TEXT), operation_parameters=draw(st.dictionaries(SHORT, TEXT, max_size=3)),
    )


@FUZZ
@given(proposals())
def test_arbitrary_valid_avro_content_round_trips(p: Proposal) -> None:
    assert decode_proposal(encode_proposal(p)) == p


@FUZZ
@given(st.integers(min_value=1, max_value=5000))
def test_deeply_nested_commit_info_decodes_or_is_a_decode_error(depth: int) -> None:
    text = '{"nested":' + '{"k":' * depth + '"leaf"' + "}" * depth + "}"
    fo = BytesIO()
    fo.write(HEADER)
    schemaless_writer(fo, PROPOSAL_SCHEMA, {
        "tableId": "t", "tableUri": "u", "proposalId": "p", "readVersion": 0, "operation": "WRITE", "changesData": True,
        "actions": [], "commitInfo": {"valuesJson": text}, "readPredicates": [], "readFiles": [],
        "readWholeTable": False, "readAppIds": [], "writer": None, "operationParameters": {},
    })
    _decodes_or_decode_error(fo.getvalue())


def test_deeper_than_the_json_parser_allows_is_a_decode_error() -> None:
    fo = BytesIO()
    fo.write(HEADER)
    schemaless_writer(fo, PROPOSAL_SCHEMA, {
        "tableId": "t", "tableUri": "u", "proposalId": "p", "readVersion": 0, "operation": "WRITE", "changesData": True,
        "actions": [], "commitInfo": {"valuesJson": '{"a":' + "[" * 200_000 + "]" * 200_000 + "}"},
        "readPredicates": [], "readFiles": [], "readWholeTable": False, "readAppIds": [], "writer": None,
        "operationParameters": {},
    })
    with pytest.raises(DecodeError, match="valuesJson"):
        decode_proposal(fo.getvalue())


# --------------------------------------------------------------------------- a newer writer's unknown action


def _newer_writer_schema() -> dict[str, Any]:
    """The current proposal schema plus an action type this reader does not know (appended union branch)."""
    schema: dict[str, Any] = json.loads(to_parsing_canonical_form(PROPOSAL_SCHEMA))
    actions = next(f for f in schema["fields"] if f["name"] == "actions")
    wrapper = actions["type"]["items"]
    union = wrapper["fields"][0]["type"]
    union.append({"type": "record", "name": "io.deltacoord.v1.FutureAction",
                  "fields": [{"name": "payload", "type": "string"}]})
    return schema


@FUZZ
@given(st.randoms(use_true_random=False), st.booleans(), TEXT)
def test_unknown_action_from_a_newer_writer_is_a_decode_error(rng: random.Random, use_it: bool, payload: str) -> None:
    schema = _newer_writer_schema()
    fp = register_writer_schema("CommitProposal", schema)
    try:
        parsed = parse_schema(schema)
        p = hostile_proposal(rng, CTX)[0]
        # Re-encode the proposal's record with the newer schema, optionally using the new branch.
        record = _record_of(p)
        if use_it:
            record["actions"].append({"action": ("io.deltacoord.v1.FutureAction", {"payload": payload})})
        fo = BytesIO()
        fo.write(SINGLE_OBJECT_MARKER + fp)
        schemaless_writer(fo, parsed, record)
        if use_it:
            with pytest.raises(DecodeError, match=r"FutureAction|counterpart|newer"):
                decode_proposal(fo.getvalue())
        else:
            assert decode_proposal(fo.getvalue()) == p
    finally:
        unregister_writer_schema(fp)


def _record_of(p: Proposal) -> dict[str, Any]:
    """The Avro record of a proposal (what encode_proposal writes)."""
    from fastavro import schemaless_reader

    fo = BytesIO(encode_proposal(p))
    fo.seek(HEADER_SIZE)
    record: dict[str, Any] = schemaless_reader(fo, PROPOSAL_SCHEMA, None, True, True)  # type: ignore[assignment]
    return record
