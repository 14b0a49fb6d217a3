"""`Table`: the batch writer people call.

Each operation reads the snapshot it needs from `_delta_log`, stages Parquet
files, and proposes one commit declaring precisely what it read: a blind
append reads nothing; DELETE/UPDATE declare their condition and the files
they scanned after partition pruning; OPTIMIZE declares the files it
compacted and changes no data.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reader.snapshot import Snapshot, delta_schema_to_arrow, parse_partition_value
from schemas.actions import AddFile, Metadata, Protocol, SetTransaction
from schemas.routing import Topics
from writer import expressions, staging
from writer.client import CoordinatorClient
from writer.transaction import CommitResult, Transaction


def _root_of(uri: str) -> Path:
    return Path(uri[len("file://"):]) if uri.startswith("file://") else Path(uri)


def default_table_id(root: Path) -> str:
    """A table's id on the wire: its absolute location (stable across writers on one machine)."""
    return root.resolve().as_uri()


class Table:
    """A handle on one coordinated Delta table."""

    def __init__(self, uri: str | Path, bootstrap_servers: str, *, table_id: str | None = None, topics: Topics | None = None,
                 writer_name: str | None = None, decision_timeout_s: float = 60.0, client: CoordinatorClient | None = None,
                 **kafka_config: Any) -> None:
        self.root = _root_of(str(uri)).resolve()
        self.uri = self.root.as_uri()
        self.table_id = table_id or default_table_id(self.root)
        self.writer_name = writer_name
        self.decision_timeout_s = decision_timeout_s
        self._own_client = client is None
        self.client = client or CoordinatorClient(bootstrap_servers, topics=topics, **kafka_config)
        self._snapshot: Snapshot | None = None

    # -- snapshots ------------------------------------------------------------------
    def snapshot(self, version: int | None = None) -> Snapshot:
        """The published snapshot (latest by default); cached for blind appends."""
        snap = Snapshot.load(self.uri, version=version)
        if version is None:
            self._snapshot = snap
        return snap

    def _cached(self) -> Snapshot:
        return self._snapshot or self.snapshot()

    def begin(self, snapshot: Snapshot | None = None) -> Transaction:
        """Start a low-level transaction at the given (default: latest) snapshot."""
        snap = snapshot or self.snapshot()
        return Transaction(self, snap.version)

    # -- DDL ------------------------------------------------------------------------
    def create(self, schema: pa.Schema, partition_by: Sequence[str] = (), properties: Mapping[str, str] | None = None,
               name: str | None = None) -> CommitResult:
        props = dict(properties or {})
        for c in partition_by:
            if c not in schema.names:
                raise staging.SchemaError(f"partition column {c!r} is not in the schema {schema.names}")
        ict = props.get("delta.enableInCommitTimestamps", "false").lower() == "true"
        protocol = Protocol(1, 7, writer_features=("appendOnly", "invariants", "inCommitTimestamp")) if ict else Protocol(1, 2)
        md = Metadata(
            id=str(uuid.uuid4()), name=name, schema_string=staging.schema_string(schema), partition_columns=tuple(partition_by),
            configuration=props, created_time=int(time.time() * 1000),
        )
        tx = Transaction(self, -1)
        tx.add(protocol, md)
        return tx.commit("CREATE TABLE", changes_data=False,
                         parameters={"partitionBy": list(partition_by), "properties": props, "isManaged": "false"})

    def set_properties(self, properties: Mapping[str, str]) -> CommitResult:
        snap = self.snapshot()
        md = snap.metadata
        new = Metadata(id=md.id, schema_string=md.schema_string, partition_columns=md.partition_columns,
                       configuration={**md.configuration, **properties}, name=md.name, description=md.description,
                       created_time=md.created_time)
        tx = Transaction(self, snap.version)
        tx.add(new)
        return tx.commit("SET TBLPROPERTIES", changes_data=False, parameters={"properties": dict(properties)})

    def add_columns(self, fields: Sequence[pa.Field]) -> CommitResult:
        snap = self.snapshot()
        md = snap.metadata
        schema = json.loads(md.schema_string)
        existing = {f["name"] for f in schema["fields"]}
        for f in fields:
            if f.name in existing:
                raise staging.SchemaError(f"column {f.name!r} already exists")
            schema["fields"].append({"name": f.name, "type": staging.delta_type(f.type), "nullable": True, "metadata": {}})
        new = Metadata(id=md.id, schema_string=json.dumps(schema, separators=(",", ":")), partition_columns=md.partition_columns,
                       configuration=md.configuration, name=md.name, description=md.description, created_time=md.created_time)
        tx = Transaction(self, snap.version)
        tx.add(new)
        return tx.commit("ADD COLUMNS", changes_data=False, parameters={"columns": [f.name for f in fields]})

    # -- writes ---------------------------------------------------------------------
    def _conform(self, data: Any, snap: Snapshot) -> pa.Table:
        t = staging.to_arrow(data)
        target = delta_schema_to_arrow(snap.metadata.schema())
        missing = [n for n in t.column_names if n not in target.names]
        if missing:
            raise staging.SchemaError(f"columns {missing} are not in the table schema {target.names}; add them first")
        cols = []
        for f in target:
            if f.name in t.column_names:
                try:
                    cols.append(t.column(f.name).cast(f.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise staging.SchemaError(f"column {f.name!r}: cannot write {t.column(f.name).type} as {f.type}: {e}") from e
            else:
                cols.append(pa.nulls(t.num_rows, f.type))
        return pa.Table.from_arrays(cols, schema=target)

    def append(self, data: Any, *, app_id: str | None = None, app_version: int | None = None) -> CommitResult:
        """A blind append (reads nothing). With app_id/app_version, exactly once per app version."""
        if (app_id is None) != (app_version is None):
            raise ValueError("give both app_id and app_version, or neither")
        snap = self.snapshot() if app_id is not None else self._cached()
        tx = Transaction(self, snap.version)
        if app_id is not None and app_version is not None:
            recorded = snap.app_versions.get(app_id, -1)
            if app_version <= recorded:
                return CommitResult(snap.version, tx.proposal_id, "WRITE", already_committed=True)
            tx.read_app_id(app_id)
            tx.add(SetTransaction(app_id, app_version, int(time.time() * 1000)))
        table = self._conform(data, snap)
        tx.stage(staging.write_data_files(self.root, table, snap.partition_columns))
        return tx.commit("WRITE", changes_data=True, parameters={"mode": "Append", "partitionBy": snap.partition_columns})

    def _read_file(self, snap: Snapshot, add: AddFile, schema: pa.Schema) -> pa.Table:
        t = pq.read_table(self.root / unquote(add.path))
        cols = []
        for f in schema:
            if f.name in snap.partition_columns:
                v = parse_partition_value(add.partition_values.get(f.name), f.type)
                cols.append(pa.array([v] * t.num_rows, type=f.type))
            elif f.name in t.column_names:
                cols.append(t.column(f.name).cast(f.type))
            else:
                cols.append(pa.nulls(t.num_rows, f.type))
        return pa.Table.from_arrays(cols, schema=schema)

    def _candidates(self, snap: Snapshot, where: str | None) -> list[AddFile]:
        """Files that may hold matching rows: partition pruning on the partition-only conjuncts."""
        files = snap.files()
        if where is None:
            return files
        part_sql = expressions.partition_only(where, snap.partition_columns)
        if part_sql is None:
            return files
        schema = delta_schema_to_arrow(snap.metadata.schema())
        pschema = pa.schema([schema.field(c) for c in snap.partition_columns])
        rows = pa.Table.from_pylist(
            [{c: parse_partition_value(a.partition_values.get(c), pschema.field(c).type) for c in snap.partition_columns} for a in files],
            schema=pschema,
        )
        import pyarrow.dataset as ds

        mask = ds.dataset(rows.append_column("__i", pa.array(range(len(files))))).to_table(
            filter=expressions.compile_filter(part_sql, pschema), columns=["__i"]
        )
        return [files[i] for i in mask.column("__i").to_pylist()]

    def _rewrite(self, where: str, operation: str, change: Any, snapshot: Snapshot | None) -> CommitResult:
        snap = snapshot or self.snapshot()
        schema = delta_schema_to_arrow(snap.metadata.schema())
        cond = expressions.compile_filter(where, schema)
        tx = Transaction(self, snap.version)
        tx.read_predicate(where)
        candidates = self._candidates(snap, where)
        tx.read_files_from(candidates)
        rewritten = 0
        import pyarrow.dataset as ds

        for add in candidates:
            t = self._read_file(snap, add, schema)
            mask = ds.dataset(t).to_table(columns={"m": cond}).column("m")
            mask = pc.fill_null(mask, False)
            if not pc.any(mask).as_py():
                continue
            rewritten += 1
            tx.remove(add)
            out = change(t, mask)
            if out.num_rows:
                tx.stage(staging.write_data_files(self.root, out, snap.partition_columns))
        return tx.commit(operation, changes_data=True, parameters={"predicate": json.dumps([where])})

    def delete(self, where: str, *, snapshot: Snapshot | None = None) -> CommitResult:
        """DELETE FROM table WHERE `where` (a SQL condition), reading `snapshot` (default: latest)."""
        return self._rewrite(where, "DELETE", lambda t, mask: t.filter(pc.invert(mask)), snapshot)

    def update(self, where: str, set: Mapping[str, str], *, snapshot: Snapshot | None = None) -> CommitResult:
        """UPDATE table SET col = <SQL expression> ... WHERE `where`, reading `snapshot` (default: latest)."""

        def change(t: pa.Table, mask: pa.ChunkedArray) -> pa.Table:
            m = mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask
            for col, value_sql in set.items():
                if col not in t.column_names:
                    raise staging.SchemaError(f"UPDATE sets unknown column {col!r}")
                new = expressions.evaluate(value_sql, t).cast(t.schema.field(col).type)
                t = t.set_column(t.column_names.index(col), col, pc.if_else(m, new, t.column(col)))
            return t

        return self._rewrite(where, "UPDATE", change, snapshot)

    def optimize(self, where: str | None = None, target_file_size: int = 128 * 1024 * 1024, min_files: int = 2,
                 *, snapshot: Snapshot | None = None) -> CommitResult:
        """Compact small files per partition; data does not change (dataChange=false)."""
        snap = snapshot or self.snapshot()
        schema = delta_schema_to_arrow(snap.metadata.schema())
        tx = Transaction(self, snap.version)
        if where is not None:
            tx.read_predicate(where)
        by_part: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
        for a in self._candidates(snap, where):
            if a.size < target_file_size:
                by_part.setdefault(tuple(sorted(a.partition_values.items())), []).append(a)
        compacted = 0
        for files in by_part.values():
            if len(files) < min_files:
                continue
            tx.read_files_from(files)
            tables = [self._read_file(snap, a, schema) for a in files]
            for a in files:
                tx.remove(a, data_change=False)
            merged = pa.concat_tables(tables)
            tx.stage(staging.write_data_files(self.root, merged, snap.partition_columns, data_change=False))
            compacted += len(files)
        return tx.commit("OPTIMIZE", changes_data=False,
                         parameters={"predicate": json.dumps([where] if where else []), "filesCompacted": str(compacted)})

    # -- reads ----------------------------------------------------------------------
    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return self.snapshot().history(limit)

    def to_pyarrow(self, version: int | None = None, **kwargs: Any) -> pa.Table:
        return self.snapshot(version).to_pyarrow(**kwargs)

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
