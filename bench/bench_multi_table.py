"""Multi-table transactions of 2 and 4 tables per second beside single-table commits of the same writers.

    python bench/bench_multi_table.py [--writers 4] [--commits-per-writer 40] [--bootstrap-servers HOST:PORT]

Four tables of one table group (one proposals partition, one `deltacoord coordinator run` process), coalescing
off so every commit is its own version. Three phases, each with the same writer processes released together:
`single` (each writer appends one row to one table per commit), `mtx2` (each transaction appends one row to
two tables) and `mtx4` (to all four). Every call returns once its versions are published. Prints one JSON line
per phase (operations/s, p50/p99 latency from the call to its return) and the ratios to `single`; the target
is at least half the single-table rate.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUP = "bench"
TABLES = 4


def _writer(bootstrap: str, prefix: str, root: str, w: int, width: int, k: int, barrier: Any, out: str) -> None:
    os.environ["DELTACOORD_COORDINATOR_CHECK"] = "0"  # the coordinator owns the partition statically
    import pyarrow as pa

    import deltacoord
    from deltacoord.schemas.routing import Topics
    from deltacoord.writer.client import CoordinatorClient
    from deltacoord.writer.table import Table

    topics = Topics.with_prefix(prefix)
    client = CoordinatorClient(bootstrap, topics=topics, relay="")
    tables = [Table(Path(root) / f"t{i}", table_id=deltacoord.grouped_table_id(GROUP, f"t{i}"), client=client)
              for i in range(TABLES)]

    def row(i: int) -> pa.Table:
        return pa.table({"writer": pa.array([w], pa.int64()), "i": pa.array([i], pa.int64())})

    def once(i: int) -> None:
        if width == 1:
            tables[w % TABLES].append(row(i))
            return
        with deltacoord.transaction(client=client) as tx:
            for j in range(width):
                tx.table(tables[(w + j) % TABLES]).append(row(i))

    once(-1)  # warm: connections, snapshots
    barrier.wait()
    lat: list[float] = []
    failed = 0
    for i in range(k):
        t0 = time.perf_counter()
        try:
            once(i)
        except Exception as e:  # counted, reported
            failed += 1
            print(f"writer {w}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        lat.append((time.perf_counter() - t0) * 1000)
    Path(out).write_text(json.dumps({"lat": lat, "failed": failed}))
    client.close()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


def run_phase(bootstrap: str, prefix: str, root: Path, width: int, writers: int, k: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers + 1)
    outs = [root / f"out-{uuid.uuid4().hex[:6]}-{i}.json" for i in range(writers)]
    procs = [ctx.Process(target=_writer, args=(bootstrap, prefix, str(root), i, width, k, barrier, str(outs[i])))
             for i in range(writers)]
    for p in procs:
        p.start()
    barrier.wait(300)
    t0 = time.perf_counter()
    for p in procs:
        p.join(600)
    elapsed = time.perf_counter() - t0
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    lat = [x for r in results for x in r["lat"]]
    return {"phase": "single" if width == 1 else f"mtx{width}", "tables_per_op": width, "writers": writers,
            "ops": len(lat), "failed": sum(r["failed"] for r in results) + writers - len(results),
            "ops_per_s": round(len(lat) / elapsed, 1), "versions_per_s": round(len(lat) * width / elapsed, 1),
            "p50_ms": round(_pct(lat, 0.5), 1), "p99_ms": round(_pct(lat, 0.99), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--commits-per-writer", type=int, default=40)
    ap.add_argument("--bootstrap-servers", default=None)
    args = ap.parse_args()
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient

    import deltacoord
    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.schemas.routing import Topics
    from deltacoord.tooling.broker import LocalBroker
    from deltacoord.writer.table import Table

    os.environ["DELTACOORD_COORDINATOR_CHECK"] = "0"
    root = Path(tempfile.mkdtemp(prefix="deltacoord-mtx-"))
    # Without --bootstrap-servers: a broker of the bench's own (a free port), stopped at the end.
    broker = LocalBroker(home=root / "broker") if args.bootstrap_servers is None else None
    bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
    prefix = f"mtx-{uuid.uuid4().hex[:6]}"
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), Topics.with_prefix(prefix), partitions=1)
    log = open(root / "coordinator.log", "wb")  # noqa: SIM115 - closed below
    coord = subprocess.Popen([sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers",
                              bootstrap, "--topic-prefix", prefix, "--partitions", "0", "--log-level", "WARNING"],
                             stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        schema = pa.schema([("writer", pa.int64()), ("i", pa.int64())])
        for i in range(TABLES):
            with Table(root / f"t{i}", bootstrap, topics=Topics.with_prefix(prefix), decision_timeout_s=120,
                       table_id=deltacoord.grouped_table_id(GROUP, f"t{i}")) as t:
                t.create(schema, properties={"deltacoord.coalesce": "false"})
        for width in (1, 2, 4):
            print(f"[mtx] {'single-table commits' if width == 1 else f'{width}-table transactions'} x "
                  f"{args.writers} writers ...", file=sys.stderr, flush=True)
            row = run_phase(bootstrap, prefix, root, width, args.writers, args.commits_per_writer)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        coord.terminate()
        coord.wait(60)
        log.close()
        if broker is not None:
            broker.stop()
    single = rows[0]["ops_per_s"]
    print(json.dumps({"ratio_to_single": {r["phase"]: round(r["ops_per_s"] / single, 2) for r in rows[1:]},
                      "target": ">= 0.5"}), flush=True)


if __name__ == "__main__":
    main()
