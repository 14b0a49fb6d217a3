"""Multi-table transactions of 2 and 4 tables per second beside single-table commits of the same writers.

    python bench/bench_multi_table.py [--writers 4] [--commits-per-writer 40] [--rounds 3] [--bootstrap-servers HOST:PORT]

Four tables of one table group (one proposals partition, one `deltacoord coordinator run` process), coalescing
off so every commit is its own version. Three phases, each with the same number of writer processes released
together: `single` (each writer appends one row to one table per commit), `mtx2` (each transaction appends one
row to two tables) and `mtx4` (to all four). Every call returns once its versions are published. The peer,
delta-rs, runs the same writes on four tables of its own: `delta-rs` (one append per operation) and
`delta-rs x2` / `x4` (two / four appends one after the other: what a pipeline does today, not atomic). The
phases are interleaved over `--rounds` rounds, so a change of the machine's load during the run weighs on every
phase alike. Prints one JSON line per phase and round, then per phase over all rounds (operations/s, p50/p99
latency from the call to its return, the load average, and for deltacoord the mean milliseconds from sending
to each step of the slowest part: produced, consumed, ratified, put, reply) and the ratios to `single`; the
target is at least half the single-table rate.
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


def _delta_rs_writer(root: str, w: int, width: int, k: int, barrier: Any, out: str) -> None:
    """The peer: `width` delta-rs appends one after the other per operation (not atomic across tables)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    def once(i: int) -> None:
        rows = pa.table({"writer": pa.array([w], pa.int64()), "i": pa.array([i], pa.int64())})
        for j in range(width):
            write_deltalake(str(Path(root) / f"d{(w + j) % TABLES}"), rows, mode="append")

    _timed(once, w, k, barrier, out, lambda: None)


def _timed(once: Any, w: int, k: int, barrier: Any, out: str, close: Any, steps: Any = None) -> None:
    once(-1)  # warm: connections, snapshots
    barrier.wait()
    lat: list[float] = []
    step_ms: list[dict[str, float]] = []
    failed = 0
    for i in range(k):
        t0 = time.perf_counter()
        try:
            r = once(i)
        except Exception as e:  # counted, reported
            failed += 1
            print(f"writer {w}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        lat.append((time.perf_counter() - t0) * 1000)
        if steps is not None:
            step_ms.append(steps(r))
    Path(out).write_text(json.dumps({"lat": lat, "failed": failed, "steps": step_ms}))
    close()


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

    def once(i: int) -> list[Any]:
        if width == 1:
            return [tables[w % TABLES].append(row(i))]
        with deltacoord.transaction(client=client) as tx:
            for j in range(width):
                tx.table(tables[(w + j) % TABLES]).append(row(i))
        assert tx.commit_result is not None
        return list(tx.commit_result.commits.values())

    def steps(results: list[Any]) -> dict[str, float]:
        """Each step's time of the slowest part (the call waits for every part)."""
        keys = {k for r in results for k in r.timings}
        return {k: max(r.timings.get(k, 0.0) for r in results) for k in keys}

    _timed(once, w, k, barrier, out, client.close, steps)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


def run_phase(bootstrap: str, prefix: str, root: Path, width: int, writers: int, k: int,
              peer: bool = False) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers + 1)
    outs = [root / f"out-{uuid.uuid4().hex[:6]}-{i}.json" for i in range(writers)]
    procs = [ctx.Process(target=_delta_rs_writer, args=(str(root), i, width, k, barrier, str(outs[i]))) if peer
             else ctx.Process(target=_writer, args=(bootstrap, prefix, str(root), i, width, k, barrier, str(outs[i])))
             for i in range(writers)]
    for p in procs:
        p.start()
    barrier.wait(300)
    t0 = time.perf_counter()
    for p in procs:
        p.join(600)
    elapsed = time.perf_counter() - t0
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    return _row(_phase_name(width, peer), width, writers, [x for r in results for x in r["lat"]], elapsed,
                sum(r["failed"] for r in results) + writers - len(results), [s for r in results for s in r["steps"]])


def _phase_name(width: int, peer: bool) -> str:
    if peer:
        return "delta-rs" if width == 1 else f"delta-rs x{width}"
    return "single" if width == 1 else f"mtx{width}"


def _row(phase: str, width: int, writers: int, lat: list[float], elapsed: float, failed: int,
         steps: list[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "phase": phase, "tables_per_op": width, "writers": writers, "ops": len(lat), "failed": failed,
        "elapsed_s": round(elapsed, 2), "ops_per_s": round(len(lat) / elapsed, 1),
        "versions_per_s": round(len(lat) * width / elapsed, 1), "p50_ms": round(_pct(lat, 0.5), 1),
        "p99_ms": round(_pct(lat, 0.99), 1), "load_avg_1m": round(os.getloadavg()[0], 1), "lat": lat}
    if steps:
        keys = sorted({k for s in steps for k in s})
        row["steps_mean_ms"] = {k: round(sum(s.get(k, 0.0) for s in steps) / len(steps), 1) for k in keys}
    row["steps"] = steps
    return row


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("lat", "steps")}


def _overall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase over all its rounds: operations over the summed elapsed time, latencies pooled."""
    first = rows[0]
    out = _row(first["phase"], first["tables_per_op"], first["writers"], [x for r in rows for x in r["lat"]],
               sum(r["elapsed_s"] for r in rows), sum(r["failed"] for r in rows), [s for r in rows for s in r["steps"]])
    out["rounds"] = len(rows)
    out["load_avg_1m"] = [r["load_avg_1m"] for r in rows]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--commits-per-writer", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every phase, interleaved (default 3)")
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
    from deltalake import write_deltalake

    by_phase: dict[str, list[dict[str, Any]]] = {}
    try:
        schema = pa.schema([("writer", pa.int64()), ("i", pa.int64())])
        for i in range(TABLES):
            with Table(root / f"t{i}", bootstrap, topics=Topics.with_prefix(prefix), decision_timeout_s=120,
                       table_id=deltacoord.grouped_table_id(GROUP, f"t{i}")) as t:
                t.create(schema, properties={"deltacoord.coalesce": "false"})
            write_deltalake(str(root / f"d{i}"), schema.empty_table(), mode="overwrite")
        for r in range(args.rounds):
            for peer in (False, True):
                for width in (1, 2, 4):
                    name = _phase_name(width, peer)
                    print(f"[mtx] round {r + 1}/{args.rounds}: {name} x {args.writers} writers ...", file=sys.stderr,
                          flush=True)
                    row = run_phase(bootstrap, prefix, root, width, args.writers, args.commits_per_writer, peer)
                    print(json.dumps({"round": r + 1, **_public(row)}), flush=True)
                    by_phase.setdefault(name, []).append(row)
    finally:
        coord.terminate()
        coord.wait(60)
        log.close()
        if broker is not None:
            broker.stop()
    overall = {name: _overall(rows) for name, rows in by_phase.items()}
    for row in overall.values():
        print(json.dumps({"overall": True, **_public(row)}), flush=True)
    single, peer1 = overall["single"]["ops_per_s"], overall["delta-rs"]["ops_per_s"]
    print(json.dumps({"ratio_to_single": {n: round(overall[n]["ops_per_s"] / single, 2) for n in ("mtx2", "mtx4")},
                      "delta_rs_ratio_to_one_append": {n: round(overall[n]["ops_per_s"] / peer1, 2)
                                                       for n in ("delta-rs x2", "delta-rs x4")},
                      "target": ">= 0.5"}), flush=True)


if __name__ == "__main__":
    main()
