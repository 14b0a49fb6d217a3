"""Commit coalescing (group commit at the Delta level): which accepted commits may share one version, and the
version they make together. Pure.

On an object store each version costs a conditional PUT (tens of milliseconds), so a table whose proposals
arrive faster than its store takes versions would fall further behind with every commit. While the table's
publication lane still holds unpublished versions (`busy`, known at the Kafka edge), consecutive accepted
commits of one decided batch that pass `coalescable` become ONE Delta version: the first (the leader) is
decided as usual; each next one is decided against the state holding the group so far (so every conflict,
txn and path check sees it) and then folded into the leader's version (`merge`). Under light load (the lane
idle when the batch is decided) nothing is coalesced, so latency does not grow.

What may share a version (everything else ends the group and keeps its own version):

* an inline proposal (not by reference) whose actions are only `add`s without deletion vectors and `txn`s,
  and that read nothing (a blind append, Delta's `isBlindAppend`): no remove, cdc, metaData, protocol,
  domainMetadata, deletion vector. A blind append's isolation promise holds at any version after its read
  version: it read nothing another commit could change.
* a `txn` app id and a file path at most once per version (Delta's rules: one `txn` per app id, one action
  per path), and the version's commit stays under `deltacoord.schemas.staged.INLINE_MAX_BYTES` and `MAX_COALESCED`
  proposals, so its decision is one modest Kafka record.
* on a table that does not set `deltacoord.coalesce=false`.

The version's commitInfo is the leader's (its timestamp and in-commit timestamp: later than the version
before, as the leader was decided), with `isBlindAppend` true, the writers' `operationMetrics` summed, and
`coalescedCommits`: per coalesced proposal in order its own commitInfo (txnId, operation, operationParameters,
readVersion, isolationLevel, the writer's keys) without the version-level timestamps, so `history` and a
lookup by proposal id explain each writer's commit. Row ids stay per file (each add keeps the ids it was
given in decision order, with the shared version as `defaultRowCommitVersion`; one high-water mark, the
last). The Kafka decisions record it: the leader's holds the whole commit, the others its version and
`coalesced_into` (the leader's proposal id); `merge` is deterministic, so recovery republishes the same bytes
from the leader's decision alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from deltacoord.schemas.actions import (
    COALESCED_KEY,
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    SetTransaction,
    commit_to_json_lines,
)
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.row_tracking import DOMAIN as ROW_TRACKING_DOMAIN
from deltacoord.schemas.staged import INLINE_MAX_BYTES

#: Proposals sharing one version at most.
MAX_COALESCED = 64
#: Keys of a commitInfo that belong to the version, not to one writer's commit.
_VERSION_KEYS = frozenset({"timestamp", "inCommitTimestamp", COALESCED_KEY})


def coalescable(p: Proposal, actions: Sequence[Action]) -> bool:
    """Whether an accepted commit (`actions`, commitInfo first) may share its version with others."""
    if p.staged is not None or not p.is_blind_append or not actions or not isinstance(actions[0], CommitInfo):
        return False
    for a in actions[1:]:
        if isinstance(a, AddFile):
            if a.deletion_vector is not None:
                return False
        elif isinstance(a, DomainMetadata):
            if a.domain != ROW_TRACKING_DOMAIN or any(isinstance(x, DomainMetadata) for x in p.actions):
                return False  # only the coordinator's own row-id high-water mark
        elif not isinstance(a, SetTransaction):
            return False
    return True


def _app_ids(actions: Sequence[Action]) -> set[str]:
    return {a.app_id for a in actions if isinstance(a, SetTransaction)}


def _paths(actions: Sequence[Action]) -> set[str]:
    return {a.path for a in actions if isinstance(a, AddFile)}


@dataclass
class Group:
    """The commits of one version being coalesced: the leader's first."""

    version: int
    leader: int
    parts: list[tuple[Action, ...]] = field(default_factory=list)
    app_ids: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    size: int = 0

    @staticmethod
    def open(version: int, leader: int, actions: tuple[Action, ...]) -> Group:
        return Group(version, leader, [actions], _app_ids(actions), _paths(actions), len(commit_to_json_lines(actions)))

    def takes(self, actions: Sequence[Action]) -> int | None:
        """The commit's size in bytes when it may join the group (distinct app ids and paths, within the
        bounds), else None."""
        if len(self.parts) >= MAX_COALESCED:
            return None
        if not self.app_ids.isdisjoint(_app_ids(actions)) or not self.paths.isdisjoint(_paths(actions)):
            return None
        size = len(commit_to_json_lines(actions))
        return size if self.size + size <= INLINE_MAX_BYTES else None

    def join(self, actions: tuple[Action, ...], size: int) -> tuple[Action, ...]:
        """Add a commit; the version's whole commit as it now stands."""
        self.parts.append(actions)
        self.app_ids |= _app_ids(actions)
        self.paths |= _paths(actions)
        self.size += size
        return merge(self.version, self.parts)


def _summed(metrics: Sequence[Any]) -> dict[str, Any] | None:
    """Operation metrics summed key by key (Delta writes them as decimal strings) where every part has the key."""
    if not metrics or not all(isinstance(m, Mapping) for m in metrics):
        return None
    out: dict[str, Any] = {}
    for k in metrics[0]:
        vals = [m.get(k) for m in metrics]
        if all(type(v) is int for v in vals):
            out[k] = sum(int(v) for v in vals if v is not None)
        elif all(isinstance(v, str) and v.isdigit() for v in vals):
            out[k] = str(sum(int(v) for v in vals if isinstance(v, str)))
    return out


def merge(version: int, parts: Sequence[tuple[Action, ...]]) -> tuple[Action, ...]:
    """One version's commit from coalesced commits (each commitInfo first, decided in this order); deterministic."""
    infos = [p[0] for p in parts if isinstance(p[0], CommitInfo)]
    assert len(infos) == len(parts), "a coalesced commit starts with its commitInfo"
    values: dict[str, Any] = dict(infos[0].values)
    values["isBlindAppend"] = True
    metrics = _summed([ci.values.get("operationMetrics") for ci in infos])
    if metrics is not None:
        values["operationMetrics"] = metrics
    values[COALESCED_KEY] = [{k: v for k, v in ci.values.items() if k not in _VERSION_KEYS} for ci in infos]
    out: list[Action] = [CommitInfo(values)]
    mark: DomainMetadata | None = None
    for part in parts:
        for a in part[1:]:
            if isinstance(a, DomainMetadata):
                mark = a  # the row-id high-water mark: the last part's is the version's
            elif isinstance(a, AddFile) and a.default_row_commit_version is not None:
                out.append(replace(a, default_row_commit_version=version))
            else:
                out.append(a)
    if mark is not None:
        out.append(mark)
    return tuple(out)


__all__ = ["COALESCED_KEY", "MAX_COALESCED", "Group", "coalescable", "merge"]
