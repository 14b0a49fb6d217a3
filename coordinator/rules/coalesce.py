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
    """The commits of one version being coalesced: the leader's first.

    The version's commit is kept as it grows (`_Merged`), so each join costs O(its own actions), not
    O(the group so far): `join` returns what `merge(version, parts)` returns, and what the join adds to the
    version, with which the table's state grows that version in place (`TableState.extend`)."""

    version: int
    leader: int
    parts: list[tuple[Action, ...]] = field(default_factory=list)
    app_ids: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    size: int = 0
    merged: _Merged | None = None

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

    def join(self, actions: tuple[Action, ...], size: int) -> tuple[tuple[Action, ...], tuple[Action, ...] | None]:
        """Add a commit: the version's whole commit as it now stands (`merge` of the parts), and what the join
        adds to the version as it stood before (the commit's adds as the version holds them, its txns, its
        high-water mark), for `TableState.extend`; None when the version's earlier actions changed too (at the
        first join, when a leader's add held another defaultRowCommitVersion than the version)."""
        first = self.merged is None
        if self.merged is None:
            self.merged = _Merged(self.version, self.parts[0])
        self.parts.append(actions)
        self.app_ids |= _app_ids(actions)
        self.paths |= _paths(actions)
        self.size += size
        added = self.merged.add(actions)
        return self.merged.commit(), None if first and self.merged.leader_changed else added


class _Merged:
    """`merge` of a group's parts, kept up to date part by part."""

    __slots__ = ("_body", "_coalesced", "_mark", "_metrics", "_metrics_ok", "_values", "leader_changed", "version")

    def __init__(self, version: int, first: tuple[Action, ...]) -> None:
        self.version = version
        ci = first[0]
        assert isinstance(ci, CommitInfo), "a coalesced commit starts with its commitInfo"
        self._values: dict[str, Any] = dict(ci.values)
        self._values["isBlindAppend"] = True
        self._coalesced: list[dict[str, Any]] = []
        self._body: list[Action] = []
        self._mark: DomainMetadata | None = None
        m0 = ci.values.get("operationMetrics")
        self._metrics_ok = isinstance(m0, Mapping)
        #: Per key of the first part's metrics: (True: ints, False: decimal strings; the sum so far), or None
        #: once a part's value is not of the first part's kind (`_summed`).
        self._metrics: dict[str, tuple[bool, int] | None] = {}
        if isinstance(m0, Mapping):
            for k, v in m0.items():
                if type(v) is int:
                    self._metrics[k] = (True, v)
                elif isinstance(v, str) and v.isdigit():
                    self._metrics[k] = (False, int(v))
                else:
                    self._metrics[k] = None
        #: Whether a leader's add held another defaultRowCommitVersion than the version (its writer's).
        self.leader_changed = self._take(first)[1]

    def _take(self, part: tuple[Action, ...]) -> tuple[tuple[Action, ...], bool]:
        """Take a part: what it adds to the version (its adds with the version as defaultRowCommitVersion, its
        txns, its high-water mark), and whether that changed one of its adds."""
        ci = part[0]
        assert isinstance(ci, CommitInfo), "a coalesced commit starts with its commitInfo"
        self._coalesced.append({k: v for k, v in ci.values.items() if k not in _VERSION_KEYS})
        version = self.version
        body = self._body
        n = len(body)
        mark: DomainMetadata | None = None
        changed = False
        for a in part[1:]:
            if isinstance(a, DomainMetadata):
                mark = self._mark = a  # the row-id high-water mark: the last part's is the version's
            elif isinstance(a, AddFile) and a.default_row_commit_version is not None:
                changed = changed or a.default_row_commit_version != version
                body.append(replace(a, default_row_commit_version=version))
            else:
                body.append(a)
        return (*body[n:], mark) if mark is not None else tuple(body[n:]), changed

    def add(self, part: tuple[Action, ...]) -> tuple[Action, ...]:
        """Take a part after the first: what it adds to the version (`_take`)."""
        ci = part[0]
        assert isinstance(ci, CommitInfo), "a coalesced commit starts with its commitInfo"
        m = ci.values.get("operationMetrics")
        if not isinstance(m, Mapping):
            self._metrics_ok = False
        elif self._metrics_ok:
            metrics = self._metrics
            for k, got in metrics.items():
                if got is None:
                    continue
                ints, total = got
                v = m.get(k)
                if ints and type(v) is int:
                    metrics[k] = (True, total + v)
                elif not ints and isinstance(v, str) and v.isdigit():
                    metrics[k] = (False, total + int(v))
                else:
                    metrics[k] = None
        return self._take(part)[0]

    def commit(self) -> tuple[Action, ...]:
        values = dict(self._values)
        if self._metrics_ok:
            values["operationMetrics"] = {k: got[1] if got[0] else str(got[1])
                                          for k, got in self._metrics.items() if got is not None}
        values[COALESCED_KEY] = list(self._coalesced)
        out: list[Action] = [CommitInfo(values), *self._body]
        if self._mark is not None:
            out.append(self._mark)
        return tuple(out)


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
