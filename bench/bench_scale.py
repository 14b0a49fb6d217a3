"""Aggregate commits/s for 1, 2 and 4 tables on separate partitions, served by 2 coordinators.

    python bench/bench_scale.py [--writers-per-table 4] [--commits-per-writer 40]

Two `deltacoord coordinator run` processes share one consumer group over a
4-partition proposals topic; tables are chosen so each sits on its own
partition. Every table gets the same number of writer processes doing one-row
blind appends. Prints one JSON line per table count, then a summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

PARTITIONS = 4


def _tables_on_distinct_partitions(root: Path, n: int) -> list[Path]:
    from deltacoord.schemas.routing import partition_for

    chosen: dict[int, Path] = {}
    i = 0
    while len(chosen) < n:
        p = (root / f"table-{i}").resolve()
        chosen.setdefault(partition_for(p.as_uri(), PARTITIONS), p)
        i += 1
    return list(chosen.values())


def run_once(bootstrap: str, n_tables: int, writers_per_table: int, k: int, workdir: Path) -> dict[str, Any]:
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.schemas.routing import Topics
    from deltacoord.tooling.bench import create_when_served, dc_writer, percentile, run_processes
    from deltacoord.writer.table import Table

    prefix = f"scale-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(prefix)
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), topics, partitions=PARTITIONS)
    logs = [open(workdir / f"coord-{prefix}-{i}.log", "wb") for i in range(2)]  # noqa: SIM115
    coords = [
        subprocess.Popen([sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
                          "--topic-prefix", prefix, "--log-level", "WARNING"], stdout=lg, stderr=subprocess.STDOUT)
        for lg in logs
    ]
    try:
        time.sleep(8)  # both members join and split the partitions
        tables = _tables_on_distinct_partitions(workdir / prefix, n_tables)
        for t in tables:
            with Table(t, bootstrap, topics=topics, decision_timeout_s=120) as tb:
                create_when_served(tb, pa.schema([("id", pa.int64()), ("writer", pa.int64()), ("value", pa.string())]), coords)
        deadline = time.monotonic() + 60
        while not all((t / "_delta_log" / f"{0:020d}.json").exists() for t in tables) and time.monotonic() < deadline:
            time.sleep(0.1)
        n = n_tables * writers_per_table
        results, elapsed = run_processes(
            dc_writer, lambda i: (bootstrap, prefix, str(tables[i % n_tables]), i, k), n, workdir
        )
    finally:
        for c in coords:
            c.terminate()
            c.wait(60)
        for lg in logs:
            lg.close()
    lat = [x for r in results for x in r["lat"]]
    return {
        "tables": n_tables, "writers": n, "commits": len(lat), "failed": sum(r["failed"] for r in results),
        "commits_per_s": round(len(lat) / elapsed, 1), "p50_ms": round(percentile(lat, 0.5), 1),
        "p99_ms": round(percentile(lat, 0.99), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers-per-table", type=int, default=4)
    ap.add_argument("--commits-per-writer", type=int, default=40)
    ap.add_argument("--bootstrap-servers", default=None)
    args = ap.parse_args()
    from deltacoord.tooling.broker import LocalBroker

    broker = LocalBroker()
    started = broker.status() is None
    bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers
    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-scale-"))
    rows = []
    try:
        for n in (1, 2, 4):
            print(f"[scale] {n} table(s) x {args.writers_per_table} writers ...", file=sys.stderr, flush=True)
            row = run_once(bootstrap, n, args.writers_per_table, args.commits_per_writer, workdir)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        if started and args.bootstrap_servers is None:
            broker.stop()
    one = rows[0]["commits_per_s"]
    print(json.dumps({"scaling": {str(r["tables"]): round(r["commits_per_s"] / one, 2) for r in rows}}), flush=True)


if __name__ == "__main__":
    main()
