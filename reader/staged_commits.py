"""Commits carried by reference, at the storage edge: stage, load, resolve and delete staged files.

What a staged file is and how it is named and checked is `deltacoord.schemas.staged` (pure). Here: the writer stages
its actions before proposing, the coordinator loads them before deciding and stages its decided commit
before ratifying, and whoever reads a decision from the commits topic (recovery, the change feed, ratified
reads) resolves it to its whole commit: from `_delta_log/<version>.json` once published (same bytes, same
digest), from the coordinator's staged file before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from deltacoord.reader.log import commit_key
from deltacoord.schemas.actions import Action
from deltacoord.schemas.messages import Decision, Proposal, StagedActions
from deltacoord.schemas.staged import (
    READ_PIECE_BYTES,
    STAGED_DIR,
    DigestingPieces,
    StagedCommitError,
    StagedDigest,
    check_staged,
    decided_commit_info,
    decided_key,
    decided_version,
    holds_verbatim,
    parse_staged,
    parse_staged_pieces,
    staged_pieces,
    writer_key,
)
from deltacoord.storage.table import TableStorage
from deltacoord.storage.uri import StorageError


def _pieces(storage: TableStorage, key: str) -> Iterator[bytes]:
    return storage.read_pieces(key, READ_PIECE_BYTES)


def load_proposal(storage: TableStorage, proposal: Proposal, max_bytes: int | None = None) -> Proposal:
    """The proposal with its staged actions loaded and checked; StagedCommitError when they cannot be.
    `max_bytes` refuses a larger file unread (`StagedCommitTooLargeError`)."""
    ref = proposal.staged
    if ref is None:
        return proposal
    if proposal.actions:
        raise StagedCommitError("a proposal carries its actions either inline or by reference, not both")
    key = writer_key(proposal.proposal_id, ref)
    where = f"{storage.location}/{key}"
    try:
        if max_bytes is not None:
            # The object's own size, not the one the message names: a larger object is never read.
            size = max(ref.size, storage.head(key).size)
            if size > max_bytes:
                raise StagedCommitTooLargeError(
                    f"the proposal's staged actions ({size:,} bytes) exceed this coordinator's max_staged_bytes "
                    f"({max_bytes:,}): split the commit, or raise the limit")
        actions = parse_staged_pieces(lambda: _pieces(storage, key), ref, where)
    except FileNotFoundError as e:
        raise StagedCommitError(f"{where} does not exist: the writer's staged actions are gone (deleted after "
                                "a decision, or never written)") from e
    return dataclasses.replace(proposal, actions=actions)


class StagedCommitTooLargeError(StagedCommitError):
    """Staged actions larger than the reader's limit: refused before anything is read."""


def stage_decision(storage: TableStorage, decision: Decision, source: Proposal | None = None) -> Decision:
    """Stage a committed decision's whole commit, written a piece at a time (its bytes are never held whole); the
    decision, still whole in memory, now names the file (published from it: `copy_decided`).

    When the commit is its commitInfo and then exactly the actions `source` loaded from a writer's staged file that
    vouched for its lines (`holds_verbatim`), the file is that commitInfo's line and then the writer's file, copied
    (and checked against its digest on the way: a file changed since it was loaded is not copied, the actions are
    written instead)."""
    assert decision.version is not None
    tmp = storage.temp_for(f"{STAGED_DIR}staging.json")
    try:
        digest = StagedDigest()
        if not (source is not None and source.staged is not None and holds_verbatim(decision.actions, source.actions)
                and _copy_writer_file(storage, decision.actions[0], source, tmp, digest)):
            digest = StagedDigest()
            with open(tmp, "wb") as out:
                for piece in staged_pieces(decision.actions):
                    digest.update(piece)
                    out.write(piece)
        ref = digest.ref()
        key = decided_key(decision.proposal_id, decision.version, ref)
        if not storage.put_file_if_absent(key, tmp) and not _matches(storage, key, ref):
            # Another content under the name (not ratified: the name holds the digest): replaced.
            with storage.open_output(key) as dest, open(tmp, "rb") as src:
                while piece := src.read(READ_PIECE_BYTES):
                    dest.write(piece)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dataclasses.replace(decision, staged=ref)


def _copy_writer_file(storage: TableStorage, commit_info: Action, source: Proposal, tmp: str,
                      digest: StagedDigest) -> bool:
    """Write `commit_info`'s line and then the writer's staged file of `source` into `tmp`, feeding `digest`; False
    (`tmp` then holds nothing of use) when that file is gone or is no longer the one `source` names."""
    ref = source.staged
    assert ref is not None
    key = writer_key(source.proposal_id, ref)
    last = b""
    try:
        with open(tmp, "wb") as out:
            for piece in staged_pieces((commit_info,)):
                digest.update(piece)
                out.write(piece)
            seen = DigestingPieces(_pieces(storage, key), ref, key)
            for piece in seen:
                digest.update(piece)
                out.write(piece)
                last = piece[-1:] or last
            seen.check()
    except (FileNotFoundError, StagedCommitError):
        return False
    # Its last line ends as every line of a commit does (so a decided file counts one newline an action).
    return last == b"\n"


def _matches(storage: TableStorage, key: str, ref: StagedActions) -> bool:
    """Whether the object is the file `ref` names (read a piece at a time); False when it is missing."""
    h, size = hashlib.sha256(), 0
    try:
        for piece in _pieces(storage, key):
            size += len(piece)
            if size > ref.size:
                return False
            h.update(piece)
    except FileNotFoundError:
        return False
    return size == ref.size and h.hexdigest() == ref.sha256


def copy_decided(storage: TableStorage, proposal_id: str, version: int, ref: StagedActions, dest: Path) -> bool:
    """Copy the coordinator's staged commit of `version` into the local file `dest`, a piece at a time, checking
    its digest: what the publisher makes `<version>.json` of. False (and no `dest`) when the staged file is gone
    (swept once published); StagedCommitError (and no `dest`) when it is not the file `ref` names."""
    key = decided_key(proposal_id, version, ref)
    h, size = hashlib.sha256(), 0
    try:
        with open(dest, "wb") as out:
            for piece in _pieces(storage, key):
                size += len(piece)
                if size > ref.size:
                    break
                h.update(piece)
                out.write(piece)
    except FileNotFoundError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest)
        return False
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest)
        raise
    if size != ref.size or h.hexdigest() != ref.sha256:
        os.unlink(dest)
        raise StagedCommitError(f"{storage.location}/{key} is not the staged commit of version {version} that was "
                                f"ratified (SHA-256 {ref.sha256}, {ref.size} bytes): it was changed after staging")
    return True


def is_published_as(storage: TableStorage, version: int, ref: StagedActions) -> bool:
    """Whether `<version>.json` holds the commit `ref` names."""
    return _matches(storage, commit_key(version), ref)


def on_the_wire(decision: Decision) -> Decision:
    """The decision as recorded on the commits topic: by reference, only the commitInfo stays inline."""
    if decision.staged is None:
        return decision
    return dataclasses.replace(decision, actions=decided_commit_info(decision.actions))


def _read(storage: TableStorage, key: str, ref: StagedActions) -> bytes | None:
    """The object's bytes when it is the file `ref` names; None when it is missing or another content."""
    try:
        data = storage.get(key)
    except FileNotFoundError:
        return None
    try:
        check_staged(data, ref, key)
    except StagedCommitError:
        return None
    return data


def resolve_decision(storage: TableStorage, decision: Decision) -> Decision:
    """`resolve_decision_bytes` without the bytes."""
    return resolve_decision_bytes(storage, decision)[0]


def resolve_decision_bytes(storage: TableStorage, decision: Decision) -> tuple[Decision, bytes | None]:
    """The decision with its whole commit, fetched when it was recorded by reference.

    The published version is read first (the staged file is deleted once it is published); the staged
    file before that. Raises StagedCommitError when neither holds the commit (a `_delta_log` cleaned
    beyond this version, or a staged file deleted by hand).
    """
    ref = decision.staged
    if ref is None or decision.version is None:
        return decision, None
    decided = decided_key(decision.proposal_id, decision.version, ref)
    for key in (commit_key(decision.version), decided, commit_key(decision.version)):  # published in between
        data = _read(storage, key, ref)
        if data is not None:
            return dataclasses.replace(decision, actions=parse_staged(data, ref, f"{storage.location}/{key}")), data
    raise StagedCommitError(
        f"version {decision.version} of {storage.location} was recorded by reference, and neither "
        f"{commit_key(decision.version)} nor {decided} holds it (SHA-256 {ref.sha256})")


def delete_writer_staged(storage: TableStorage, proposal_id: str, ref: StagedActions) -> None:
    """Delete a writer's staged actions (missing is fine)."""
    storage.delete(writer_key(proposal_id, ref))


def sweep_decided(storage: TableStorage, published: int) -> int:
    """Delete the coordinator's staged commits of versions at or below `published` (each such version is in
    `_delta_log`, so nothing needs them: the published one, or one an aborted transaction or a fenced coordinator
    left); returns how many."""
    n = 0
    for info in storage.list(STAGED_DIR):
        v = decided_version(info.key)
        if v is not None and v <= published:
            storage.delete(info.key)
            n += 1
    return n


__all__ = [
    "StagedCommitError",
    "StagedCommitTooLargeError",
    "StorageError",
    "copy_decided",
    "delete_writer_staged",
    "is_published_as",
    "load_proposal",
    "on_the_wire",
    "resolve_decision",
    "resolve_decision_bytes",
    "stage_decision",
    "sweep_decided",
]
