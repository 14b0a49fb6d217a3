"""Ratified versions a table's `_delta_log` does not have yet, read from the commits topic.

A version is committed once its decision is in the commits topic; `_delta_log/<v>.json` follows a few
milliseconds later. A reader that must see its own `wait="ratified"` commits at once (as Delta's
catalog-managed tables let readers see ratified commits before they are published) reads the newest
published version from `_delta_log`, then the decisions after it from Kafka.

The scan is short: it starts at the first commits-topic record no older than the newest published
version's commitInfo timestamp (the coordinator stamps it when it decides, just before it produces the
decision; `SCAN_MARGIN_MS` covers a clock step), found with Kafka's time index, and ends at the
partition's end. Only records whose table-id header matches are decoded.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException

from deltacoord.reader.staged_commits import resolve_decision
from deltacoord.schemas.actions import Action
from deltacoord.schemas.codec import decode_decision
from deltacoord.schemas.commits_topic import (
    CommitsTopicNotFoundError,
    PartitionScan,
    ScanIncompleteError,
    commits_partition,
    read_committed,
)
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.routing import H_TABLE_ID, H_VERSION, Topics, header
from deltacoord.schemas.staged import StagedCommitError
from deltacoord.storage.table import TableStorage

#: How far before the newest published version's commitInfo timestamp the scan starts.
SCAN_MARGIN_MS = 5_000


class RatifiedReadError(DeltaCoordError):
    """The commits topic could not be read to its end in time."""


@dataclass(frozen=True)
class RatifiedSource:
    """Where a table's ratified versions are: the deployment's Kafka and topics, and the table's id."""

    bootstrap_servers: str
    table_id: str
    topics: Topics = field(default_factory=Topics.with_prefix)
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0

    def after(self, version: int, since_ms: int, *,
              storage: TableStorage | None = None) -> list[tuple[int, tuple[Action, ...]]]:
        """The table's ratified versions after `version`, in order, each with its actions (the commit exactly as it
        will be published); `since_ms` is `version`'s commitInfo timestamp (0: scan the whole partition).
        `storage` (the table's) resolves versions recorded by reference (`deltacoord.reader.staged_commits`)."""
        try:
            return self._scan(version, since_ms, storage)
        except StagedCommitError as e:
            raise RatifiedReadError(f"a ratified version of {self.table_id} cannot be read: {e}") from e
        except (CommitsTopicNotFoundError, ScanIncompleteError) as e:
            raise RatifiedReadError(str(e)) from e
        except KafkaException as e:
            raise RatifiedReadError(f"cannot read the ratified versions of {self.table_id} from "
                                    f"{self.topics.commits}: {e}") from e

    def _scan(self, version: int, since_ms: int, storage: TableStorage | None) -> list[tuple[int, tuple[Action, ...]]]:
        conf = read_committed({"bootstrap.servers": self.bootstrap_servers, **self.kafka_config},
                              f"deltacoord-stream-ratified-{uuid.uuid4().hex[:12]}")
        topic = self.topics.commits

        def partition(c: Consumer) -> int:
            return commits_partition(c, topic, self.table_id, self.bootstrap_servers, self.timeout_s)

        out: dict[int, tuple[Action, ...]] = {}
        with PartitionScan(conf, topic, partition, since_ms=max(0, since_ms - SCAN_MARGIN_MS) if since_ms > 0 else None,
                           headers={H_TABLE_ID: {self.table_id.encode()}}, budget_s=self.timeout_s,
                           deadline_s=self.timeout_s) as scan:
            for m in scan:
                raw_version = header(m, H_VERSION)
                if raw_version is None or int(raw_version) <= version:
                    continue
                value = m.value()
                if value is None:
                    continue
                d = decode_decision(value)
                if d.holds_version:  # not a redelivery's answer, nor a commit coalesced into the version
                    if d.staged is not None:
                        if storage is None:
                            raise StagedCommitError(f"version {d.version} was recorded by reference; give the table's "
                                                    "storage to read it")
                        d = resolve_decision(storage, d)
                    out[int(raw_version)] = d.actions
        commits: list[tuple[int, tuple[Action, ...]]] = []
        for n in sorted(out):
            if n != version + 1 + len(commits):
                break  # not contiguous: stop at the gap rather than skip a version
            commits.append((n, out[n]))
        return commits


__all__ = ["SCAN_MARGIN_MS", "RatifiedReadError", "RatifiedSource"]
