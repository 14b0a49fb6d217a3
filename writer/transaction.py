"""The low-level transaction: record what was read, collect actions, propose, raise typed conflicts.

Everything Delta's conflict checker distinguishes is expressible here: the read
version, partition predicates, files scanned, a whole-table read, app ids read,
and any mix of add/remove/metaData/protocol/txn/domainMetadata actions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import unquote

from confluent_kafka import KafkaException

from deltacoord.reader.deletion_vectors import dv_object
from deltacoord.reader.log import commit_key, commit_object, read_commit, read_commit_info
from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, CommitInfo, Metadata, RemoveFile
from deltacoord.schemas.actions import Protocol as ProtocolAction
from deltacoord.schemas.control_chars import path_control_character
from deltacoord.schemas.errors import (
    CONFLICT_CLASSES,
    BadFilePathError,
    CommitNotPublishedError,
    CommitOutcomeUnknownError,
    DeltaConcurrentModificationException,
    DeltaCoordError,
    InvalidProposalError,
    ProposalNotSentError,
    unknown_outcome_hint,
)
from deltacoord.schemas.messages import Decision, FileRead, Proposal, StagedActions
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.remove_lines import FilePart, RemovedFiles
from deltacoord.schemas.signing import WriterKey
from deltacoord.schemas.staged import INLINE_MAX_BYTES, StagedDigest, staged_pieces, writer_key
from deltacoord.storage.table import StorageError, TableStorage
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.replies import Pending, ProposalNotPublishedError
from deltacoord.writer.staging import delete_staged

ENGINE_INFO = "deltacoord-writer/0.1"
log = logging.getLogger(__name__)

#: When a commit returns: `published` (default) once `_delta_log/<v>.json` exists, so every Delta reader
#: sees it; `ratified` once the decision is recorded in Kafka (read it through deltacoord with `ratified=`).
WaitFor = Literal["published", "ratified"]
WAIT_MODES: tuple[WaitFor, ...] = ("published", "ratified")
#: How long a writer waits for the coordinator's publication notice before it also looks for `<v>.json`
#: itself (a lost notice, or a coordinator restarted between ratification and publication).
NOTICE_WAIT_S = 2.0


def check_wait(wait: str) -> WaitFor:
    if wait == "published":
        return "published"
    if wait == "ratified":
        return "ratified"
    raise ValueError(f"wait={wait!r}: use 'published' (return once Delta readers see the commit) or 'ratified' "
                     "(return once it is recorded in Kafka)")


@dataclass(frozen=True)
class CommitResult:
    """What a successful operation returns.

    `version` is the committed version; for a skipped operation
    (`already_committed` or `noop`) it is the version of the snapshot read.
    """

    version: int
    proposal_id: str
    operation: str
    #: True when the proposal had already committed (redelivery) or an app version was already recorded.
    already_committed: bool = False
    metrics: Mapping[str, int] = field(default_factory=dict)
    #: True when the operation had nothing to change and, like Delta's commitIfNeeded, made no commit.
    noop: bool = False
    #: Milliseconds from proposing to the decision (`decided_ms`) and, when waited for, to publication
    #: (`published_ms`): where a commit's time went.
    timings: Mapping[str, float] = field(default_factory=dict)


class TableHandle(Protocol):
    """What a transaction needs of its table (`deltacoord.writer.table.Table` is one)."""

    table_id: str
    uri: str
    storage: TableStorage
    writer_name: str | None
    #: Signs every proposal when set (tables with registered writer keys require it).
    writer_key: WriterKey | None
    decision_timeout_s: float
    #: How long a commit waits for publication after ratification (wait="published").
    publish_timeout_s: float
    #: The default of `Transaction.commit(wait=...)`.
    wait: WaitFor
    client: CoordinatorClient

    def committed(self, version: int, *, changed_metadata: bool = False) -> None: ...

    def invalidate(self) -> None: ...


def error_from_decision(d: Decision, storage: TableStorage | None = None) -> DeltaCoordError:
    """The typed exception a rejected decision stands for; a conflict names its table and (read from the
    winning version's commitInfo in `storage`, when given and published) the winning operation."""
    cls = CONFLICT_CLASSES.get(d.error_type or "")
    if cls is not None:
        return cls(d.error_message, winning_version=d.winning_version, table=d.table_uri or d.table_id,
                   winning_operation=_operation_of(storage, d.winning_version))
    code = d.reason_code or d.error_type
    reason = ReasonCode.from_wire(code) if code else ReasonCode.REJECTED
    message = d.error_message or "proposal rejected"
    # The coordinator's message is its own error's text, which already begins with the code.
    return InvalidProposalError(reason, message.removeprefix(f"{reason}: "))


def _operation_of(storage: TableStorage | None, version: int | None) -> str | None:
    """The operation of a published version (None when unknown: not published yet, or unreadable)."""
    if storage is None or version is None or version < 0:
        return None
    try:
        info = read_commit_info(commit_object(storage, version))
    except (OSError, StorageError, ValueError):
        return None
    op = info.operation if info is not None else None
    return op if isinstance(op, str) else None


def check_proposal_id(proposal_id: str | None) -> str:
    """A new proposal id, or the one given to retry an operation whose outcome was unknown."""
    if proposal_id is None:
        return str(uuid.uuid4())
    if not isinstance(proposal_id, str) or not proposal_id.strip() or proposal_id != proposal_id.strip():
        raise ValueError(f"proposal_id={proposal_id!r}: give the id an unknown-outcome error named (e.g. "
                         "'0b6f5c1e-9a43-4f57-8d0e-2f1a6f0c9b1d'), or none for a new proposal")
    return proposal_id


def table_location(table: TableHandle) -> str:
    """How people name the table: its local path or its URI, with `--table-id` when the id is not the location."""
    where = table.storage.local_path() if table.storage.is_local else table.uri
    return where if table.table_id == table.uri else f"{where} --table-id {table.table_id}"


class Transaction:
    """One optimistic transaction against a table at `read_version`.

    `proposal_id` retries an operation whose outcome was unknown: the coordinator decides a
    proposal id once and answers a repeat with the first decision, so the retry commits at most
    once (`CommitResult.already_committed` when the first attempt had committed).
    """

    def __init__(self, table: TableHandle, read_version: int, proposal_id: str | None = None) -> None:
        self.table = table
        self.read_version = read_version
        self.proposal_id = check_proposal_id(proposal_id)
        #: The id this transaction made up; any other (given here or set later) may have been proposed before.
        self._fresh_id = self.proposal_id if proposal_id is None else None
        self.read_predicates: list[str] = []
        self.read_files: list[FileRead] = []
        self.read_whole_table = False
        self.read_app_ids: list[str] = []
        self.actions: list[Action] = []
        #: Files removed in bulk (`remove_all`), each after the first `index` actions of `actions`.
        self._bulk: list[tuple[int, RemovedFiles]] = []
        self.staged: list[AddFile] = []
        #: Other objects written for this transaction (deletion-vector files), deleted with the staged files.
        self.staged_keys: list[str] = []
        #: The key of this transaction's actions when they travel by reference (`_by_reference`).
        self.staged_commit: str | None = None
        #: Set once the proposal went to Kafka: from then on only its decision may delete staged files.
        self.proposed = False
        #: More commitInfo fields (a compaction's row map, `deltacoord.schemas.row_map`); the coordinator copies them.
        self.info: dict[str, Any] = {}

    # -- reads ----------------------------------------------------------------------
    def read_predicate(self, predicate: str) -> None:
        """Record a filter on partition columns (data-column conjuncts are widened by the coordinator)."""
        self.read_predicates.append(predicate)

    def read_file(self, add: AddFile) -> None:
        """Record a scanned file: its concurrent removal is a ConcurrentDeleteReadException."""
        self.read_files.append(FileRead(add.path, dict(add.partition_values)))

    def read_files_from(self, adds: Iterable[AddFile]) -> None:
        for a in adds:
            self.read_file(a)

    def read_whole(self) -> None:
        """Record that every row was read: any concurrent add or remove conflicts. Use only when true."""
        self.read_whole_table = True

    def read_app_id(self, app_id: str) -> None:
        """Record a dependency on an app id's version: a concurrent txn for it is a ConcurrentTransactionException."""
        self.read_app_ids.append(app_id)

    # -- writes ---------------------------------------------------------------------
    def add(self, *actions: Action) -> None:
        for a in actions:
            if isinstance(a, CommitInfo):
                raise ValueError("commitInfo is written by the coordinator; pass operation parameters to commit()")
            self.actions.append(a)

    def stage(self, adds: Iterable[AddFile]) -> None:
        """Add files this transaction wrote (deleted again if the commit is rejected)."""
        for a in adds:
            self.staged.append(a)
            self.actions.append(a)

    def stage_cdc(self, files: Iterable[AddCDCFile]) -> None:
        """Add change data files this transaction wrote (deleted again if the commit is rejected)."""
        for f in files:
            self.staged_keys.append(unquote(f.path))
            self.actions.append(f)

    def remove(self, add: AddFile, data_change: bool = True) -> None:
        self.actions.append(add.to_remove(int(time.time() * 1000), data_change=data_change))

    def remove_all(self, parts: Iterable[FilePart], data_change: bool = True) -> int:
        """Remove many files at once, as a snapshot holds them (`Snapshot.file_parts`, or a list of AddFiles): the
        same removes as `remove` on each, written as lines straight from the adds, with no RemoveFile per file
        unless the commit is small enough to go inline. Returns how many files."""
        removed = RemovedFiles(tuple(parts), int(time.time() * 1000), data_change)
        if len(removed):
            self._bulk.append((len(self.actions), removed))
        return len(removed)

    def action_counts(self) -> dict[str, int]:
        """`action_metrics` of this transaction's actions, files removed in bulk included."""
        out = action_metrics(self.actions)
        out["numRemovedFiles"] += self._bulk_count()
        return out

    def _bulk_count(self) -> int:
        return sum(len(r) for _, r in self._bulk)

    def _with_bulk(self, actions: tuple[Action, ...]) -> Iterator[Action | RemovedFiles]:
        """`actions` (the proposal's, `self.actions`) with the bulk removes in their places."""
        done = 0
        for index, removed in self._bulk:
            yield from actions[done:index]
            yield removed
            done = index
        yield from actions[done:]

    def _inline(self, p: Proposal) -> Proposal:
        """`p` (from `_proposal`) with the bulk removes as actions in their places."""
        if not self._bulk:
            return p
        out: list[Action] = []
        for a in self._with_bulk(p.actions):
            if isinstance(a, RemovedFiles):
                out.extend(a.actions())
            else:
                out.append(a)
        return dataclasses.replace(p, actions=tuple(out))

    def _staged_file(self, actions: tuple[Action, ...]) -> tuple[memoryview, StagedActions]:
        """The staged file of `actions` and the bulk removes (`staged_bytes`'s, written a piece at a time)."""
        out, digest, done = io.BytesIO(), StagedDigest(), 0
        segments: list[Iterator[bytes]] = []
        for index, removed in self._bulk:
            segments += [staged_pieces(actions[done:index]), removed.lines()]
            done = index
        segments.append(staged_pieces(actions[done:]))
        for segment in segments:
            for piece in segment:
                digest.update(piece)
                out.write(piece)
        return out.getbuffer(), digest.ref()

    def abandon(self) -> None:
        """Delete the staged files of a transaction given up before it was proposed (an error while
        preparing it). After proposing, the decision decides: a commit references them."""
        if not self.proposed:
            self._delete_staged()
            self.staged, self.staged_keys = [], []

    def _by_reference(self, p: Proposal) -> Proposal:
        """`p` (from `_proposal`: without the bulk removes), carrying its actions by reference when they are too
        large for a Kafka message (`deltacoord.schemas.staged`): they are staged under `_delta_log/_staged_commits/`
        first. Inline, the bulk removes join them as actions."""
        if len(p.actions) + self._bulk_count() < 64:  # far below the limit: not worth serialising twice
            return self._inline(p)
        data, ref = self._staged_file(p.actions)
        if ref.size <= INLINE_MAX_BYTES:
            return self._inline(p)
        key = writer_key(p.proposal_id, ref)
        self.table.storage.put_if_absent(key, data)
        self.staged_commit = key
        log.debug("proposal %s carries its %d actions (%d bytes) by reference: %s", p.proposal_id, ref.count,
                  ref.size, key)
        return dataclasses.replace(p, actions=(), staged=ref)

    def _delete_staged(self) -> None:
        self._delete_files(self.staged, self.staged_keys)
        self._delete_staged_commit()

    def _delete_files(self, adds: Iterable[AddFile | AddCDCFile], keys: Iterable[str]) -> None:
        """Best effort: a file left behind is referenced by no version and VACUUM removes it, while a store that
        does not answer (an outage) must not turn the call's answer (a rejection, a refused send, a commit) into
        a storage error."""
        adds, keys = list(adds), list(keys)
        try:
            delete_staged(self.table.storage, adds)
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    self.table.storage.delete(key)
        except (StorageError, OSError) as e:
            log.warning("could not delete the %d file(s) staged for proposal %s under %s (%s); they are referenced "
                        "by no version and VACUUM removes them", len(adds) + len(keys), self.proposal_id,
                        self.table.uri, e)

    def _delete_staged_commit(self) -> None:
        """The staged actions are read by the coordinator before it decides: after a decision they go."""
        if self.staged_commit is not None:
            with contextlib.suppress(FileNotFoundError, StorageError):
                self.table.storage.delete(self.staged_commit)
            self.staged_commit = None

    # -- commit ---------------------------------------------------------------------
    def proposal(self, operation: str, changes_data: bool, parameters: Mapping[str, Any] | None = None,
                 metrics: Mapping[str, int] | None = None) -> Proposal:
        """The wire proposal with every action inline; `metrics` become commitInfo.operationMetrics (strings, as
        Delta writes them). `commit` sends `_by_reference(_proposal(...))` instead: the same, its actions by
        reference when large.

        A file path holding a control character (`deltacoord.schemas.control_chars`) raises BadFilePathError, a ValueError:
        nothing is sent (the coordinator would refuse it with BAD_FILE_PATH)."""
        return self._inline(self._proposal(operation, changes_data, parameters, metrics))

    def _proposal(self, operation: str, changes_data: bool, parameters: Mapping[str, Any] | None = None,
                  metrics: Mapping[str, int] | None = None) -> Proposal:
        """`proposal` without the bulk removes (`_by_reference` adds them), their paths checked all the same."""
        def refuse(kind: str, path: str, chars: str) -> BadFilePathError:
            return BadFilePathError(
                f"{kind} path {path!r} {chars}; nothing was sent. C0, DEL and C1 controls are "
                "refused in action paths: percent-encode what the file's name needs, or rename the file")

        for a in self._with_bulk(tuple(self.actions)):
            if isinstance(a, RemovedFiles):
                bad = a.bad_path()
                if bad is not None:
                    raise refuse("RemoveFile", *bad)
            elif isinstance(a, (AddFile, RemoveFile, AddCDCFile)):
                chars = path_control_character(a.path)
                if chars is not None:
                    raise refuse(type(a).__name__, a.path, chars)
        params = {k: v if isinstance(v, str) else _json(v) for k, v in (parameters or {}).items()}
        info: dict[str, Any] = {
            **self.info,
            "timestamp": int(time.time() * 1000),
            "operation": operation,
            "operationParameters": params,
            "engineInfo": ENGINE_INFO,
            "txnId": self.proposal_id,
        }
        if metrics:
            info["operationMetrics"] = {k: str(v) for k, v in metrics.items()}
        return Proposal(
            table_id=self.table.table_id,
            table_uri=self.table.uri,
            proposal_id=self.proposal_id,
            read_version=self.read_version,
            operation=operation,
            changes_data=changes_data,
            actions=tuple(self.actions),
            commit_info=CommitInfo(info),
            read_predicates=tuple(self.read_predicates),
            read_files=tuple(self.read_files),
            read_whole_table=self.read_whole_table,
            read_app_ids=tuple(self.read_app_ids),
            writer=self.table.writer_name,
            operation_parameters=params,
        )

    def commit(self, operation: str, *, changes_data: bool = True, parameters: Mapping[str, Any] | None = None,
               timeout_s: float | None = None, metrics: Mapping[str, int] | None = None,
               wait: WaitFor | None = None) -> CommitResult:
        """Propose and wait: by default (`wait="published"`, or the table's `wait`) until the version is ratified
        in Kafka and published in `_delta_log`, so any Delta reader sees it; with `wait="ratified"` until
        ratified only. Conflicts raise `deltacoord.schemas.errors` classes; staged files of a rejection are deleted,
        and so are those of a proposal that never reached Kafka (`ProposalNotSentError`).

        An unknown outcome (CommitOutcomeUnknownError, or a delivery that cannot be
        confirmed) keeps the staged files: the proposal may still commit and then
        references them (VACUUM removes them if it never does). A ratified version not
        published within the table's `publish_timeout_s`, or on a halted table, raises
        CommitNotPublishedError: it is committed (durable in Kafka), just not visible yet.

        A proposal id decided before (a retry with the `proposal_id` of an unknown outcome) is
        answered with that first decision: a commit returns `already_committed=True` with its
        version, and the files staged for this attempt that the commit does not reference are deleted.
        """
        mode = check_wait(wait or self.table.wait)
        all_metrics = {**self.action_counts(), **(metrics or {})}
        try:
            p = self._by_reference(self._proposal(operation, changes_data, parameters, all_metrics))
        except BaseException:
            self.abandon()
            raise
        sent_before = self.proposed  # commit() again on this transaction: its files may be in the first attempt
        self.proposed = True
        client = self.table.client
        where = table_location(self.table)
        t0 = time.perf_counter()
        try:
            pending = client.propose(p, key=self.table.writer_key, wait=mode)
        except ProposalNotSentError:
            if not sent_before:
                self._delete_staged()  # it never reached Kafka: it cannot commit
            raise
        except KeyboardInterrupt as e:
            raise _sent_before(e, p, where) from None
        try:
            try:
                d = client.decided(pending, p.table_id, timeout_s or self.table.decision_timeout_s, where)
            except (KafkaException, TimeoutError) as e:  # sent: whatever failed, the proposal may still commit
                raise CommitOutcomeUnknownError(p.proposal_id, p.table_id, timeout_s or self.table.decision_timeout_s,
                                                where, why=f"waiting for its decision failed ({e})") from e
            timings = step_timings(pending, (time.perf_counter() - t0) * 1000)
            if d.committed and d.version is not None:
                changed_metadata = any(isinstance(a, (Metadata, ProtocolAction)) for a in self.actions)
                self.table.committed(d.version, changed_metadata=changed_metadata)
                if mode == "published":
                    self._await_publication(pending, d.version, notice=d.duplicate_of is None)
                    timings["published_ms"] = (time.perf_counter() - t0) * 1000
                self._delete_staged_commit()
                already = d.duplicate_of is not None
                if already or self.proposal_id != self._fresh_id:
                    already = self._settle_repeat(d.version, already, publish_wait_s=5.0 if mode == "ratified" else 0.0)
                return CommitResult(
                    d.version, p.proposal_id, operation, already_committed=already, metrics=all_metrics, timings=timings,
                )
        except KeyboardInterrupt as e:
            raise _sent_before(e, p, where) from None
        finally:
            client.forget(p.proposal_id)
        self._delete_staged()
        self.table.invalidate()  # the next attempt must read a fresh snapshot
        raise error_from_decision(d, self.table.storage)

    def _settle_repeat(self, version: int, duplicate: bool, publish_wait_s: float) -> bool:
        """After a commit answering a proposal id that may have been proposed before (a retry with the id of an
        unknown outcome): whether the commit is an earlier attempt's (`already_committed`), and if so the files
        staged for this attempt that it does not reference are deleted.

        The answer may be the earlier attempt's own decision (its reply or its commits-topic record can reach
        this attempt first), so the commit's files decide: an attempt whose staged files the commit does not
        reference did not commit. Kept when the commit cannot be read in time (VACUUM removes them)."""
        if not self.staged and not self.staged_keys:
            return duplicate
        commit = commit_object(self.table.storage, version)
        deadline = time.monotonic() + publish_wait_s
        try:
            while not commit.exists():
                if time.monotonic() >= deadline:
                    log.warning("version %d of %s is not published yet; keeping the %d file(s) staged for proposal %s, "
                                "which was decided before", version, self.table.uri,
                                len(self.staged) + len(self.staged_keys), self.proposal_id)
                    return duplicate
                time.sleep(0.05)
            actions = read_commit(commit)
        except (OSError, StorageError, ValueError) as e:
            log.warning("cannot read version %d of %s (%s); keeping the files staged for proposal %s", version,
                        self.table.uri, e, self.proposal_id)
            return duplicate
        info = next((a for a in actions if isinstance(a, CommitInfo)), None)
        if info is None or self.proposal_id not in info.txn_ids:
            log.warning("version %d of %s does not name proposal %s (written around the coordinator?); keeping the "
                        "files staged for it", version, self.table.uri, self.proposal_id)
            return duplicate
        adds = [a for a in actions if isinstance(a, AddFile)]
        paths = {a.path for a in adds}
        # Keys of the other files the commit references: deletion vector files and change data files.
        dv_keys = {dv_object(self.table.storage, a.deletion_vector).key for a in adds
                   if a.deletion_vector is not None and a.deletion_vector.storage_type != "i"}
        dv_keys |= {unquote(a.path) for a in actions if isinstance(a, AddCDCFile)}
        if not any(a.path in paths for a in self.staged) and not any(k in dv_keys for k in self.staged_keys):
            duplicate = True  # committed by an earlier attempt, with files of its own
        if not duplicate:
            return False
        self._delete_files([a for a in self.staged if a.path not in paths], [k for k in self.staged_keys if k not in dv_keys])
        return True

    def _await_publication(self, pending: Pending, version: int, *, notice: bool) -> None:
        """Return once `_delta_log/<version>.json` exists: on the coordinator's notice, or (no notice within
        NOTICE_WAIT_S, or none to expect for an already-committed proposal) on finding the file."""
        table = self.table
        deadline = time.monotonic() + table.publish_timeout_s
        if notice:
            try:
                pending.published.result(min(NOTICE_WAIT_S, table.publish_timeout_s))
                return
            except TimeoutError:
                pass
            except ProposalNotPublishedError as e:
                raise CommitNotPublishedError(table.table_id, version, str(e)) from None
        delay = 0.005
        key = commit_key(version)
        while True:
            try:
                if table.storage.exists(key) and self._published_is_ours(version):
                    return
            except (OSError, StorageError, ValueError):
                pass  # the store does not answer: the deadline decides
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommitNotPublishedError(table.table_id, version, (
                    f"_delta_log/{key.rsplit('/', 1)[-1]} did not appear within {table.publish_timeout_s:.1f}s; the "
                    "coordinator's publisher is behind or stopped (it publishes on restart)"))
            try:
                pending.published.result(min(delay, remaining))  # a late notice still ends the wait
                return
            except TimeoutError:
                pass
            except ProposalNotPublishedError as e:
                raise CommitNotPublishedError(table.table_id, version, str(e)) from None
            delay = min(delay * 2, 0.5)


    def _published_is_ours(self, version: int) -> bool:
        """Whether `<version>.json`, found without the coordinator's notice, is this proposal's commit: its commitInfo
        names the proposal (a coalesced version names each it holds). A file written there around the coordinator
        meets the coordinator's own publication, which halts the table: it raises CommitNotPublishedError, never
        passing for this commit."""
        info = read_commit_info(commit_object(self.table.storage, version))
        if info is not None and self.proposal_id in info.txn_ids:
            return True
        raise CommitNotPublishedError(self.table.table_id, version, (
            f"_delta_log/{commit_key(version).rsplit('/', 1)[-1]} holds another commit, not proposal "
            f"{self.proposal_id}: it was written around the coordinator, which halts the table rather than overwrite "
            "it (see 'Recover a halted table')"))


def step_timings(pending: Pending, elapsed_ms: float) -> dict[str, float]:
    """Milliseconds since the proposal was handed to the producer: `produced` (broker acknowledged),
    the coordinator's `consumed` (its batch began), `ratified` (its transaction committed) and `put`
    (`<v>.json` written; wait="published"), `reply` (the reply reached this writer), `decided_ms` (the
    decision known to be ratified: the coordinator's `ratified` when the reply carries it). Coordinator
    times are its wall clock: exact on one host, skewed by the clocks' difference across hosts."""
    def since(t: float) -> float:
        return round((t - pending.sent_at) * 1000, 3)

    out: dict[str, float] = {"decided_ms": elapsed_ms}
    if pending.sent_at:
        if pending.produced_at:
            out["produced_ms"] = since(pending.produced_at)
        for name, key in (("consumed", "consumed_ms"), ("ratified", "ratified_ms"), ("published", "put_ms")):
            if name in pending.coordinator_times:
                out[key] = since(pending.coordinator_times[name])
        if pending.replied_at:
            out["reply_ms"] = since(pending.replied_at)
        if "ratified_ms" in out:
            out["decided_ms"] = min(elapsed_ms, out["ratified_ms"])
    return out


def _sent_before(e: KeyboardInterrupt, p: Proposal, where: str) -> KeyboardInterrupt:
    """An interrupt after the proposal went out: the caller must learn which proposal to look up (its staged
    files stay: it may still commit)."""
    e.deltacoord_proposal_id = p.proposal_id  # type: ignore[attr-defined]
    e.add_note(f"proposal {p.proposal_id} of table {p.table_id} was sent before the interrupt; its outcome is "
               f"unknown: it may still commit. {unknown_outcome_hint(p.proposal_id, where)}")
    return e


def _json(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), default=str)


def action_metrics(actions: Iterable[Action]) -> dict[str, int]:
    adds = [a for a in actions if isinstance(a, AddFile)]
    removes = [a for a in actions if isinstance(a, RemoveFile)]
    return {
        "numAddedFiles": len(adds),
        "numRemovedFiles": len(removes),
        "numAddedBytes": sum(a.size for a in adds),
    }


T = TypeVar("T")


def retry(fn: Callable[[], T], *, attempts: int = 5, base_delay_s: float = 0.05, max_delay_s: float = 2.0,
          on_retry: Callable[[int, DeltaConcurrentModificationException], None] | None = None) -> T:
    """Re-run `fn` on retryable conflicts, with bounded attempts and jittered exponential backoff.

    Non-retryable errors (ProtocolChanged, ConcurrentTransaction, invalid
    proposals, unknown outcomes) are raised at once.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except DeltaConcurrentModificationException as e:
            if not e.retryable or attempt == attempts:
                raise
            if on_retry is not None:
                on_retry(attempt, e)
            delay = min(max_delay_s, base_delay_s * 2 ** (attempt - 1))
            time.sleep(random.uniform(0, delay))
    raise AssertionError("unreachable")
