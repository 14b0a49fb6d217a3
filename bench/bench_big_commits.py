"""Commits of any size: deltacoord beside delta-rs committing the same actions, in one run.

    python bench/bench_big_commits.py [--sizes 10000,100000,1000000] [--bootstrap-servers HOST:PORT] [--inline-too]

For each size N, on a table of two columns (the files need not hold rows: the adds carry stats of both
columns, about 340 bytes each, as a real writer's would):

* `append`: one commit adding N files, timed from the call to its return (deltacoord: the version is in
  `_delta_log`; delta-rs: `DeltaTable.create_write_transaction(..., mode="append")`, its transaction API);
* `overwrite`: one commit replacing those N files by one (deltacoord: `Table.overwrite`, which lists a
  `remove` for every live file; delta-rs: the same through `create_write_transaction(mode="overwrite")`),
  each timed from loading the table to its return;
* both timed on a machine doing nothing else, as delta-rs's are (the ratios are of these), on a coordinator that
  has decided one large commit before (a daemon's one-time work: imports, its first hold); that first commit
  (an append of 10,000 files to a table of its own) is timed and printed apart, as `first_large_append_s`;
* the same append and overwrite again, on another table, while 4 writers append one row at a time to a third
  table of the same partition: the large commits' times beside them, and those writers' latency during the
  large commits (p50/p99) beside their latency before (what a huge commit costs the others);
* the coordinator's peak resident memory (VmHWM of its own process, started fresh for each size);
  The large commits are decided off the deciding thread (a hold, `deltacoord.coordinator.kafka.holds`); with
  `--inline-too` each size runs again with holds off (`DELTACOORD_HOLD_MIN_ACTIONS` above the size: decided on the
  deciding thread, as before holds), and both are printed.

A local broker is started in a temporary directory unless `--bootstrap-servers` is given; the coordinator
runs as its own process, as deployed. Prints JSON lines, then a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SMALL_WRITERS = 4
#: Files of the coordinator's first large commit, timed apart from the compared ones.
FIRST_FILES = 10_000


def _stats(i: int) -> str:
    return json.dumps({"numRecords": 1, "minValues": {"id": i, "value": f"value-{i:09d}"},
                       "maxValues": {"id": i, "value": f"value-{i:09d}"}, "nullCount": {"id": 0, "value": 0}},
                      separators=(",", ":"))


def _path(tag: str, i: int) -> str:
    return f"part-{tag}-{i:09d}-c000.snappy.parquet"


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _start_coordinator(bootstrap: str, prefix: str, log: Path, hold: bool = True) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the child
    env = {**os.environ, **({} if hold else {"DELTACOORD_HOLD_MIN_ACTIONS": str(1 << 40),
                                              "DELTACOORD_HOLD_PREDICATE_CHARS": str(1 << 40)})}
    return subprocess.Popen(
        [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
         "--topic-prefix", prefix, "--log-level", "WARNING"], stdout=out, stderr=subprocess.STDOUT, env=env)


def _small_writer(bootstrap: str, prefix: str, path: str, stop: str, out: str) -> None:
    """4 threads appending one row each, in a loop, until `stop` exists; (start, ms) of each commit to `out`."""
    import threading

    import pyarrow as pa

    from deltacoord.schemas.routing import Topics
    from deltacoord.writer.table import Table

    got: list[tuple[float, float]] = []
    lock = threading.Lock()

    def body(w: int) -> None:
        with Table(path, bootstrap, topics=Topics.with_prefix(prefix), decision_timeout_s=600,
                   publish_timeout_s=600) as t:
            rows = pa.table({"id": [w], "value": ["small"]})
            while not os.path.exists(stop):
                s = time.time()
                t.append(rows)
                with lock:
                    got.append((s, (time.time() - s) * 1000))

    threads = [threading.Thread(target=body, args=(w,)) for w in range(SMALL_WRITERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    Path(out).write_text(json.dumps(got))


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def _big_pair(t: Any, n: int, schema: Any) -> tuple[float, float]:
    """An append of `n` files to the empty table `t`, then an overwrite of them all by one row: each call's seconds."""
    import pyarrow as pa

    from deltacoord.schemas.actions import AddFile

    now = int(time.time() * 1000)
    adds = [AddFile(_path("dc", i), {}, 1000 + i % 100, now, True, stats=_stats(i)) for i in range(n)]
    s = time.perf_counter()
    tx = t.begin()
    tx.add(*adds)
    tx.commit("WRITE", parameters={"mode": "Append"})
    append_s = time.perf_counter() - s
    del adds, tx
    # Built before the clock starts, as delta-rs's one new add is: `pa.table` of Python lists imports pandas, 0.3 s
    # or more once per process, which is pyarrow's cost, not the commit's.
    new_rows = pa.table({"id": [0], "value": ["new"]}, schema=schema)
    s = time.perf_counter()
    t.invalidate()
    t.overwrite(new_rows)
    return append_s, time.perf_counter() - s


def _deltacoord(bootstrap: str, prefix: str, workdir: Path, n: int, hold: bool = True) -> dict[str, Any]:
    import pyarrow as pa

    from deltacoord.schemas.routing import Topics
    from deltacoord.tooling.bench import create_when_served
    from deltacoord.writer.table import Table

    schema = pa.schema([("id", pa.int64()), ("value", pa.string())])
    coordinator = _start_coordinator(bootstrap, prefix, workdir / "coordinator.log", hold)
    tag = f"{n}-{'hold' if hold else 'inline'}"
    small_path = str(workdir / f"small-{tag}")
    stop, small_out = workdir / f"stop-{tag}", workdir / f"small-{tag}.json"
    small: Any = None
    topics = Topics.with_prefix(prefix)

    def big(name: str) -> Table:
        """A new table for the large commits, created (its `with` closes it)."""
        t = Table(str(workdir / name), bootstrap, topics=topics, decision_timeout_s=1800, publish_timeout_s=1800)
        t.create(schema)
        return t

    try:
        with Table(small_path, bootstrap, topics=topics) as t:
            create_when_served(t, schema, [coordinator])
        # The coordinator's first large commit (its one-time imports and first hold) on a table of its own,
        # reported apart; then the compared pair alone, as delta-rs runs; then again beside the small writers.
        with big(f"dc-first-{tag}") as t:
            first_s, _ = _big_pair(t, FIRST_FILES, schema)
        with big(f"dc-{tag}") as t:
            append_s, overwrite_s = _big_pair(t, n, schema)
        small = mp.get_context("spawn").Process(target=_small_writer,
                                                args=(bootstrap, prefix, small_path, str(stop), str(small_out)))
        small.start()
        with big(f"dc-busy-{tag}") as t:
            time.sleep(3)  # the small writers' latency before the large commits
            big_start = time.time()
            busy_append_s, busy_overwrite_s = _big_pair(t, n, schema)
            big_end = time.time()
        stop.touch()
        small.join(600)
        peak = _peak_rss_mb(coordinator.pid)
    finally:
        stop.touch()
        if small is not None and small.is_alive():
            small.join(60)
        coordinator.terminate()
        coordinator.wait(120)
    got = json.loads(small_out.read_text()) if small_out.exists() else []
    during = [ms for start, ms in got if start + ms / 1000 >= big_start and start <= big_end]
    before = [ms for start, ms in got if start + ms / 1000 < big_start]
    return {"append_s": round(append_s, 2), "overwrite_s": round(overwrite_s, 2),
            "first_large_append_s": round(first_s, 2), "busy_append_s": round(busy_append_s, 2), "busy_overwrite_s": round(busy_overwrite_s, 2),
            "coordinator_peak_mb": round(peak), "writer_peak_mb": round(_self_peak_mb()),
            "small_before_p50_ms": _pct(before, 0.5), "small_before_p99_ms": _pct(before, 0.99),
            "small_during_p50_ms": _pct(during, 0.5), "small_during_p99_ms": _pct(during, 0.99),
            "small_during_commits": len(during)}


def _self_peak_mb() -> float:
    return _peak_rss_mb(os.getpid())


def _delta_rs(workdir: Path, n: int) -> dict[str, Any]:
    """delta-rs in a process of its own (its memory apart from ours)."""
    code = r"""
import json, sys, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction
sys.path.insert(0, sys.argv[3])
from bench_big_commits import _path, _stats
path, n = sys.argv[1], int(sys.argv[2])
schema = pa.schema([("id", pa.int64()), ("value", pa.string())])
write_deltalake(path, pa.table({"id": pa.array([], pa.int64()), "value": pa.array([], pa.string())}))
now = int(time.time() * 1000)
adds = [AddAction(_path("rs", i), 1000 + i % 100, {}, now, True, _stats(i)) for i in range(n)]
s = time.perf_counter()
DeltaTable(path).create_write_transaction(adds, mode="append", schema=schema)
append_s = time.perf_counter() - s
del adds
s = time.perf_counter()
DeltaTable(path).create_write_transaction([AddAction(_path("rs-new", 0), 1000, {}, now, True, _stats(0))],
                                          mode="overwrite", schema=schema)
overwrite_s = time.perf_counter() - s
peak = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"append_s": round(append_s, 2), "overwrite_s": round(overwrite_s, 2), "peak_mb": round(peak)}))
"""
    done = subprocess.run([sys.executable, "-c", code, str(workdir / f"rs-{n}"), str(n), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"delta-rs run failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(bootstrap: str, sizes: list[int], workdir: Path, inline_too: bool = False) -> list[dict[str, Any]]:
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.schemas.routing import Topics

    rows = []
    for n in sizes:
        for hold in (True, False) if inline_too else (True,):
            prefix = f"big-{uuid.uuid4().hex[:6]}"
            ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), Topics.with_prefix(prefix), partitions=1)
            print(f"[big commits] {n:,} files: deltacoord{'' if hold else ' (holds off)'} ...", file=sys.stderr, flush=True)
            dc = _deltacoord(bootstrap, prefix, workdir, n, hold)
            dc["load"] = _load()
            print(f"[big commits] {n:,} files: delta-rs ...", file=sys.stderr, flush=True)
            rs = _delta_rs(workdir, n) if hold else rows[-1]["delta_rs"]
            rows.append(_row(n, hold, dc, rs))
    return rows


def _row(n: int, hold: bool, dc: dict[str, Any], rs: dict[str, Any]) -> dict[str, Any]:
    row = {"files": n, "hold": hold, "deltacoord": dc, "delta_rs": rs,
           "append_ratio": round(dc["append_s"] / max(rs["append_s"], 1e-9), 2),
           "overwrite_ratio": round(dc["overwrite_s"] / max(rs["overwrite_s"], 1e-9), 2)}
    print(json.dumps(row), flush=True)
    return row


def _table(rows: list[dict[str, Any]]) -> None:
    print(f"{'files':>10} {'decided':>8} {'append s dc/rs':>16} {'ratio':>6} {'overwrite s dc/rs':>19} {'ratio':>6} "
          f"{'coord MB':>9} {'rs MB':>6} {'beside 4 writers: append/overwrite s':>37} "
          f"{'their p50/p99 ms before':>24} {'during':>14} {'load':>15}")
    for r in rows:
        dc, rs = r["deltacoord"], r["delta_rs"]
        print(f"{r['files']:>10,} {'held' if r['hold'] else 'inline':>8} {dc['append_s']:>8}/{rs['append_s']:<7} "
              f"{r['append_ratio']:>6} "
              f"{dc['overwrite_s']:>9}/{rs['overwrite_s']:<9} {r['overwrite_ratio']:>6} {dc['coordinator_peak_mb']:>9} "
              f"{rs['peak_mb']:>6} {dc['busy_append_s']:>28}/{dc['busy_overwrite_s']:<8} "
              f"{dc['small_before_p50_ms']:>10}/{dc['small_before_p99_ms']:<13} "
              f"{dc['small_during_p50_ms']:>7}/{dc['small_during_p99_ms']:<7} {dc['load']:>15}")
    print(f"(median small-writer commits during the large ones: {statistics.median(r['deltacoord']['small_during_commits'] for r in rows)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated file counts (1000000 takes minutes)")
    ap.add_argument("--bootstrap-servers", default=None)
    ap.add_argument("--inline-too", action="store_true",
                    help="run each size again with holds off (the large commits decided on the deciding thread)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    from deltacoord.tooling.broker import LocalBroker

    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-big-"))
    broker = None if args.bootstrap_servers else LocalBroker(workdir / "broker")
    try:
        bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
        rows = run(bootstrap, sizes, workdir, args.inline_too)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    _table(rows)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
