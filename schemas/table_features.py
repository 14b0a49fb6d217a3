"""Every Delta table feature this project knows, in one table (`FEATURES`): whether its reader reads tables that
have it, whether readers must know it too (`readerFeatures`), the legacy protocol versions that imply it, the
features it requires, what in a table's metadata needs it (PROTOCOL.md's *active* feature: a property, a column
key or type), whether the coordinator's rules guard it, and whether its writer honours it, per table and
operation. The highest protocol versions this project knows are here too. Everything else derives from this
table: the reader's check of a table's reader features (`reader_problems`), the writer's (`writer_problems`),
the protocol of a new table and of an upgrade (`writer/table_protocol.py`, `writer/protocols.py`), and the
coordinator's feature rules (`coordinator/rules/table_features.py`).

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


#: Column metadata key of an identity column's start (PROTOCOL.md, "Identity Columns").
IDENTITY_START_KEY = "delta.identity.start"


def _identity(md: Metadata, op: str) -> str | None:
    cols = _with_metadata(md, IDENTITY_START_KEY)
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


#: The highest protocol versions this project knows (PROTOCOL.md: reader 3 and writer 7 have table features).
MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7


def _true(value: str | None) -> bool:
    return str(value).strip().lower() == "true"


def _types(t: Any) -> Iterator[str]:
    if isinstance(t, str):
        yield t
    elif isinstance(t, Mapping):
        for key in ("elementType", "keyType", "valueType"):
            yield from _types(t.get(key))
        for f in t.get("fields", []):
            yield from _types(f.get("type"))


@dataclass(frozen=True)
class Use:
    """What in a table's metadata needs a feature (PROTOCOL.md's *active* feature): `what` says it, `test` finds
    it in (configuration, schema as parsed JSON)."""

    what: str
    test: Callable[[Mapping[str, str], Mapping[str, Any]], bool]

    def __call__(self, configuration: Mapping[str, str], schema: Mapping[str, Any]) -> bool:
        return self.test(configuration, schema)


def _property(key: str) -> Use:
    """The table property `key` is `true` (Delta's metadata-enabled features)."""
    return Use(f"{key}=true", lambda conf, _schema: _true(conf.get(key)))


def _column_key(key: str) -> Use:
    """A column, nested ones included, carries `key` in its metadata."""
    return Use(f"a column with {key}", lambda _conf, schema: any(key in (f.get("metadata") or {}) for _n, f in _fields(schema)))


def _column_type(name: str) -> Use:
    """A column, nested ones included, is of type `name`."""
    return Use(f"a {name} column", lambda _conf, schema: name in set(_types(schema)))


_COLUMN_MAPPING = Use("delta.columnMapping.mode other than none",
                      lambda conf, _s: str(conf.get("delta.columnMapping.mode", "none")).lower() != "none")
_V2_CHECKPOINTS = Use("delta.checkpointPolicy=v2",
                      lambda conf, _s: str(conf.get("delta.checkpointPolicy", "classic")).lower() == "v2")
#: The configuration keys of CHECK constraints start with this (PROTOCOL.md, "CHECK Constraints").
CONSTRAINT_PREFIX = "delta.constraints."
#: Column metadata keys of an invariant and of a generated column's expression (PROTOCOL.md).
INVARIANTS_KEY = "delta.invariants"
GENERATION_KEY = "delta.generationExpression"
_CONSTRAINTS = Use(f"{CONSTRAINT_PREFIX}<name>", lambda conf, _s: any(k.lower().startswith(CONSTRAINT_PREFIX) for k in conf))


@dataclass(frozen=True)
class Feature:
    """One table feature, every column stated: what this project's reader, writer and coordinator do with it."""

    name: str
    #: How this writer treats it: "honoured", "refused", or "conditional" (honoured unless `rule` finds a problem).
    outcome: str
    rule: Rule
    #: This project's reader reads tables whose protocol lists it in readerFeatures.
    read: bool
    #: A reader-writer feature: listed in readerFeatures as well (reader version 3).
    readers_too: bool
    #: The legacy (reader, writer) protocol versions that first imply it, per PROTOCOL.md (None: table features only).
    legacy: tuple[int, int] | None
    #: What in a table's metadata needs it (None: only asked for by name, `delta.feature.<name>=supported`).
    used_by: Use | None
    #: Features a table with it must have too (PROTOCOL.md's requirements), listed before it.
    requires: tuple[str, ...]
    #: What the coordinator's rules refuse because of it (None: no coordinator rule); the rules are
    #: `coordinator/rules/table_features.py`'s `RULES`, one per feature that names one here.
    coordinator: str | None


_R = _refused
_ICEBERG = "Iceberg compatibility {} needs Iceberg metadata this writer does not keep"
_CATALOG = "a catalog-managed table commits through its catalog"

#: Every feature this project knows. Rows that a table's metadata can need come first, in the order a new table
#: lists them; the legacy ones are in version order within each legacy writer version.
FEATURES: dict[str, Feature] = {f.name: f for f in (
    #       name, outcome, rule; read, readers_too, legacy; used_by, requires; coordinator
    Feature("appendOnly", "honoured", _honoured, False, False, (1, 2), _property("delta.appendOnly"), (),
            "removes of data on a table with delta.appendOnly=true"),
    Feature("changeDataFeed", "conditional", _change_data_feed, False, False, (1, 4),
            _property("delta.enableChangeDataFeed"), (), None),
    Feature("inCommitTimestamp", "honoured", _honoured, False, False, None,
            _property("delta.enableInCommitTimestamps"), (), None),
    Feature("deletionVectors", "honoured", _honoured, True, True, None, _property("delta.enableDeletionVectors"), (),
            None),
    Feature("rowTracking", "honoured", _honoured, False, False, None, _property("delta.enableRowTracking"),
            ("domainMetadata",), None),
    Feature("typeWidening", "honoured", _honoured, True, True, None, _property("delta.enableTypeWidening"), (), None),
    Feature("icebergCompatV1", "refused", _R(_ICEBERG.format("V1")), False, False, None,
            _property("delta.enableIcebergCompatV1"), (), None),
    Feature("icebergCompatV2", "refused", _R(_ICEBERG.format("V2")), False, False, None,
            _property("delta.enableIcebergCompatV2"), (), None),
    Feature("columnMapping", "conditional", _column_mapping, True, True, (2, 5), _COLUMN_MAPPING, (), None),
    Feature("v2Checkpoint", "honoured", _honoured, True, True, None, _V2_CHECKPOINTS, (), None),
    Feature("checkConstraints", "honoured", _honoured, False, False, (1, 3), _CONSTRAINTS, (),
            "a metaData action declaring CHECK constraints"),
    Feature("invariants", "honoured", _honoured, False, False, (1, 2), _column_key(INVARIANTS_KEY), (), None),
    Feature("generatedColumns", "honoured", _honoured, False, False, (1, 4), _column_key(GENERATION_KEY),
            (), None),
    Feature("identityColumns", "conditional", _identity, False, False, (1, 6), _column_key(IDENTITY_START_KEY), (),
            None),
    Feature("timestampNtz", "honoured", _honoured, True, True, None, _column_type("timestamp_ntz"), (), None),
    Feature("variantType", "conditional", _variant, True, True, None, _column_type("variant"), (), None),
    Feature("domainMetadata", "honoured", _honoured, False, False, None, None, (), "domainMetadata actions"),
    Feature("clustering", "honoured", _honoured, False, False, None, None, ("domainMetadata",), None),
    Feature("vacuumProtocolCheck", "honoured", _honoured, True, True, None, None, (), None),
    Feature("typeWidening-preview", "honoured", _honoured, True, True, None, None, (), None),
    Feature("variantType-preview", "conditional", _variant, True, True, None, None, (), None),
    Feature("allowColumnDefaults", "refused", _R("column defaults: this writer does not fill default values"), False,
            False, None, None, (), None),
    Feature(COORDINATED, "honoured", _honoured, False, False, None, None, (),
            "a protocol without it, but for the DROP FEATURE commit of a release"),
    # Read, never written: a catalog-managed table's commits go through its catalog, not this writer.
    Feature("catalogManaged", "refused", _R(_CATALOG), True, True, None, None, ("inCommitTimestamp",), None),
    Feature("catalogOwned-preview", "refused", _R(_CATALOG), True, True, None, None, ("inCommitTimestamp",), None),
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


def needed_features(configuration: Mapping[str, str], schema: Mapping[str, Any]) -> list[str]:
    """The features a table's properties and schema (parsed JSON) need (`Feature.used_by`), each after the
    features it requires (`Feature.requires`), in `FEATURES` order."""
    return with_required([f.name for f in FEATURES.values() if f.used_by is not None and f.used_by(configuration, schema)])


def with_required(names: list[str]) -> list[str]:
    """`names` with the features each requires (`Feature.requires`) inserted just before it when missing."""
    out = list(dict.fromkeys(names))
    for name in list(out):
        feature = FEATURES.get(name)
        for needed in feature.requires if feature is not None else ():
            if needed not in out:
                out.insert(out.index(name), needed)
    return out


def legacy_reader_features(reader_version: int) -> tuple[str, ...]:
    """The reader features a legacy reader version (1 or 2) implies: reader-writer features of that version."""
    return tuple(f.name for f in FEATURES.values()
                 if f.readers_too and f.legacy is not None and f.legacy[0] <= reader_version)


def reader_problems(protocol: Protocol) -> list[str]:
    """What in a protocol this project's reader cannot honour (empty: it reads the table)."""
    if protocol.min_reader_version > MAX_READER_VERSION:
        return [f"reader version {protocol.min_reader_version} is not supported"]
    if protocol.min_reader_version == MAX_READER_VERSION:
        missing = sorted(set(protocol.reader_features or ()) - READABLE)
        if missing:
            return [f"unsupported reader features {missing}"]
    return []


def writer_problems(protocol: Protocol, metadata: Metadata, operation: str) -> list[tuple[str, str]]:
    """(feature, why) for every writer feature of the table this writer cannot honour for `operation`."""
    problems: list[tuple[str, str]] = []
    if protocol.min_writer_version > MAX_WRITER_VERSION:
        problems.append((f"writer version {protocol.min_writer_version}",
                         f"newer than the protocol this writer knows ({MAX_WRITER_VERSION})"))
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
    "CONSTRAINT_PREFIX",
    "COORDINATED",
    "FEATURES",
    "GENERATION_KEY",
    "IDENTITY_START_KEY",
    "INVARIANTS_KEY",
    "LEGACY_VERSIONS",
    "MAX_READER_VERSION",
    "MAX_WRITER_VERSION",
    "NO_CHANGE_DATA_OWED",
    "READABLE",
    "READER_WRITER",
    "SPARK_SINK",
    "Feature",
    "Use",
    "coordinated",
    "legacy_reader_features",
    "needed_features",
    "reader_problems",
    "with_coordinated",
    "with_required",
    "without_coordinated",
    "writer_features",
    "writer_problems",
]
