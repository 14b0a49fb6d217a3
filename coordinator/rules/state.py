"""Per-table state the conflict checks need, kept compact and updated once per commit.

`TableState` is what one coordinator holds for one table: the head version,
protocol, metadata, app-id versions, domains, the last in-commit timestamp,
and three bounded indexes:

* **Winners window** -- a `WinningCommit` summary of each recent commit,
  computed once in `apply` (added files with their partition rows, removed
  paths, app ids, domains, blind-append flag). A check reads only the summaries
  of the commits after the proposal's read version, so its cost grows with the
  winners' size and never with the table's. The window keeps at most
  `max_window_commits` commits and at most `max_window_files` file actions
  (adds + removes) in total, but always the newest commit. A proposal that read
  an older version cannot be checked and is rejected as retryable.
* **txnId index** -- proposal id -> committed version for the last
  `txn_index_limit` commits (default 100,000), so a redelivered proposal is
  answered with its original version instead of committing twice. A
  redelivery older than that bound is not recognised by this index (the
  coordinator's consumer offsets make such old redeliveries impossible).
* **Live-file set** -- one 64-bit hash per live logical file key
  (path, deletion-vector id); no AddFile bodies. About 8 bytes per file in a
  sorted array (`LiveFileSet`), i.e. 8 MB for 1,000,000 live files. The
  hash is BLAKE2b-64 of the key, the same in every process, because state
  snapshots persist it (Python's `hash()` of a str is salted per process).

The window keeps no AddFile either: a winner's added files are summarised by
their distinct partition rows, which is all the append check reads.

`fork()` gives a state that sees this one and takes commits of its own
without changing it, in O(1) whatever the table's size: a batch decides
against forks, and its commits reach the live state only once the batch is
recorded in Kafka (`deltacoord.coordinator.rules.batch`). `extend()` grows the head
version by more actions in O(those actions): a commit coalesced into it
(`deltacoord.coordinator.rules.coalesce`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from hashlib import blake2b
from typing import overload

import numpy as np

from deltacoord.coordinator.rules.compaction import ROW_MAPPED_OPERATIONS, Compaction, compaction_of, is_zorder
from deltacoord.coordinator.rules.layers import ForkedTxnIndex, ForkedWindow, LayeredDict, TxnIndex, WinnersWindow
from deltacoord.coordinator.rules.live_files import LiveFileLayer, LiveFileSet
from deltacoord.coordinator.rules.row_level import DvUpdate, deletion_vector_table, dv_updates, row_level_table
from deltacoord.schemas.actions import (
    COALESCED_KEY,
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.expressions.partitions import PartitionSchema, Row, partition_schema, row_of
from deltacoord.schemas.properties import TableProperties
from deltacoord.schemas.row_tracking import DOMAIN as ROW_TRACKING_DOMAIN
from deltacoord.schemas.row_tracking import supported as row_tracking_supported

DEFAULT_MAX_WINDOW_COMMITS = 50_000
DEFAULT_MAX_WINDOW_FILES = 100_000
DEFAULT_TXN_INDEX_LIMIT = 100_000

_EMPTY: frozenset[str] = frozenset()


class WindowExceededError(LookupError):
    """The commits after a read version are no longer retained, so they cannot be checked."""

    def __init__(self, table_id: str, read_version: int, oldest_retained: int, head: int) -> None:
        self.read_version = read_version
        self.oldest_retained = oldest_retained
        self.head = head
        super().__init__(
            f"read version {read_version} of table {table_id} is too old to check: the coordinator retains "
            f"commits {oldest_retained}..{head} only. Retry the operation from a fresh snapshot."
        )


@dataclass(slots=True)
class WinningCommit:
    """Summary of one committed version, precomputed once at apply time."""

    version: int
    commit_info: CommitInfo | None
    removed_paths: frozenset[str]
    metadata: Metadata | None
    protocol: Protocol | None
    app_ids: frozenset[str]
    domains: frozenset[str]
    is_blind_append: bool
    operation: str | None
    #: Distinct partition rows of `added`, in `partition_schema` order (first-seen order).
    partition_rows: tuple[Row, ...] = ()
    #: Partition schema in force for this commit's files (after its own metaData, if any).
    partition_schema: PartitionSchema = ()
    #: Table metadata in force before this commit (the read-time metadata of a txn that read version-1).
    prior_metadata: Metadata | None = None
    in_commit_timestamp: int | None = None
    num_file_actions: int = 0
    #: No protocol, metaData, domains or removes, and added files (if any) only by a blind append.
    #: Such a winner can conflict only through app ids or with a transaction whose reads are
    #: checked against blind appends (Serializable, or one changing metadata); see `conflicts.check`.
    quiet: bool = False
    #: The commit's own file actions, kept only on `maxcompute` tables: that profile's rebase
    #: names the earlier job's files (an overwrite removes them, a compaction's rebase replaces them).
    added_files: tuple[AddFile, ...] = ()
    removed_files: tuple[RemoveFile, ...] = ()
    #: On deletion-vector tables: the files whose deletion vector the commit replaced, by path; on
    #: row-level tables (`row_level.row_level_table`) also its added files that hold new rows (not such
    #: a re-added file, nor a compaction's dataChange=false output).
    dv_updates: Mapping[str, DvUpdate] = field(default_factory=dict)
    new_files: tuple[AddFile, ...] = ()
    #: On deletion-vector tables, an OPTIMIZE's row map (`deltacoord.coordinator.rules.compaction`); None otherwise.
    compaction: Compaction | None = None
    #: An OPTIMIZE ... ZORDER BY.
    zorder: bool = False
    #: A row-mapped compaction's removed files' vectors, by path (whose vector a follower must have read).
    removed_vectors: Mapping[str, DeletionVector | None] = field(default_factory=dict)

    @property
    def marked(self) -> bool:
        """Indexed by the window (`Winners.marked`): a commit that is not quiet, or names app ids. A quiet
        commit without app ids can fail only a transaction that checks its reads against blind appends."""
        return not self.quiet or bool(self.app_ids)


class Winners(Sequence[WinningCommit]):
    """The commits after a read version (`TableState.winners_since`), in version order, read from the window
    as they are asked for: a proposal far behind the head visits the window's marked commits (`marked`)
    without a list of every intervening commit being built. Valid while its state does not change."""

    __slots__ = ("_first", "_n", "_window")

    def __init__(self, window: WinnersWindow[WinningCommit] | ForkedWindow[WinningCommit], first: int, n: int) -> None:
        self._window, self._first, self._n = window, first, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> WinningCommit: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[WinningCommit]: ...

    def __getitem__(self, i: int | slice) -> WinningCommit | Sequence[WinningCommit]:
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._window.at(self._first + i)

    def __iter__(self) -> Iterator[WinningCommit]:
        return iter(self._window.tail(self._n)) if self._n else iter(())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Winners({list(self)!r})"

    def marked(self) -> list[WinningCommit]:
        """The marked commits among these (`WinningCommit.marked`), in version order: every commit that is not
        quiet or that names app ids; the others are quiet commits without app ids."""
        if not self._n:
            return []
        return self._window.marked_since(self._window.at(self._first).version - 1)


def key_hash(path: str, dv_id: str | None) -> int:
    """Stable signed 64-bit hash of a logical file key (path, deletion vector id); see the module docstring."""
    data = path.encode("utf-8", "surrogatepass") if dv_id is None else f"{path}\x00{dv_id}".encode("utf-8", "surrogatepass")
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little", signed=True)


def key_text_hash(key: str) -> int:
    """`key_hash` of a key given as one string: the path, then NUL and the deletion vector id when it has one
    (`deltacoord.schemas.action_arrow.key_string`, which a snapshot computes for all its files at once)."""
    return int.from_bytes(blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little", signed=True)


def file_key_hash(action: AddFile | RemoveFile) -> int:
    """64-bit hash of a file action's logical key (path, deletion vector id)."""
    dv = action.deletion_vector
    return key_hash(action.path, dv.unique_id() if dv is not None else None)


#: From this many file actions on, a commit changes the live-file set in bulk (`LiveFileSet.add_many`).
BULK_LIVE_CHANGES = 256


def _change_live(live: LiveFileSet | LiveFileLayer, keys: array[int], added: bytearray) -> None:
    """Add (`added[i]`) or discard each of `keys` in order. A large commit whose keys are distinct (validation refuses a
    key added or removed twice, or both) is applied in bulk: then the order does not matter. The keys come as a
    machine array (8 bytes each, not a list of Python ints: 36 MB at a million files)."""
    if len(keys) >= BULK_LIVE_CHANGES:
        hashes = np.frombuffer(keys, dtype=np.int64)
        if np.unique(hashes).size == hashes.size:
            is_add = np.frombuffer(added, dtype=bool)
            live.discard_many(hashes[~is_add])
            live.add_many(hashes[is_add])
            return
    for h, add in zip(keys, added, strict=True):
        if add:
            live.add(h)
        else:
            live.discard(h)


@dataclass(frozen=True, slots=True)
class TableStateExport:
    """A table's state without its winners window, for a state snapshot (`deltacoord.coordinator.kafka.state_snapshots`)."""

    table_id: str
    table_uri: str
    version: int
    protocol: Protocol | None
    metadata: Metadata | None
    app_versions: Mapping[str, int]
    domains: tuple[DomainMetadata, ...]
    last_ict: int | None
    last_commit_timestamp: int | None
    creation_operation: str | None
    #: The live-file set's key hashes (`key_hash`), sorted int64.
    live_hashes: np.ndarray
    #: The txnId index, oldest first: (proposal id, version).
    txn_ids: tuple[tuple[str, int], ...]


class TableState:
    """Everything the conflict engine knows about one table at its head version."""

    def __init__(
        self,
        table_id: str,
        table_uri: str,
        *,
        max_window_commits: int = DEFAULT_MAX_WINDOW_COMMITS,
        max_window_files: int = DEFAULT_MAX_WINDOW_FILES,
        txn_index_limit: int = DEFAULT_TXN_INDEX_LIMIT,
    ) -> None:
        if max_window_commits < 1 or max_window_files < 0 or txn_index_limit < 0:
            raise ValueError("window and index bounds must be positive")
        self.table_id = table_id
        self.table_uri = table_uri
        self.version = -1
        self.protocol: Protocol | None = None
        self.metadata: Metadata | None = None
        self.app_versions: MutableMapping[str, int] = {}
        self.domains: MutableMapping[str, DomainMetadata] = {}
        self.last_ict: int | None = None
        #: commitInfo.timestamp of the newest commit (ICT fallback when ICT was just enabled).
        self.last_commit_timestamp: int | None = None
        #: Operation of version 0, for the "two creators" ProtocolChangedException.
        self.creation_operation: str | None = None
        self.max_window_commits = max_window_commits
        self.max_window_files = max_window_files
        self.txn_index_limit = txn_index_limit
        self._partition_schema: PartitionSchema = ()
        self._window: WinnersWindow[WinningCommit] | ForkedWindow[WinningCommit] = WinnersWindow()
        self._txns: TxnIndex | ForkedTxnIndex = TxnIndex(txn_index_limit)
        self._live: LiveFileSet | LiveFileLayer = LiveFileSet()

    # -- construction ----------------------------------------------------------

    @classmethod
    def empty(
        cls,
        table_id: str,
        table_uri: str,
        *,
        max_window_commits: int = DEFAULT_MAX_WINDOW_COMMITS,
        max_window_files: int = DEFAULT_MAX_WINDOW_FILES,
        txn_index_limit: int = DEFAULT_TXN_INDEX_LIMIT,
    ) -> TableState:
        """State of a table that does not exist yet (version -1)."""
        return cls(
            table_id,
            table_uri,
            max_window_commits=max_window_commits,
            max_window_files=max_window_files,
            txn_index_limit=txn_index_limit,
        )

    @classmethod
    def restore(
        cls,
        table_id: str,
        table_uri: str,
        *,
        version: int,
        protocol: Protocol,
        metadata: Metadata,
        live_files: Iterable[AddFile],
        app_versions: Mapping[str, int] | None = None,
        domains: Iterable[DomainMetadata] = (),
        last_ict: int | None = None,
        committed_txn_ids: Iterable[tuple[str, int]] = (),
        **bounds: int,
    ) -> TableState:
        """State at `version` from a snapshot (e.g. a checkpoint), with an empty window.

        Proposals that read a version older than `version` are rejected as
        too old until enough commits have been applied; `committed_txn_ids`
        (txnId, version) seeds the redelivery index.
        """
        st = cls(table_id, table_uri, **bounds)
        st.version = version
        st.protocol = protocol
        st.metadata = metadata
        st._partition_schema = partition_schema(metadata)
        st.app_versions = dict(app_versions or {})
        st.domains = {d.domain: d for d in domains if not d.removed}
        st.last_ict = last_ict
        st._window = WinnersWindow(next_version=version + 1)
        st._live = LiveFileSet(file_key_hash(a) for a in live_files)
        for txn_id, v in committed_txn_ids:
            st._txns.remember(txn_id, v)
        return st

    def fork(self) -> TableState:
        """A state that starts as this one and applies commits without changing it (O(1), see the module doc).

        This state must not change while the fork is in use.
        """
        f = TableState.__new__(TableState)
        f.table_id = self.table_id
        f.table_uri = self.table_uri
        f.version = self.version
        f.protocol = self.protocol
        f.metadata = self.metadata
        f.app_versions = LayeredDict(self.app_versions)
        f.domains = LayeredDict(self.domains)
        f.last_ict = self.last_ict
        f.last_commit_timestamp = self.last_commit_timestamp
        f.creation_operation = self.creation_operation
        f.max_window_commits = self.max_window_commits
        f.max_window_files = self.max_window_files
        f.txn_index_limit = self.txn_index_limit
        f._partition_schema = self._partition_schema
        f._window = self._window.fork()
        f._txns = self._txns.fork()
        f._live = self._live.fork()
        return f

    def absorb(self, fork: TableState) -> None:
        """Become what `fork` (made from this state by `fork()`, this state unchanged since) has become.

        O(the fork's changes): the commits it applied are not applied again, their
        summaries, hashes and indexes move over as they are.
        """
        assert isinstance(fork._window, ForkedWindow) and fork._window._base is self._window, "not a fork of this state"
        assert isinstance(fork.app_versions, LayeredDict) and isinstance(fork.domains, LayeredDict)
        assert isinstance(fork._txns, ForkedTxnIndex) and isinstance(fork._live, LiveFileLayer)
        fork.app_versions.commit()
        fork.domains.commit()
        fork._window.commit()
        fork._txns.commit()
        fork._live.commit()
        self.version = fork.version
        self.protocol = fork.protocol
        self.metadata = fork.metadata
        self.last_ict = fork.last_ict
        self.last_commit_timestamp = fork.last_commit_timestamp
        self.creation_operation = fork.creation_operation
        self._partition_schema = fork._partition_schema

    def export(self) -> TableStateExport:
        """What a state snapshot keeps of this (live, unforked) state: everything but the winners window."""
        assert isinstance(self._live, LiveFileSet) and isinstance(self._txns, TxnIndex), "export a live state, not a fork"
        self._live.merge()
        txns = self._txns
        return TableStateExport(
            table_id=self.table_id, table_uri=self.table_uri, version=self.version, protocol=self.protocol,
            metadata=self.metadata, app_versions=dict(self.app_versions), domains=tuple(self.domains.values()),
            last_ict=self.last_ict, last_commit_timestamp=self.last_commit_timestamp,
            creation_operation=self.creation_operation, live_hashes=self._live.array(),
            txn_ids=tuple((txns.order_at(i), v) for i in range(len(txns)) if (v := txns.get(txns.order_at(i))) is not None))

    @classmethod
    def from_export(cls, e: TableStateExport, **bounds: int) -> TableState:
        """The state `export` saw, with an empty winners window (proposals that read an older version than
        `e.version` are rejected as too old to check until commits refill it)."""
        st = cls(e.table_id, e.table_uri, **bounds)
        st.version = e.version
        st.protocol = e.protocol
        st.metadata = e.metadata
        st._partition_schema = partition_schema(e.metadata) if e.metadata is not None else ()
        st.app_versions = dict(e.app_versions)
        st.domains = {d.domain: d for d in e.domains}
        st.last_ict = e.last_ict
        st.last_commit_timestamp = e.last_commit_timestamp
        st.creation_operation = e.creation_operation
        st._window = WinnersWindow(next_version=e.version + 1)
        st._live = LiveFileSet.of_array(e.live_hashes)
        st._txns = TxnIndex.of(e.txn_ids, st.txn_index_limit)
        return st

    # -- queries -----------------------------------------------------------------

    @property
    def live_file_count(self) -> int:
        return len(self._live)

    @property
    def partition_schema(self) -> PartitionSchema:
        """Partition schema of the current metadata."""
        return self._partition_schema

    @property
    def oldest_retained_version(self) -> int:
        """Oldest version whose summary is still in the window (head+1 when empty)."""
        return self._window.oldest_version

    @property
    def window_size(self) -> int:
        return len(self._window)

    def is_live(self, action: AddFile | RemoveFile) -> bool:
        """Whether the file key is live (hash based; false positives ~ n/2^64)."""
        return file_key_hash(action) in self._live

    def committed_version_of(self, txn_id: str) -> int | None:
        """Version at which a proposal (by txnId) committed, if still in the index."""
        return self._txns.get(txn_id)

    def winners_since(self, read_version: int) -> Sequence[WinningCommit]:
        """Summaries of versions read_version+1..head, in version order.

        Raises WindowExceededError if some of them are no longer retained, and
        ValueError for a read version beyond the head.
        """
        if read_version > self.version:
            raise ValueError(f"read version {read_version} is beyond the head {self.version} of {self.table_id}")
        if read_version == self.version:
            return ()
        oldest = self.oldest_retained_version
        first = read_version + 1
        if first < oldest:
            raise WindowExceededError(self.table_id, read_version, oldest, self.version)
        n = self.version - read_version
        return Winners(self._window, len(self._window) - n, n)

    # -- mutation ------------------------------------------------------------------

    def apply(self, version: int, actions: Sequence[Action]) -> None:
        """Advance the state by one committed version (must be head + 1)."""
        if version != self.version + 1:
            raise ValueError(f"cannot apply version {version} to {self.table_id} at version {self.version}")
        prior_metadata = self.metadata
        commit_info: CommitInfo | None = None
        adds: list[AddFile] = []
        removes: list[RemoveFile] = []
        metadata: Metadata | None = None
        protocol: Protocol | None = None
        app_ids: set[str] = set()
        domains: set[str] = set()
        # The live-file changes in commit order: (hash, added?).
        keys: array[int] = array("q")
        added = bytearray()
        n_files = 0
        for a in actions:
            if isinstance(a, AddFile):
                adds.append(a)
                dv = a.deletion_vector
                keys.append(key_hash(a.path, dv.unique_id() if dv is not None else None))
                added.append(1)
            elif isinstance(a, RemoveFile):
                removes.append(a)
                n_files += 1
                dv = a.deletion_vector
                keys.append(key_hash(a.path, dv.unique_id() if dv is not None else None))
                added.append(0)
            elif isinstance(a, CommitInfo):
                commit_info = a
            elif isinstance(a, Metadata):
                metadata = a
            elif isinstance(a, Protocol):
                protocol = a
            elif isinstance(a, (SetTransaction, DomainMetadata)):
                self._name(a, app_ids, domains)
            elif isinstance(a, AddCDCFile):
                n_files += 1
        _change_live(self._live, keys, added)
        # Built once from the removes (no set beside the frozenset: two hash tables of a million paths otherwise).
        removed = frozenset(r.path for r in removes) if removes else _EMPTY
        if protocol is not None:
            self.protocol = protocol
        if metadata is not None:
            self.metadata = metadata
            self._partition_schema = partition_schema(metadata)
        schema = self._partition_schema
        ict: int | None = None
        operation: str | None = None
        blind = False
        dv_table = deletion_vector_table(self.metadata)
        compaction: Compaction | None = None
        zorder = False
        if commit_info is not None:
            operation = commit_info.operation
            if operation in ROW_MAPPED_OPERATIONS:
                params = commit_info.values.get("operationParameters")
                zorder = is_zorder(operation, params if isinstance(params, Mapping) else None)
                if dv_table and removes:
                    compaction = compaction_of(operation, params if isinstance(params, Mapping) else None,
                                               commit_info.values, actions, committed=True)
        # A row-mapped compaction's outputs hold no new rows: they are left out of the append check.
        new_adds = [a for a in adds if a.path not in compaction.outputs] if compaction is not None else adds
        if adds:
            n_files += len(adds)
        if new_adds:
            rows = tuple(dict.fromkeys(row_of(a.partition_values, schema) for a in new_adds)) if schema else ((),)
        else:
            rows = ()
        if commit_info is not None:
            ict = commit_info.in_commit_timestamp
            blind = commit_info.is_blind_append
            for txn_id in commit_info.txn_ids:  # a coalesced version records every proposal it holds
                self._txns.remember(txn_id, version)
            if ict is not None:
                self.last_ict = ict
            self.last_commit_timestamp = commit_info.timestamp
        if version == 0:
            self.creation_operation = operation
        keep_files = TableProperties.of(self.metadata).maxcompute
        dvu: Mapping[str, DvUpdate] = {}
        new_files: tuple[AddFile, ...] = ()
        if adds and dv_table:
            dvu = dv_updates(actions) if removes else {}
            if row_level_table(self.metadata):
                new_files = tuple(a for a in adds if a.data_change and a.path not in dvu)
        if domains and row_tracking_supported(self.protocol):
            domains.discard(ROW_TRACKING_DOMAIN)  # assigned by the coordinator: never a conflict
        self.version = version
        winner = WinningCommit(
            version=version,
            commit_info=commit_info,
            removed_paths=removed,
            metadata=metadata,
            protocol=protocol,
            app_ids=frozenset(app_ids) if app_ids else _EMPTY,
            domains=frozenset(domains) if domains else _EMPTY,
            is_blind_append=blind,
            operation=operation,
            partition_rows=rows,
            partition_schema=schema,
            prior_metadata=prior_metadata,
            in_commit_timestamp=ict,
            num_file_actions=n_files,
            quiet=metadata is None and protocol is None and not domains and not removed and (blind or not rows),
            added_files=tuple(adds) if keep_files else (),
            removed_files=tuple(removes) if keep_files else (),
            dv_updates=dvu,
            new_files=new_files,
            compaction=compaction,
            zorder=zorder,
            removed_vectors={r.path: r.deletion_vector for r in removes} if compaction is not None else {},
        )
        self._window.append(winner, self.max_window_commits, self.max_window_files)

    def _name(self, a: Action, app_ids: set[str], domains: set[str]) -> None:
        """Record a commit's txn (app id and its version) or domain metadata, naming it in `app_ids` or `domains`."""
        if isinstance(a, SetTransaction):
            app_ids.add(a.app_id)
            self.app_versions[a.app_id] = a.version
        elif isinstance(a, DomainMetadata):
            domains.add(a.domain)
            if a.removed:
                self.domains.pop(a.domain, None)
            else:
                self.domains[a.domain] = a

    def extend(self, version: int, commit_info: CommitInfo, actions: Sequence[Action]) -> None:
        """Make the head version hold `actions` too, with `commit_info` as its commitInfo: a coalescing group's
        join (`deltacoord.coordinator.rules.coalesce`) in O(`actions`), where applying the grown version again
        on the table before it costs O(the version so far).

        Afterwards the state is the one `apply` of the whole grown commit makes on the state before the version:
        live files, app ids, domains, the version's summary in the window, the proposal ids it records. Hence
        the conditions, else ValueError and the state unchanged: this state applied the version itself (not the
        state it was forked from), and the version holds no metaData, protocol or remove; `actions` are adds
        without deletion vectors, txns and domain metadata (what a coalesced version holds); `commit_info`
        keeps the version's txnId, operation, timestamp and in-commit timestamp, and records the proposals of
        the version's commitInfo first (its coalesced commits extend theirs).
        """
        w = self._window.own_newest()
        if version != self.version or w is None or w.version != version:
            raise ValueError(f"version {version} of {self.table_id} is not the head this state applied itself")
        old = w.commit_info
        if w.metadata is not None or w.protocol is not None or w.removed_paths or old is None:
            raise ValueError(f"version {version} of {self.table_id} is not an append with a commitInfo")
        if (commit_info.txn_id, commit_info.operation, commit_info.timestamp, commit_info.in_commit_timestamp) != \
                (old.txn_id, old.operation, old.timestamp, old.in_commit_timestamp):
            raise ValueError("the commitInfo of a grown version keeps its txnId, operation and timestamps")
        ids = _recorded_after(old, commit_info)
        if ids is None:
            raise ValueError("the commitInfo of a grown version records the proposals it recorded, first")
        for a in actions:
            if not isinstance(a, (AddFile, SetTransaction, DomainMetadata)) or (isinstance(a, AddFile) and a.deletion_vector):
                raise ValueError("a version grows by adds without deletion vectors, txns and domain metadata, "
                                 f"not {type(a).__name__}")
        adds: list[AddFile] = []
        keys: array[int] = array("q")
        app_ids: set[str] = set()
        domains: set[str] = set()
        for a in actions:
            if isinstance(a, AddFile):
                adds.append(a)
                keys.append(key_hash(a.path, None))
            else:
                self._name(a, app_ids, domains)
        _change_live(self._live, keys, bytearray(b"\x01") * len(keys))
        for txn_id in ids:
            self._txns.remember(txn_id, version)
        if domains and row_tracking_supported(self.protocol):
            domains.discard(ROW_TRACKING_DOMAIN)
        schema = w.partition_schema
        rows = w.partition_rows
        if adds:
            rows = tuple(dict.fromkeys((*rows, *(row_of(a.partition_values, schema) for a in adds)))) if schema else ((),)
        all_domains = w.domains | domains if domains else w.domains
        blind = commit_info.is_blind_append
        params = commit_info.values.get("operationParameters")
        operation = commit_info.operation
        grown = replace(
            w,
            commit_info=commit_info,
            app_ids=w.app_ids | app_ids if app_ids else w.app_ids,
            domains=all_domains,
            is_blind_append=blind,
            partition_rows=rows,
            num_file_actions=w.num_file_actions + len(adds),
            quiet=not all_domains and (blind or not rows),
            added_files=(*w.added_files, *adds) if TableProperties.of(self.metadata).maxcompute else (),
            new_files=(*w.new_files, *(a for a in adds if a.data_change))
            if adds and deletion_vector_table(self.metadata) and row_level_table(self.metadata) else w.new_files,
            zorder=operation in ROW_MAPPED_OPERATIONS and is_zorder(operation, params if isinstance(params, Mapping) else None),
        )
        self._window.replace_newest(grown, self.max_window_commits, self.max_window_files)


def _recorded_after(old: CommitInfo, new: CommitInfo) -> list[str] | None:
    """The proposal ids `new` records (`CommitInfo.txn_ids`) after those of `old`, read from the coalesced commits
    it adds to `old`'s (not O(all of them)); None when `new` does not record `old`'s first."""
    before, after = old.values.get(COALESCED_KEY), new.values.get(COALESCED_KEY)
    b = before if isinstance(before, list) else []
    a = after if isinstance(after, list) else []
    n = len(b)
    if n > len(a) or (n and a[:n] != b):  # a list compares its items by identity first: O(n) pointer checks here
        return None
    return [t for part in a[n:] if isinstance(part, Mapping) and isinstance(t := part.get("txnId"), str)]


__all__ = [
    "DEFAULT_MAX_WINDOW_COMMITS",
    "DEFAULT_MAX_WINDOW_FILES",
    "DEFAULT_TXN_INDEX_LIMIT",
    "TableState",
    "TableStateExport",
    "WindowExceededError",
    "Winners",
    "WinningCommit",
    "file_key_hash",
    "key_hash",
    "key_text_hash",
]
