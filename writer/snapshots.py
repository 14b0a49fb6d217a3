"""A consistent read of several tables: every part of a multi-table transaction, or none of them.

Plain Delta readers see each table's version once it is published, and the parts of one transaction are
published table by table. Atomic visibility comes from the commits topic instead: one point of its partition
(its read_committed end when the read starts) orders every ratified version, and a transaction's parts are
consecutive records of one Kafka transaction there. Each table is read at its newest version ratified before
that point: its newest published version (listed before the point is taken, so before it) moved forward by
the ratified versions after it, read from the commits topic (`Snapshot.with_commits`), so nothing waits on
publication. The point is moved past any transaction whose parts it would split.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from deltacoord.reader.ratified import SCAN_MARGIN_MS, RatifiedReadError
from deltacoord.reader.snapshot import Snapshot
from deltacoord.reader.staged_commits import resolve_decision
from deltacoord.schemas.actions import Action, CommitInfo
from deltacoord.schemas.codec import decode_decision
from deltacoord.schemas.commits_topic import PartitionScan, ScanIncompleteError, read_committed
from deltacoord.schemas.messages import TRANSACTION_KEY
from deltacoord.schemas.routing import H_TABLE_ID, H_VERSION, header
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table


def snapshots(tables: Sequence[Table | str], bootstrap_servers: str | None = None, *,
              storage_options: Mapping[str, str] | None = None, timeout_s: float = 30.0,
              client: CoordinatorClient | None = None, **kafka_config: Any) -> list[Snapshot]:
    """Snapshots of `tables` (handles, or locations whose table id is their location) at one point of the order
    of commits: a multi-table transaction is in all of them or in none. Versions ratified but not yet published
    are included (read from the commits topic)."""
    if not tables:
        return []
    own = client is None and not all(isinstance(t, Table) for t in tables)
    if own:
        client = CoordinatorClient(bootstrap_servers, coordinator_check=False, **kafka_config)
    try:
        handles = [t if isinstance(t, Table) else Table(t, client=client, storage_options=storage_options)
                   for t in tables]
        return _snapshots(handles, client, timeout_s)
    finally:
        if own and client is not None:
            client.close()


def _snapshots(handles: Sequence[Table], client: CoordinatorClient | None, timeout_s: float) -> list[Snapshot]:
    if len({t.table_id for t in handles}) != len(handles):
        raise ValueError("snapshots(): a table is named twice")
    kc = client or handles[0].client
    published = {t.table_id: Snapshot.load(t.uri, storage_options=t.storage_options) for t in handles}
    by_partition: dict[int, list[Table]] = {}
    for t in handles:
        by_partition.setdefault(kc.partition_of(t.table_id), []).append(t)
    out: dict[str, Snapshot] = {}
    for partition, group in by_partition.items():
        ratified = _scan(kc, partition, {t.table_id: published[t.table_id] for t in group}, timeout_s)
        for t in group:
            commits = ratified.get(t.table_id, {})
            snap = published[t.table_id]
            after: list[tuple[int, tuple[Action, ...]]] = []
            for v in sorted(commits):
                if v != snap.version + 1 + len(after):
                    break
                after.append((v, commits[v]))
            out[t.table_id] = snap.with_commits(after)
    return [out[t.table_id] for t in handles]


def _scan(kc: CoordinatorClient, partition: int, published: Mapping[str, Snapshot],
          timeout_s: float) -> dict[str, dict[int, tuple[Action, ...]]]:
    """Per table id, its versions after the published one that were ratified before this partition's point."""
    stamps = [s._commit_info_ms() for s in published.values()]
    since = max(0, min(stamps) - SCAN_MARGIN_MS) if stamps and min(stamps) > 0 else None
    wanted = {tid.encode(): tid for tid in published}
    out: dict[str, dict[int, tuple[Action, ...]]] = {}
    try:
        with PartitionScan(read_committed(kc._conf, f"deltacoord-snapshots-{uuid.uuid4().hex[:12]}"), kc.topics.commits,
                           partition, since_ms=since, headers={H_TABLE_ID: wanted.keys()}, budget_s=timeout_s,
                           deadline_s=timeout_s) as scan:
            for m in scan:  # the scan's end is the point: moved past a transaction it would split
                offset = m.offset()
                tid = wanted[header(m, H_TABLE_ID) or b""]
                raw_version = header(m, H_VERSION)
                value = m.value()
                if offset is None or raw_version is None or value is None:
                    continue
                if int(raw_version) <= published[tid].version:
                    continue
                d = decode_decision(value)
                if not d.holds_version:
                    continue
                info = d.actions[0] if d.actions and isinstance(d.actions[0], CommitInfo) else None
                tx = info.values.get(TRANSACTION_KEY) if info is not None else None
                if isinstance(tx, dict) and isinstance(tx.get("tables"), list) and tid in tx["tables"]:
                    # The parts are consecutive records: the point may not fall among them.
                    scan.end = max(scan.end, offset - tx["tables"].index(tid) + len(tx["tables"]))
                if d.staged is not None:
                    d = resolve_decision(published[tid].storage, d)
                out.setdefault(tid, {})[int(raw_version)] = d.actions
    except ScanIncompleteError as e:
        raise RatifiedReadError(str(e)) from e
    return out


__all__ = ["snapshots"]
