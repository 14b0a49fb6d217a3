"""`deltacoord demo`: the product in two minutes, end to end on a real broker.

`--storage s3` puts the table in a fresh bucket of the local S3 server
(versitygw, started if needed): the same writers, coordinator and delta-rs
check, with storage options instead of a directory.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka.admin import AdminClient

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.topics import ensure_topics
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.errors import DeltaConcurrentModificationException
from deltacoord.schemas.kafka_logs import kafka_config
from deltacoord.schemas.properties import Property
from deltacoord.schemas.routing import Topics
from deltacoord.tooling.broker import LocalBroker

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("amount", pa.int64())])
DATES = ["2024-01-01", "2024-01-02", "2024-01-03"]


STEPS = 6
INTRO = ("what this shows: several writers committing to one Delta table at once through the coordinator; two real "
         "conflicts with winner and loser; the table's history; the same load through delta-rs alone for contrast; "
         "and delta-rs reading every version the same as deltacoord")


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _step(n: int, what: str) -> None:
    print(flush=True)
    _say(f"step {n}/{STEPS}: {what}")


@dataclass
class WriterStats:
    commits: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")


@dataclass
class Appends:
    """One system's concurrent appends: per writer, and over all."""

    per_writer: list[WriterStats]
    seconds: float

    @property
    def commits(self) -> int:
        return sum(w.commits for w in self.per_writer)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.per_writer)

    @property
    def rate(self) -> float:
        return self.commits / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        xs = [x for w in self.per_writer for x in w.latencies_ms]
        return statistics.median(xs) if xs else float("nan")

    def figures(self) -> dict[str, Any]:
        return {"commits": self.commits, "failed": self.failed, "commits_per_s": round(self.rate, 1),
                "p50_ms": round(self.p50_ms, 1)}


def _writer(system: str, uri: str, w: int, k: int, bootstrap: str, prefix: str, options: dict[str, str],
            barrier: Any, out: str) -> None:
    """One writer process: `k` one-row appends through deltacoord or delta-rs alone; latencies to `out`."""
    from deltalake import write_deltalake

    from deltacoord.schemas.routing import Topics
    from deltacoord.writer.table import Table

    table = None
    if system == "deltacoord":
        table = Table(uri, bootstrap, topics=Topics.with_prefix(prefix), storage_options=options, writer_name=f"demo-{w}")
        table.snapshot()  # connected and caught up before the clock starts (delta-rs needs no set-up)
        table.client.wait_leased(30)
    lat: list[float] = []
    failed = 0
    barrier.wait()
    for i in range(k):
        data = pa.table({"id": [1000 * (w + 1) + i], "date": [DATES[(w + i) % len(DATES)]], "amount": [i]})
        t0 = time.perf_counter()
        try:
            if table is not None:
                table.append(data)
            else:
                write_deltalake(uri, data, mode="append", storage_options=options or None)
        except Exception:  # a commit that failed after the system's own retries
            failed += 1
            continue
        lat.append((time.perf_counter() - t0) * 1000)
    end = time.time()
    if table is not None:
        table.close()
    Path(out).write_text(json.dumps({"lat": lat, "failed": failed, "end": end}))


def _appends(system: str, uri: str, writers: int, k: int, bootstrap: str, prefix: str, options: dict[str, str],
             workdir: Path) -> Appends:
    """`writers` processes (each its own interpreter, as real writers are) appending `k` one-row batches each."""
    from deltacoord.tooling.bench import run_processes

    workdir.mkdir(parents=True, exist_ok=True)
    results, t0, end = run_processes(_writer, lambda w: (system, uri, w, k, bootstrap, prefix, options), writers, workdir)
    per_writer = [WriterStats(len(r["lat"]), r["failed"], r["lat"]) for r in results]
    per_writer += [WriterStats(0, k) for _ in range(writers - len(results))]  # a process that died: all its appends failed
    return Appends(per_writer, end - t0)


@dataclass
class Race:
    """Two operations from one snapshot: the first commits, the second wins too or loses with Delta's exception."""

    number: int
    read_version: int
    first: str
    first_version: int
    second: str
    second_version: int
    conflict: str | None = None
    why: str = ""

    def lines(self) -> list[str]:
        out = [f"  race {self.number}: both read version {self.read_version}",
               f"    winner  {self.first:<42} -> version {self.first_version}"]
        if self.conflict is None:
            out.append(f"    also    {self.second:<42} -> version {self.second_version} (no conflict)")
        else:
            out += [f"    loser   {self.second:<42} -> {self.conflict}: {self.why}",
                    f"    {'':<8}{'retried on a fresh snapshot':<42} -> version {self.second_version}"]
        return out


def _race(number: int, table: Any, first: str, second: str, do_first: Callable[[Any], Any], do_second: Callable[[Any], Any],
          retry: Callable[[], Any]) -> Race:
    snap = table.snapshot()
    won = do_first(snap)
    try:
        r = do_second(snap)
        return Race(number, snap.version, first, won.version, second, r.version)
    except DeltaConcurrentModificationException as e:
        why = str(e).splitlines()[0].removeprefix(f"{type(e).__name__}: ")
        again = retry()
        return Race(number, snap.version, first, won.version, second, again.version, type(e).__name__,
                    why if len(why) <= 160 else why[:157] + "...")


def _collapsed(history: list[dict[str, Any]]) -> list[str]:
    """History lines, newest first, with each run of blind appends as one line."""
    out: list[str] = []
    i = 0
    while i < len(history):
        h = history[i]
        j = i
        if h.get("isBlindAppend") is True:
            while (j + 1 < len(history) and history[j + 1].get("isBlindAppend") is True
                   and history[j + 1].get("operation") == h.get("operation")):
                j += 1
        if j > i:
            out.append(f"  v{history[j]['version']}..v{h['version']:<6} {h.get('operation', '?'):<10} x{j - i + 1} "
                       "blind appends")
        else:
            out.append(f"  v{h['version']:<12} {h.get('operation', '?'):<10} isolation={h.get('isolationLevel', '-')}")
        i = j + 1
    return out


def run_demo(table_dir: Path | None = None, writers: int = 16, appends_per_writer: int = 5, keep_broker: bool = False,
             storage: str = "local") -> dict[str, Any]:
    from deltalake import DeltaTable, write_deltalake
    from deltalake import __version__ as deltalake_version

    from deltacoord.reader.snapshot import Snapshot
    from deltacoord.tooling.storage_servers import S3Server
    from deltacoord.writer.table import Table

    _say(INTRO)
    _step(1, "start Kafka and the coordinator, create a table")
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
    work = Path(tempfile.mkdtemp(prefix="deltacoord-demo-work-"))
    try:
        table = Table(root, info.bootstrap_servers, topics=topics, storage_options=options)
        # One version per commit, as plain Delta: the history the demo prints tells each writer's commit apart
        # (coalescing, which shares a version among appends while the store lags, is `deltacoord bench`'s).
        table.create(SCHEMA, partition_by=["date"], properties={Property.CHECKPOINT_INTERVAL.value: "10",
                                                               Property.COALESCE.value: "false"})
        _say(f"created {table.uri} partitioned by date")
        table.append(pa.table({"id": [0, 1, 2], "date": DATES, "amount": [10, 20, 30]}))

        _step(2, f"{writers} writers append {appends_per_writer} rows each, at the same time, through the coordinator")
        ours = _appends("deltacoord", table.uri, writers, appends_per_writer, info.bootstrap_servers, prefix,
                        options, work / "deltacoord")
        for w, stats in enumerate(ours.per_writer):
            print(f"  writer {w}: {stats.commits} committed, {stats.failed} failed, p50 {stats.p50_ms:.0f} ms", flush=True)
        _say(f"{ours.commits} appends in {ours.seconds:.2f} s ({ours.rate:.1f} commits/s), {ours.failed} failed: "
             "blind appends never conflict, so nobody retries")

        _step(3, "two real conflicts, decided as Delta decides them (each pair read the same snapshot)")
        races = [
            _race(1, table, "UPDATE amount + 100 on date 2024-01-01", "DELETE id 0 on date 2024-01-01",
                  lambda snap: table.update("date = '2024-01-01'", {"amount": "amount + 100"}, snapshot=snap),
                  lambda snap: table.delete("date = '2024-01-01' AND id = 0", snapshot=snap),
                  lambda: table.delete("date = '2024-01-01' AND id = 0")),
            _race(2, table, "DELETE amount 3 on date 2024-01-02", "OPTIMIZE (compacts that partition's files)",
                  lambda snap: table.delete("date = '2024-01-02' AND amount = 3", snapshot=snap),
                  lambda snap: table.optimize(snapshot=snap),
                  table.optimize),
        ]
        for race in races:
            for line in race.lines():
                print(line, flush=True)
            if race.conflict:
                conflicts[race.conflict] += 1
        assert coord.publisher.wait_idle(60)

        history = table.history()
        _step(4, "the table's history (newest first; runs of blind appends collapsed)")
        for line in _collapsed(history):
            print(line, flush=True)

        _step(5, f"the same load through delta-rs alone: {writers} writers x {appends_per_writer} write_deltalake appends")
        theirs_root = f"{root}-delta-rs" if s3 is not None else Path(str(root) + "-delta-rs")
        write_deltalake(str(theirs_root), pa.table({"id": [0, 1, 2], "date": DATES, "amount": [10, 20, 30]}),
                        partition_by=["date"], storage_options=options or None)
        theirs = _appends("delta-rs", str(theirs_root), writers, appends_per_writer, info.bootstrap_servers, prefix,
                          options, work / "delta-rs")
        print(f"  {'':12}{'commits/s':>10}{'failed':>8}{'p50 ms':>8}", flush=True)
        for name, r in (("deltacoord", ours), ("delta-rs", theirs)):
            print(f"  {name:12}{r.rate:>10.1f}{r.failed:>8}{r.p50_ms:>8.0f}", flush=True)
        if theirs.failed:
            _say(f"delta-rs: {theirs.failed} of {writers * appends_per_writer} appends failed after its own retries "
                 "(optimistic concurrency: every writer races for the next version)")

        latest = Snapshot.load(table.uri, storage_options=options).version
        _step(6, f"delta-rs {deltalake_version} reads every one of the {latest + 1} versions the same as deltacoord")
        for v in range(latest + 1):
            mine = Snapshot.load(table.uri, version=v, storage_options=options).to_pyarrow().sort_by("id")
            read = DeltaTable(str(root), version=v, storage_options=options or None).to_pyarrow_table()
            read = read.select(mine.column_names).sort_by("id")
            if not mine.cast(read.schema).equals(read):
                raise AssertionError(f"version {v}: delta-rs and deltacoord disagree")
        _say("all versions agree")
        table.close()
        storage_flags = "".join(f" --storage-option {k}={v}" for k, v in options.items()
                                if k.upper() not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"))
        _say("inspect the table yourself:")
        print(f"  deltacoord table history {table.uri}{storage_flags}\n"
              f"  deltacoord table describe {table.uri}{storage_flags}\n"
              f"  python -c \"import deltalake; print(deltalake.DeltaTable('{table.uri}').to_pandas())\"", flush=True)
        return {
            "table": table.uri,
            "versions": latest + 1,
            "commits": len(history),
            "conflicts": dict(conflicts),
            "verified_with": f"deltalake {deltalake_version}",
            "appends": {"deltacoord": ours.figures(), "delta_rs": theirs.figures()},
            **({"storage": storage} if storage != "local" else {}),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
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
