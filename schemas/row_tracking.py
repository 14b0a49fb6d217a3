"""Row tracking (PROTOCOL.md "Row Tracking"): what a row's id and commit version are, for writer and coordinator.

A fresh row's id is its file's `baseRowId` plus its physical position in the file, and its commit version
is the file's `defaultRowCommitVersion`. A row copied to a new file (UPDATE, MERGE, a DELETE that rewrites
the file, OPTIMIZE) keeps both through two hidden columns named in the table's configuration; a null
there means "fresh". The coordinator assigns `baseRowId`s from the `delta.rowTracking` domain's high-water
mark at decision time, in version order, so concurrent writers never conflict over row ids.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from deltacoord.schemas.actions import DomainMetadata, Metadata, Protocol
from deltacoord.schemas.properties import Property

FEATURE = "rowTracking"
#: Row tracking needs domain metadata for its high-water mark.
REQUIRED_FEATURES = ("domainMetadata", FEATURE)
DOMAIN = "delta.rowTracking"
_HWM = "rowIdHighWaterMark"


def supported(protocol: Protocol | None) -> bool:
    """Writers must assign row ids once the protocol names the feature, whether or not it is enabled."""
    return protocol is not None and protocol.min_writer_version >= 7 and FEATURE in (protocol.writer_features or ())


def high_water_mark(domains: Mapping[str, DomainMetadata]) -> int:
    """The highest row id assigned so far (-1: none). A configuration that is not Delta's JSON is -1."""
    d = domains.get(DOMAIN)
    if d is None or d.removed:
        return -1
    try:
        v = json.loads(d.configuration).get(_HWM)
    except (ValueError, AttributeError):
        return -1
    return v if isinstance(v, int) and not isinstance(v, bool) else -1


def high_water_mark_action(hwm: int) -> DomainMetadata:
    return DomainMetadata(DOMAIN, json.dumps({_HWM: hwm}, separators=(",", ":")))


@dataclass(frozen=True)
class MaterializedColumns:
    """The hidden columns carrying copied rows' ids and commit versions."""

    row_id: str
    row_commit_version: str


def materialized_columns(metadata: Metadata | None) -> MaterializedColumns | None:
    conf = metadata.configuration if metadata is not None else {}
    rid = conf.get(Property.MATERIALIZED_ROW_ID)
    ver = conf.get(Property.MATERIALIZED_ROW_COMMIT_VERSION)
    return MaterializedColumns(rid, ver) if rid and ver else None


def new_materialized_columns() -> dict[str, str]:
    """Configuration naming fresh hidden columns, as Delta does when row tracking is enabled."""
    return {Property.MATERIALIZED_ROW_ID.value: f"_row-id-col-{uuid.uuid4()}",
            Property.MATERIALIZED_ROW_COMMIT_VERSION.value: f"_row-commit-version-col-{uuid.uuid4()}"}


__all__ = ["DOMAIN", "FEATURE", "REQUIRED_FEATURES", "MaterializedColumns", "high_water_mark",
           "high_water_mark_action", "materialized_columns", "new_materialized_columns", "supported"]
