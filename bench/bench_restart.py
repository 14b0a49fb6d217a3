"""Restart (partition recovery) time against the length of the commits topic, with and without a state snapshot.

    python bench/bench_restart.py [--histories 10000,100000,1000000] [--live-files 10000,100000,1000000]
                                  [--tail 1000] [--bootstrap-servers HOST:PORT]

For each history length H a fresh commits topic gets H decision records, as a
busy partition accumulates them: 10 tables, half the records commits (each adds
one file and, once the table holds its share of `--live-files`, removes its
oldest), half rejections (kept on the topic forever, and read by a recovery
without a snapshot). Then:

* `full`: the recovery a coordinator without `state_root` does, reading all H records;
* `snapshot`: a state snapshot of that state is written, `--tail` more records are
  added, and the recovery a coordinator with `state_root` does is timed: load the
  newest snapshot, check the record it ends with, read the tail.

A second series keeps H fixed (the middle history length) and varies the live files
the snapshot holds, to show the snapshot path follows the state's size.
Recovery is `deltacoord.coordinator.kafka.recovery.recover_partition`, what
`PartitionCoordinator.start` runs after fencing (a constant, not measured here).
The figures are printed as JSON lines, then a table. A local broker is started in a
temporary directory unless `--bootstrap-servers` is given.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

TABLES = 10


def _produce_history(bootstrap: str, commits_topic: str, start: int, n: int, heads: dict[str, int],
                     live: dict[str, list[str]], live_per_table: int) -> None:
    """Append `n` decision records (half commits, half rejections) to partition 0 of `commits_topic`."""
    from confluent_kafka import Producer

    from deltacoord.coordinator.kafka.batch_transaction import decision_headers
    from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol, RemoveFile
    from deltacoord.schemas.codec import encode_decision
    from deltacoord.schemas.messages import Decision, Outcome

    # Idempotence keeps the records in order when the broker is slow and batches are retried.
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    tables = [f"file:///bench/restart/t{i}" for i in range(TABLES)]
    for i in range(start, start + n):
        tid = tables[i % TABLES]
        v = heads.get(tid, -1) + 1
        pid = f"p-{i}"
        if v == 0:
            actions: tuple[Any, ...] = (CommitInfo({"operation": "CREATE TABLE", "txnId": pid}), Protocol(1, 2), Metadata(
                id=str(uuid.uuid4()), schema_string='{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}',
                partition_columns=()))
            d = Decision(tid, tid, pid, Outcome.COMMITTED, version=0, actions=actions, decided_at_ms=1)
        elif (i // TABLES) % 2 == 0:
            name = f"part-{i:09d}.parquet"
            acts: list[Any] = [CommitInfo({"operation": "WRITE", "txnId": pid}), AddFile(name, {}, 100, 1, True)]
            files = live.setdefault(tid, [])
            files.append(name)
            if len(files) > live_per_table:
                acts.append(RemoveFile(files.pop(0), 1, True))
            d = Decision(tid, tid, pid, Outcome.COMMITTED, version=v, actions=tuple(acts), decided_at_ms=1)
        else:
            d = Decision(tid, tid, pid, Outcome.REJECTED, error_type="ConcurrentAppendException",
                         error_message="a concurrent append", winning_version=v - 1, decided_at_ms=1)
        if d.committed:
            heads[tid] = v
        while True:
            try:
                producer.produce(commits_topic, value=encode_decision(d), key=tid.encode(), headers=decision_headers(d),
                                 partition=0)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(120)


def _bulk_live(heads: dict[str, int], live: dict[str, list[str]], live_per_table: int) -> None:
    """Grow each table's live files to `live_per_table` in the snapshot series (cheaper than producing commits)."""
    for tid in heads:
        files = live.setdefault(tid, [])
        files.extend(f"bulk-{tid[-3:]}-{j:09d}.parquet" for j in range(len(files), live_per_table))


def _recover(settings: Any, heads: dict[str, int]) -> tuple[float, Any]:
    from deltacoord.coordinator.kafka.recovery import recover_partition

    t0 = time.monotonic()
    rec = recover_partition(settings, 0, published_version=lambda uri: heads.get(uri, -1))
    return time.monotonic() - t0, rec


def run(bootstrap: str, history: int, live_files: int, tail: int, workdir: Path, bulk: bool = False) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.state_snapshots import PartitionSnapshot, SnapshotStore
    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.coordinator.rules.state import key_hash
    from deltacoord.coordinator.settings import CoordinatorSettings
    from deltacoord.schemas.routing import Topics

    topics = Topics.with_prefix(f"restart{uuid.uuid4().hex[:8]}")
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), topics, partitions=1)
    heads: dict[str, int] = {}
    live: dict[str, list[str]] = {}
    per_table = live_files // TABLES
    t0 = time.monotonic()
    _produce_history(bootstrap, topics.commits, 0, history, heads, live, per_table)
    produced_s = time.monotonic() - t0
    full = CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id=f"{topics.proposals}-bench")
    full_s, rec = _recover(full, heads)
    assert rec.records == history and not rec.halted, (rec.records, history, list(rec.halted.values())[:1])
    if bulk:  # the snapshot series: the state holds `live_files` files whatever the history
        import numpy as np

        _bulk_live(heads, live, per_table)
        for tid, st in rec.states.items():
            from deltacoord.coordinator.rules.live_files import LiveFileSet

            st._live = LiveFileSet.of_array(np.unique(np.array([key_hash(f, None) for f in live[tid]], dtype=np.int64)))
    root = workdir / topics.commits
    with_state = CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id=f"{topics.proposals}-bench",
                                     state_root=str(root))
    snap = PartitionSnapshot(commits_topic=topics.commits, partition=0, offset=rec.end_offset, last=rec.last,
                             tables=[st.export() for st in rec.states.values()], decided=list(rec.decided),
                             created_ms=int(time.time() * 1000))
    t0 = time.monotonic()
    size = SnapshotStore(str(root), {}, topics.commits, 0).write(snap)
    write_s = time.monotonic() - t0
    _produce_history(bootstrap, topics.commits, history, tail, heads, live, per_table)
    snap_s, rec2 = _recover(with_state, heads)
    assert rec2.snapshot_offset == snap.offset and rec2.records == tail, (rec2.snapshot_offset, rec2.records)
    assert {t: s.version for t, s in rec2.states.items()} == heads
    live_now = sum(s.live_file_count for s in rec2.states.values())
    shutil.rmtree(root, ignore_errors=True)
    return {"history_records": history, "live_files": live_now, "full_recovery_s": round(full_s, 2),
            "snapshot_bytes": size, "snapshot_write_s": round(write_s, 2), "tail_records": tail,
            "snapshot_recovery_s": round(snap_s, 2), "produce_s": round(produced_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--histories", default="10000,100000,1000000")
    ap.add_argument("--live-files", default="10000,100000,1000000")
    ap.add_argument("--tail", type=int, default=1000)
    ap.add_argument("--bootstrap-servers", default=None)
    args = ap.parse_args()
    histories = [int(x) for x in args.histories.split(",")]
    lives = [int(x) for x in args.live_files.split(",")]
    from deltacoord.tooling.broker import LocalBroker

    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-restart-"))
    broker = None
    if args.bootstrap_servers is None:
        broker = LocalBroker(workdir / "broker")
    bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
    rows = []
    try:
        for h in histories:
            print(f"[restart] history of {h} records ...", file=sys.stderr, flush=True)
            row = {"series": "history", **run(bootstrap, h, min(lives), args.tail, workdir)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        middle = histories[len(histories) // 2]
        for n in lives:
            print(f"[restart] {n} live files, history of {middle} records ...", file=sys.stderr, flush=True)
            row = {"series": "state", **run(bootstrap, middle, n, args.tail, workdir, bulk=True)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'series':8} {'history':>9} {'live files':>10} {'full s':>7} {'snapshot MB':>11} {'from snapshot s':>15}")
    for r in rows:
        print(f"{r['series']:8} {r['history_records']:>9} {r['live_files']:>10} {r['full_recovery_s']:>7} "
              f"{r['snapshot_bytes'] / 1e6:>11.1f} {r['snapshot_recovery_s']:>15}")


if __name__ == "__main__":
    main()
