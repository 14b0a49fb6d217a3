"""Raising a table's protocol so it names a feature its properties turn on.

A table whose metadata enables a feature its protocol does not list is refused by Delta on Spark
(DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH): enabling the change data feed or column mapping must raise
the protocol in the same commit, to the legacy version that implies the feature or, at writer version 7,
by listing it. The versions and whether readers must know the feature are the table of features'
(`deltacoord.schemas.table_features.FEATURES`).
"""

from __future__ import annotations

from deltacoord.schemas.actions import Protocol
from deltacoord.schemas.table_features import FEATURES


def with_feature(p: Protocol, feature: str) -> Protocol:
    """`p` raised to hold `feature`: the legacy (reader, writer) pair that implies it, or the feature listed (on
    the reader side too when readers must know it) at writer 7."""
    known = FEATURES.get(feature)
    if known is None or known.legacy is None:
        raise ValueError(f"{feature!r} has no legacy protocol version: list it at writer version 7 instead")
    reader_version, writer_version = known.legacy
    if p.min_writer_version < 7:
        return Protocol(max(p.min_reader_version, reader_version), max(p.min_writer_version, writer_version))
    writer = (*dict.fromkeys([*(p.writer_features or ()), feature]),)
    if p.min_reader_version >= 3 and known.readers_too:
        reader = (*dict.fromkeys([*(p.reader_features or ()), feature]),)
        return Protocol(3, 7, reader_features=reader, writer_features=writer)
    return Protocol(max(p.min_reader_version, reader_version), 7, reader_features=p.reader_features, writer_features=writer)


def with_change_data_feed(p: Protocol) -> Protocol:
    """`p` able to hold a table with `delta.enableChangeDataFeed` (writer 4, or the changeDataFeed feature)."""
    return with_feature(p, "changeDataFeed")


__all__ = ["with_change_data_feed", "with_feature"]
