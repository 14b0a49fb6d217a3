"""CREATE TABLE, ALTER TABLE SET TBLPROPERTIES and ADD COLUMNS: commits of protocol and metadata."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence

import pyarrow as pa

from deltacoord.reader.snapshot import (
    Snapshot,
    UnsupportedTableFeatureError,
    delta_schema_to_arrow,
)
from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.schemas.errors import ProtocolChangedException
from deltacoord.schemas.expressions import arrow as expressions
from deltacoord.schemas.properties import Property, TableProperties
from deltacoord.schemas.row_tracking import new_materialized_columns
from deltacoord.schemas.row_tracking import supported as row_tracking_supported
from deltacoord.schemas.table_features import (
    legacy_reader_features,
    with_coordinated,
    writer_features,
    writer_problems,
)
from deltacoord.writer import column_mapping, protocols, staging
from deltacoord.writer.constraints import CONSTRAINT_PREFIX, WriteRules
from deltacoord.writer.operations import (
    DV_FEATURE,
    OperationTable,
    cdf_on,
    layout_of,
    replace_metadata,
)
from deltacoord.writer.table_control import check_location_free
from deltacoord.writer.table_protocol import ProtocolRequestError, new_table, with_column_mapping
from deltacoord.writer.transaction import CommitResult, Transaction


class TableExistsError(ProtocolChangedException):
    """`create` on a location that already holds a Delta table.

    A ProtocolChangedException because it is the creators' race lost before
    proposing: code that tolerates a concurrent creator catches both.
    """

    def __init__(self, uri: str, hint: str = "") -> None:
        super().__init__(hint or f"a Delta table already exists at {uri}; append to it, or create the new table at "
                         "another location", winning_version=0, table=uri)


def with_dv_feature(p: Protocol) -> Protocol | None:
    """`p` upgraded to support deletion vectors (None when it already does)."""
    if DV_FEATURE in (p.writer_features or ()) and DV_FEATURE in (p.reader_features or ()):
        return None
    writer = list(writer_features(p))
    # At reader version 3 the features are listed; below it, they are what the legacy version implies.
    reader = list(p.reader_features or ()) if p.min_reader_version >= 3 else list(legacy_reader_features(p.min_reader_version))
    return Protocol(3, 7, reader_features=(*dict.fromkeys([*reader, DV_FEATURE]),),
                    writer_features=(*dict.fromkeys([*writer, DV_FEATURE]),))


def begin_create(table: OperationTable, schema: pa.Schema, partition_by: Sequence[str] = (), properties: Mapping[str, str] | None = None,
                 name: str | None = None, *, features: Sequence[str] = (), protocol: Protocol | None = None,
                 constraints: Mapping[str, str] | None = None, proposal_id: str | None = None) -> Transaction:
    """`Table.begin_create` (documented there, where users read it)."""
    props = dict(properties or {})
    for cname, text in (constraints or {}).items():
        props[f"{CONSTRAINT_PREFIX}{cname}"] = text
    for c in partition_by:
        if c not in schema.names:
            raise staging.SchemaError(f"partition column {c!r} is not in the schema {schema.names}")
    if TableProperties(props).row_tracking:
        props = {**new_materialized_columns(), **props}  # where copied rows keep their ids, as Delta names them
    schema_string, props = with_column_mapping(staging.schema_string(schema), props)
    try:
        new = new_table(schema_string, props, features, protocol)
    except ProtocolRequestError as e:
        raise UnsupportedTableFeatureError(f"{table.uri}: cannot create this table: {e}") from e
    md = Metadata(
        id=str(uuid.uuid4()), name=name, schema_string=schema_string, partition_columns=tuple(partition_by),
        configuration=new.configuration, created_time=int(time.time() * 1000),
    )
    # The project's own writer feature: Delta writers that follow the protocol refuse to write around the coordinator.
    protocol = with_coordinated(new.protocol)
    check_creatable(table.uri, protocol, md)
    tx = table.begin_operation(-1, proposal_id)
    tx.add(protocol, md)
    return tx


def check_creatable(uri: str, protocol: Protocol, md: Metadata) -> None:
    """Refuse, naming them, the features this writer could not honour on the table it would create, and
    constraints or generation expressions it could not evaluate."""
    problems = writer_problems(protocol, md, "CREATE TABLE")
    if problems:
        listed = "; ".join(f"writer feature {f}: {why}" for f, why in problems)
        raise UnsupportedTableFeatureError(
            f"{uri}: cannot create this table: {listed}. Create it without the feature, or with an engine "
            "that supports it.")
    rules = WriteRules.of(protocol, md)
    if rules:
        empty = delta_schema_to_arrow(md.schema()).empty_table()
        for check in rules.checks:
            expressions.compile_filter(check.expression, empty.schema)
        for g in rules.generated:
            expressions.compile_filter(g.expression, empty.schema)


def create(table: OperationTable, schema: pa.Schema, partition_by: Sequence[str] = (), properties: Mapping[str, str] | None = None,
           name: str | None = None, *, features: Sequence[str] = (), protocol: Protocol | None = None,
           constraints: Mapping[str, str] | None = None, proposal_id: str | None = None) -> CommitResult:
    """`Table.create` (documented there, where users read it)."""
    exists = table.exists()
    if table.last_committed_version is not None or exists:
        raise TableExistsError(table.uri, "" if exists else held_hint(table))
    check_location_free(table, "create")
    tx = begin_create(table, schema, partition_by, properties, name, features=features, protocol=protocol,
                      constraints=constraints, proposal_id=proposal_id)
    props = next(dict(a.configuration) for a in tx.actions if isinstance(a, Metadata))
    try:
        created = tx.commit("CREATE TABLE", changes_data=False,
                            parameters={"partitionBy": list(partition_by), "properties": props, "isManaged": "false"})
    except ProtocolChangedException as e:
        if e.winning_version == 0 and not isinstance(e, TableExistsError):
            raise TableExistsError(table.uri, "" if table.exists() else held_hint(table)) from e
        raise
    # A new table: versions this handle committed to a table dropped at this location before are no floor.
    table.restart_at(created.version)
    return created


def held_hint(table: OperationTable) -> str:
    """Why a creation on a location without a log is refused: the coordinator still holds a table there."""
    table_opt = "" if table.table_id == table.uri else f" --table-id {table.table_id}"
    return (f"the coordinator still holds table {table.table_id} at {table.uri}, though the location has no "
            "_delta_log (were its files deleted?). Deleting a coordinated table's files does not drop it: drop it "
            f"with `deltacoord table drop {table.uri}{table_opt}` (Python: Table(uri).drop()), then create it again")


def set_properties(table: OperationTable, properties: Mapping[str, str], *, snapshot: Snapshot | None = None,
                   proposal_id: str | None = None) -> CommitResult:
    """`Table.set_properties` (documented there, where users read it)."""
    snap = snapshot or table.snapshot()
    if TableProperties(properties).row_tracking and not row_tracking_supported(snap.protocol):
        raise UnsupportedTableFeatureError(
            f"{snap.table_uri}: enabling row tracking on an existing table needs every file's row ids backfilled, "
            "which this writer does not do; create the table with delta.enableRowTracking=true, or enable it "
            "with Delta on Spark (ALTER TABLE ... SET TBLPROPERTIES) and adopt the table")
    config = {**snap.metadata.configuration, **properties}
    schema_text = None
    old_mode = TableProperties.of(snap.metadata).column_mapping_mode
    new_mode = column_mapping.check_mode(config.get(Property.COLUMN_MAPPING_MODE, "none"))
    if new_mode != old_mode:
        if (old_mode, new_mode) != ("none", "name"):
            raise ValueError(f"changing the column mapping mode from {old_mode} to {new_mode} is not supported; as in "
                             "Delta, an existing table can only go from none to name (create the table in id mode)")
        # As Delta does: existing columns keep their names as physical names (no file changes) and get ids.
        schema_json = snap.metadata.schema()
        config[column_mapping.MAX_ID_PROPERTY] = str(
            column_mapping.assign_ids(schema_json["fields"], 1, physical_names=False) - 1)
        schema_text = json.dumps(schema_json, separators=(",", ":"))
    tx = table.begin_operation(snap.version, proposal_id)
    protocol = snap.protocol
    if TableProperties(properties).deletion_vectors:
        protocol = with_dv_feature(protocol) or protocol
    if cdf_on(properties):
        protocol = protocols.with_change_data_feed(protocol)
    if new_mode != "none":
        protocol = column_mapping.with_feature(protocol)
    if protocol != snap.protocol:
        tx.add(protocol)
    tx.add(replace_metadata(snap.metadata, schema_string=schema_text, configuration=config))
    return tx.commit("SET TBLPROPERTIES", changes_data=False, parameters={"properties": dict(properties)})


def add_columns(table: OperationTable, fields: Sequence[pa.Field], *, snapshot: Snapshot | None = None,
                proposal_id: str | None = None) -> CommitResult:
    """`Table.add_columns` (documented there, where users read it)."""
    snap = snapshot or table.snapshot()
    schema = json.loads(snap.metadata.schema_string)
    existing = {f["name"].lower() for f in schema["fields"]}
    added = []
    for f in fields:
        if f.name.lower() in existing:
            raise staging.SchemaError(f"column {f.name!r} already exists")
        existing.add(f.name.lower())
        added.append({"name": f.name, "type": staging.delta_type(f.type), "nullable": True, "metadata": {}})
    schema["fields"].extend(added)
    config = dict(snap.metadata.configuration)
    if layout_of(snap).mapped:
        # New columns get the next ids and fresh physical names (PROTOCOL.md "Column Mapping").
        first = max(int(config.get(column_mapping.MAX_ID_PROPERTY, "0")), column_mapping.max_id(schema)) + 1
        config[column_mapping.MAX_ID_PROPERTY] = str(column_mapping.assign_ids(added, first) - 1)
    tx = table.begin_operation(snap.version, proposal_id)
    tx.add(replace_metadata(snap.metadata, schema_string=json.dumps(schema, separators=(",", ":")),
                                  configuration=config))
    return tx.commit("ADD COLUMNS", changes_data=False, parameters={"columns": [f.name for f in fields]})

