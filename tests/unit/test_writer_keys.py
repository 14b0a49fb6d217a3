"""Writer keys: key files, the `deltacoord.writerKeys` property, and the authentication rule in the batch decision."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from deltacoord.coordinator.kafka.partition_tables import PartitionTables
from deltacoord.coordinator.rules.authentication import Signature
from deltacoord.coordinator.rules.batch import Submitted, decide_batch
from deltacoord.coordinator.rules.decided import DecidedIds
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import AddCDCFile, AddFile, Metadata
from deltacoord.schemas.codec import encode_proposal
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.properties import Property
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.signing import (
    WRITER_KEY_ENV,
    WriterKey,
    WriterKeyError,
    parse_writer_keys,
    resolve_writer_key,
    verify,
)
from tests.unit.builders import NOW, TABLE_ID, add, metadata, proposal, protocol

ALICE, BOB, MALLORY = WriterKey.generate("alice"), WriterKey.generate("bob"), WriterKey.generate("mallory")


# -- key files and the property --------------------------------------------------------------
def test_a_key_file_round_trips_and_names_its_key(tmp_path: Path) -> None:
    f = tmp_path / "alice.key"
    f.write_text(ALICE.to_text())
    for source in (str(f), f, ALICE.to_text()):
        k = WriterKey.load(source)
        assert k.name == "alice" and k.registration == ALICE.registration
        assert verify(parse_writer_keys(ALICE.registration)["alice"], k.sign(b"proposal"), b"proposal")
    assert "PRIVATE" not in repr(ALICE)
    from_env = resolve_writer_key(None, environ={WRITER_KEY_ENV: str(f)})
    assert from_env is not None and from_env.registration == ALICE.registration
    assert resolve_writer_key(None, environ={}) is None
    assert resolve_writer_key(BOB, environ={WRITER_KEY_ENV: str(f)}) is BOB


@pytest.mark.parametrize("text,problem", [
    ("-----BEGIN PRIVATE KEY-----\nxx\n-----END PRIVATE KEY-----\n", "first line must be"),
    ("deltacoord-writer-key: bad name!\n", "is not allowed"),
    ("deltacoord-writer-key: alice\nnot a pem\n", "cannot be read"),
])
def test_a_bad_key_file_says_what_is_wrong(tmp_path: Path, text: str, problem: str) -> None:
    f = tmp_path / "k"
    f.write_text(text)
    with pytest.raises(WriterKeyError, match=problem):
        WriterKey.load(f)
    with pytest.raises(WriterKeyError, match="cannot read the writer key file"):
        WriterKey.load(tmp_path / "missing.key")


@pytest.mark.parametrize("value,problem", [
    ("alice", "is not name:base64key"),
    ("alice:!!!", "is not base64"),
    ("alice:AAAA", "has 3 bytes"),
    (f"{ALICE.registration},{ALICE.registration}", "registered twice"),
    (f"a b:{ALICE.public_key_b64}", "is not allowed"),
], ids=["no-key", "bad-base64", "short-key", "registered-twice", "bad-name"])  # ids without the random key: xdist
# workers must collect the same names
def test_a_bad_writer_keys_value_is_refused(value: str, problem: str) -> None:
    with pytest.raises(WriterKeyError, match=problem):
        parse_writer_keys(value)


def test_a_signature_covers_every_byte_and_the_context() -> None:
    pub = parse_writer_keys(ALICE.registration)["alice"]
    sig = ALICE.sign(b"abc")
    assert verify(pub, sig, b"abc")
    assert not verify(pub, sig, b"abd")
    assert not verify(pub, ALICE.private_key.sign(b"abc"), b"abc"), "a bare signature (no deltacoord context) is refused"
    assert not verify(parse_writer_keys(BOB.registration)["bob"], sig, b"abc")


# -- the rule ---------------------------------------------------------------------------------
def _keys(*keys: WriterKey) -> dict[str, str]:
    return {Property.WRITER_KEYS: ", ".join(k.registration for k in keys)}


def _signed(p: Proposal, key: WriterKey | None, *, as_writer: str | None = None, signer: str | None = None) -> Submitted:
    """`p` from writer `as_writer` (default: the key's name), signed by `key` (under the name `signer`)."""
    p = dataclasses.replace(p, writer=as_writer if as_writer is not None else (key.name if key else None))
    data = encode_proposal(p)
    sig = None if key is None else Signature(signer or key.name, key.sign(data), data)
    return Submitted(p, NOW, sig)


def _create(*keys: WriterKey, extra: dict[str, str] | None = None) -> Proposal:
    return proposal(-1, [protocol(), metadata(config={**_keys(*keys), **(extra or {})})], operation="CREATE TABLE",
                    changes_data=False)


def _decide(live: dict[str, TableState], items: Sequence[Submitted]) -> list[Decision]:
    decisions, overlay = decide_batch(live, list(items), NOW)
    overlay.apply_to(live)
    return decisions


def _outcomes(ds: list[Decision]) -> list[str | int | None]:
    return [d.version if d.committed else d.reason_code for d in ds]


def _table(*keys: WriterKey, extra: dict[str, str] | None = None) -> dict[str, TableState]:
    live: dict[str, TableState] = {}
    assert _outcomes(_decide(live, [_signed(_create(*keys, extra=extra), keys[0])])) == [0]
    return live


def test_a_table_without_keys_stays_open_to_unsigned_writers() -> None:
    live: dict[str, TableState] = {}
    create = proposal(-1, [protocol(), metadata()], operation="CREATE TABLE", changes_data=False)
    assert _outcomes(_decide(live, [_signed(create, None), _signed(proposal(0, [add("a")]), None, as_writer="anyone")])) == [0, 1]


def test_registering_the_first_keys_needs_a_signature_by_one_of_them() -> None:
    nobody = _decide({}, [_signed(_create(ALICE), None)])
    other = _decide({}, [_signed(_create(ALICE), MALLORY)])
    assert _outcomes(nobody) == _outcomes(other) == [ReasonCode.WRITER_NOT_AUTHENTICATED]
    assert "newly registered" in (other[0].error_message or "")
    bad = proposal(-1, [protocol(), metadata(config={Property.WRITER_KEYS: "alice:nope"})], operation="CREATE TABLE",
                   changes_data=False)
    assert _outcomes(_decide({}, [_signed(bad, ALICE)])) == [ReasonCode.BAD_WRITER_KEYS]


def test_a_table_with_keys_accepts_only_proposals_signed_by_a_registered_key_under_its_name() -> None:
    live = _table(ALICE)
    append = proposal(0, [add("a")])
    forged_sig = _signed(append, ALICE)
    assert forged_sig.signature is not None
    tampered = Submitted(forged_sig.proposal, NOW, dataclasses.replace(forged_sig.signature, data=forged_sig.signature.data + b"x"))
    cases = {
        "unsigned, declaring alice": _signed(append, None, as_writer="alice"),
        "mallory's key": _signed(append, MALLORY),
        "mallory's key under alice's name": _signed(append, MALLORY, as_writer="alice", signer="alice"),
        "alice's key, declaring bob": _signed(append, ALICE, as_writer="bob"),
        "other bytes than signed": tampered,
    }
    for what, item in cases.items():
        (d,) = _decide(live, [item])
        assert d.reason_code == ReasonCode.WRITER_NOT_AUTHENTICATED, what
    assert _outcomes(_decide(live, [_signed(append, ALICE)])) == [1]


def test_the_allow_list_checks_the_authenticated_name_and_only_a_registered_key_changes_it() -> None:
    live = _table(ALICE, BOB, extra={Property.ALLOWED_WRITERS: "alice"})
    md = live[TABLE_ID].metadata
    assert md is not None
    opened = dataclasses.replace(md, configuration={**md.configuration, Property.ALLOWED_WRITERS: "alice, mallory",
                                                    Property.WRITER_KEYS: f"{ALICE.registration}, {MALLORY.registration}"})
    takeover = proposal(0, [opened], operation="SET TBLPROPERTIES", changes_data=False)
    outcomes = _outcomes(_decide(live, [
        _signed(proposal(0, [add("b")]), BOB),           # registered, not on the allow-list
        _signed(takeover, None, as_writer="alice"),       # the probe: a self-declared alice replaces the lists
        _signed(takeover, MALLORY),                       # mallory cannot register herself
        _signed(proposal(0, [add("a")]), ALICE),
    ]))
    assert outcomes == [ReasonCode.WRITER_NOT_ALLOWED, ReasonCode.WRITER_NOT_AUTHENTICATED,
                        ReasonCode.WRITER_NOT_AUTHENTICATED, 1]


def test_keys_rotate_through_proposals_signed_by_a_current_key() -> None:
    live = _table(ALICE)

    def set_keys(read: int, *keys: WriterKey) -> Proposal:
        md = live[TABLE_ID].metadata
        assert md is not None
        return proposal(read, [dataclasses.replace(md, configuration=_keys(*keys))], operation="SET TBLPROPERTIES",
                        changes_data=False)

    add_bob = set_keys(0, ALICE, BOB)
    outcomes = _outcomes(_decide(live, [
        _signed(proposal(0, [add("b0")]), BOB),   # not yet registered
        _signed(add_bob, ALICE),                  # v1: alice registers bob
        _signed(proposal(1, [add("b1")]), BOB),   # v2: bob, in the same batch (the overlay's keys)
    ]))
    assert outcomes == [ReasonCode.WRITER_NOT_AUTHENTICATED, 1, 2]
    assert _outcomes(_decide(live, [_signed(set_keys(2, BOB), BOB), _signed(proposal(3, [add("a3")]), ALICE)])) == [
        3, ReasonCode.WRITER_NOT_AUTHENTICATED]


def test_added_files_are_checked_only_for_tables_that_ask_and_after_authentication() -> None:
    checked: list[tuple[str, list[str]]] = []

    def check(uri: str, files: Sequence[AddFile | AddCDCFile]) -> str | None:
        checked.append((uri, [f.path for f in files]))
        return "missing" if any(f.path == "gone" for f in files) else None

    plain = _table(ALICE)
    decisions, _ = decide_batch(plain, [_signed(proposal(0, [add("gone")]), ALICE)], NOW, check_files=check)
    assert _outcomes(decisions) == [1] and checked == []

    verified = _table(ALICE, extra={Property.VERIFY_ADDED_FILES: "true"})
    decisions, _ = decide_batch(verified, [
        _signed(proposal(0, [add("here")]), ALICE),
        _signed(proposal(0, [add("gone")]), ALICE),
        _signed(proposal(0, [add("gone")]), None, as_writer="alice"),   # never reaches the storage
    ], NOW, check_files=check)
    assert _outcomes(decisions) == [1, ReasonCode.ADDED_FILE_MISSING, ReasonCode.WRITER_NOT_AUTHENTICATED]
    assert [paths for _uri, paths in checked] == [["here"], ["gone"]]


def test_the_property_set_in_the_same_proposal_applies_to_its_own_files() -> None:
    live = _table(ALICE)
    md = live[TABLE_ID].metadata
    assert isinstance(md, Metadata)
    on = dataclasses.replace(md, configuration={**md.configuration, Property.VERIFY_ADDED_FILES: "true"})
    decisions, _ = decide_batch(live, [_signed(proposal(0, [on, add("gone")]), ALICE)], NOW,
                                check_files=lambda uri, files: "missing")
    assert _outcomes(decisions) == [ReasonCode.ADDED_FILE_MISSING]


def test_the_spark_sink_signs_with_its_writer_key_option(tmp_path: Path) -> None:
    from deltacoord.writer.spark_sink import SinkOptions

    f = tmp_path / "etl.key"
    f.write_text(WriterKey.generate("etl").to_text())
    opts = SinkOptions.parse({"path": str(tmp_path / "t"), "bootstrap.servers": "127.0.0.1:1", "writerKey": str(f)})
    t = opts.table()
    try:
        assert t.writer_key is not None and t.writer_key.name == "etl" and t.writer_name == "etl"
    finally:
        t.close()
    unsigned = SinkOptions.parse({"path": str(tmp_path / "t"), "bootstrap.servers": "127.0.0.1:1"}).table()
    try:
        assert unsigned.writer_key is None and unsigned.writer_name == "spark"
    finally:
        unsigned.close()


def test_an_unauthenticated_message_cannot_claim_a_genuine_proposals_id() -> None:
    """Mallory saw alice's proposal id and sends a message with it first (unsigned, then signed by her own key):
    both are refused, and alice's signed proposal with that id is still decided on its own merits, in the same
    batch and in a later one; the window keeps only alice's decision."""
    live = _table(ALICE)
    genuine = proposal(0, [add("a1")])
    forged = dataclasses.replace(proposal(0, [add("evil")]), proposal_id=genuine.proposal_id)
    decisions = _decide(live, [_signed(forged, None, as_writer="alice"), _signed(forged, MALLORY, as_writer="alice"),
                               _signed(genuine, ALICE)])
    assert _outcomes(decisions) == [ReasonCode.WRITER_NOT_AUTHENTICATED, ReasonCode.WRITER_NOT_AUTHENTICATED, 1]

    later = proposal(1, [add("a2")])
    window = DecidedIds()
    first = _decide(live, [_signed(dataclasses.replace(proposal(1, [add("x")]), proposal_id=later.proposal_id), None,
                                   as_writer="alice")])
    for d in first:
        window.remember(d)
    assert window.get(TABLE_ID, later.proposal_id) is None
    decisions, _ = decide_batch(live, [_signed(later, ALICE)], NOW, earlier=window.get)
    assert _outcomes(decisions) == [2] and decisions[0].duplicate_of is None


def test_a_rejected_signed_proposal_is_never_decided_again_whatever_other_tables_send() -> None:
    """Alice's signed proposal read a version the table did not have yet (rejected). Later the table reaches that
    version, so deciding a replay of it again would commit it. Junk on open and unknown tables, spread over many
    table ids so that no one table holds more ids than hers (the window's fair share alone evicted her table's
    oldest ids), is remembered apart from a keyed table's signed ids: the replay gets its first answer."""
    live = _table(ALICE)
    tables = PartitionTables(DecidedIds(limit=50, max_age_ms=10**12), states=live)
    early = _signed(proposal(2, [add("replayed")]), ALICE)
    first = _decide(live, [early])
    assert _outcomes(first) == [ReasonCode.READ_VERSION_AHEAD]
    ours = [_signed(proposal(v, [add(f"a{v}")]), ALICE) for v in range(2)]
    for d in first + _decide(live, ours):
        tables.remember(d)
    assert live[TABLE_ID].version == 2 and tables.signed(TABLE_ID)
    for i in range(100):  # 2 ids on each of 50 open tables, 100 ids on unknown tables
        table = f"open-{i % 50}"
        if table not in live:
            for d in _decide(live, [Submitted(proposal(-1, [protocol(), metadata()], operation="CREATE TABLE",
                                                       changes_data=False, table_id=table), NOW)]):
                tables.remember(d)
        junk = [Submitted(proposal(99, [add(f"j{i}")], table_id=table), NOW),
                Submitted(proposal(0, [add(f"u{i}")], table_id=f"unknown-{i}"), NOW)]
        for d in _decide(live, junk):
            assert not d.committed
            tables.remember(d)
    assert not tables.signed("open-0") and tables.decided.held_by("open-0") <= 3
    again, _ = decide_batch(live, [early], NOW, earlier=tables.decided.get)
    assert _outcomes(again) == [ReasonCode.READ_VERSION_AHEAD], "the replay got its first answer, not a commit"
    fresh, _ = decide_batch(live, [early], NOW)
    assert _outcomes(fresh) == [3], "without the window the replay would commit"
    assert tables.decided.held_by(TABLE_ID) == 3
