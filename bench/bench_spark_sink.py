"""Benchmark: the `deltacoord` Spark sink's commit time per micro-batch vs Delta Lake's own streaming writes.

    python bench/bench_spark_sink.py [--batches 20] [--rows 2000] [--bootstrap HOST:PORT] [--dir DIR]

Both runs stream the same JSON files (one file per micro-batch,
`maxFilesPerTrigger=1`, Trigger.AvailableNow) into a new table under the same
directory, in the same Spark session:

* deltacoord: ``writeStream.format("deltacoord")``; the sink's driver-side
  commit records, per batch, the time from proposing to the coordinator's
  decision and the whole driver commit (client set-up, snapshot, propose,
  decision). A coordinator runs in this process against the broker.
* Delta: ``foreachBatch(lambda df, id: df.write.format("delta")
  .option("txnAppId", app).option("txnVersion", id).mode("append").save(p))``;
  the time of that call is measured (it includes the Parquet write job, which
  Delta does not separate from its commit).
* Delta's own sink: ``writeStream.format("delta")`` to a plain table.

For both, Spark's `durationMs.addBatch` of each batch is printed too (the
same measure for both: write job + commit). The broker is
`KAFKA_BOOTSTRAP_SERVERS` / `--bootstrap`, else a local broker is started.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltacoord.writer.spark_sink import register
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.spark_harness import build_session


def _files(d: Path, batches: int, rows: int) -> None:
    d.mkdir(parents=True)
    for b in range(batches):
        lines = [json.dumps({"id": b * rows + i, "value": f"v{b}-{i}", "grp": f"g{i % 4}"}) for i in range(rows)]
        (d / f"part-{b:04d}.json").write_text("\n".join(lines) + "\n")


def _stats(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    s = sorted(xs)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    return f"{statistics.median(s):7.1f} / {p95:7.1f} / {statistics.fmean(s):7.1f}"


def _add_batch_ms(q: Any) -> list[float]:
    out = []
    for p in q.recentProgress:
        d = p.durationMs if hasattr(p, "durationMs") else p["durationMs"]
        rows = p.numInputRows if hasattr(p, "numInputRows") else p["numInputRows"]
        if rows and "addBatch" in d:
            out.append(float(d["addBatch"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--dir", default=None, help="working directory (default: a new temporary directory)")
    args = ap.parse_args()

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-spark-sink-"))
    base.mkdir(parents=True, exist_ok=True)
    broker = None
    bootstrap = args.bootstrap
    if not bootstrap:
        from deltacoord.tooling.broker import LocalBroker

        broker = LocalBroker(home=base / "broker")
        broker.start()
        info = broker.status()
        assert info is not None
        bootstrap = info.bootstrap_servers
    try:
        src = base / "input"
        _files(src, args.batches, args.rows)
        spark = build_session("bench-spark-sink")
        register(spark)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(args.batches * 2 + 10))
        schema = "id long, value string, grp string"
        topics = fresh_topics(bootstrap)
        prefix = topics.proposals.removesuffix(".proposals")
        metrics = base / "deltacoord-metrics.jsonl"
        with coordinator_thread(bootstrap, topics):
            t0 = time.monotonic()
            df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(src))
            q = (df.writeStream.format("deltacoord").option("path", str(base / "deltacoord-table"))
                 .option("bootstrap.servers", bootstrap).option("topic.prefix", prefix)
                 .option("checkpointLocation", str(base / "ckpt-deltacoord")).option("metricsPath", str(metrics))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            dc_wall = time.monotonic() - t0
            dc_add = _add_batch_ms(q)
        entries = [json.loads(line) for line in metrics.read_text().splitlines()]
        dc_propose = [e["propose_to_decision_ms"] for e in entries if "propose_to_decision_ms" in e]
        dc_commit = [e["commit_ms"] for e in entries if "commit_ms" in e]
        dc_setup = [e["setup_ms"] for e in entries if "setup_ms" in e]

        delta_path = str(base / "delta-table")
        delta_ms: list[float] = []

        def write_batch(batch_df: Any, batch_id: int) -> None:
            t = time.monotonic()
            (batch_df.write.format("delta").option("txnAppId", "bench-delta").option("txnVersion", batch_id)
             .mode("append").save(delta_path))
            delta_ms.append((time.monotonic() - t) * 1000)

        t0 = time.monotonic()
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(src))
        q = (df.writeStream.foreachBatch(write_batch).option("checkpointLocation", str(base / "ckpt-delta"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        delta_wall = time.monotonic() - t0
        delta_add = _add_batch_ms(q)

        sink_path = str(base / "delta-sink-table")
        t0 = time.monotonic()
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(src))
        q = (df.writeStream.format("delta").option("checkpointLocation", str(base / "ckpt-delta-sink"))
             .trigger(availableNow=True).start(sink_path))
        q.awaitTermination()
        sink_wall = time.monotonic() - t0
        sink_add = _add_batch_ms(q)
        n_sink = spark.read.format("delta").load(sink_path).count()
        n_dc = spark.read.format("deltacoord").load(str(base / "deltacoord-table")).count()
        n_delta = spark.read.format("delta").load(delta_path).count()
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()

    print(f"\n{args.batches} micro-batches of {args.rows} rows, one Spark session (local[2]), tables under {base}")
    print(f"rows written: deltacoord {n_dc}, Delta foreachBatch {n_delta}, Delta sink {n_sink}\n")
    print(f"{'ms per micro-batch (median / p95 / mean)':<44}{'deltacoord sink':>28}{'Delta foreachBatch':>28}"
          f"{'Delta format(delta)':>28}")
    print(f"{'commit: propose -> decision':<44}{_stats(dc_propose):>28}{'n/a':>28}{'n/a':>28}")
    print(f"{'driver commit (set-up + propose + decision)':<44}{_stats(dc_commit):>28}{'n/a':>28}{'n/a':>28}")
    print(f"{'foreachBatch df.write...save() (job + commit)':<44}{'n/a':>28}{_stats(delta_ms):>28}{'n/a':>28}")
    print(f"{'Spark addBatch (write job + commit)':<44}{_stats(dc_add):>28}{_stats(delta_add):>28}{_stats(sink_add):>28}")
    print(f"{'query wall time, s':<44}{dc_wall:>28.1f}{delta_wall:>28.1f}{sink_wall:>28.1f}")
    print(json.dumps({"batches": args.batches, "rows": args.rows, "deltacoord_commit_ms": dc_commit,
                      "deltacoord_setup_ms": dc_setup, "deltacoord_propose_to_decision_ms": dc_propose,
                      "deltacoord_add_batch_ms": dc_add, "delta_foreach_batch_add_batch_ms": delta_add,
                      "delta_sink_add_batch_ms": sink_add}))


if __name__ == "__main__":
    main()
