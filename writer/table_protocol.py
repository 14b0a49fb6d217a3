"""The protocol a new table gets: the features asked for, those its properties and schema need, as Delta does.

What needs which feature, which features a feature requires and the legacy versions are the one table of
features' (`deltacoord.schemas.table_features`); this module acts on them.

Delta enables a feature when a table property or the schema uses it (`delta.enableChangeDataFeed=true`
needs changeDataFeed, a CHECK constraint checkConstraints, a generated column generatedColumns, ...),
and takes explicit ones as `delta.feature.<name>=supported` properties. A table whose features all exist
at a legacy writer version gets that version (the smallest that has them, as Delta does: a CHECK
constraint alone gives (1, 3)); anything else gets table features (reader 3 when a reader-writer feature
is among them, writer 7), listing the features of the base version too. `delta.feature.*`,
`delta.minReaderVersion` and `delta.minWriterVersion` are protocol requests, not table properties: they
are taken out of the configuration, as Delta does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltacoord.schemas.actions import Protocol
from deltacoord.schemas.table_features import (
    LEGACY_VERSIONS,
    READER_WRITER,
    legacy_reader_features,
    needed_features,
    with_required,
    writer_features,
)
from deltacoord.writer import column_mapping

FEATURE_PREFIX = "delta.feature."
MIN_READER_PROPERTY = "delta.minReaderVersion"
MIN_WRITER_PROPERTY = "delta.minWriterVersion"


class ProtocolRequestError(ValueError):
    """A protocol request that cannot be met (a bad version, a feature property that is not `supported`)."""


@dataclass(frozen=True)
class NewTable:
    """What a CREATE TABLE commits: its protocol and the configuration left once protocol requests are taken out."""

    protocol: Protocol
    configuration: dict[str, str]


def _schema_fields(fields: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for f in fields:
        yield f
        t = f.get("type")
        while isinstance(t, Mapping):
            if t.get("type") == "struct":
                yield from _schema_fields(t.get("fields", []))
                break
            t = t.get("elementType") or t.get("valueType")


def required_features(schema_string: str, configuration: Mapping[str, str]) -> list[str]:
    """The features a table's properties and schema need, in a stable order (`table_features.needed_features`)."""
    return needed_features(configuration, json.loads(schema_string))


def _version(value: Any, what: str, highest: int) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError) as e:
        raise ProtocolRequestError(f"{what} must be an integer from 1 to {highest}, got {value!r}") from e
    if not 1 <= v <= highest:
        raise ProtocolRequestError(f"{what} must be from 1 to {highest}, got {v}")
    return v


def new_table(schema_string: str, properties: Mapping[str, str], features: Sequence[str] = (),
              protocol: Protocol | None = None) -> NewTable:
    """The protocol and configuration of a new table (see the module docstring for the rules).

    `protocol` is the least protocol asked for (its versions and features are kept); `features` are
    features asked for by name, as `delta.feature.<name>=supported` properties are.
    """
    config = {k: str(v) for k, v in properties.items()}
    asked = list(features)
    for key in list(config):
        if key.lower().startswith(FEATURE_PREFIX):
            value = config.pop(key)
            if value.strip().lower() not in ("supported", "enabled"):
                raise ProtocolRequestError(f"{key}={value!r}: a feature property must be 'supported'")
            asked.append(key[len(FEATURE_PREFIX):])
    reader, writer = (protocol.min_reader_version, protocol.min_writer_version) if protocol is not None else (1, 2)
    if MIN_READER_PROPERTY in config:
        reader = max(reader, _version(config.pop(MIN_READER_PROPERTY), MIN_READER_PROPERTY, 3))
    if MIN_WRITER_PROPERTY in config:
        writer = max(writer, _version(config.pop(MIN_WRITER_PROPERTY), MIN_WRITER_PROPERTY, 7))
    reader, writer = _version(reader, "the minimum reader version", 3), _version(writer, "the minimum writer version", 7)
    required = with_required([*asked, *required_features(schema_string, config)])
    base = Protocol(reader, writer, reader_features=protocol.reader_features if protocol is not None else None,
                    writer_features=protocol.writer_features if protocol is not None else None)
    if writer < 7 and not asked and all(f in LEGACY_VERSIONS for f in required):
        r = max([reader, *(LEGACY_VERSIONS[f][0] for f in required)])
        w = max([writer, *(LEGACY_VERSIONS[f][1] for f in required)])
        return NewTable(Protocol(r, w), config)
    have = list(writer_features(base if writer >= 7 else Protocol(1, writer)))
    all_writer = list(dict.fromkeys([*have, *required]))
    readers = list(base.reader_features or ()) if reader >= 3 else list(legacy_reader_features(reader))
    readers = list(dict.fromkeys([*readers, *(f for f in all_writer if f in READER_WRITER)]))
    if readers:
        return NewTable(Protocol(3, 7, reader_features=tuple(readers), writer_features=tuple(all_writer)), config)
    return NewTable(Protocol(1, 7, writer_features=tuple(all_writer)), config)


COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
MAX_COLUMN_ID = "delta.columnMapping.maxColumnId"
COLUMN_ID_KEY = "delta.columnMapping.id"
PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"


def with_column_mapping(schema_string: str, configuration: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A new table in column mapping mode `name` or `id` gets, as Delta gives it, an id and a physical name
    (`col-<uuid>`) on every field, nested ones included, and `delta.columnMapping.maxColumnId`. Fields
    that already carry both keep them."""
    config = dict(configuration)
    if str(config.get(COLUMN_MAPPING_MODE, "none")).lower() not in ("name", "id"):
        return schema_string, config
    schema = json.loads(schema_string)
    fields = list(_schema_fields(schema.get("fields", [])))
    top = max([int(config.get(MAX_COLUMN_ID, 0))] + [int((f.get("metadata") or {}).get(COLUMN_ID_KEY, 0)) for f in fields])
    config[MAX_COLUMN_ID] = str(column_mapping.assign_ids(schema.get("fields", []), top + 1) - 1)
    return json.dumps(schema, separators=(",", ":")), config


__all__ = ["NewTable", "ProtocolRequestError", "new_table",
           "required_features", "with_column_mapping"]
