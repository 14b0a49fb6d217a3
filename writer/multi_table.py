"""Multi-table transactions: several tables change together or not at all.

    with deltacoord.transaction("127.0.0.1:19092") as tx:
        tx.table("/lake/g::staging").delete("batch = 7")   # any Table operation, one per table
        tx.table("/lake/g::facts").append(rows)
    # here every table's version is published, or nothing was committed

Each operation runs as usual (reads its snapshot, stages its files) but its commit is held; on leaving the block
one proposals-topic message carries every part (`deltacoord.schemas.messages.MultiTable`), so the coordinator decides all
parts at one point of its order and ratifies all or none in one Kafka transaction. An exception inside the
block sends nothing and deletes the staged files. The tables must share a proposals partition: a table group
(`deltacoord.schemas.routing.grouped_table_id`) makes them.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import Metadata
from deltacoord.schemas.actions import Protocol as ProtocolAction
from deltacoord.schemas.errors import CommitOutcomeUnknownError, DeltaCoordError, ProposalNotSentError
from deltacoord.schemas.messages import SIBLING_REJECTED, TRANSACTION_KEY, Decision, MultiTable, Proposal
from deltacoord.schemas.routing import spans_partitions_message
from deltacoord.schemas.signing import WriterKey
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import (
    CommitResult,
    Transaction,
    WaitFor,
    check_proposal_id,
    check_wait,
    error_from_decision,
    step_timings,
    table_location,
)

#: Namespace of the parts' proposal ids, derived from the transaction id so a retry repeats them.
_PART_IDS = uuid.UUID("6f1d7f0e-3c2a-4b8e-9d51-0a7c2e4b9f10")


class TransactionSpansPartitionsError(DeltaCoordError, ValueError):
    """The tables of a multi-table transaction are on different proposals partitions: nothing was sent."""


@dataclass(frozen=True)
class TransactionResult:
    """A committed multi-table transaction: its id and, per table id, its part's commit."""

    id: str
    commits: Mapping[str, CommitResult] = field(default_factory=dict)

    @property
    def versions(self) -> dict[str, int]:
        return {t: c.version for t, c in self.commits.items()}


@dataclass
class _Held:
    operation: str
    changes_data: bool
    parameters: Mapping[str, Any] | None
    metrics: Mapping[str, int] | None


class _PartTransaction(Transaction):
    """One table's part: `commit()` holds the operation until the whole transaction commits."""

    held: _Held | None = None

    def commit(self, operation: str, *, changes_data: bool = True, parameters: Mapping[str, Any] | None = None,
               timeout_s: float | None = None, metrics: Mapping[str, int] | None = None,
               wait: WaitFor | None = None) -> CommitResult:
        self.held = _Held(operation, changes_data, parameters, metrics)
        # The version is the transaction's: known once it commits (`TransactionResult`).
        return CommitResult(-1, self.proposal_id, operation, metrics={**self.action_counts(), **(metrics or {})})


class _PartTable(Table):
    """A table inside a multi-table transaction: its one write operation becomes a part."""

    part: _PartTransaction | None = None
    transaction_id = ""
    #: The caller's own handle when the table was given as one: it shares its snapshot cache and learns the commit.
    origin: Table | None = None

    def committed(self, version: int, *, changed_metadata: bool = False) -> None:
        super().committed(version, changed_metadata=changed_metadata)
        if self.origin is not None:
            self.origin.committed(version, changed_metadata=changed_metadata)

    def invalidate(self) -> None:
        super().invalidate()
        if self.origin is not None:
            self.origin.invalidate()

    def snapshot(self, version: int | None = None, *, ratified: bool = False,
                 files_on_demand: bool = False) -> Snapshot:
        generation = self.origin._generation if self.origin is not None else 0
        snap = super().snapshot(version, ratified=ratified, files_on_demand=files_on_demand)
        if self.origin is not None and version is None:
            # The caller's handle keeps it: its next transaction's blind appends need not read the log again.
            self.origin._keep(snap, generation)
        return snap

    def _part(self, read_version: int) -> _PartTransaction:
        if self.part is not None:
            raise ValueError(f"table {self.table_id} already has an operation in multi-table transaction "
                             f"{self.transaction_id}: one operation per table (each part reads its table once)")
        pid = str(uuid.uuid5(_PART_IDS, f"{self.transaction_id}\n{self.table_id}"))
        self.part = _PartTransaction(self, read_version, pid)
        self.part._fresh_id = pid
        return self.part

    def begin_operation(self, read_version: int, proposal_id: str | None) -> Transaction:
        if proposal_id is not None:
            raise ValueError("inside a multi-table transaction the parts' proposal ids come from the transaction id: "
                             "give transaction_id= to deltacoord.transaction() instead")
        tx = self._part(read_version)
        self.client.ensure_coordinator(self.table_id)
        return tx

    def _not_a_part(self, what: str) -> ValueError:
        return ValueError(f"{what} is a request of its own and cannot be part of multi-table transaction "
                          f"{self.transaction_id}: run it on the table outside the transaction")

    def adopt(self, *, timeout_s: float | None = None) -> CommitResult:
        raise self._not_a_part("adopt")

    def release(self, *, timeout_s: float | None = None) -> CommitResult:
        raise self._not_a_part("release")

    def drop(self, *, delete_files: bool = False, timeout_s: float | None = None) -> CommitResult:
        raise self._not_a_part("drop")

    def begin(self, snapshot: Any = None, *, proposal_id: str | None = None) -> Transaction:
        snap = snapshot or self.snapshot()
        return self.begin_operation(snap.version, proposal_id)


class MultiTableTransaction:
    """Operations on several tables committed together (see the module's docstring); use `deltacoord.transaction`.

    Its Kafka settings (`bootstrap_servers`, `topics=`, `topic_prefix=`, ...) are a client's; without them the
    transaction uses the client of the first `Table` handle given to `table()`.
    `transaction_id` retries a transaction whose outcome was unknown: the parts' proposal ids derive from it, so
    the coordinator answers a repeat with the first decisions (each `CommitResult.already_committed`)."""

    def __init__(self, bootstrap_servers: str | None = None, *, transaction_id: str | None = None,
                 wait: WaitFor = "published", client: CoordinatorClient | None = None,
                 writer_key: WriterKey | str | Path | None = None, decision_timeout_s: float | None = None,
                 publish_timeout_s: float = 60.0, **kafka_config: Any) -> None:
        self.id = check_proposal_id(transaction_id)
        self.wait: WaitFor = check_wait(wait)
        self._client = client
        self._own_client = False
        self._bootstrap_servers = bootstrap_servers
        self._kafka_config = kafka_config
        self._writer_key = writer_key
        self._decision_timeout_s = decision_timeout_s
        self._publish_timeout_s = publish_timeout_s
        self._tables: dict[str, _PartTable] = {}
        self._done = False
        #: What `commit()` returned (set when the `with` block committed on exit).
        self.commit_result: TransactionResult | None = None

    @property
    def client(self) -> CoordinatorClient:
        """The client the transaction is sent with: the one given, else (no Kafka settings given) that of the first
        table handle given when it has no relay, else one of its own (closed with the transaction)."""
        if self._client is None:
            self._client = CoordinatorClient(self._bootstrap_servers, relay="", **self._kafka_config)
            self._own_client = True
        return self._client

    def table(self, uri: str | Path | Table, *, table_id: str | None = None,
              storage_options: Mapping[str, str] | None = None) -> Table:
        """The handle through which one table takes part: call one write operation on it (append, delete, ...)."""
        if self._done:
            raise ValueError(f"multi-table transaction {self.id} was already committed or abandoned")
        origin = uri if isinstance(uri, Table) else None
        if origin is not None:
            if self._client is None and not origin.client.relay and self._bootstrap_servers is None \
                    and not self._kafka_config:
                self._client = origin.client  # no settings of its own: the table's deployment
            if origin.client.topics != self.client.topics:
                raise ValueError(f"table {origin.table_id} is on topics {origin.client.topics.proposals}, the "
                                 f"transaction on {self.client.topics.proposals}: every table of a transaction is "
                                 "of one deployment")
        location: str | Path
        if isinstance(uri, Table):
            table_id, storage_options, location = uri.table_id, storage_options or uri.storage_options, uri.uri
        else:
            location = uri
        t = _PartTable(location, table_id=table_id, client=self.client, storage_options=storage_options,
                       writer_key=self._writer_key, decision_timeout_s=self._decision_timeout_s,
                       publish_timeout_s=self._publish_timeout_s, wait=self.wait)
        if t.table_id in self._tables:
            return self._tables[t.table_id]
        t.transaction_id = self.id
        if origin is not None:
            t.origin, t._snapshot, t._floor = origin, origin._snapshot, origin._floor
        self._tables[t.table_id] = t
        return t

    def __enter__(self) -> MultiTableTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        try:
            if exc_type is None:
                self.commit_result = self.commit()
            else:
                self.abandon()
        finally:
            self.close()

    def abandon(self) -> None:
        """Give the transaction up before it is sent: every part's staged files are deleted."""
        for t in self._tables.values():
            if t.part is not None:
                t.part.abandon()
        self._done = True

    def close(self) -> None:
        if self._own_client and self._client is not None:
            self._client.close()

    def _parts(self) -> list[_PartTransaction]:
        return [t.part for t in self._tables.values() if t.part is not None and t.part.held is not None]

    def commit(self) -> TransactionResult:
        """Send every part in one message and wait: by default until each table's version is published.

        A conflict of any part rejects them all and raises that part's exception (Delta's, naming its table); an
        unknown outcome raises CommitOutcomeUnknownError (retry with `transaction_id=` this id)."""
        if self._done:
            raise ValueError(f"multi-table transaction {self.id} was already committed or abandoned")
        self._done = True
        parts = self._parts()
        if not parts:
            return TransactionResult(self.id)
        tables = tuple(tx.table.table_id for tx in parts)
        homes = {t: self.client.partition_of(t) for t in tables}
        if len(set(homes.values())) > 1:
            self.abandon()
            raise TransactionSpansPartitionsError(spans_partitions_message(self.id, homes, self.client._num_partitions or 0)
                                                  + ". Nothing was sent")
        mt = MultiTable(self.id, tables)
        proposals: list[Proposal] = []
        try:
            for tx in parts:
                assert tx.held is not None
                h = tx.held
                tx.info[TRANSACTION_KEY] = {"id": self.id, "tables": list(tables)}
                p = tx._by_reference(tx._proposal(h.operation, h.changes_data, h.parameters,
                                                  {**tx.action_counts(), **(h.metrics or {})}))
                proposals.append(dataclasses.replace(p, transaction=mt))
        except BaseException:
            self.abandon()
            raise
        carrier = dataclasses.replace(proposals[0], transaction=MultiTable(self.id, tables, tuple(proposals[1:])))
        for tx in parts:
            tx.proposed = True
        first = parts[0].table
        t0 = time.perf_counter()
        try:
            pendings = self.client.propose_transaction(carrier, key=first.writer_key, wait=self.wait)
        except ProposalNotSentError:
            for tx in parts:
                tx._delete_staged()
            raise
        timeout = self._decision_timeout_s or first.decision_timeout_s
        decisions: list[Decision] = []
        try:
            for tx, p, pending in zip(parts, proposals, pendings, strict=True):
                try:
                    decisions.append(self.client.decided(pending, p.table_id, timeout, table_location(tx.table)))
                except (KafkaException, TimeoutError) as e:
                    raise CommitOutcomeUnknownError(p.proposal_id, p.table_id, timeout, table_location(tx.table),
                                                    why=f"waiting for its decision failed ({e})") from e
        except CommitOutcomeUnknownError as e:
            e.add_note(f"it is part of multi-table transaction {self.id}: all its parts commit or none; retry with "
                       f"deltacoord.transaction(..., transaction_id={self.id!r}) and the same operations")
            raise
        finally:
            for p in proposals:
                self.client.forget(p.proposal_id)
        if all(d.committed and d.version is not None for d in decisions):
            commits: dict[str, CommitResult] = {}
            for tx, d, pending in zip(parts, decisions, pendings, strict=True):
                assert d.version is not None
                tx.table.committed(d.version, changed_metadata=any(isinstance(x, (Metadata, ProtocolAction))
                                                                   for x in tx.actions))
                timings = step_timings(pending, (time.perf_counter() - t0) * 1000)
                if self.wait == "published":
                    tx._await_publication(pending, d.version, notice=d.duplicate_of is None)
                    timings["published_ms"] = (time.perf_counter() - t0) * 1000
                tx._delete_staged_commit()
                if d.duplicate_of is not None:  # a retry of a transaction that had committed: this attempt's files go
                    tx._settle_repeat(d.version, True, publish_wait_s=5.0 if self.wait == "ratified" else 0.0)
                held = tx.held
                assert held is not None
                commits[tx.table.table_id] = CommitResult(
                    d.version, tx.proposal_id, held.operation, already_committed=d.duplicate_of is not None,
                    metrics={**tx.action_counts(), **(held.metrics or {})}, timings=timings)
            return TransactionResult(self.id, commits)
        for tx in parts:
            tx._delete_staged()
            tx.table.invalidate()
        failing = next((d for d in decisions if not d.committed and not (d.error_message or "").startswith(SIBLING_REJECTED)),
                       next(d for d in decisions if not d.committed))
        storage = next(tx.table.storage for tx in parts if tx.table.table_id == failing.table_id)
        raise error_from_decision(failing, storage)


def transaction(bootstrap_servers: str | None = None, **kwargs: Any) -> MultiTableTransaction:
    """A multi-table transaction: `with deltacoord.transaction(servers) as tx: tx.table(a).append(...); ...`."""
    return MultiTableTransaction(bootstrap_servers, **kwargs)


__all__ = ["MultiTableTransaction", "TransactionResult", "TransactionSpansPartitionsError", "transaction"]
