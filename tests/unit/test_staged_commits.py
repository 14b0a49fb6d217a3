"""Commits carried by reference: names, digests, the wire form, old messages, resolution from a store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from fastavro.schema import parse_schema

from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.reader.staged_commits import (
    StagedCommitTooLargeError,
    copy_decided,
    is_published_as,
    load_proposal,
    on_the_wire,
    resolve_decision,
    resolve_decision_bytes,
    stage_decision,
    sweep_decided,
)
from deltacoord.schemas import staged as staged_module
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, commit_to_json_lines, parse_commit
from deltacoord.schemas.codec import decode_decision, decode_proposal, encode_decision, encode_proposal
from deltacoord.schemas.messages import Decision, Outcome, Proposal, StagedActions
from deltacoord.schemas.staged import (
    STAGED_DIR,
    StagedCommitError,
    VerbatimActions,
    decided_key,
    decided_version,
    is_staged_key,
    parse_staged,
    parse_staged_pieces,
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


@pytest.mark.parametrize("change", ["byte", "truncate", "append", "json"])
def test_an_altered_staged_file_is_refused(change: str) -> None:
    data, ref = staged_bytes(FULL_PROPOSAL.actions)
    bad = {"byte": data.replace(b"date", b"datf", 1), "truncate": data[:-2], "append": data + b"{}\n",
           "json": data.replace(b"{", b"[", 1)}[change]
    with pytest.raises(StagedCommitError, match=r"SHA-256|bytes"):
        parse_staged(bad, ref, "f")
    # Read a piece at a time, the digest is the verdict too, even where the change broke the JSON.
    with pytest.raises(StagedCommitError, match=r"SHA-256|bytes"):
        parse_staged_pieces(lambda: (bad[i:i + 7] for i in range(0, len(bad), 7)), ref, "f")


@pytest.mark.parametrize("piece", [1, 3, 64, 1 << 20])
def test_a_staged_file_read_in_pieces_of_any_size_gives_its_actions(piece: int) -> None:
    """Lines cut anywhere, a multi-byte character cut in two included, parse as the whole file does."""
    actions = (*FULL_PROPOSAL.actions, dataclasses.replace(ACTIONS["add-minimal"], path="dåte=ü/ñ\u2028 x.parquet"))
    data, ref = staged_bytes(actions)
    assert parse_staged_pieces(lambda: (data[i:i + piece] for i in range(0, len(data), piece)), ref, "f") == actions
    broken = data.replace(b'{"add"', b'{"add" x', 1)
    bad_ref = dataclasses.replace(ref, sha256=hashlib.sha256(broken).hexdigest(), size=len(broken))
    with pytest.raises(StagedCommitError, match="not Delta JSON actions"):
        parse_staged_pieces(lambda: (broken[i:i + piece] for i in range(0, len(broken), piece)), bad_ref, "f")
    with pytest.raises(StagedCommitError, match="holds 2 actions, not the 3"):
        short, _ = staged_bytes(actions[:2])
        parse_staged_pieces(lambda: [short], dataclasses.replace(ref, sha256=hashlib.sha256(short).hexdigest(), size=len(short),
                                                         count=3), "f")


def test_a_decided_commit_is_copied_for_publication_only_when_it_is_the_one_ratified(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    staged = stage_decision(storage, COMMITTED)
    assert staged.staged is not None and COMMITTED.version is not None
    key = decided_key(COMMITTED.proposal_id, COMMITTED.version, staged.staged)
    dest = tmp_path / "copy.json"
    assert copy_decided(storage, COMMITTED.proposal_id, COMMITTED.version, staged.staged, dest)
    assert dest.read_bytes() == commit_to_json_lines(COMMITTED.actions)
    assert not is_published_as(storage, COMMITTED.version, staged.staged)
    storage.put(f"_delta_log/{COMMITTED.version:020d}.json", dest.read_bytes())
    assert is_published_as(storage, COMMITTED.version, staged.staged)
    dest.unlink()
    storage.put(key, storage.get(key).replace(b"commitInfo", b"commitInfx"))
    with pytest.raises(StagedCommitError, match="changed after staging"):
        copy_decided(storage, COMMITTED.proposal_id, COMMITTED.version, staged.staged, dest)
    assert not dest.exists(), "nothing half copied is left"
    # Staging again replaces the altered content (the name holds the digest: it was never ratified as that).
    assert stage_decision(storage, COMMITTED).staged == staged.staged
    assert copy_decided(storage, COMMITTED.proposal_id, COMMITTED.version, staged.staged, dest)
    storage.delete(key)
    dest.unlink()
    assert not copy_decided(storage, COMMITTED.proposal_id, COMMITTED.version, staged.staged, dest), "swept: gone"
    assert not dest.exists()


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
    staged = stage_decision(storage, COMMITTED)
    assert staged.staged is not None and COMMITTED.version is not None
    data = storage.get(decided_key(COMMITTED.proposal_id, COMMITTED.version, staged.staged))
    assert data == commit_to_json_lines(COMMITTED.actions)
    assert staged.actions == COMMITTED.actions and staged.staged is not None
    wire = decode_decision(encode_decision(on_the_wire(staged)))
    assert wire.actions == COMMITTED.actions[:1], "only the commitInfo inline"
    assert resolve_decision(storage, wire) == staged, "before publication: from the staged file"
    assert COMMITTED.version is not None
    storage.put(f"_delta_log/{COMMITTED.version:020d}.json", commit_to_json_lines(COMMITTED.actions))
    assert resolve_decision_bytes(storage, wire) == (staged, data)
    other = stage_decision(storage, dataclasses.replace(COMMITTED, version=COMMITTED.version + 1))
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


def _publish(root: Path, *tasks: PublishTask) -> Publisher:
    p = Publisher(fsync=False, lanes=1)
    p.start()
    for t in tasks:
        p.submit(t)
    assert p.wait_idle(30)
    p.stop()
    return p


def _by_file(root: Path, staged: Decision) -> PublishTask:
    assert staged.version is not None and staged.staged is not None
    return PublishTask(staged.table_id, root.as_uri(), staged.version, staged.actions[:1],
                       staged=(staged.proposal_id, staged.staged))


def test_a_commit_by_reference_is_published_from_its_staged_file(tmp_path: Path) -> None:
    """The publish task holds neither the commit's bytes nor its file actions: `<v>.json` is a checked copy of
    the staged commit, the same bytes as a re-publication after a crash, and an altered staged file halts the
    table instead of being published."""
    root = tmp_path / "t"
    storage = TableStorage(str(root))
    staged = stage_decision(storage, COMMITTED)
    assert staged.version is not None and staged.staged is not None
    task = _by_file(root, staged)
    assert task.from_staged_file and len(task.actions) == 1
    p = _publish(root, task)
    published = storage.get(f"_delta_log/{staged.version:020d}.json")
    assert published == commit_to_json_lines(COMMITTED.actions) and p.published_version(staged.table_id) == staged.version
    assert storage.list(STAGED_DIR) == [], "swept once published"
    # Published again (a recovery) with its staged file swept: the version already holds it.
    p = _publish(root, task)
    assert p.halted(staged.table_id) is None and p.published_version(staged.table_id) == staged.version

    other = tmp_path / "altered"
    ostorage = TableStorage(str(other))
    staged = stage_decision(ostorage, COMMITTED)
    assert staged.version is not None and staged.staged is not None
    key = decided_key(staged.proposal_id, staged.version, staged.staged)
    ostorage.put(key, ostorage.get(key).replace(b"commitInfo", b"commitInfx"))
    p = _publish(other, _by_file(other, staged))
    assert "changed after staging" in (p.halted(staged.table_id) or "")
    assert not ostorage.exists(f"_delta_log/{staged.version:020d}.json")
    ostorage.delete(key)
    p = _publish(other, _by_file(other, staged))
    assert "is gone and the version was never published" in (p.halted(staged.table_id) or "")


def test_max_staged_bytes_is_an_operators_setting(tmp_path: Path) -> None:
    """The bound on a commit by reference (and so on how long deciding one holds its partition's other tables) is
    read from the config file, the environment and the flag; below 1 is refused at start."""
    from deltacoord.coordinator import settings

    assert settings.load(None, environ={}).coordinator.max_staged_bytes == 1 << 30
    cfg = tmp_path / "c.toml"
    cfg.write_text("[coordinator]\nmax_staged_bytes = 34000000\n")
    assert settings.load(cfg, environ={}).coordinator.max_staged_bytes == 34_000_000
    assert settings.load(cfg, environ={"DELTACOORD_MAX_STAGED_BYTES": "1000"}).coordinator.max_staged_bytes == 1000
    assert settings.load(cfg, {"max_staged_bytes": 2000}, environ={}).coordinator.max_staged_bytes == 2000
    with pytest.raises(settings.SettingsError, match="max_staged_bytes must be 1 or more"):
        settings.load(None, {"max_staged_bytes": 0}, environ={})


def _vouched(storage: TableStorage, data: bytes) -> tuple[Proposal, Decision]:
    """A proposal by reference whose file `data` a strict reading vouched for, and a commit of exactly its actions."""
    ref = StagedActions(hashlib.sha256(data).hexdigest(), len(parse_commit(data)), len(data))
    storage.put(writer_key(FULL_PROPOSAL.proposal_id, ref), data)
    p = dataclasses.replace(FULL_PROPOSAL, actions=VerbatimActions(parse_commit(data)), staged=ref)
    assert isinstance(COMMITTED.actions[0], CommitInfo)
    return p, dataclasses.replace(COMMITTED, proposal_id=p.proposal_id, actions=(COMMITTED.actions[0], *p.actions))


def _decided_bytes(storage: TableStorage, d: Decision) -> bytes:
    assert d.staged is not None and d.version is not None
    return storage.get(decided_key(d.proposal_id, d.version, d.staged))


def test_a_commit_of_exactly_a_vouched_writer_file_is_its_commit_info_then_that_file(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    p, d = _vouched(storage, commit_to_json_lines(FULL_PROPOSAL.actions))
    encoded = _decided_bytes(storage, stage_decision(storage, d))
    copied = stage_decision(storage, d, p)
    assert _decided_bytes(storage, copied) == encoded, "a file written by this project's encoder: the same bytes"
    # Lines another writer laid out otherwise (key order, spaces, an explicit null) are copied as they are.
    other = b"".join(json.dumps({k: dict(reversed(v.items())) for k, v in json.loads(line).items()}).encode() + b"\n"
                     for line in commit_to_json_lines(FULL_PROPOSAL.actions).splitlines())
    assert other != commit_to_json_lines(FULL_PROPOSAL.actions)
    p, d = _vouched(storage, other)
    copied = stage_decision(storage, d, p)
    data = _decided_bytes(storage, copied)
    assert data == commit_to_json_lines(d.actions[:1]) + other
    assert copied.staged == StagedActions(hashlib.sha256(data).hexdigest(), len(d.actions), len(data))
    assert tuple(parse_commit(data)) == d.actions


def test_a_writer_file_is_not_copied_unless_the_commit_is_exactly_its_vouched_actions(tmp_path: Path) -> None:
    storage = TableStorage(str(tmp_path))
    other = commit_to_json_lines(FULL_PROPOSAL.actions).replace(b'{"', b'{ "')
    p, d = _vouched(storage, other)
    encoded = commit_to_json_lines(d.actions)
    plain = dataclasses.replace(p, actions=tuple(p.actions))
    assert _decided_bytes(storage, stage_decision(storage, d, plain)) == encoded, "not vouched for: written anew"
    equal_not_same = dataclasses.replace(d, actions=(d.actions[0], *(dataclasses.replace(a) for a in p.actions)))
    assert _decided_bytes(storage, stage_decision(storage, equal_not_same, p)) == encoded, "rebased: written anew"
    assert _decided_bytes(storage, stage_decision(storage, d, p)) != encoded, "exactly its actions: copied"
    assert p.staged is not None
    storage.put(writer_key(p.proposal_id, p.staged), other.replace(b'"path"', b'"pat\\u0068"'))
    assert _decided_bytes(storage, stage_decision(storage, d, p)) == encoded, "changed since it was read: written anew"
    storage.delete(writer_key(p.proposal_id, p.staged))
    again = stage_decision(storage, d, p)
    assert _decided_bytes(storage, again) == encoded, "gone: written anew"
    assert again.staged == staged_bytes(d.actions)[1]


def test_only_a_file_the_strict_reading_took_whole_is_loaded_as_verbatim(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staged_module, "ARROW_LINES_MIN_BYTES", 0)  # the strict reading for any size
    storage = TableStorage(str(tmp_path))
    files = tuple(AddFile(f"part-{i:05d}.parquet", {}, 100 + i, 1, True, stats=f'{{"numRecords":{i}}}')
                  for i in range(50))

    def loaded(actions: tuple[Action, ...]) -> Proposal:
        data, ref = staged_bytes(actions)
        storage.put(writer_key(FULL_PROPOSAL.proposal_id, ref), data)
        return load_proposal(storage, dataclasses.replace(FULL_PROPOSAL, actions=(), staged=ref))

    p = loaded((*files, files[0].to_remove(5)))
    assert isinstance(p.actions, VerbatimActions) and p.actions == (*files, files[0].to_remove(5))
    d = dataclasses.replace(COMMITTED, proposal_id=p.proposal_id, actions=(COMMITTED.actions[0], *p.actions))
    assert _decided_bytes(storage, stage_decision(storage, d, p)) == commit_to_json_lines(d.actions)
    with_metadata = loaded((*files, ACTIONS["metadata-minimal"]))
    assert with_metadata.actions == (*files, ACTIONS["metadata-minimal"])
    assert not isinstance(with_metadata.actions, VerbatimActions), "a line the strict reading leaves to the parser"
    monkeypatch.setattr(staged_module, "ARROW_LINES_MIN_BYTES", 1 << 40)
    assert not isinstance(loaded(files).actions, VerbatimActions), "a file read by the parser alone"
