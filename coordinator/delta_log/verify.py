"""Check a coordinated table against its source of truth (the commits topic).

`verify_table` reports, without changing anything:

* the commits topic: committed versions of the table contiguous from 0, each
  proposal decided once (answers to redeliveries, `duplicate_of`, are counted
  apart and are not a second decision); a commit coalesced into an earlier
  decision's version (`coalesced_into`) follows that version, whose commitInfo
  names it; an adoption record at version N
  (`deltacoord table adopt`) stands for the versions up to N, which another
  engine wrote and only `_delta_log` holds (`adopted_versions`);
* `_delta_log` versions contiguous from 0, or from the oldest retained commit
  when log cleanup removed older ones (then a checkpoint at or after the
  version before it must exist, or the table cannot be reconstructed);
* every `<v>.json` byte-for-byte equal to the committed decision of version v,
  no version in `_delta_log` the topic does not have, and (unless
  `require_published=False`, for a coordinator still publishing) every
  ratified version published;
* every data file the latest snapshot references present, with its size;
* every checkpoint equal to replaying the JSON commits up to its version (the
  topic's decision stands in for a commit file removed by log cleanup): live
  files (key, partition values, size), protocol, metaData, txns, domain
  metadata; its tombstones must be tombstones of the replay. Read directly, so
  an unreadable checkpoint is reported (a reader silently falls back to JSON);
* `_last_checkpoint`, when present, readable and naming a complete checkpoint
  that exists.

Data files no retained commit or checkpoint references (a writer killed after
staging, a rejected proposal whose writer could not clean up, files waiting
for VACUUM) are listed in `orphan_files`: they are not problems.

The table is any location `deltacoord.reader.log` accepts; pass `storage_options` (or a
`TableStorage`) for an object store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from deltacoord.coordinator.kafka.control import ADOPT, DROP, control_kind
from deltacoord.coordinator.kafka.recovery import decision_resolver, read_decisions
from deltacoord.coordinator.rules.action_values import deletion_vector_problem, partition_value_problem
from deltacoord.coordinator.rules.stats import stats_problem
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.checkpoint import read_checkpoint_actions
from deltacoord.reader.log import (
    LAST_CHECKPOINT_KEY,
    LAST_CHECKPOINT_NAME,
    CheckpointRef,
    LogListing,
    TableLocation,
    TableNotFoundError,
    commit_file_name,
    data_object,
    list_log,
    log_file_names,
    read_commit,
    read_last_checkpoint,
    table_storage,
)
from deltacoord.reader.snapshot import LogReplayState
from deltacoord.schemas.action_arrow import key_string
from deltacoord.schemas.actions import (
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    commit_to_json_lines,
)
from deltacoord.schemas.expressions.partitions import partition_schema
from deltacoord.schemas.properties import TableProperties
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import partition_for
from deltacoord.schemas.staged import StagedCommitError
from deltacoord.storage.table import StorageError, TableStorage

#: At most this many examples per kind of mismatch go into a problem message.
_EXAMPLES = 5
_CHECKPOINT_COLUMNS = ("txn", "metaData", "protocol", "domainMetadata", "add", "remove")


@dataclass
class VerifyReport:
    table_id: str
    table_uri: str = ""
    #: Committed (non-duplicate) versions on the commits topic.
    topic_versions: int = 0
    #: Ratified versions whose `<v>.json` is in `_delta_log` (and was compared).
    published_versions: int = 0
    #: Ratified versions whose commit file log cleanup removed (covered by a checkpoint).
    cleaned_versions: int = 0
    #: Versions another engine wrote before the table was adopted (in `_delta_log` only).
    adopted_versions: int = 0
    rejections: int = 0
    duplicate_answers: int = 0
    #: Commits that share the version of an earlier decision (`coalesced_into`), each named by its commitInfo.
    coalesced_commits: int = 0
    #: Oldest and newest `<v>.json` in `_delta_log` (None: no commit file).
    log_versions: tuple[int, int] | None = None
    checkpoints_checked: list[int] = field(default_factory=list)
    last_checkpoint: int | None = None
    live_files: int = 0
    orphan_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "table_id": self.table_id,
            "table_uri": self.table_uri,
            "topic_versions": self.topic_versions,
            "published_versions": self.published_versions,
            "cleaned_versions": self.cleaned_versions,
            "adopted_versions": self.adopted_versions,
            "rejections": self.rejections,
            "duplicate_answers": self.duplicate_answers,
            "coalesced_commits": self.coalesced_commits,
            "log_versions": None if self.log_versions is None else list(self.log_versions),
            "checkpoints_checked": list(self.checkpoints_checked),
            "last_checkpoint": self.last_checkpoint,
            "live_files": self.live_files,
            "orphan_files": list(self.orphan_files),
            "problems": list(self.problems),
        }


def verify_table(settings: CoordinatorSettings, table_uri: TableLocation, table_id: str, num_partitions: int = 1,
                 *, require_published: bool = True, storage_options: Mapping[str, str] | None = None) -> VerifyReport:
    """Check one table (see the module doc); `rep.problems` is empty when everything holds."""
    root = table_storage(table_uri, storage_options)
    rep = VerifyReport(table_id, root.location if isinstance(table_uri, TableStorage) else str(table_uri))
    adopted: set[int] = set()
    ratified = _read_topic(rep, settings, table_id, partition_for(table_id, num_partitions), adopted)

    try:
        listing = list_log(root)
    except TableNotFoundError as e:
        if not ratified:
            rep.problems.append(f"no Delta table at {rep.table_uri}: no _delta_log there and no commit of table id "
                                f"{table_id} on {settings.topics.commits}; check the path (and --table-id, --topic-prefix)")
        elif require_published:
            rep.problems.append(f"{len(ratified)} versions are ratified but there is no _delta_log: {e}")
        return rep
    commits = listing.commits
    covered_below = _check_listing(rep, listing)
    _compare_commits(rep, root, listing, ratified, covered_below, require_published, adopted)
    referenced = _check_replay_and_checkpoints(rep, listing, ratified)
    _check_last_checkpoint(rep, root, listing)
    if commits or listing.checkpoints:
        _check_data_files(rep, root)
    rep.orphan_files = _orphans(root, referenced)
    return rep


# --------------------------------------------------------------------------- the commits topic


def _read_topic(rep: VerifyReport, settings: CoordinatorSettings, table_id: str, partition: int,
                adopted: set[int]) -> dict[int, tuple[Action, ...]]:
    """The table's ratified versions from the commits topic (problems for gaps and double decisions); the versions
    adoption records stand for go to `adopted`."""
    decided: Counter[str] = Counter()  # new versions per proposal id
    rejected: set[str] = set()
    ratified: dict[int, tuple[Action, ...]] = {}
    resolve = decision_resolver(settings)
    expected = 0
    for d in read_decisions(settings, partition, table_id=table_id):
        if control_kind(d) == DROP and d.duplicate_of is None:  # the versions after it are a new table's
            ratified.clear()
            adopted.clear()
            expected = rep.topic_versions = rep.adopted_versions = 0
            continue
        if control_kind(d) == ADOPT:
            if d.winning_version is not None and d.winning_version >= expected:
                adopted.update(range(expected, d.winning_version + 1))
                rep.adopted_versions += d.winning_version + 1 - expected
                expected = d.winning_version + 1
            continue
        if d.committed and d.duplicate_of is not None:
            rep.duplicate_answers += 1  # the answer to a redelivery names the first decision's version
            continue
        if not d.committed:
            rep.rejections += 1
            if d.reason_code != ReasonCode.WRITER_NOT_AUTHENTICATED:  # a message that proved nothing claims no id
                rejected.add(d.proposal_id)
            continue
        if d.coalesced_into is not None:  # its version is the one just ratified, whose commitInfo names it
            held = ratified.get(d.version) if d.version is not None else None
            ci = held[0] if held else None
            if d.version != expected - 1 or not isinstance(ci, CommitInfo) or d.proposal_id not in ci.txn_ids:
                rep.problems.append(f"commits topic: proposal {d.proposal_id} is coalesced into version {d.version}, "
                                    "whose commit does not record it")
            else:
                rep.coalesced_commits += 1
            decided[d.proposal_id] += 1
            continue
        decided[d.proposal_id] += 1
        if d.version != expected:
            rep.problems.append(f"commits topic: version {d.version} where {expected} was expected")
            expected = (d.version or 0) + 1
            continue
        try:
            d = resolve(d)[0]
        except (StagedCommitError, StorageError, OSError, ValueError) as e:
            rep.problems.append(f"commits topic: version {d.version} was recorded by reference and cannot be read: {e}")
            expected += 1
            continue
        ratified[expected] = d.actions
        expected += 1
        rep.topic_versions += 1
    # A proposal decided twice: committed at two versions, or rejected and later committed. A rejection answered
    # again (the proposal re-sent) is one decision repeated, not a second one.
    twice = sorted(pid for pid, n in decided.items() if n > 1 or pid in rejected)
    for pid in twice[:_EXAMPLES]:
        rep.problems.append(f"proposal {pid} was committed at {decided[pid]} versions" if decided[pid] > 1 else
                            f"proposal {pid} was rejected and later committed")
    if len(twice) > _EXAMPLES:
        rep.problems.append(f"... and {len(twice) - _EXAMPLES} more proposals decided twice")
    return ratified


# --------------------------------------------------------------------------- _delta_log


def _check_listing(rep: VerifyReport, listing: LogListing) -> int:
    """Contiguity of the commit files; returns the version below which missing commits are cleaned up."""
    commits = listing.commits
    checkpoint_versions = sorted(listing.checkpoints)
    if not commits:
        if checkpoint_versions:
            rep.problems.append(f"_delta_log has checkpoints {checkpoint_versions[:_EXAMPLES]} but no commit file")
        return 0
    earliest, latest = min(commits), max(commits)
    rep.log_versions = (earliest, latest)
    covered_below = 0
    if earliest > 0:
        if any(v >= earliest - 1 for v in checkpoint_versions):
            covered_below = earliest
        else:
            rep.problems.append(
                f"_delta_log starts at version {earliest} (log cleanup?) but no checkpoint at or after version "
                f"{earliest - 1} covers the versions before it (checkpoints: {checkpoint_versions[-_EXAMPLES:]})"
            )
    gaps = [v for v in range(earliest, latest + 1) if v not in commits]
    if gaps:
        rep.problems.append(f"_delta_log versions are not contiguous: {len(gaps)} missing between {earliest} and "
                            f"{latest}, first {gaps[:_EXAMPLES]}")
    beyond = [v for v in checkpoint_versions if v > latest]
    if beyond:
        rep.problems.append(f"checkpoints {beyond[:_EXAMPLES]} are newer than the newest commit {latest}")
    return covered_below


def _compare_commits(rep: VerifyReport, root: TableStorage, listing: LogListing, ratified: Mapping[int, tuple[Action, ...]],
                     covered_below: int, require_published: bool, adopted: set[int]) -> None:
    commits = listing.commits
    for v, actions in ratified.items():
        if v not in commits:
            if v < covered_below:
                rep.cleaned_versions += 1
            elif require_published:
                rep.problems.append(f"version {v} is ratified but {commit_file_name(v)} is missing")
            continue
        rep.published_versions += 1
        if listing.commit(v).read_bytes() != commit_to_json_lines(actions):
            rep.problems.append(f"{commit_file_name(v)} differs from the committed decision of version {v}")
    extra = sorted(v for v in commits if v not in ratified and v not in adopted)
    if extra:
        rep.problems.append(f"_delta_log has versions {extra[:_EXAMPLES]} that the commits topic does not")


# --------------------------------------------------------------------------- replay and checkpoints


def _paths(actions: Iterable[Action]) -> Iterable[str]:
    for a in actions:
        if isinstance(a, AddFile | RemoveFile | AddCDCFile):
            yield a.path


def _check_replay_and_checkpoints(rep: VerifyReport, listing: LogListing,
                                  ratified: Mapping[int, tuple[Action, ...]]) -> set[str]:
    """Replay every version once (JSON, or the topic where cleaned up) and compare each checkpoint on the way.

    Returns every data path (as written in the log) a retained commit or checkpoint references.
    """
    referenced: set[str] = set()
    unreadable: list[str] = []
    commits = listing.commits
    latest = max(commits) if commits else -1
    state = LogReplayState()
    replayable = True
    for v in range(latest + 1):
        actions: Iterable[Action] | None = None
        path = listing.commit(v) if v in commits else None
        if path is not None:
            try:
                actions = read_commit(path)
            except (ValueError, UnicodeDecodeError) as e:
                rep.problems.append(f"{path.name} cannot be parsed: {e}")
        if actions is None:
            actions = ratified.get(v)
        if actions is None:
            replayable = False  # neither a commit file nor a ratified decision: reported as a gap above
        elif replayable:
            acts = list(actions)
            state.apply(acts)
            if path is not None:
                referenced.update(_paths(acts))
            unreadable.extend(f"version {v}: {p}" for p in _unreadable_values(acts, state.metadata))
        for ref in listing.checkpoints.get(v, ()):
            rep.checkpoints_checked.append(v)
            ckpt_paths: set[str] = set()
            problems = _checkpoint_problems(ref, state if replayable else None, ckpt_paths)
            rep.problems.extend(problems)
            referenced.update(ckpt_paths)
    rep.problems.extend(f"{u} (Delta readers cannot read it)" for u in unreadable[:_EXAMPLES])
    if len(unreadable) > _EXAMPLES:
        rep.problems.append(f"... and {len(unreadable) - _EXAMPLES} more added files Delta readers cannot read")
    return referenced


def _unreadable_values(actions: Iterable[Action], metadata: Metadata | None) -> Iterator[str]:
    """What the coordinator's validation refuses, found in published adds: stats, partition values against their
    columns' types, deletion-vector descriptors (`deltacoord.coordinator.rules.validate`)."""
    schema = partition_schema(metadata)
    for a in actions:
        if not isinstance(a, AddFile):
            continue
        problem = stats_problem(a.stats)
        if problem is None and a.deletion_vector is not None:
            problem = deletion_vector_problem(a.deletion_vector)
        for c in schema:
            if problem is None:
                why = partition_value_problem(a.partition_values.get(c.physical_name), c.type_name)
                problem = None if why is None else f"partition value of {c.name!r} ({c.type_name}) is {why}"
        if problem is not None:
            yield f"add {a.path!r}: {problem}"


def _describe(keys: Iterable[str]) -> str:
    ks = sorted(keys)
    shown = ", ".join(repr(k.replace("\x00", " dv ")) for k in ks[:_EXAMPLES])
    return shown + (f" (+{len(ks) - _EXAMPLES} more)" if len(ks) > _EXAMPLES else "")


def _metadata_view(md: Metadata | None) -> tuple[Any, ...] | None:
    if md is None:
        return None
    return (md.id, md.schema_string, tuple(md.partition_columns), dict(md.configuration), md.format_provider,
            dict(md.format_options), md.name, md.description)


def _checkpoint_problems(ref: CheckpointRef, state: LogReplayState | None, paths_out: set[str]) -> list[str]:
    """How a checkpoint differs from the JSON replay `state` of its version (None: not replayable, only read it)."""
    name = ref.paths[0].name if ref.num_parts == 1 else f"{ref.paths[0].name} ({ref.num_parts} parts)"
    protocols: list[Protocol] = []
    metadatas: list[Metadata] = []
    txns: dict[str, SetTransaction] = {}
    domains: dict[str, DomainMetadata] = {}
    adds: dict[str, AddFile] = {}
    removes: dict[str, RemoveFile] = {}
    try:
        for a in read_checkpoint_actions(ref.paths, _CHECKPOINT_COLUMNS):
            if isinstance(a, AddFile):
                adds[key_string(*a.key())] = a
            elif isinstance(a, RemoveFile):
                removes[key_string(*a.key())] = a
            elif isinstance(a, Protocol):
                protocols.append(a)
            elif isinstance(a, Metadata):
                metadatas.append(a)
            elif isinstance(a, SetTransaction):
                txns[a.app_id] = a
            elif isinstance(a, DomainMetadata):
                domains[a.domain] = a
    except Exception as e:  # a corrupt file fails in Arrow, Parquet, JSON or the conversion
        return [f"checkpoint {name} is unreadable: {type(e).__name__}: {str(e)[:300]}"]
    paths_out.update(a.path for a in adds.values())
    paths_out.update(r.path for r in removes.values())
    out: list[str] = []
    if len(protocols) != 1 or len(metadatas) != 1:
        out.append(f"checkpoint {name} has {len(protocols)} protocol and {len(metadatas)} metaData actions, not one each")
    if state is None:
        return out
    if protocols and protocols[0] != state.protocol:
        out.append(f"checkpoint {name}: protocol {protocols[0]} differs from the JSON replay's {state.protocol}")
    if metadatas and _metadata_view(metadatas[0]) != _metadata_view(state.metadata):
        out.append(f"checkpoint {name}: metaData differs from the JSON replay's")

    live = {k: a for k, a in state.files.items() if isinstance(a, AddFile)}
    missing, extra = live.keys() - adds.keys(), adds.keys() - live.keys()
    if missing:
        out.append(f"checkpoint {name} lacks {len(missing)} live files of the JSON replay: {_describe(missing)}")
    if extra:
        out.append(f"checkpoint {name} has {len(extra)} live files the JSON replay does not: {_describe(extra)}")
    changed = [k for k in live.keys() & adds.keys()
               if (dict(adds[k].partition_values), adds[k].size) != (dict(live[k].partition_values), live[k].size)]
    if changed:
        out.append(f"checkpoint {name}: {len(changed)} files differ in partition values or size: {_describe(changed)}")
    not_tombstones = [k for k in removes if not isinstance(state.files.get(k), RemoveFile)]
    if not_tombstones:
        out.append(f"checkpoint {name} has {len(not_tombstones)} tombstones the JSON replay does not: "
                   f"{_describe(not_tombstones)}")

    replay_txns = {k: (t.version, t.last_updated) for k, t in state.txns.items()}
    ckpt_txns = {k: (t.version, t.last_updated) for k, t in txns.items()}
    expiring = state.metadata is not None and TableProperties.of(state.metadata).txn_retention_ms is not None
    if ckpt_txns != replay_txns and not (expiring and ckpt_txns.items() <= replay_txns.items()):
        out.append(f"checkpoint {name}: txns {sorted(ckpt_txns.items())[:_EXAMPLES]} differ from the JSON replay's "
                   f"{sorted(replay_txns.items())[:_EXAMPLES]}")
    replay_domains = {k: d.configuration for k, d in state.domains.items() if not d.removed}
    ckpt_domains = {k: d.configuration for k, d in domains.items() if not d.removed}
    if ckpt_domains != replay_domains:
        out.append(f"checkpoint {name}: domain metadata {sorted(ckpt_domains)[:_EXAMPLES]} differs from the JSON "
                   f"replay's {sorted(replay_domains)[:_EXAMPLES]}")
    return out


def _check_last_checkpoint(rep: VerifyReport, root: TableStorage, listing: LogListing) -> None:
    if not root.exists(LAST_CHECKPOINT_KEY):
        return
    lc = read_last_checkpoint(root)
    if lc is None:
        rep.problems.append(f"{LAST_CHECKPOINT_NAME} is unreadable")
        return
    rep.last_checkpoint = lc.version
    refs = listing.checkpoints.get(lc.version, [])
    if not refs:
        rep.problems.append(f"{LAST_CHECKPOINT_NAME} points at version {lc.version}, which has no complete checkpoint")
    elif lc.parts is not None and not any(r.kind == "multipart" and r.num_parts == lc.parts for r in refs):
        rep.problems.append(f"{LAST_CHECKPOINT_NAME} names a {lc.parts}-part checkpoint of version {lc.version}, "
                            "which does not exist")


# --------------------------------------------------------------------------- data files


def _check_data_files(rep: VerifyReport, root: TableStorage) -> None:
    from deltacoord.reader.snapshot import Snapshot

    try:
        files = Snapshot.load(root).files()
    except Exception as e:  # a log a reader cannot load is the problem to report
        rep.problems.append(f"the latest snapshot cannot be loaded: {type(e).__name__}: {str(e)[:300]}")
        return
    rep.live_files = len(files)
    missing: list[str] = []
    resized: list[str] = []
    for a in files:
        obj = data_object(root, a.path)
        try:
            size = obj.storage.head(obj.key).size
        except FileNotFoundError:
            missing.append(a.path)
            continue
        if size != a.size:
            resized.append(f"{a.path} ({size} bytes, the log says {a.size})")
    for path in missing[:_EXAMPLES]:
        rep.problems.append(f"live data file {path} is missing")
    if len(missing) > _EXAMPLES:
        rep.problems.append(f"... and {len(missing) - _EXAMPLES} more live data files are missing")
    if resized:
        rep.problems.append(f"{len(resized)} live data files have another size than the log says: {resized[:_EXAMPLES]}")


def _orphans(root: TableStorage, referenced: Iterable[str]) -> list[str]:
    """Parquet files under the table root that no retained commit or checkpoint references (relative paths)."""
    known: set[str] = set()
    for p in referenced:
        try:
            obj = data_object(root, p)
        except ValueError:
            continue  # a path this reader cannot name is not an orphan of this table
        if obj.storage.location == root.location:
            known.add(obj.key)
    out: list[str] = []
    for info in root.list():
        parts = info.key.split("/")
        # Not data: _delta_log and hidden directories (cdc files in _change_data are referenced by cdc actions).
        if any(d.startswith((".", "_delta_log")) for d in parts[:-1]):
            continue
        name = parts[-1]
        if name.startswith((".", "_")) or not name.endswith(".parquet"):
            continue
        if info.key not in known:
            out.append(info.key)
    return sorted(out)


def assert_verified(rep: VerifyReport) -> None:
    assert rep.ok, f"table {rep.table_id} failed verification: {rep.problems[:10]}"


def log_files(root: TableLocation) -> list[str]:
    """Every name in the table's `_delta_log` (what a test compares before and after)."""
    return log_file_names(root)


__all__ = ["VerifyReport", "assert_verified", "log_files", "verify_table"]
