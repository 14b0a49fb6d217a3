"""Builders for conflict-engine tests: tables, files, proposals and a tiny harness.

`Harness` owns a TableState created at version 0 (protocol + metadata) and
optionally a version 1 with seed files. Transactions are built as Proposals
that read some version; `run` decides a proposal and, when accepted, applies
it, so a test can replay "A and B start at v1, A commits, then B" exactly as
the coordinator would.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deltacoord.coordinator.rules.conflicts import decide
from deltacoord.coordinator.rules.outcomes import Accepted, Duplicate, Rejected
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import (
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
from deltacoord.schemas.deletion_vectors import z85_encode
from deltacoord.schemas.messages import FileRead, Proposal

TABLE_ID = "tbl-orders"
TABLE_URI = "s3://lake/warehouse/orders"
NOW = 1_700_000_000_000

_ids = itertools.count(1)


def next_id(prefix: str = "p") -> str:
    return f"{prefix}-{next(_ids):06d}"


def schema_json(columns: Mapping[str, str], physical: Mapping[str, str] | None = None) -> str:
    """A Delta struct-type schema string; `physical` adds column-mapping physical names."""
    fields = []
    for name, typ in columns.items():
        meta: dict[str, Any] = {}
        if physical and name in physical:
            meta["delta.columnMapping.physicalName"] = physical[name]
        fields.append({"name": name, "type": typ, "nullable": True, "metadata": meta})
    return json.dumps({"type": "struct", "fields": fields})


DEFAULT_COLUMNS: dict[str, str] = {
    "order_id": "long",
    "amount": "double",
    "date": "date",
    "country": "string",
    "part": "integer",
    "x": "integer",
}


def metadata(
    partition_by: Sequence[str] = (),
    *,
    isolation: str | None = None,
    columns: Mapping[str, str] | None = None,
    config: Mapping[str, str] | None = None,
    table_uuid: str = "5f1c0c9e-0000-4000-8000-000000000001",
    physical: Mapping[str, str] | None = None,
) -> Metadata:
    conf = dict(config or {})
    if isolation is not None:
        conf["delta.isolationLevel"] = isolation
    return Metadata(
        id=table_uuid,
        schema_string=schema_json(columns or DEFAULT_COLUMNS, physical),
        partition_columns=tuple(partition_by),
        configuration=conf,
        created_time=NOW - 10_000,
    )


def protocol(reader: int = 1, writer: int = 2) -> Protocol:
    return Protocol(min_reader_version=reader, min_writer_version=writer)


#: A protocol with the `domainMetadata` writer feature: tables whose commits write domainMetadata need it.
DOMAINS_PROTOCOL = Protocol(1, 7, None, ("appendOnly", "invariants", "domainMetadata"))


def dv_id(name: str) -> str:
    """A readable on-disk ('u') deletion-vector id: `name` as the random prefix, then the Z85 of a UUID made
    from it (a valid descriptor, as validation requires)."""
    return name + z85_encode(uuid.uuid5(uuid.NAMESPACE_URL, name).bytes)


def add(path: str, data_change: bool = True, dv: str | None = None, stats: str | None = None, **parts: Any) -> AddFile:
    pv = {k: (None if v is None else str(v)) for k, v in parts.items()}
    return AddFile(
        path=path,
        partition_values=pv,
        size=1024,
        modification_time=NOW - 5_000,
        data_change=data_change,
        stats=stats,
        deletion_vector=None if dv is None else DeletionVector("u", dv_id(dv), 40, 3),
    )


def remove(path: str, data_change: bool = True, dv: str | None = None, **parts: Any) -> RemoveFile:
    pv = {k: (None if v is None else str(v)) for k, v in parts.items()}
    return RemoveFile(
        path=path,
        deletion_timestamp=NOW - 1_000,
        data_change=data_change,
        extended_file_metadata=True,
        partition_values=pv,
        size=1024,
        deletion_vector=None if dv is None else DeletionVector("u", dv_id(dv), 40, 3),
    )


def removal_of(f: AddFile, data_change: bool = True) -> RemoveFile:
    return f.to_remove(NOW - 1_000, data_change=data_change)


def read(f: AddFile) -> FileRead:
    return FileRead(path=f.path, partition_values=dict(f.partition_values))


def proposal(
    read_version: int,
    actions: Iterable[Action] = (),
    *,
    operation: str = "WRITE",
    changes_data: bool = True,
    predicates: Sequence[str] = (),
    read_files: Iterable[AddFile | FileRead] = (),
    whole_table: bool = False,
    app_ids: Sequence[str] = (),
    proposal_id: str | None = None,
    commit_info: Mapping[str, Any] | None = None,
    table_id: str = TABLE_ID,
    table_uri: str = TABLE_URI,
    operation_parameters: Mapping[str, str] | None = None,
) -> Proposal:
    pid = next_id() if proposal_id is None else proposal_id
    ci = {"engineInfo": "deltacoord-tests", "txnId": pid} if commit_info is None else dict(commit_info)
    return Proposal(
        table_id=table_id,
        table_uri=table_uri,
        proposal_id=pid,
        read_version=read_version,
        operation=operation,
        changes_data=changes_data,
        actions=tuple(actions),
        commit_info=CommitInfo(ci),
        read_predicates=tuple(predicates),
        read_files=tuple(read(f) if isinstance(f, AddFile) else f for f in read_files),
        read_whole_table=whole_table,
        read_app_ids=tuple(app_ids),
        operation_parameters=dict(operation_parameters or {}),
    )


Result = Accepted | Rejected | Duplicate


class Harness:
    """A table at version 0 (or 1 with seed files) and helpers to commit and decide."""

    def __init__(
        self,
        partition_by: Sequence[str] = (),
        *,
        isolation: str | None = None,
        files: Sequence[AddFile] = (),
        config: Mapping[str, str] | None = None,
        md: Metadata | None = None,
        proto: Protocol | None = None,
        create_files: Sequence[AddFile] = (),
        **bounds: int,
    ) -> None:
        self.state = TableState.empty(TABLE_ID, TABLE_URI, **bounds)
        self.metadata = md or metadata(partition_by, isolation=isolation, config=config)
        self.clock = NOW
        create = proposal(
            -1,
            [proto or protocol(), self.metadata, *create_files],
            operation="CREATE TABLE AS SELECT" if create_files else "CREATE TABLE",
            changes_data=bool(create_files),
        )
        self.must_commit(create)
        if files:
            seed = proposal(0, files, operation="WRITE")
            self.must_commit(seed)

    @property
    def head(self) -> int:
        return self.state.version

    def tick(self) -> int:
        self.clock += 1_000
        return self.clock

    def decide(self, p: Proposal, now_ms: int | None = None) -> Result:
        return decide(self.state, p, self.tick() if now_ms is None else now_ms)

    def run(self, p: Proposal, now_ms: int | None = None) -> Result:
        """Decide and, if accepted, apply (what the coordinator loop does)."""
        r = self.decide(p, now_ms)
        if isinstance(r, Accepted):
            self.state.apply(r.version, r.actions)
        return r

    def must_commit(self, p: Proposal, now_ms: int | None = None) -> Accepted:
        r = self.run(p, now_ms)
        assert isinstance(r, Accepted), f"expected the proposal to commit, got {r!r}"
        return r

    def commit_raw(
        self,
        actions: Sequence[Action],
        *,
        operation: str | None = "WRITE",
        blind: bool | None = None,
        commit_info: Mapping[str, Any] | None = None,
        with_commit_info: bool = True,
    ) -> int:
        """Apply a commit written by another engine (no checks), e.g. without commitInfo."""
        acts: list[Action] = []
        if with_commit_info:
            ci: dict[str, Any] = dict(commit_info or {})
            if operation is not None:
                ci.setdefault("operation", operation)
            if blind is not None:
                ci.setdefault("isBlindAppend", blind)
            acts.append(CommitInfo(ci))
        acts.extend(actions)
        v = self.state.version + 1
        self.state.apply(v, acts)
        return v


# -- operation shapes used by the seed-document tables -------------------------------------------------


def insert_op(read_version: int, new_files: Sequence[AddFile]) -> Proposal:
    """INSERT INTO: a blind append (reads nothing, adds files)."""
    return proposal(read_version, new_files, operation="WRITE", operation_parameters={"mode": "Append"})


def dml_op(
    op: str,
    read_version: int,
    *,
    predicates: Sequence[str],
    scanned: Sequence[AddFile],
    rewritten: Sequence[AddFile],
    new_files: Sequence[AddFile],
) -> Proposal:
    """UPDATE / DELETE / MERGE: read files matching predicates, remove the rewritten ones, add new ones."""
    actions: list[Action] = [removal_of(f) for f in rewritten]
    actions += list(new_files)
    return proposal(read_version, actions, operation=op, predicates=predicates, read_files=scanned)


def optimize_op(
    read_version: int, *, compacted: Sequence[AddFile], output: AddFile, predicates: Sequence[str] = ("true",)
) -> Proposal:
    """OPTIMIZE: reads the files it compacts, removes and re-adds with dataChange=false."""
    actions: list[Action] = [removal_of(f, data_change=False) for f in compacted]
    actions.append(output)
    return proposal(
        read_version,
        actions,
        operation="OPTIMIZE",
        changes_data=False,
        predicates=predicates,
        read_files=compacted,
    )


def cdc(path: str, **parts: Any) -> AddCDCFile:
    return AddCDCFile(path=path, partition_values={k: str(v) for k, v in parts.items()}, size=10)


def txn(app_id: str, version: int) -> SetTransaction:
    return SetTransaction(app_id=app_id, version=version, last_updated=NOW)


def domain(name: str, config: str = "{}", removed: bool = False) -> DomainMetadata:
    return DomainMetadata(domain=name, configuration=config, removed=removed)
