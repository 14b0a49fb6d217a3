"""`deltacoord bench`: N writer processes doing one-row blind appends, deltacoord vs delta-rs.

Both systems run in the same invocation on the same disk. For deltacoord the
latency is propose -> decision (the Kafka round trip and the decision; staging
the Parquet file is excluded and reported separately). For delta-rs it is the
`write_deltalake` call, which includes writing its file and its own retries.

With `storage="s3"` both tables live in one bucket of the local S3 server
(versitygw, which enforces `If-None-Match`), delta-rs commits with its S3
conditional-put mode (`aws_conditional_put=etag`), and both latencies run from
the write call (staging the data file included) to the version's visibility in
`_delta_log`. delta-rs's call returns once its own conditional PUT of `<v>.json`
succeeded, so its call is that latency. deltacoord's call returns at the decision
(durable in Kafka) and the coordinator publishes `<v>.json` after it: one
watcher in the bench process lists `_delta_log` (from the last version it saw)
every few milliseconds and notes in shared memory when each version appears;
each writer waits for its version there before its next write, as a delta-rs
writer waits for its call, so both run closed loops from write call to visibility.
Every writer process of both systems makes one untimed warm-up commit before
the start barrier, so the figures are steady state, not process start-up.
Before the timed deltacoord phase an untimed one of the same shape warms the
Kafka broker: a freshly started JVM compiles its hot paths during its first
few thousand transactions, and a long-running broker (the deployment this
measures) has done so long ago. delta-rs has no service to warm.
Each phase also reports the CPU a commit costs (`cpu_ms_per_commit`): the writer
processes' own (`time.process_time` from the barrier to their last commit, every
thread), and for deltacoord the coordinator's process tree and the broker's
(`deltacoord.tooling.cpu_usage`, when the broker runs on this machine); with
every core busy, commits/s cannot pass cores * 1000 / that total.
The memory part writes a table of 1,000,000 live files, then, in a fresh
process with the daemon's imports, holds its `TableState` and has the daemon's
checkpoint process checkpoint it; it reports the deciding process's resident
memory, the checkpoint process's peak, and their sum.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from deltacoord.schemas.kafka_logs import kafka_config
from deltacoord.tooling.cpu_usage import ServiceCpu, broker_pid
from deltacoord.tooling.latency_proxy import LatencyProxy

SCHEMA_FIELDS = [("id", "int64"), ("writer", "int64"), ("value", "string")]
#: statistics.interval.ms of the deltacoord writers' Kafka clients (their reply consumers' received bytes).
STATS_MS = 1000


def create_when_served(table: Any, schema: Any, coordinators: Sequence[subprocess.Popen[bytes]],
                       timeout_s: float = 120.0, **create: Any) -> None:
    """`table.create(schema, **create)` once a coordinator the bench just started serves the table's partition:
    until it joined its group the writer's check says NoCoordinatorError (nothing proposed), asked again here
    while the processes live."""
    from deltacoord.schemas.errors import NoCoordinatorError

    started = time.monotonic()
    while True:
        try:
            table.create(schema, **create)
            return
        except NoCoordinatorError:
            if time.monotonic() - started > timeout_s or all(c.poll() is not None for c in coordinators):
                raise


def _spread(location: str, tables: int) -> tuple[list[str], str]:
    """The tables a run's writers are dealt over (`<location>-<i>` when more than one), and how to name them."""
    if tables == 1:
        return [location], location
    return [f"{location}-{i}" for i in range(tables)], f"{tables} tables {location}-<i>"


def _say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]


#: A summary's private key holding every timed commit's latency (ms), drawn by the chart and not printed.
SAMPLES = "_latencies_ms"


def _summary(writers: int, results: list[dict[str, Any]], k: int, elapsed: float) -> dict[str, Any]:
    """The issue's keys, plus the untimed first commit of each process (cold start, whole call)."""
    latencies = [x for r in results for x in r["lat"]]
    failed = sum(r["failed"] for r in results) + (writers - len(results)) * k
    commits = len(latencies)
    out: dict[str, Any] = {
        "writers": writers, "commits": commits, "failed": failed,
        "commits_per_s": round(commits / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": round(percentile(latencies, 0.5), 2), "p99_ms": round(percentile(latencies, 0.99), 2),
        "first_commit_p50_ms": round(percentile([x for r in results for x in r.get("warm", [])], 0.5), 2),
    }
    for name in ("decided", "visible"):  # deltacoord's propose -> decision and propose -> publication
        xs = [x for r in results for x in r.get(name, [])]
        if xs:
            out[f"{name}_p50_ms"] = round(percentile(xs, 0.5), 2)
            out[f"{name}_p99_ms"] = round(percentile(xs, 0.99), 2)
    steps = [s for r in results for s in r.get("steps", [])]
    if steps:  # where a commit's time goes: p50 of each step's time since proposing (CommitResult.timings)
        names = sorted({k for s in steps for k in s}, key=lambda k: percentile([s[k] for s in steps if k in s], 0.5))
        out["steps_p50_ms"] = {k: round(percentile([s[k] for s in steps if k in s], 0.5), 2) for k in names}
    if commits and all("cpu_s" in r for r in results):
        out["cpu_ms_per_commit"] = {"writers": round(sum(r["cpu_s"] for r in results) * 1000 / commits, 2)}
    out[SAMPLES] = latencies  # for the chart; `run` takes it out of the printed figures
    if any("rx_bytes" in r for r in results) and commits:
        out["fetch_bytes_per_commit"] = round(sum(r.get("rx_bytes", 0) for r in results) / commits, 1)
        out["foreign_records"] = sum(r.get("foreign", 0) for r in results)
    return out


# -- deltacoord writers ---------------------------------------------------------------
def dc_writer(bootstrap: str, prefix: str, table: str, w: int, k: int, storage_options: dict[str, str],
               relay: str, barrier: Any, out: str) -> None:
    import pyarrow as pa

    from deltacoord.schemas.errors import DeltaCoordError
    from deltacoord.schemas.routing import Topics
    from deltacoord.writer import staging
    from deltacoord.writer.table import Table

    # Client statistics every STATS_MS: the reply consumers' received bytes (`rxbytes`) give the fetch bytes.
    stats: dict[str, Any] = {"statistics.interval.ms": STATS_MS}
    t = Table(table, bootstrap, topics=Topics.with_prefix(prefix), writer_name=f"bench-{w}", storage_options=storage_options,
              relay=relay, **stats)
    t.client.wait_leased(60)  # a reply partition of its own (else it shares one, and says so in foreign_records)
    snap = t.snapshot()

    def staged(row_id: int, value: str) -> Any:
        tx = t.begin(snap)
        tx.stage(staging.write_data_files(t.storage, pa.table({"id": [row_id], "writer": [w], "value": [value]})))
        return tx

    # One untimed warm-up commit (as the delta-rs side does): connections, the reply consumer,
    # fastavro's compiled schemas and pyarrow's Parquet writer are then ready, so the timed
    # commits measure the steady state, not process start-up.
    s0 = time.perf_counter()
    staged(-1, "warm-up").commit("WRITE", parameters={"mode": "Append"})
    warm = [(time.perf_counter() - s0) * 1000]
    lat: list[float] = []
    decided: list[float] = []
    visible: list[float] = []
    stage: list[float] = []
    steps: list[dict[str, float]] = []
    failed = 0
    time.sleep(2 * STATS_MS / 1000)  # a statistics report after the warm-up: the baseline of the bytes
    counts = t.client.reply_counts
    rx0, foreign0 = counts.rx_bytes, counts.foreign
    barrier.wait()
    cpu0 = time.process_time()  # every thread of this process: Python's and the Kafka clients'
    for i in range(k):
        s0 = time.perf_counter()
        tx = staged(i, f"{w}-{i}")
        s1 = time.perf_counter()
        try:
            r = tx.commit("WRITE", parameters={"mode": "Append"})  # returns once published in _delta_log
            lat.append((time.perf_counter() - s0) * 1000)
            decided.append(r.timings["decided_ms"])
            visible.append(r.timings["published_ms"])
            steps.append(dict(r.timings))
        except DeltaCoordError:
            failed += 1
        stage.append((s1 - s0) * 1000)
    end = time.time()
    cpu_s = time.process_time() - cpu0
    time.sleep(2 * STATS_MS / 1000)  # the last statistics report covers the timed commits
    counts = t.client.reply_counts
    t.close()
    Path(out).write_text(json.dumps({"lat": lat, "decided": decided, "visible": visible, "failed": failed, "stage": stage,
                                     "warm": warm, "end": end, "cpu_s": cpu_s, "rx_bytes": counts.rx_bytes - rx0,
                                     "foreign": counts.foreign - foreign0, "steps": steps}))


def _rs_writer(table: str, w: int, k: int, storage_options: dict[str, str], barrier: Any, out: str) -> None:
    """delta-rs's writer: its call returns when its commit is visible (its own conditional PUT of `<v>.json`)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    opts = storage_options or None
    # Untimed warm-up, as on the deltacoord side; its own retries may run out under contention.
    s0 = time.perf_counter()
    warm: list[float] = []
    with contextlib.suppress(Exception):
        write_deltalake(table, pa.table({"id": [-1], "writer": [w], "value": ["warm-up"]}), mode="append",
                        storage_options=opts)
        warm.append((time.perf_counter() - s0) * 1000)
    lat: list[float] = []
    failed = 0
    barrier.wait()
    cpu0 = time.process_time()  # every thread of this process: delta-rs's runtime included
    for i in range(k):
        s0 = time.perf_counter()
        try:
            write_deltalake(table, pa.table({"id": [i], "writer": [w], "value": [f"{w}-{i}"]}), mode="append",
                            storage_options=opts)
            lat.append((time.perf_counter() - s0) * 1000)
        except Exception:
            failed += 1
    end = time.time()
    Path(out).write_text(json.dumps({"lat": lat, "failed": failed, "warm": warm, "end": end,
                                     "cpu_s": time.process_time() - cpu0}))


def run_processes(target: Any, args_for: Any, n: int, workdir: Path, services: ServiceCpu | None = None,
                   on_release: Callable[[], None] | None = None) -> tuple[list[dict[str, Any]], float, float]:
    """Run `n` writer processes released together; their results, and when the timed phase began and ended
    (`services`: their CPU is read as the writers are released and once every writer has ended; `on_release`
    runs as they are released)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    outs = [workdir / f"out-{uuid.uuid4().hex[:6]}-{i}.json" for i in range(n)]
    procs = [ctx.Process(target=target, args=(*args_for(i), barrier, str(outs[i]))) for i in range(n)]
    for p in procs:
        p.start()
    # Start each timed phase with no dirty pages left by the previous one (the other system's
    # files and logs): their writeback would otherwise land inside this phase.
    os.sync()
    barrier.wait(timeout=300)
    t0 = time.time()
    if services is not None:
        services.start()
    if on_release is not None:
        on_release()
    for p in procs:
        p.join()
    if services is not None:
        services.stop()
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    end = max((r["end"] for r in results), default=time.time())
    return results, t0, end


def bench_deltacoord(bootstrap: str, writers: int, k: int, workdir: Path, *, quiet: bool = False,
                     table: str | None = None, storage_options: dict[str, str] | None = None,
                     table_roots: str | None = None, relay: bool = False, tables: int = 1) -> dict[str, Any]:
    """deltacoord's phase: a coordinator process and `writers` writer processes on `table`
    (default: a directory in `workdir`; an object-store URI with its storage options). With `relay`, the
    writers go through one relay process (`deltacoord relay run`), as the writer processes of one host would.
    With `tables` above 1 the writers are dealt round-robin over that many tables (`<table>-<i>`) of one
    coordinator."""
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import DEFAULT_REPLY_PARTITIONS, ensure_topics
    from deltacoord.schemas.routing import Topics
    from deltacoord.writer.relay import relay_counts
    from deltacoord.writer.table import Table

    workdir.mkdir(parents=True, exist_ok=True)
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(prefix)
    admin = AdminClient(kafka_config({"bootstrap.servers": bootstrap}))
    ensure_topics(admin, topics, reply_partitions=max(DEFAULT_REPLY_PARTITIONS, 2 * writers))
    options = dict(storage_options or {})
    # Credentials go to the coordinator through its environment (the cloud's chain), not its command line.
    secret = {k: v for k, v in options.items() if k.upper() in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    storage_args = [a for key, value in options.items() if key not in secret for a in ("--storage-option", f"{key}={value}")]
    roots_args = ["--table-roots", table_roots] if table_roots else []
    log = open(workdir / "coordinator.log", "wb")  # noqa: SIM115 - lives as long as the child
    coord = subprocess.Popen(
        [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
         "--topic-prefix", prefix, "--log-level", "WARNING", *roots_args, *storage_args],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **{k.upper(): v for k, v in secret.items()}},
    )
    location = table or str(workdir / "deltacoord-table")
    locations, on = _spread(location, tables)
    relay_proc: subprocess.Popen[bytes] | None = None
    sock = ""
    try:
        if relay:
            # A short path: a Unix socket's path is limited to about 100 bytes.
            sock = os.path.join(tempfile.gettempdir(), f"deltacoord-bench-relay-{uuid.uuid4().hex[:8]}.sock")
            relay_proc = subprocess.Popen(
                [sys.executable, "-m", "deltacoord.cli.main", "relay", "run", "--socket", sock, "--bootstrap-servers",
                 bootstrap, "--topic-prefix", prefix, "--log-level", "WARNING", "--kafka", f"statistics.interval.ms={STATS_MS}"],
                stdout=log, stderr=subprocess.STDOUT)
            started = time.monotonic()
            while not os.path.exists(sock):
                if relay_proc.poll() is not None or time.monotonic() - started > 60:
                    raise RuntimeError(f"the bench's relay did not start (see {workdir / 'coordinator.log'})")
                time.sleep(0.05)
        for where in locations:
            with Table(where, bootstrap, topics=topics, storage_options=options, relay=sock) as t:
                create_when_served(t, pa.schema([(n, getattr(pa, ty)()) for n, ty in SCHEMA_FIELDS]), [coord])
        if not quiet:
            _say(f"deltacoord: {writers} writers x {k} blind appends on {on} ...")
        pids = {"coordinator": coord.pid, "broker": broker_pid(bootstrap)}
        if relay_proc is not None:
            pids["relay"] = relay_proc.pid
        services = ServiceCpu(pids)
        before: dict[str, int] = {}
        results, t0, end = run_processes(dc_writer, lambda i: (bootstrap, prefix, locations[i % tables], i, k, options, sock),
                                          writers, workdir, services,
                                          (lambda: before.update(relay_counts(sock, topics))) if relay else None)
        elapsed = end - t0
        relayed: dict[str, int] = {}
        if relay:
            time.sleep(2 * STATS_MS / 1000)  # the relay's last statistics report covers the timed commits
            after = relay_counts(sock, topics)
            relayed = {key: after[key] - before.get(key, 0) for key in ("rx_bytes", "foreign", "proposals", "batches")}
    finally:
        if relay_proc is not None:
            relay_proc.terminate()
            relay_proc.wait(60)
        coord.terminate()
        coord.wait(60)
        log.close()
        # Leave the broker as found: bench topics piling up on a long-lived local broker slow it down.
        for f in admin.delete_topics(
                [topics.proposals, topics.commits, topics.dead_letters, topics.replies], operation_timeout=30).values():
            with contextlib.suppress(Exception):
                f.result(60)
    out = _summary(writers, results, k, elapsed)
    if relay and out["commits"]:  # the relay fetched every writer's replies
        out["relay"] = True
        out["fetch_bytes_per_commit"] = round(relayed["rx_bytes"] / out["commits"], 1)
        out["foreign_records"] = relayed["foreign"]
        # How many writers' proposals the relay gathered into one batch of Produce calls.
        out["relay_proposals_per_batch"] = round(relayed["proposals"] / max(1, relayed["batches"]), 2)
    out["stage_p50_ms"] = round(percentile([x for r in results for x in r["stage"]], 0.5), 2)
    if "cpu_ms_per_commit" in out:  # the coordinator (with its checkpoint process) and the broker, when local
        cpu = out["cpu_ms_per_commit"]
        for name, used in services.used.items():
            cpu[name] = None if used is None else round(used * 1000 / out["commits"], 2)
        cpu["total"] = round(sum(v for v in cpu.values() if v is not None), 2)
    return out


def bench_delta_rs(writers: int, k: int, workdir: Path, *, table: str | None = None,
                   storage_options: dict[str, str] | None = None, tables: int = 1) -> dict[str, Any]:
    import pyarrow as pa
    from deltalake import write_deltalake

    locations, on = _spread(table or str(workdir / "delta-rs-table"), tables)
    options = dict(storage_options or {})
    for where in locations:
        write_deltalake(where, pa.table({n: pa.array([], getattr(pa, ty)()) for n, ty in SCHEMA_FIELDS}), mode="overwrite",
                        storage_options=options or None)
    _say(f"delta-rs: {writers} processes x {k} write_deltalake appends on {on} ...")
    results, t0, end = run_processes(_rs_writer, lambda i: (locations[i % tables], i, k, options), writers, workdir)
    return _summary(writers, results, k, end - t0)


# -- memory --------------------------------------------------------------------------
_MEMORY_COMMITS = 100  # the table is built by 100 commits; a checkpoint every 10


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


def _peak_rss_mb_of(pid: int) -> float:
    """VmHWM: the process's peak resident set so far."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def memory_table(files: int, workdir: Path | str) -> dict[str, Any]:
    """Write a table of `files` live files: 100 commits of files/100 adds, checkpoints at 10, 20, ..., 90."""
    from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
    from deltacoord.coordinator.delta_log.files import put_if_absent
    from deltacoord.reader.log import commit_path
    from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol, commit_to_json_lines
    from deltacoord.schemas.properties import Property

    root = Path(workdir) / "memory-table"
    md = Metadata(id="bench", schema_string='{"type":"struct","fields":[{"name":"d","type":"string","nullable":true,"metadata":{}}]}',
                  partition_columns=("d",), configuration={Property.CHECKPOINT_INTERVAL.value: "10"})
    put_if_absent(commit_path(root, 0), commit_to_json_lines([CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2), md]),
                  fsync=False)
    per = max(1, files // _MEMORY_COMMITS)
    for v in range(1, _MEMORY_COMMITS + 1):
        adds = [AddFile(f"d={i % 100}/part-{v:05d}-{i:07d}-{uuid.uuid4()}.c000.snappy.parquet", {"d": str(i % 100)}, 1000,
                        1_700_000_000_000, True, stats='{"numRecords":1}') for i in range(per)]
        put_if_absent(commit_path(root, v), commit_to_json_lines([CommitInfo({"operation": "WRITE"}), *adds]), fsync=False)
        if v % 10 == 0 and v < _MEMORY_COMMITS:
            create_checkpoint(str(root), v)
            _say(f"  table: version {v}, {v * per:,} files")
    return {"table": str(root), "version": _MEMORY_COMMITS, "live_files": per * _MEMORY_COMMITS}


def memory_coordinator(table: str, version: int) -> dict[str, Any]:
    """Resident memory of a coordinator holding `table` (deciding process) and its checkpoint process's peak.

    This process imports what the daemon imports and builds the table's
    `TableState` from its commits; then the daemon's `CheckpointWorker` (a
    spawned process) checkpoints the last version, which the previous
    checkpoint plus 10 commits make up. Both processes exist at once in a
    running coordinator, so their sum is the coordinator's footprint.
    """
    import deltacoord.coordinator.kafka.daemon  # noqa: F401  (the deciding process's imports)
    from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker
    from deltacoord.coordinator.rules.state import TableState
    from deltacoord.reader.log import commit_file_name, log_dir, read_commit

    ld = log_dir(Path(table))
    st = TableState.empty("bench", table)
    for v in range(version + 1):
        st.apply(v, read_commit(ld / commit_file_name(v)))
    deciding = _rss_mb()
    worker = CheckpointWorker()
    try:
        pid = worker.start()
        idle = _peak_rss_mb_of(pid)
        t0 = time.perf_counter()
        worker(table, version)
        took = time.perf_counter() - t0
        peak = _peak_rss_mb_of(pid)
    finally:
        worker.close()
    return {"live_files": st.live_file_count, "deciding_rss_mb": round(deciding, 1), "checkpoint_process_idle_mb": round(idle, 1),
            "checkpoint_process_peak_mb": round(peak, 1), "coordinator_peak_mb": round(deciding + peak, 1),
            "checkpoint_s": round(took, 2)}


def _in_subprocess(fn: str, *args: Any) -> dict[str, Any]:
    code = f"import json,sys; from deltacoord.tooling.bench import {fn}; print(json.dumps({fn}(*json.loads(sys.argv[1]))))"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([str(a) if isinstance(a, Path) else a for a in args])],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{fn} failed:\n{proc.stderr[-3000:]}")
    sys.stderr.write(proc.stderr)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _compare(dc: dict[str, Any], rs: dict[str, Any]) -> dict[str, Any]:
    """The issue's ratios of one writer count: commits/s, and write call to visible (p50, p99)."""
    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b else float("inf")
    out = {"commits_per_s_ratio": ratio(dc["commits_per_s"], rs["commits_per_s"]),
           "p50_fraction_of_delta_rs": ratio(dc["p50_ms"], rs["p50_ms"]),
           "p99_fraction_of_delta_rs": ratio(dc["p99_ms"], rs["p99_ms"])}
    dc_cpu, rs_cpu = dc.get("cpu_ms_per_commit", {}).get("total"), rs.get("cpu_ms_per_commit", {}).get("writers")
    if dc_cpu and rs_cpu:
        # Every process's CPU per commit: with all cores busy, commits/s cannot pass cores * 1000 / this.
        out["cpu_per_commit_fraction_of_delta_rs"] = ratio(dc_cpu, rs_cpu)
        out["cpu_ceiling_commits_per_s"] = round((os.cpu_count() or 1) * 1000 / dc_cpu, 1)
    return out


def _chart(runs: list[dict[str, Any]], samples: list[tuple[list[float], list[float]]], path: Path) -> None:
    from deltacoord.tooling.bench_chart import ChartRun, SystemRun, write_chart

    def system(name: str, summary: dict[str, Any], latencies: list[float]) -> SystemRun:
        return SystemRun(name, summary["commits_per_s"], summary["failed"], latencies)

    write_chart([ChartRun(r["deltacoord"]["writers"], (system("deltacoord", r["deltacoord"], dc),
                                                       system("delta-rs", r["delta_rs"], rs)))
                 for r, (dc, rs) in zip(runs, samples, strict=True)], path)


def run(writers: int | list[int], commits_per_writer: int | list[int], memory_files: int, bootstrap: str | None,
        warmup_commits_per_writer: int = 150, *, storage: str = "local", chart: Path | str | None = None,
        relay: bool = False, tables: int = 1, s3_latency_ms: float = 0.0) -> dict[str, Any]:
    """One run per writer count (each: deltacoord, then delta-rs on the same storage), then the memory figures.

    `tables`: the writers of each run are dealt over that many tables (one coordinator). `s3_latency_ms`: both
    systems reach the local S3 server through a proxy adding that round trip to every request (`latency_proxy`).

    With one writer count the result is {"deltacoord", "delta_rs", ...}; with several, {"runs": [...], ...}.
    `chart`: also draw commits/s and latency distributions of both systems there (SVG or PNG by suffix).
    """
    from deltacoord.tooling.broker import LocalBroker
    from deltacoord.tooling.storage_servers import S3Server

    if storage not in ("local", "s3"):
        raise ValueError(f"storage must be 'local' or 's3', not {storage!r}")
    if s3_latency_ms and storage != "s3":
        raise ValueError("s3_latency_ms needs storage='s3'")
    if tables < 1:
        raise ValueError(f"tables must be 1 or more, got {tables}")
    counts = [writers] if isinstance(writers, int) else list(writers)
    ks = [commits_per_writer] * len(counts) if isinstance(commits_per_writer, int) else list(commits_per_writer)
    if len(ks) == 1:
        ks = ks * len(counts)
    if not counts or len(ks) != len(counts) or min(counts) < 1 or min(ks) < 1:
        raise ValueError(f"writers {counts} and commits per writer {ks}: give positive numbers, one commit count or one "
                         "per writer count")
    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-bench-"))
    broker = LocalBroker()
    started = False
    s3 = S3Server() if storage == "s3" else None
    started_s3 = s3 is not None and s3.status() is None
    proxy: LatencyProxy | None = None
    if bootstrap is None:
        started = broker.status() is None
        _say("starting the local broker ..." if started else "reusing the running local broker")
        bootstrap = broker.start().bootstrap_servers
    try:
        options: dict[str, str] = {}
        roots: str | None = None
        bucket = ""
        if s3 is not None:
            _say("starting the local S3 server (versitygw) ..." if started_s3 else "reusing the running local S3 server")
            info = s3.start()
            bucket = f"bench-{uuid.uuid4().hex[:10]}"
            s3.create_bucket(bucket)
            options = dict(info.storage_options)
            if s3_latency_ms > 0:
                where = urlsplit(options["AWS_ENDPOINT_URL"])
                proxy = LatencyProxy((where.hostname or "127.0.0.1", int(where.port or 80)), s3_latency_ms).start()
                options["AWS_ENDPOINT_URL"] = proxy.endpoint
                _say(f"S3 requests of both systems go through {proxy.endpoint}, adding {s3_latency_ms:g} ms to each")
            roots = f"s3://{bucket}"
            _say(f"tables in s3://{bucket} on {info.endpoint} (delta-rs: aws_conditional_put={options.get('aws_conditional_put')})")

        def table(name: str) -> str | None:
            return f"s3://{bucket}/{name}" if s3 is not None else None

        if warmup_commits_per_writer > 0:
            n = min(16, max(counts))
            _say(f"warming the broker (untimed): {n} writers x {warmup_commits_per_writer} appends ...")
            warm = bench_deltacoord(bootstrap, n, warmup_commits_per_writer, workdir / "warm-up", quiet=True,
                                    table=table("warm"), storage_options=options, table_roots=roots, relay=relay,
                                    tables=tables)
            _say(f"warm-up done: {warm['commits_per_s']} commits/s, p99 {warm['p99_ms']} ms (not reported)")
        runs: list[dict[str, Any]] = []
        samples: list[tuple[list[float], list[float]]] = []
        for n, k in zip(counts, ks, strict=True):
            dc = bench_deltacoord(bootstrap, n, k, workdir / f"dc-{n}", table=table(f"dc-{n}"), storage_options=options,
                                  table_roots=roots, relay=relay, tables=tables)
            dc_lat = dc.pop(SAMPLES)
            _say(f"deltacoord: {json.dumps(dc)}")
            (workdir / f"rs-{n}").mkdir(parents=True, exist_ok=True)
            rs = bench_delta_rs(n, k, workdir / f"rs-{n}", table=table(f"rs-{n}"), storage_options=options, tables=tables)
            samples.append((dc_lat, rs.pop(SAMPLES)))
            _say(f"delta-rs:   {json.dumps(rs)}")
            cmp = _compare(dc, rs)
            _say(f"{n} writers: {json.dumps(cmp)}")
            runs.append({"deltacoord": dc, "delta_rs": rs, **cmp})
        result: dict[str, Any] = runs[0] if len(runs) == 1 else {"runs": runs}
        result["latency"] = ("write call (staging the Parquet file included) until the version is in _delta_log, for both; "
                             "deltacoord's decided/visible figures run from proposing")
        if s3 is not None:
            result["storage"] = "s3"
            result["s3_latency_ms"] = s3_latency_ms
            result["ratio"] = runs[-1]["commits_per_s_ratio"]
        result["tables"] = tables
        if memory_files > 0 and s3 is None:
            _say(f"memory: writing a table of {memory_files:,} live files ...")
            made = _in_subprocess("memory_table", memory_files, workdir)
            _say(f"memory: a coordinator holding it checkpoints version {made['version']} ...")
            result["memory"] = _in_subprocess("memory_coordinator", made["table"], made["version"])
            _say(f"memory: {json.dumps(result['memory'])} (target < 300 MB)")
        if chart is not None:
            _chart(runs, samples, Path(chart))
            result["chart"] = str(chart)
            _say(f"chart: {chart}")
        if len(runs) > 1:
            a, b = runs[0]["deltacoord"], next((r["deltacoord"] for r in runs if r["deltacoord"]["writers"] == 16), runs[1]["deltacoord"])
            if a.get("fetch_bytes_per_commit"):
                result["fetch_bytes_growth"] = round(b["fetch_bytes_per_commit"] / a["fetch_bytes_per_commit"], 2)
        return result
    finally:
        if proxy is not None:
            proxy.stop()
        if started:
            broker.stop()
        if s3 is not None and started_s3:
            s3.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), None)))
