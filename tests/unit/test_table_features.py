"""The one table of table features (`schemas/table_features.py`) against Delta's PROTOCOL.md.

`APPENDIX` is PROTOCOL.md's "Valid Feature Names in Table Features" (plus the Variant Data Type section's
feature); `LEGACY` its "Writer Version Requirements" and "Reader Version Requirements" tables.
"""

from __future__ import annotations

import json

import pytest

from deltacoord.coordinator.rules.table_features import RULES
from deltacoord.schemas.actions import Protocol
from deltacoord.schemas.table_features import (
    FEATURES,
    LEGACY_VERSIONS,
    MAX_READER_VERSION,
    MAX_WRITER_VERSION,
    READABLE,
    READER_WRITER,
    legacy_reader_features,
    needed_features,
    reader_problems,
    with_required,
)
from deltacoord.writer import protocols

APPENDIX = """
[Append-only Tables](#append-only-tables) | `appendOnly` | Writers only
[Column Invariants](#column-invariants) | `invariants` | Writers only
[`CHECK` constraints](#check-constraints) | `checkConstraints` | Writers only
[Generated Columns](#generated-columns) | `generatedColumns` | Writers only
[Default Columns](#default-columns) | `allowColumnDefaults` | Writers only
[Change Data Feed](#add-cdc-file) | `changeDataFeed` | Writers only
[Column Mapping](#column-mapping) | `columnMapping` | Readers and writers
[Identity Columns](#identity-columns) | `identityColumns` | Writers only
[Deletion Vectors](#deletion-vectors) | `deletionVectors` | Readers and writers
[Row Tracking](#row-tracking) | `rowTracking` | Writers only
[Timestamp without Timezone](#timestamp-without-timezone-timestampNtz) | `timestampNtz` | Readers and writers
[Domain Metadata](#domain-metadata) | `domainMetadata` | Writers only
[V2 Checkpoint](#v2-checkpoint-table-feature) | `v2Checkpoint` | Readers and writers
[Catalog-managed Tables](#catalog-managed-tables) | `catalogManaged` | Readers and writers
[Iceberg Compatibility V1](#iceberg-compatibility-v1) | `icebergCompatV1` | Writers only
[Iceberg Compatibility V2](#iceberg-compatibility-v2) | `icebergCompatV2` | Writers only
[Clustered Table](#clustered-table) | `clustering` | Writers only
[VACUUM Protocol Check](#vacuum-protocol-check) | `vacuumProtocolCheck` | Readers and Writers
[In-Commit Timestamps](#in-commit-timestamps) | `inCommitTimestamp` | Writers only
[Variant Data Type](#variant-data-type) | `variantType` | Readers and writers
"""

#: (reader, writer) versions that first imply a feature.
LEGACY = {"appendOnly": (1, 2), "invariants": (1, 2), "checkConstraints": (1, 3), "changeDataFeed": (1, 4),
          "generatedColumns": (1, 4), "columnMapping": (2, 5), "identityColumns": (1, 6)}

#: What in a table's metadata makes each feature active (PROTOCOL.md's sections and table properties).
ACTIVE: dict[str, tuple[dict[str, str], list[dict[str, object]]]] = {
    "appendOnly": ({"delta.appendOnly": "true"}, []),
    "changeDataFeed": ({"delta.enableChangeDataFeed": "true"}, []),
    "inCommitTimestamp": ({"delta.enableInCommitTimestamps": "true"}, []),
    "deletionVectors": ({"delta.enableDeletionVectors": "true"}, []),
    "rowTracking": ({"delta.enableRowTracking": "true"}, []),
    "icebergCompatV1": ({"delta.enableIcebergCompatV1": "true"}, []),
    "icebergCompatV2": ({"delta.enableIcebergCompatV2": "true"}, []),
    "columnMapping": ({"delta.columnMapping.mode": "name"}, []),
    "v2Checkpoint": ({"delta.checkpointPolicy": "v2"}, []),
    "checkConstraints": ({"delta.constraints.positive": "x > 0"}, []),
    "invariants": ({}, [{"name": "x", "type": "integer", "metadata": {"delta.invariants": "{}"}}]),
    "generatedColumns": ({}, [{"name": "x", "type": "integer", "metadata": {"delta.generationExpression": "1"}}]),
    "identityColumns": ({}, [{"name": "x", "type": "long", "metadata": {"delta.identity.start": 1}}]),
    "timestampNtz": ({}, [{"name": "x", "type": {"type": "array", "elementType": "timestamp_ntz"}, "metadata": {}}]),
    "variantType": ({}, [{"name": "x", "type": "variant", "metadata": {}}]),
}

#: Features PROTOCOL.md says a table with the feature must support too.
REQUIRES = {"rowTracking": ("domainMetadata",), "clustering": ("domainMetadata",),
            "catalogManaged": ("inCommitTimestamp",)}


def _appendix() -> dict[str, bool]:
    rows = [line.split("|") for line in APPENDIX.strip().splitlines()]
    return {name.strip().strip("`"): kind.strip().lower() == "readers and writers" for _f, name, kind in rows}


@pytest.mark.parametrize("name", list(_appendix()))
def test_every_protocol_feature_is_in_the_table_with_every_column(name: str) -> None:
    assert name in FEATURES, f"{name} is missing from schemas/table_features.FEATURES"
    f = FEATURES[name]
    assert f.name == name
    assert f.readers_too is _appendix()[name], "readers_too disagrees with PROTOCOL.md's Readers or Writers? column"
    assert (name in READER_WRITER) is f.readers_too
    assert f.legacy == LEGACY.get(name), "legacy versions disagree with PROTOCOL.md's version requirements"
    assert f.outcome in ("honoured", "refused", "conditional")
    assert callable(f.rule)
    assert isinstance(f.read, bool) and (not f.read or f.readers_too), "only reader features are read"
    assert (name in READABLE) is f.read
    assert f.requires == REQUIRES.get(name, ())
    assert all(r in FEATURES for r in f.requires)
    assert (f.coordinator is not None) is (name in RULES), "a coordinator rule is named in the table and in RULES"
    conf, fields = ACTIVE.get(name, ({}, []))
    schema = {"type": "struct", "fields": fields}
    if name in ACTIVE:
        assert f.used_by is not None and f.used_by(conf, schema), f"{name} is not found active in {conf} {fields}"
        assert name in needed_features(conf, schema)
        assert not f.used_by({}, {"type": "struct", "fields": []})
        assert f.used_by.what
    else:
        assert f.used_by is None, "a feature no metadata makes active is asked for by name"


def test_the_coordinators_rules_are_exactly_those_the_table_names() -> None:
    assert set(RULES) == {f.name for f in FEATURES.values() if f.coordinator is not None}


def test_derived_knowledge() -> None:
    assert MAX_READER_VERSION == 3 and MAX_WRITER_VERSION == 7
    assert LEGACY_VERSIONS == LEGACY
    assert legacy_reader_features(1) == () and legacy_reader_features(2) == ("columnMapping",)
    assert with_required(["clustering", "rowTracking"]) == ["domainMetadata", "clustering", "rowTracking"]
    assert needed_features({"delta.enableRowTracking": "true"}, {}) == ["domainMetadata", "rowTracking"]
    schema = json.loads('{"type":"struct","fields":[{"name":"t","type":"timestamp_ntz","metadata":{}}]}')
    assert needed_features({"delta.enableChangeDataFeed": "true", "delta.constraints.a": "t > 0"}, schema) == [
        "changeDataFeed", "checkConstraints", "timestampNtz"]
    assert reader_problems(Protocol(3, 7, tuple(READABLE), ())) == []
    assert reader_problems(Protocol(3, 7, ("someFutureFeature",), ())) == ["unsupported reader features ['someFutureFeature']"]
    assert reader_problems(Protocol(4, 7)) == ["reader version 4 is not supported"]
    assert reader_problems(Protocol(2, 5)) == []
    # the protocol upgrades take their versions from the table
    assert protocols.with_feature(Protocol(1, 2), "columnMapping") == Protocol(2, 5)
    assert protocols.with_feature(Protocol(1, 2), "identityColumns") == Protocol(1, 6)
    with pytest.raises(ValueError, match="'deletionVectors' has no legacy protocol version"):
        protocols.with_feature(Protocol(1, 2), "deletionVectors")


@pytest.mark.parametrize(("before", "reader", "writer"), [
    (Protocol(1, 2), ("deletionVectors",), ("appendOnly", "invariants", "deletionVectors")),
    (Protocol(2, 5), ("columnMapping", "deletionVectors"),
     ("appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns", "columnMapping",
      "deletionVectors")),
    (Protocol(3, 7, reader_features=("columnMapping",), writer_features=("columnMapping", "appendOnly")),
     ("columnMapping", "deletionVectors"), ("columnMapping", "appendOnly", "deletionVectors")),
])
def test_the_deletion_vector_upgrade_keeps_what_the_protocol_had(before: Protocol, reader: tuple[str, ...],
                                                                 writer: tuple[str, ...]) -> None:
    """Raising a table to deletion vectors lists, at (3, 7), every feature its legacy versions implied (from the
    table of features) beside the new one; a table that has them is left as it is."""
    from deltacoord.writer.table_ddl import with_dv_feature

    assert with_dv_feature(before) == Protocol(3, 7, reader_features=reader, writer_features=writer)
    assert with_dv_feature(Protocol(3, 7, reader_features=reader, writer_features=writer)) is None
