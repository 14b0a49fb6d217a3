"""Commits carried by reference: names, digests, the wire form, old messages, resolution from a store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from fastavro.schema import parse_schema

from deltacoord.reader.staged_commits import (
    StagedCommitTooLargeError,
    load_proposal,
    on_the_wire,
    resolve_decision,
    resolve_decision_bytes,
    stage_decision,
    sweep_decided,
)
from deltacoord.schemas.actions import commit_to_json_lines, parse_commit
from deltacoord.schemas.codec import decode_decision, decode_proposal, encode_decision, encode_proposal
from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.staged import (
    STAGED_DIR,
    StagedCommitError,
    decided_key,
    decided_version,
    is_staged_key,
    parse_staged,
    staged_bytes,
    writer_key,
)
from deltacoord.storage.table import TableStorage
from tests.unit.test_codec import ACTIONS, COMMITTED, FULL_PROPOSAL, body_record, single_object

HISTORY = Path(__file__).resolve().parents[2] / "schemas" / "avro" / "history"


def test_a_staged_file_is_named_by_proposal_and_digest_and_never_looks_like_a_version() -> None:
    data, ref = staged_bytes(FULL_PROPOSAL.actions)
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size == len(data)
    assert ref.count == len(FULL_PROPOSAL.actions)
    w, d = writer_key("p/../1\n", ref), decided_key("p/../1\n", 12, ref)
    assert w.startswith(STAGED_DIR + "w-") and d.startswith(STAGED_DIR + "d-") and w != d
    assert "/../" not in w and "\n" not in w, "any proposal id gives a plain name"
    assert is_staged_key(w) and is_staged_key(d)
    assert decided_version(d) == 12 and decided_version(w) is None
    assert not is_staged_key("_delta_log/00000000000000000001.json")
    assert not is_staged_key(STAGED_DIR + "00000000000000000001.3a7c.json"), "Delta's own staged commits are not ours"
    assert writer_key("other", ref) != w


def test_actions_survive_the_staged_file_exactly() -> None:
    actions = tuple(a for a in ACTIONS.values())
    data, ref = staged_bytes(actions)
    assert parse_staged(data, ref, "f") == actions
    assert commit_to_json_lines(parse_commit(data)) == data, "re-serialised byte for byte (recovery republishes it)"


@pytest.mark.parametrize("change", ["byte", "truncate", "append"])
def test_an_altered_staged_file_is_refused(change: str) -> None:
    data, ref = staged_bytes(FULL_PROPOSAL.actions)
    bad = {"byte": data.replace(b"date", b"datf", 1), "truncate": data[:-2], "append": data + b"{}\n"}[change]
    with pytest.raises(StagedCommitError, match=r"SHA-256|bytes"):
        parse_staged(bad, ref, "f")


def test_a_proposal_by_reference_is_small_on_the_wire_and_loads_whole(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    data, ref = staged_bytes(FULL_PROPOSAL.actions)
    storage.put(writer_key(FULL_PROPOSAL.proposal_id, ref), data)
    by_ref = dataclasses.replace(FULL_PROPOSAL, actions=(), staged=ref)
    wire = encode_proposal(by_ref)
    assert len(wire) < len(encode_proposal(FULL_PROPOSAL))
    decoded = decode_proposal(wire)
    assert decoded.staged == ref and decoded.actions == ()
    assert load_proposal(storage, decoded).actions == FULL_PROPOSAL.actions
    with pytest.raises(StagedCommitTooLargeError, match="max_staged_bytes"):
        load_proposal(storage, decoded, max_bytes=ref.size - 1)
    storage.delete(writer_key(FULL_PROPOSAL.proposal_id, ref))
    with pytest.raises(StagedCommitError, match="does not exist"):
        load_proposal(storage, decoded)
    with pytest.raises(StagedCommitError, match="not both"):
        load_proposal(storage, dataclasses.replace(FULL_PROPOSAL, staged=ref))


def test_a_decision_by_reference_resolves_from_the_staged_file_then_from_the_version(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    staged, data = stage_decision(storage, COMMITTED)
    assert data == commit_to_json_lines(COMMITTED.actions)
    assert staged.actions == COMMITTED.actions and staged.staged is not None
    wire = decode_decision(encode_decision(on_the_wire(staged)))
    assert wire.actions == COMMITTED.actions[:1], "only the commitInfo inline"
    assert resolve_decision(storage, wire) == staged, "before publication: from the staged file"
    assert COMMITTED.version is not None
    storage.put(f"_delta_log/{COMMITTED.version:020d}.json", commit_to_json_lines(COMMITTED.actions))
    assert resolve_decision_bytes(storage, wire) == (staged, data)
    other, _ = stage_decision(storage, dataclasses.replace(COMMITTED, version=COMMITTED.version + 1))
    assert sweep_decided(storage, COMMITTED.version) == 1, "the published version's staged commit goes, not the next"
    assert resolve_decision(storage, wire) == staged, "after publication: from the version, same digest"
    assert resolve_decision(storage, on_the_wire(other)) == other
    storage.put(f"_delta_log/{COMMITTED.version:020d}.json", b'{"commitInfo":{}}\n')
    with pytest.raises(StagedCommitError, match="neither"):
        resolve_decision(storage, wire)
    plain = Decision("t", "u", "p", Outcome.REJECTED, reason_code="X")
    assert resolve_decision(storage, plain) is plain


@pytest.mark.parametrize("message", ["CommitProposal", "CommitDecision"])
def test_messages_written_before_the_staged_fields_still_decode(message: str) -> None:
    field = "stagedActions" if message == "CommitProposal" else "stagedCommit"
    (old,) = [f for f in HISTORY.glob(f"{message}.*.json") if f'"{field}"' not in f.read_text()]
    schema = parse_schema(json.loads(old.read_text()))
    current = encode_proposal(FULL_PROPOSAL) if message == "CommitProposal" else encode_decision(COMMITTED)
    from deltacoord.schemas.codec import DECISION_SCHEMA, PROPOSAL_SCHEMA
    record = body_record(current, PROPOSAL_SCHEMA if message == "CommitProposal" else DECISION_SCHEMA)
    record.pop("stagedActions" if message == "CommitProposal" else "stagedCommit")
    data = single_object(schema, record)
    assert data[2:10].hex() == old.name.split(".")[1], "the fingerprint of the schema the file keeps"
    if message == "CommitProposal":
        assert decode_proposal(data) == FULL_PROPOSAL
    else:
        assert decode_decision(data) == COMMITTED


def test_vacuum_deletes_only_old_writer_staged_actions(tmp_path: Path) -> None:
    import os
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    from deltacoord.writer.vacuum import vacuum

    write_deltalake(str(tmp_path), pa.table({"id": [1]}))
    _, ref = staged_bytes(FULL_PROPOSAL.actions)
    old_w, new_w, old_d, old_d0 = (writer_key("p-old", ref), writer_key("p-new", ref), decided_key("p-old", 1, ref),
                                   decided_key("p-0", 0, ref))
    week_ago = time.time() - 8 * 24 * 3600
    for key in (old_w, new_w, old_d, old_d0):
        path = tmp_path / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"{}\n")
        if key != new_w:
            os.utime(path, (week_ago, week_ago))
    result = vacuum(str(tmp_path), dry_run=True)
    assert sorted(result.deleted) == sorted([old_d0, old_w]), "a writer's, and the coordinator's of a published version"
    vacuum(str(tmp_path))
    assert not (tmp_path / old_w).exists()
    assert (tmp_path / new_w).exists(), "a proposal may be deciding now"
    assert (tmp_path / old_d).exists(), "version 1 is not published: it may hold a ratified version"
