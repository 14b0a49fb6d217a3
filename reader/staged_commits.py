"""Commits carried by reference, at the storage edge: stage, load, resolve and delete staged files.

What a staged file is and how it is named and checked is `deltacoord.schemas.staged` (pure). Here: the writer stages
its actions before proposing, the coordinator loads them before deciding and stages its decided commit
before ratifying, and whoever reads a decision from the commits topic (recovery, the change feed, ratified
reads) resolves it to its whole commit: from `_delta_log/<version>.json` once published (same bytes, same
digest), from the coordinator's staged file before.
"""

from __future__ import annotations

import dataclasses

from deltacoord.reader.log import commit_key
from deltacoord.schemas.messages import Decision, Proposal, StagedActions
from deltacoord.schemas.staged import (
    STAGED_DIR,
    StagedCommitError,
    check_staged,
    decided_commit_info,
    decided_key,
    decided_version,
    parse_staged,
    staged_bytes,
    writer_key,
)
from deltacoord.storage.table import TableStorage
from deltacoord.storage.uri import StorageError


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
        data = storage.get(key)
    except FileNotFoundError as e:
        raise StagedCommitError(f"{where} does not exist: the writer's staged actions are gone (deleted after "
                                "a decision, or never written)") from e
    return dataclasses.replace(proposal, actions=parse_staged(data, ref, where))


class StagedCommitTooLargeError(StagedCommitError):
    """Staged actions larger than the reader's limit: refused before anything is read."""


def stage_decision(storage: TableStorage, decision: Decision) -> tuple[Decision, bytes]:
    """Stage a committed decision's whole commit; the decision, still whole in memory, now names the file, and
    the file's bytes (published as they are)."""
    assert decision.version is not None
    data, ref = staged_bytes(decision.actions)
    key = decided_key(decision.proposal_id, decision.version, ref)
    if not storage.put_if_absent(key, data) and _read(storage, key, ref) is None:
        storage.put(key, data)  # another content under the name (not ratified: the name holds the digest): replaced
    return dataclasses.replace(decision, staged=ref), data


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
    "delete_writer_staged",
    "load_proposal",
    "on_the_wire",
    "resolve_decision",
    "resolve_decision_bytes",
    "stage_decision",
    "sweep_decided",
]
