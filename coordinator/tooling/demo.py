"""`deltacoord demo`: the product in two minutes, end to end on a real broker.

`--storage s3` puts the table in a fresh bucket of the local S3 server
(versitygw, started if needed): the same writers, coordinator and delta-rs
check, with storage options instead of a directory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka.admin import AdminClient

from coordinator.delta_log.checkpointer import create_checkpoint
from coordinator.kafka.daemon import Coordinator
from coordinator.kafka.topics import ensure_topics
from coordinator.settings import CoordinatorSettings
from coordinator.tooling.broker import LocalBroker
from schemas.errors import DeltaConcurrentModificationException
from schemas.kafka_logs import kafka_config
from schemas.properties import Property
from schemas.routing import Topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("amount", pa.int64())])
DATES = ["2024-01-01", "2024-01-02", "2024-01-03"]


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_demo(table_dir: Path | None = None, writers: int = 4, appends_per_writer: int = 10, keep_broker: bool = False,
             storage: str = "local") -> dict[str, Any]:
    from deltalake import DeltaTable
    from deltalake import __version__ as deltalake_version

    from coordinator.tooling.storage_servers import S3Server
    from reader.snapshot import Snapshot
    from writer.table import Table

    s3 = S3Server() if storage == "s3" else None
    started_s3 = s3 is not None and s3.status() is None
    options: dict[str, str] = {}
    root: Path | str
    if s3 is not None:
        _say("starting the local S3 server (versitygw) ..." if started_s3 else "reusing the running local S3 server")
        s3_info = s3.start()
        bucket = f"deltacoord-demo-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        options = dict(s3_info.storage_options)
        root = f"s3://{bucket}/sales"
        _say(f"S3 at {s3_info.endpoint}, bucket {bucket}")
    else:
        root = table_dir or Path(tempfile.mkdtemp(prefix="deltacoord-demo-")) / "sales"

    broker = LocalBroker()
    started_broker = broker.status() is None
    _say("starting the local Kafka broker (KRaft, from Maven Central jars) ..." if started_broker else "reusing the running local broker")
    info = broker.start()
    _say(f"broker at {info.bootstrap_servers}")
    prefix = f"demo-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(prefix)  # the coordinators' group is <prefix>-coordinator, where writers look for it
    ensure_topics(AdminClient(kafka_config({"bootstrap.servers": info.bootstrap_servers})), topics)
    settings = CoordinatorSettings(info.bootstrap_servers, topics=topics, group_id=f"{prefix}-coordinator",
                                   transactional_id_prefix=f"{topics.proposals}-tx",
                                   table_roots=(str(root).rsplit("/", 1)[0],) if s3 is not None else None,
                                   storage_options=options)
    coord = Coordinator(settings, checkpoint_fn=create_checkpoint)
    thread = threading.Thread(target=coord.run, name="demo-coordinator", daemon=True)
    thread.start()
    while not coord.ready and thread.is_alive():
        time.sleep(0.05)
    _say(f"coordinator ready on {topics.proposals} -> {topics.commits}")

    conflicts: Counter[str] = Counter()
    events: list[str] = []
    try:
        table = Table(root, info.bootstrap_servers, topics=topics, storage_options=options)
        table.create(SCHEMA, partition_by=["date"], properties={Property.CHECKPOINT_INTERVAL.value: "10"})
        _say(f"created {table.uri} partitioned by date")
        table.append(pa.table({"id": [0, 1, 2], "date": DATES, "amount": [10, 20, 30]}))

        def appender(w: int) -> None:
            with Table(root, info.bootstrap_servers, topics=topics, storage_options=options) as t:
                for i in range(appends_per_writer):
                    d = DATES[(w + i) % len(DATES)]
                    t.append(pa.table({"id": [1000 * (w + 1) + i], "date": [d], "amount": [i]}))

        threads = [threading.Thread(target=appender, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        _say(f"{writers} writers are blind-appending {appends_per_writer} rows each (blind appends never conflict)")

        # An UPDATE and a DELETE read the same snapshot of partition 2024-01-01.
        snap = table.snapshot()
        upd = table.update("date = '2024-01-01'", {"amount": "amount + 100"}, snapshot=snap)
        events.append(f"UPDATE committed at version {upd.version}")
        try:
            # Deletes row 0, which the UPDATE just rewrote: the two read the same partition.
            res = table.delete("date = '2024-01-01' AND id = 0", snapshot=snap)
            events.append(f"DELETE committed at version {res.version} (no conflict)")
        except DeltaConcurrentModificationException as e:
            conflicts[type(e).__name__] += 1
            events.append(f"DELETE lost to the UPDATE: {type(e).__name__} (winning version {e.winning_version})")
            _say(f"conflict: {e}")
            res = table.delete("date = '2024-01-01' AND id = 0")
            events.append(f"DELETE retried on a fresh snapshot, committed at version {res.version}")

        # OPTIMIZE and a DELETE on another partition, from one snapshot: the DELETE rewrites a file OPTIMIZE compacts.
        for t in threads:
            t.join()
        snap = table.snapshot()
        dele = table.delete("date = '2024-01-02' AND amount = 3", snapshot=snap)
        events.append(f"DELETE on 2024-01-02 committed at version {dele.version}")
        try:
            opt = table.optimize(snapshot=snap)
            events.append(f"OPTIMIZE committed at version {opt.version}")
        except DeltaConcurrentModificationException as e:
            conflicts[type(e).__name__] += 1
            events.append(f"OPTIMIZE lost to the DELETE: {type(e).__name__} (winning version {e.winning_version})")
            _say(f"conflict: {e}")
            opt = table.optimize()
            events.append(f"OPTIMIZE retried, committed at version {opt.version}")
        assert coord.publisher.wait_idle(60)

        history = table.history()
        _say("history (newest first):")
        for h in history:
            print(f"  v{h['version']:<4} {h.get('operation', '?'):<14} isolation={h.get('isolationLevel', '-'):<18} "
                  f"blind={h.get('isBlindAppend', '-')}", flush=True)
        for line in events:
            _say(line)

        latest = Snapshot.load(table.uri, storage_options=options).version
        _say(f"verifying all {latest + 1} versions with delta-rs {deltalake_version} ...")
        for v in range(latest + 1):
            ours = Snapshot.load(table.uri, version=v, storage_options=options).to_pyarrow().sort_by("id")
            theirs = DeltaTable(str(root), version=v, storage_options=options or None).to_pyarrow_table()
            theirs = theirs.select(ours.column_names).sort_by("id")
            if not ours.cast(theirs.schema).equals(theirs):
                raise AssertionError(f"version {v}: delta-rs and deltacoord disagree")
        table.close()
        commits = sum(1 for h in history)
        return {
            "table": table.uri,
            "versions": latest + 1,
            "commits": commits,
            "conflicts": dict(conflicts),
            "verified_with": f"deltalake {deltalake_version}",
            **({"storage": storage} if storage != "local" else {}),
        }
    finally:
        coord.stop_event.set()
        thread.join(60)
        if started_broker and not keep_broker:
            broker.stop()
            _say("broker stopped")
        if s3 is not None and started_s3:
            s3.stop()
            _say("S3 server stopped")


def main(keep_table: bool = True, storage: str = "local") -> None:
    summary = run_demo(storage=storage)
    if not keep_table and storage == "local":
        shutil.rmtree(Path(summary["table"].removeprefix("file://")).parent, ignore_errors=True)
    print(json.dumps(summary), flush=True)
