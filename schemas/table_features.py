"""Every Delta table feature this project knows, in one table: whether its reader reads tables that have it,
whether readers must know it too (`readerFeatures`), the legacy protocol versions that imply it, and whether its
writer honours it, per table and operation. The coordinator's rules for features (`coordinator/rules/
table_features.py`) and the protocol upgrades (`writer/table_protocol.py`) read this table.

A writer that ignores a feature the table declares breaks the table for every other engine (a CHECK
constraint left unenforced, a generated column left wrong, a change data feed with holes). PROTOCOL.md
lets a writer write a table only when it supports every writer feature the table's protocol names, so
`writer_problems` answers, before anything is staged: which of the table's features this writer cannot
honour for this operation, and why. The answer is pure (protocol and metadata in, reasons out).

Outcomes (`FEATURES` documents each):
* honoured: appendOnly (the coordinator refuses removes), deletionVectors, domainMetadata,
  inCommitTimestamp, rowTracking (the coordinator assigns row ids; copied rows keep theirs), timestampNtz,
  typeWidening (this writer never widens a type), vacuumProtocolCheck, clustering (appends; OPTIMIZE does
  not recluster), identityColumns (values generated from the high-water mark; not by the Spark data
  source), invariants and checkConstraints (every written row is checked, `deltacoord.writer.constraints`),
  generatedColumns (computed when the data omits them, verified when it supplies them), changeDataFeed
  (DELETE, UPDATE and MERGE write `_change_data` files; the other operations rewrite no file partially, so
  readers infer their changes), columnMapping (name and id modes: physical names and field ids in files,
  stats and partition values), v2Checkpoint (the coordinator writes V2 checkpoints with sidecars when
  `delta.checkpointPolicy=v2`);
* refused: icebergCompatV1/V2, allowColumnDefaults, variantType, a column mapping mode
  PROTOCOL.md does not define, and any unknown feature.

The project's own writer feature, `deltacoord-coordinated` (`COORDINATED`), marks a table that this
project's coordinator decides: every table created through it carries the feature, adoption adds it
and release removes it (`with_coordinated`, `without_coordinated`). Delta writers that follow
PROTOCOL.md (Delta on Spark, delta-rs) do not know it, so they refuse to write the table around the
coordinator; readers look only at reader features, so they read it as before. This project's writer
honours it (it commits through the coordinator).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from deltacoord.schemas.actions import Metadata, Protocol

#: Operations that rewrite no file partially: readers of the change data feed infer their changes from the
#: add and remove actions, so no `_change_data` file is owed.
#: What the Spark data source is checked as: its executors stage the rows as they are (appends and overwrites only).
SPARK_SINK = "SPARK SINK"
NO_CHANGE_DATA_OWED = frozenset({"WRITE", "STREAMING UPDATE", "CREATE TABLE", "CREATE OR REPLACE TABLE", "OPTIMIZE",
                                 "REORG", "SET TBLPROPERTIES", "TRUNCATE", "UPGRADE PROTOCOL", "DROP FEATURE",
                                 SPARK_SINK})
#: Operations that rewrite files partially and write `_change_data` files for every row they change.
CHANGE_DATA_WRITTEN = frozenset({"DELETE", "UPDATE", "MERGE"})


#: The project's own writer feature: the table's commits are decided by a deltacoord coordinator (see above).
COORDINATED = "deltacoord-coordinated"


def _legacy_writer_features() -> tuple[tuple[int, tuple[str, ...]], ...]:
    by_version: dict[int, list[str]] = {}
    for f in FEATURES.values():
        if f.legacy is not None:
            by_version.setdefault(f.legacy[1], []).append(f.name)
    return tuple((v, tuple(by_version[v])) for v in sorted(by_version))


def writer_features(protocol: Protocol) -> tuple[str, ...]:
    """The writer features a protocol names: its list at writer version 7, else those its version implies."""
    if protocol.min_writer_version >= 7:
        return tuple(protocol.writer_features or ())
    return tuple(f for version, names in _LEGACY if protocol.min_writer_version >= version for f in names)


def _fields(schema: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every field of a Delta schema, nested ones included, with its dotted name."""
    for f in schema.get("fields", []):
        name = f"{prefix}{f.get('name')}"
        yield name, f
        t = f.get("type")
        while isinstance(t, Mapping):
            if t.get("type") == "struct":
                yield from _fields(t, name + ".")
                break
            t = t.get("elementType") or t.get("valueType")


def _with_metadata(md: Metadata, key: str) -> list[str]:
    try:
        schema = md.schema()
    except (ValueError, TypeError):
        return []
    return [n for n, f in _fields(schema) if key in (f.get("metadata") or {})]


Rule = Callable[[Metadata, str], str | None]


def _honoured(_md: Metadata, _op: str) -> str | None:
    return None


def _refused(why: str) -> Rule:
    def rule(_md: Metadata, _op: str) -> str | None:
        return why

    return rule


def _identity(md: Metadata, op: str) -> str | None:
    cols = _with_metadata(md, "delta.identity.start")
    nested = [c for c in cols if "." in c]
    if nested:
        return f"identity columns {nested} are nested; this writer generates top-level identity columns only"
    if cols and op == SPARK_SINK:
        return f"identity columns {cols}: the Spark data source does not generate their values; write with Table.append"
    return None


def _change_data_feed(md: Metadata, op: str) -> str | None:
    on = str(md.configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"
    if not on or op in NO_CHANGE_DATA_OWED or op in CHANGE_DATA_WRITTEN:
        return None
    return f"the change data feed is on and {op} would need _change_data files, which this writer does not write for it"


def _column_mapping(md: Metadata, _op: str) -> str | None:
    mode = str(md.configuration.get("delta.columnMapping.mode", "none")).lower()
    if mode in ("none", "name", "id"):
        return None
    return f"column mapping mode {mode!r} is not one PROTOCOL.md defines (none, name, id)"


def _variant(md: Metadata, _op: str) -> str | None:
    return "the variant type cannot be written (Arrow has no variant type)" if '"variant"' in md.schema_string else None


@dataclass(frozen=True)
class Feature:
    """One writer feature: how this writer treats it, and the rule that says when it cannot."""

    name: str
    outcome: str  # "honoured", "refused", or "conditional" (honoured unless the rule finds a problem)
    rule: Rule
    #: This project's reader reads tables whose protocol lists it in readerFeatures.
    read: bool = False
    #: A reader-writer feature: listed in readerFeatures as well (reader version 3).
    readers_too: bool = False
    #: The legacy (reader, writer) protocol versions that first imply it, per PROTOCOL.md.
    legacy: tuple[int, int] | None = None


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("appendOnly", "honoured", _honoured, legacy=(1, 2)),
    Feature("invariants", "honoured", _honoured, legacy=(1, 2)),
    Feature("checkConstraints", "honoured", _honoured, legacy=(1, 3)),
    Feature("changeDataFeed", "conditional", _change_data_feed, legacy=(1, 4)),
    Feature("generatedColumns", "honoured", _honoured, legacy=(1, 4)),
    Feature("columnMapping", "conditional", _column_mapping, read=True, readers_too=True, legacy=(2, 5)),
    Feature("identityColumns", "conditional", _identity, legacy=(1, 6)),
    Feature("deletionVectors", "honoured", _honoured, read=True, readers_too=True),
    Feature("rowTracking", "honoured", _honoured),
    Feature("timestampNtz", "honoured", _honoured, read=True, readers_too=True),
    Feature("domainMetadata", "honoured", _honoured),
    Feature("v2Checkpoint", "honoured", _honoured, read=True, readers_too=True),
    Feature("icebergCompatV1", "refused", _refused("Iceberg compatibility V1 needs Iceberg metadata this writer does not keep")),
    Feature("icebergCompatV2", "refused", _refused("Iceberg compatibility V2 needs Iceberg metadata this writer does not keep")),
    Feature("clustering", "honoured", _honoured),
    Feature("vacuumProtocolCheck", "honoured", _honoured, read=True, readers_too=True),
    Feature("typeWidening", "honoured", _honoured, read=True, readers_too=True),
    Feature("typeWidening-preview", "honoured", _honoured, read=True, readers_too=True),
    Feature("inCommitTimestamp", "honoured", _honoured),
    Feature("allowColumnDefaults", "refused", _refused("column defaults: this writer does not fill default values")),
    Feature("variantType", "conditional", _variant, read=True, readers_too=True),
    Feature("variantType-preview", "conditional", _variant, read=True, readers_too=True),
    Feature(COORDINATED, "honoured", _honoured),
    # Read, never written: a catalog-managed table's commits go through its catalog, not this writer.
    Feature("catalogManaged", "refused", _refused("a catalog-managed table commits through its catalog"), read=True,
            readers_too=True),
    Feature("catalogOwned-preview", "refused", _refused("a catalog-managed table commits through its catalog"),
            read=True, readers_too=True),
)}

#: Reader features this project's reader honours when reading data.
READABLE = frozenset(f.name for f in FEATURES.values() if f.read)
#: Features readers must know too (they go in readerFeatures at reader version 3).
READER_WRITER = frozenset(f.name for f in FEATURES.values() if f.readers_too)
#: The legacy (reader, writer) versions that first have each feature that has them.
LEGACY_VERSIONS: dict[str, tuple[int, int]] = {f.name: f.legacy for f in FEATURES.values() if f.legacy is not None}
#: Writer features each legacy writer version implies (cumulative), per PROTOCOL.md.
_LEGACY = _legacy_writer_features()


def coordinated(protocol: Protocol) -> bool:
    """Whether the protocol names the project's own writer feature (`COORDINATED`)."""
    return COORDINATED in writer_features(protocol)


def with_coordinated(protocol: Protocol) -> Protocol:
    """`protocol` with the `COORDINATED` writer feature (itself when it has it already).

    Writer features exist at writer version 7 only: a legacy protocol is raised to 7 with the features its
    writer version implies listed explicitly, as PROTOCOL.md requires (a (1, 2) table becomes (1, 7) with
    appendOnly and invariants). The reader side is left as it is: the feature is the writers' alone.
    """
    if coordinated(protocol):
        return protocol
    writers = (*writer_features(protocol), COORDINATED)
    readers = protocol.reader_features if protocol.min_reader_version >= 3 else None
    return Protocol(protocol.min_reader_version, 7, reader_features=readers, writer_features=writers)


def without_coordinated(protocol: Protocol) -> Protocol:
    """`protocol` without the `COORDINATED` writer feature (itself when it lacks it): what a released table
    carries. When the features left are exactly those a legacy writer version implies (and the reader version
    is not 3), the protocol goes back to that version, as Delta's DROP FEATURE does: a table adopted at
    (1, 2) is released at (1, 2)."""
    if not coordinated(protocol):
        return protocol
    left = tuple(f for f in writer_features(protocol) if f != COORDINATED)
    reader = protocol.min_reader_version
    if reader < 3:
        for version in range(1, 7):
            implied = {f for v, names in _LEGACY if version >= v for f in names}
            if implied == set(left) and (reader < 2 or version >= 5):
                return Protocol(reader, version)
    return Protocol(reader, 7, reader_features=protocol.reader_features if reader >= 3 else None, writer_features=left)


def writer_problems(protocol: Protocol, metadata: Metadata, operation: str) -> list[tuple[str, str]]:
    """(feature, why) for every writer feature of the table this writer cannot honour for `operation`."""
    problems: list[tuple[str, str]] = []
    if protocol.min_writer_version > 7:
        problems.append((f"writer version {protocol.min_writer_version}", "newer than the protocol this writer knows (7)"))
    for name in writer_features(protocol):
        feature = FEATURES.get(name)
        if feature is None:
            problems.append((name, "a writer feature this writer does not know"))
            continue
        why = feature.rule(metadata, operation)
        if why is not None:
            problems.append((name, why))
    if not any(f == "columnMapping" for f, _ in problems):
        # An unknown column-mapping mode is refused even when the protocol omits the feature (a table others broke).
        why = _column_mapping(metadata, operation)
        if why is not None:
            problems.append(("columnMapping", why))
    return problems


__all__ = [
    "CHANGE_DATA_WRITTEN",
    "COORDINATED",
    "FEATURES",
    "LEGACY_VERSIONS",
    "NO_CHANGE_DATA_OWED",
    "READABLE",
    "READER_WRITER",
    "SPARK_SINK",
    "Feature",
    "coordinated",
    "with_coordinated",
    "without_coordinated",
    "writer_features",
    "writer_problems",
]
