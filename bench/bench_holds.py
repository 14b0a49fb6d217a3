"""Another table's latency during a burst of large read predicates: held (the default) beside decided on the deciding
thread (`hold_predicate_chars=0`), in one run, with delta-rs's one-row appends as the peer.

    python bench/bench_holds.py [--proposals 40] [--bootstrap-servers HOST:PORT]

Table A gets a burst of N proposals at once (one thread each), every one with four read predicates of about 16 KiB
that parse (the largest the rules accept; distinct, so no compiled predicate is reused), while 4 writers append one
row at a time to table B of the same partition (`bench_big_commits`' small writers). Printed per mode: B's p50/p99
before and during the burst, the burst's duration, A's outcomes, the load average; then delta-rs's one-row appends
(4 threads, a table of its own) measured right after, on the same machine. The coordinator runs as its own process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench_big_commits import _load, _pct, _small_writer

#: delta-rs's peer run: this long, 4 threads.
PEER_S = 5.0


def _predicates(n: int) -> list[str]:
    """Four distinct predicates of 15 to 16 KiB on the partition column, for proposal `n`."""
    out = [" OR ".join(f"(date = '2026-{i % 12 + 1:02d}-{i % 28 + 1:02d}' AND date <> 'p{n}x{k}y{i}')"
                       for i in range(330)) for k in range(4)]
    assert all(15_000 < len(p) <= 16_384 for p in out), [len(p) for p in out]
    return out


def _coordinator(bootstrap: str, prefix: str, log: Path, held: bool) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the child
    env = {**os.environ, **({} if held else {"DELTACOORD_HOLD_PREDICATE_CHARS": "0"})}
    return subprocess.Popen(
        [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
         "--topic-prefix", prefix, "--log-level", "WARNING"], stdout=out, stderr=subprocess.STDOUT, env=env)


def _deltacoord(bootstrap: str, workdir: Path, proposals: int, held: bool) -> dict[str, Any]:
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.schemas.routing import Topics
    from deltacoord.tooling.bench import create_when_served
    from deltacoord.writer import staging
    from deltacoord.writer.table import Table

    prefix = f"holds-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(prefix)
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), topics, partitions=1)  # A and B share it
    coordinator = _coordinator(bootstrap, prefix, workdir / "coordinator.log", held)
    tag = "held" if held else "inline"
    b_path, a_path = str(workdir / f"b-{tag}"), str(workdir / f"a-{tag}")
    stop, b_out = workdir / f"stop-{tag}", workdir / f"b-{tag}.json"
    small: Any = None
    outcomes: list[str] = []
    try:
        with Table(b_path, bootstrap, topics=topics) as t:
            create_when_served(t, pa.schema([("id", pa.int64()), ("value", pa.string())]), [coordinator])
        small = mp.get_context("spawn").Process(target=_small_writer, args=(bootstrap, prefix, b_path, str(stop), str(b_out)))
        small.start()
        with Table(a_path, bootstrap, topics=topics, decision_timeout_s=1800) as a:
            a.create(pa.schema([("id", pa.int64()), ("date", pa.string())]), partition_by=["date"])
            txs = []
            for n in range(proposals):
                tx = a.begin()
                for p in _predicates(n):
                    tx.read_predicate(p)
                tx.add(*staging.write_data_files(a.storage, pa.table({"id": [n], "date": ["2026-01-01"]}), ["date"]))
                txs.append(tx)
            time.sleep(3)  # B's latency before the burst

            def commit(tx: Any) -> None:
                try:
                    tx.commit("WRITE", parameters={"mode": "Append"})
                    outcomes.append("committed")
                except Exception as e:  # a conflict between the burst's own proposals
                    outcomes.append(type(e).__name__)

            threads = [threading.Thread(target=commit, args=(tx,)) for tx in txs]
            burst_start = time.time()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            burst_end = time.time()
        stop.touch()
        small.join(600)
    finally:
        stop.touch()
        if small is not None and small.is_alive():
            small.join(60)
        coordinator.terminate()
        coordinator.wait(120)
    got = json.loads(b_out.read_text()) if b_out.exists() else []
    during = [ms for start, ms in got if start + ms / 1000 >= burst_start and start <= burst_end]
    before = [ms for start, ms in got if start + ms / 1000 < burst_start]
    return {"mode": tag, "burst_s": round(burst_end - burst_start, 1),
            "outcomes": {k: outcomes.count(k) for k in sorted(set(outcomes))},
            "b_before_p50_ms": _pct(before, 0.5), "b_before_p99_ms": _pct(before, 0.99),
            "b_during_p50_ms": _pct(during, 0.5), "b_during_p99_ms": _pct(during, 0.99), "b_during_commits": len(during),
            "load": _load()}


def _delta_rs(workdir: Path) -> dict[str, Any]:
    """4 threads appending one row each to a delta-rs table for `PEER_S` seconds: the peer's p50/p99."""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(workdir / f"rs-{uuid.uuid4().hex[:6]}")
    write_deltalake(path, pa.table({"id": pa.array([], pa.int64()), "value": pa.array([], pa.string())}))
    got: list[float] = []
    lock = threading.Lock()
    until = time.monotonic() + PEER_S
    failed = 0

    def body(w: int) -> None:
        nonlocal failed
        rows = pa.table({"id": [w], "value": ["small"]})
        while time.monotonic() < until:
            s = time.perf_counter()
            try:
                write_deltalake(path, rows, mode="append")
            except Exception:  # a lost race for the next version: delta-rs's own conflict
                with lock:
                    failed += 1
                continue
            with lock:
                got.append((time.perf_counter() - s) * 1000)

    threads = [threading.Thread(target=body, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"p50_ms": _pct(got, 0.5), "p99_ms": _pct(got, 0.99), "commits": len(got), "failed": failed, "load": _load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--proposals", type=int, default=40, help="proposals in A's burst")
    ap.add_argument("--bootstrap-servers", default=None)
    args = ap.parse_args()
    from deltacoord.tooling.broker import LocalBroker

    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-holds-"))
    broker = None if args.bootstrap_servers else LocalBroker(workdir / "broker")
    rows = []
    try:
        bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
        for held in (True, False):
            print(f"[holds] {args.proposals} proposals with 4 x 16 KiB predicates, {'held' if held else 'inline'} ...",
                  file=sys.stderr, flush=True)
            row = _deltacoord(bootstrap, workdir, args.proposals, held)
            row["delta_rs"] = _delta_rs(workdir)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'mode':>7} {'B p50/p99 ms before':>20} {'during':>16} {'B commits during':>17} {'burst s':>8} "
          f"{'load':>15} {'delta-rs p50/p99 ms':>20} {'load':>15}")
    for r in rows:
        rs = r["delta_rs"]
        print(f"{r['mode']:>7} {r['b_before_p50_ms']:>10}/{r['b_before_p99_ms']:<9} {r['b_during_p50_ms']:>8}/"
              f"{r['b_during_p99_ms']:<7} {r['b_during_commits']:>17} {r['burst_s']:>8} {r['load']:>15} "
              f"{rs['p50_ms']:>10}/{rs['p99_ms']:<9} {rs['load']:>15}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
