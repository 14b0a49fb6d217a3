"""What one coordinator partition sustains, beside the bare Kafka loop it is built on (the floor), in one run.

    python bench/bench_capacity.py [--writers 64] [--tables 1] [--seconds 10 | --commits N] [--bootstrap-servers HOST:PORT]

Writer processes cost CPU: 64 of them on a 2-core machine measure the machine, not the coordinator. Here one
lightweight process emulates N writers on other hosts. Before the timed part it stages every Parquet file (one
file per table, hard-linked under a distinct name per commit: the coordinator checks only an added file's path
and, for tables that ask for it, its size) and builds every proposal with the writer's own code (`Transaction`,
`encode_proposal`, the writer's producer settings): one-row blind appends to M local tables on one proposals
partition. During it the process only produces: each emulated writer has one proposal in flight and sends its
next once its decision is on the commits topic (read_committed; a closed loop). Publication is followed on the
writer's own reply path (`wait=published`: a reply once `<v>.json` exists).

Two systems, one after the other, each on its own topics and fed the same way:

- `coordinator`: `deltacoord coordinator run --partitions 0`, local tables.
- `floor`: the coordinator's Kafka consume-transform-produce loop with the rules and publication stubbed out:
  read the proposals partition read_committed, one transaction per batch with send_offsets_to_transaction,
  one small record per proposal to a commits topic (`python bench/bench_capacity.py --serve-floor`).

Prints one JSON line per system (commits/s decided and visible, p50/p99 from produce to decision and to
visibility, CPU per commit of the system's process, the broker and the generator, the load average) and a
summary line with the ratio capacity/floor; the target is at least 1,000 commits/s and at least half the floor.
`--details FILE` writes what each proposal got (for tests).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: One record of each batch per proposal, as the coordinator's own loop takes them (`CoordinatorSettings.max_batch`).
MAX_BATCH = 500
#: How long the loop waits without any decision (and the drain after it for publications) before giving up.
DRAIN_S = 120.0


@dataclasses.dataclass
class Emulated:
    """One staged proposal: its encoded value and what it adds."""

    proposal_id: str
    table: int
    table_id: str
    value: bytes
    path: str


@dataclasses.dataclass
class Loop:
    """What the closed loop saw: per proposal id, when it was sent, decided and made visible, and how."""

    sent: dict[str, float] = dataclasses.field(default_factory=dict)
    decided: dict[str, float] = dataclasses.field(default_factory=dict)
    decisions: dict[str, int] = dataclasses.field(default_factory=dict)  # decision records seen per proposal id
    outcome: dict[str, str] = dataclasses.field(default_factory=dict)
    version: dict[str, int] = dataclasses.field(default_factory=dict)
    visible: dict[str, float] = dataclasses.field(default_factory=dict)
    t0: float = 0.0
    stopped_sending: float = 0.0
    exhausted: bool = False
    #: No decision arrived for DRAIN_S while proposals were in flight: the loop gave up on them.
    stalled: bool = False
    #: What the system's own counters grew by during the timed part (the coordinator's /metrics).
    counters: dict[str, float] = dataclasses.field(default_factory=dict)
    #: CPU seconds of each measured process's threads during the timed part, by kind (`thread_cpu_s`).
    threads: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float | None:
    from deltacoord.tooling.bench import percentile

    return round(percentile(xs, q), 1) if xs else None


# -- staging (before the timed part) -------------------------------------------------------------
def stage(tables: list[Any], per_writer: list[int], writers: int, rows: Any) -> list[deque[Emulated]]:
    """Each emulated writer's proposals: one-row blind appends, built and encoded as `Table.append` does, of a
    file hard-linked under a distinct name per proposal (staged here, before anything is timed)."""
    from deltacoord.schemas.codec import encode_proposal
    from deltacoord.writer import staging
    from deltacoord.writer.transaction import Transaction

    firsts = []
    for t in tables:
        snap = t.snapshot()
        (add,) = staging.write_data_files(t.storage, rows, snap.partition_columns)
        firsts.append((snap, add))
    queues: list[deque[Emulated]] = []
    for w in range(writers):
        i = w % len(tables)
        t, (snap, add) = tables[i], firsts[i]
        q: deque[Emulated] = deque()
        for k in range(per_writer[w]):
            path = f"cap-w{w}-{k}-{add.path}"
            os.link(t.root / add.path, t.root / path)
            tx = Transaction(t, snap.version)  # a long-lived appender's cached snapshot, as `Table.append` keeps it
            tx.stage([dataclasses.replace(add, path=path)])
            p = tx.proposal("WRITE", True, {"mode": "Append", "partitionBy": snap.partition_columns},
                            {"numAddedFiles": 1, "numRemovedFiles": 0, "numAddedBytes": add.size,
                             "numOutputRows": rows.num_rows})
            q.append(Emulated(p.proposal_id, i, p.table_id, encode_proposal(p), path))
        queues.append(q)
    return queues


# -- the closed loop -----------------------------------------------------------------------------
def drive(conf: dict[str, Any], proposals_topic: str, commits_topic: str, queues: list[deque[Emulated]],
          seconds: float | None, expect: Callable[[str], Any] | None, loop: Loop) -> None:
    """Keep one proposal per emulated writer in flight until the queues run out (or `seconds` pass), then wait
    for the decisions still due. Decisions are read from the commits topic; `expect(proposal_id)` registers a
    proposal on the writer's reply path and returns its routing headers (None: no replies, the floor)."""
    from confluent_kafka import Consumer, TopicPartition

    from deltacoord.schemas.commits_topic import watermarks
    from deltacoord.schemas.routing import H_OUTCOME, H_PROPOSAL_ID, H_TABLE_ID, H_VERSION, header
    from deltacoord.writer.client import proposal_producer

    producer = proposal_producer(conf)
    decisions = Consumer({**conf, "group.id": f"cap-decisions-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                          "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    tp = TopicPartition(commits_topic, 0)
    _low, high = watermarks(decisions, tp)  # a topic just made may have no leader yet (NOT_LEADER_FOR_PARTITION)
    decisions.assign([TopicPartition(commits_topic, 0, high)])
    in_flight: dict[bytes, int] = {}  # proposal id -> emulated writer

    def send(w: int) -> None:
        e = queues[w].popleft()
        headers: list[tuple[str, str | bytes | None]] = [(H_PROPOSAL_ID, e.proposal_id.encode()),
                                                         (H_TABLE_ID, e.table_id.encode())]
        if expect is not None:
            headers += expect(e.proposal_id)
        in_flight[e.proposal_id.encode()] = w
        loop.sent[e.proposal_id] = time.time()
        producer.produce(proposals_topic, value=e.value, key=e.table_id.encode(), partition=0, headers=headers)
        producer.poll(0)

    loop.t0 = time.time()
    deadline = None if seconds is None else loop.t0 + seconds
    sending = True
    for w in range(len(queues)):
        if queues[w]:
            send(w)
    progress = loop.t0  # when the last decision arrived: a loop that hears none for DRAIN_S stops, and says so
    while in_flight:
        now = time.time()
        if sending and deadline is not None and now >= deadline:
            sending, loop.stopped_sending = False, now
        if now - progress > DRAIN_S:
            loop.stalled = True
            break
        first = decisions.poll(0.05)  # `consume(n, t)` would wait for n records or all of t
        for m in [] if first is None else [first, *decisions.consume(MAX_BATCH - 1, 0)]:
            if m.error() is not None:
                continue
            raw = header(m, H_PROPOSAL_ID)
            if raw is None:
                continue
            pid = raw.decode()
            if pid not in loop.sent:
                continue
            loop.decisions[pid] = loop.decisions.get(pid, 0) + 1
            w_of = in_flight.pop(raw, None)
            if w_of is None:
                continue  # a second decision of a proposal: counted above, and the test says so
            progress = at = time.time()
            loop.decided[pid] = at
            loop.outcome[pid] = (header(m, H_OUTCOME) or b"?").decode()
            version = header(m, H_VERSION)
            if version is not None:
                loop.version[pid] = int(version)
            if sending and queues[w_of]:
                send(w_of)
        producer.poll(0)
    if sending:
        loop.stopped_sending = time.time()
    loop.exhausted = seconds is not None and sending and not loop.stalled
    # Decision records that arrive late (a doubled decision) are still counted for a short while.
    for m in decisions.consume(MAX_BATCH, 0.5):
        raw = header(m, H_PROPOSAL_ID) if m.error() is None else None
        if raw is not None and raw.decode() in loop.sent:
            loop.decisions[raw.decode()] = loop.decisions.get(raw.decode(), 0) + 1
    producer.flush(30)
    decisions.close()


def summarise(system: str, loop: Loop, timed: set[str], cpu: dict[str, float | None], n_writers: int,
              n_tables: int, load: float) -> dict[str, Any]:
    """One system's JSON line from the timed proposals of its loop."""
    decided = [p for p in timed if p in loop.decided]
    committed = [p for p in decided if loop.outcome.get(p) == "COMMITTED"]
    end = max((loop.decided[p] for p in decided), default=loop.t0)
    span = max(end - loop.t0, 1e-9)
    lat = [(loop.decided[p] - loop.sent[p]) * 1000 for p in decided]
    out: dict[str, Any] = {
        "system": system, "writers": n_writers, "tables": n_tables, "load_average_1m": round(load, 2),
        "sent": len(timed), "decided": len(decided), "committed": len(committed),
        "rejected": len(decided) - len(committed), "undecided": len(timed) - len(decided),
        "seconds": round(span, 2), "decided_per_s": round(len(decided) / span, 1),
        "decided_p50_ms": _pct(lat, 0.5), "decided_p99_ms": _pct(lat, 0.99),
    }
    if system == "coordinator":
        seen = [p for p in committed if p in loop.visible]
        vis_end = max((loop.visible[p] for p in seen), default=loop.t0)
        vlat = [(loop.visible[p] - loop.sent[p]) * 1000 for p in seen]
        out |= {"visible": len(seen), "visible_per_s": round(len(seen) / max(vis_end - loop.t0, 1e-9), 1),
                "visible_p50_ms": _pct(vlat, 0.5), "visible_p99_ms": _pct(vlat, 0.99),
                "versions": len({loop.version[p] for p in committed if p in loop.version})}
    n = max(len(decided), 1)
    out["cpu_ms_per_commit"] = {k: None if v is None else round(v * 1000 / n, 3) for k, v in cpu.items()}
    out["cpu_ms_per_commit_by_thread"] = {k: {kind: round(v * 1000 / n, 3) for kind, v in t.items()}
                                          for k, t in loop.threads.items()}
    if loop.exhausted:
        out["pool_exhausted"] = True  # --seconds ended early: raise --max-commits
    if loop.stalled:
        out["stalled"] = f"no decision for {DRAIN_S:.0f} s with {out['undecided']} proposals in flight"
    return out


# -- the floor: the coordinator's Kafka loop, rules and publication stubbed out -----------------------------
def serve_floor(bootstrap: str, prefix: str, out: str, offsets_every_batch: bool) -> None:
    """Consume the proposals partition read_committed; per batch one transaction holding one small record per
    proposal on the commits topic, and the consumed offsets (send_offsets_to_transaction): in every transaction
    with `offsets_every_batch`, else as the coordinator does (`BatchTransaction._transact`): the records carry
    the next offset and the group's offset joins a transaction once a second. Writes its counts to `out` on SIGTERM."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from deltacoord.schemas.routing import H_NEXT_OFFSET, H_OUTCOME, H_PROPOSAL_ID, Topics, header

    topics = Topics.with_prefix(prefix)
    stop = False

    def on_term(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    # The coordinator's proposals consumer and transactional producer settings (`deltacoord.coordinator.kafka.batch_transaction`).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-floor", "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-floor-0", "linger.ms": 0,
                         "retry.backoff.ms": 2, "retry.backoff.max.ms": 10})
    producer.init_transactions(60)
    consumer.assign([TopicPartition(topics.proposals, 0, 0)])
    counts = {"consumed": 0, "produced": 0, "transactions": 0, "offset_commits": 0}
    offsets_at = time.monotonic()
    Path(out + ".ready").write_text("ready")
    while not stop:
        first = consumer.poll(0.1)
        if first is None:
            continue
        batch = [m for m in [first, *consumer.consume(MAX_BATCH - 1, 0)] if m.error() is None]
        if not batch:
            continue
        last = batch[-1].offset()
        assert last is not None
        mark = str(last + 1).encode()
        producer.begin_transaction()
        for m in batch:
            pid = header(m, H_PROPOSAL_ID) or b""
            producer.produce(topics.commits, value=str(m.offset()).encode(), key=m.key(), partition=0,
                             headers=[(H_PROPOSAL_ID, pid), (H_OUTCOME, b"COMMITTED"), (H_NEXT_OFFSET, mark)])
        if offsets_every_batch or time.monotonic() - offsets_at >= 1.0:
            producer.send_offsets_to_transaction([TopicPartition(topics.proposals, 0, last + 1)],
                                                 consumer.consumer_group_metadata(), 30)
            offsets_at = time.monotonic()
            counts["offset_commits"] += 1
        producer.commit_transaction(30)
        counts["consumed"] += len(batch)
        counts["produced"] += len(batch)
        counts["transactions"] += 1
    consumer.close()
    Path(out).write_text(json.dumps(counts))


# -- the two systems ------------------------------------------------------------------------------
def _ensure(bootstrap: str, prefix: str) -> Any:
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.schemas.routing import Topics

    topics = Topics.with_prefix(prefix)
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), topics, partitions=1)
    return topics


def _cpu(pid: int | None) -> float | None:
    from deltacoord.tooling.cpu_usage import process_tree_cpu_s

    return None if pid is None else process_tree_cpu_s(pid)


def _timed(conf: dict[str, Any], topics: Any, warm: list[deque[Emulated]], queues: list[deque[Emulated]],
           seconds: float | None, expect: Callable[[str], Any] | None,
           pids: dict[str, int | None],
           counters: Callable[[], dict[str, float]] | None = None) -> tuple[Loop, Loop, dict[str, float | None]]:
    """An untimed warm-up through the same loop, then the timed loop with the CPU each process spent in it (and
    how much `counters` grew meanwhile)."""
    warm_loop = Loop()
    drive(conf, topics.proposals, topics.commits, warm, None, expect, warm_loop)
    at_start = counters() if counters is not None else {}
    threads0 = {k: thread_cpu_s(p) for k, p in pids.items() if p is not None and k != "broker"}
    before = {k: _cpu(p) for k, p in pids.items()}
    g0 = time.process_time()
    loop = Loop()
    drive(conf, topics.proposals, topics.commits, queues, seconds, expect, loop)
    if counters is not None:
        loop.counters = {k: v - at_start.get(k, 0.0) for k, v in counters().items()}
    for k, t0 in threads0.items():
        t1 = thread_cpu_s(pids[k] or 0)
        loop.threads[k] = {kind: t1.get(kind, 0.0) - v for kind, v in t0.items()}
    used: dict[str, float | None] = {"generator": time.process_time() - g0}
    for k, p in pids.items():
        after, b = _cpu(p), before[k]
        used[k] = None if after is None or b is None else after - b
    return warm_loop, loop, used


def _scrape(port: int) -> dict[str, float]:
    """The coordinator's batch and coalescing counters from its /metrics (summed over label sets)."""
    import urllib.request

    want = ("deltacoord_batch_size_sum", "deltacoord_batch_size_count", "deltacoord_coalesced_commits_total")
    out = dict.fromkeys(want, 0.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads by kind: `main` (a coordinator decides there), `python` (its other
    Python threads: publication, replies, checkpoint requests), `librdkafka` (the Kafka clients' own threads),
    and `children` (the checkpoint process, alive or reaped). Linux only: empty elsewhere."""
    import re

    from deltacoord.tooling.cpu_usage import process_tree_cpu_s

    ticks = os.sysconf("SC_CLK_TCK")
    out = {"main": 0.0, "python": 0.0, "librdkafka": 0.0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    own = 0.0
    for tid in tids:
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that just ended
        used = (int(fields[11]) + int(fields[12])) / ticks
        own += used
        kind = "main" if tid == str(pid) else "librdkafka" if re.match(r"rdk:", comm) else "python"
        out[kind] += used
    tree = process_tree_cpu_s(pid)
    # The whole tree less the live threads: children, and threads that ended (counted as python).
    out["children"] = max(0.0, (tree or own) - own)
    return out


def _split(total: int, writers: int) -> list[int]:
    return [total // writers + (1 if w < total % writers else 0) for w in range(writers)]


def run(bootstrap: str, writers: int, n_tables: int, seconds: float | None, commits: int, warmup: int,
        workdir: Path, coalesce: bool, floors: list[bool]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Both systems, one after the other; their JSON lines and the details of every proposal."""
    import pyarrow as pa

    from deltacoord.tooling.cpu_usage import broker_pid
    from deltacoord.tooling.ports import free_port
    from deltacoord.writer.client import CoordinatorClient
    from deltacoord.writer.table import Table

    os.environ["DELTACOORD_COORDINATOR_CHECK"] = "0"  # the coordinator is given its partition statically
    conf = {"bootstrap.servers": bootstrap}
    broker = broker_pid(bootstrap)
    rows = pa.table({"id": pa.array([1], pa.int64()), "value": pa.array(["x"], pa.string())})
    prefix = f"cap-{uuid.uuid4().hex[:6]}"
    topics = _ensure(bootstrap, prefix)
    log = open(workdir / "coordinator.log", "wb")  # noqa: SIM115 - closed below
    metrics_port = free_port()
    coord = subprocess.Popen([sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers",
                              bootstrap, "--topic-prefix", prefix, "--partitions", "0", "--log-level", "WARNING",
                              "--metrics-port", str(metrics_port)],
                             stdout=log, stderr=subprocess.STDOUT)
    client = CoordinatorClient(bootstrap, topics=topics, relay="")
    lines: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    try:
        tables = [Table(workdir / f"t{i}", client=client, decision_timeout_s=120) for i in range(n_tables)]
        for t in tables:
            t.create(rows.schema, properties={} if coalesce else {"deltacoord.coalesce": "false"})
        client.wait_leased(30)
        print(f"[capacity] staging {warmup + commits} proposals for {writers} emulated writers on {n_tables} "
              "table(s) ...", file=sys.stderr, flush=True)
        warm = stage(tables, _split(warmup, writers), writers, rows)
        queues = stage(tables, _split(commits, writers), writers, rows)
        paths = {e.proposal_id: (e.table, e.path) for q in [*warm, *queues] for e in q}
        visible: dict[str, float] = {}

        def expect(pid: str) -> Any:
            pending = client.expect(pid, "published")

            def seen(f: Any) -> None:
                if f.exception() is None:
                    visible.setdefault(pid, time.time())

            pending.published.add_done_callback(seen)
            return pending.headers

        print(f"[capacity] coordinator: {writers} emulated writers ...", file=sys.stderr, flush=True)
        load = os.getloadavg()[0]
        warm_loop, loop, used = _timed(conf, topics, warm, queues, seconds, expect,
                                       {"coordinator": coord.pid, "broker": broker},
                                       lambda: _scrape(metrics_port))
        every = [warm_loop, loop]
        committed = [p for x in every for p in x.decided if x.outcome.get(p) == "COMMITTED"]
        deadline = time.monotonic() + DRAIN_S
        while any(p not in visible for p in committed) and time.monotonic() < deadline:
            time.sleep(0.05)
        loop.visible = warm_loop.visible = dict(visible)
        lines.append(summarise("coordinator", loop, set(loop.sent), used, writers, n_tables, load))
        if loop.counters:
            batches = loop.counters["deltacoord_batch_size_count"]
            lines[-1]["transactions"] = int(batches)
            lines[-1]["proposals_per_transaction"] = round(loop.counters["deltacoord_batch_size_sum"] / max(batches, 1), 1)
            lines[-1]["coalesced"] = int(loop.counters["deltacoord_coalesced_commits_total"])
        print(json.dumps(lines[-1]), flush=True)
        details["coordinator"] = {
            "tables": [str(t.root) for t in tables], "rows_per_file": rows.num_rows,
            "proposals": {p: {"table": paths[p][0], "path": paths[p][1], "decisions": x.decisions.get(p, 0),
                              "outcome": x.outcome.get(p), "version": x.version.get(p), "visible": p in visible,
                              "warmup": x is warm_loop} for x in every for p in x.sent},
            "unsent": sum(len(q) for q in queues),
        }
    finally:
        client.close()
        coord.terminate()
        coord.wait(60)
        log.close()

    for every_batch in floors:
        line, details[_floor_name(every_batch)] = run_floor(bootstrap, workdir, writers, n_tables, seconds, commits,
                                                            warmup, rows, every_batch)
        lines.append(line)
    return lines, details


def _floor_name(every_batch: bool) -> str:
    return "floor_offsets_every_batch" if every_batch else "floor"


def run_floor(bootstrap: str, workdir: Path, writers: int, n_tables: int, seconds: float | None, commits: int,
              warmup: int, rows: Any, every_batch: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The floor loop's process on topics of its own, fed by the same generator; its line and details."""
    from deltacoord.tooling.cpu_usage import broker_pid
    from deltacoord.writer.client import CoordinatorClient
    from deltacoord.writer.table import Table

    name = _floor_name(every_batch)
    fprefix = f"capfloor-{uuid.uuid4().hex[:6]}"
    ftopics = _ensure(bootstrap, fprefix)
    fout = str(workdir / f"{fprefix}.json")
    floor = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-floor", "--bootstrap-servers",
                              bootstrap, "--topic-prefix", fprefix, "--floor-out", fout,
                              *(["--floor-offsets-every-batch"] if every_batch else [])])
    try:
        while not Path(fout + ".ready").exists():
            if floor.poll() is not None:
                raise RuntimeError(f"the floor loop ended before it was ready (exit {floor.returncode})")
            time.sleep(0.05)
        # The same generator, fed the same kind of proposals (built afresh: proposal ids are never reused).
        fclient = CoordinatorClient(bootstrap, topics=ftopics, relay="")
        tables = [Table(workdir / f"t{i}", client=fclient) for i in range(n_tables)]
        warm = stage(tables, _split(warmup, writers), writers, rows)
        queues = stage(tables, _split(commits, writers), writers, rows)
        fclient.close()
        print(f"[capacity] {name}: {writers} emulated writers ...", file=sys.stderr, flush=True)
        load = os.getloadavg()[0]
        warm_loop, loop, used = _timed({"bootstrap.servers": bootstrap}, ftopics, warm, queues, seconds, None,
                                       {"floor": floor.pid, "broker": broker_pid(bootstrap)})
        line = summarise(name, loop, set(loop.sent), used, writers, n_tables, load)
        print(json.dumps(line), flush=True)
    finally:
        floor.send_signal(signal.SIGTERM)
        floor.wait(60)
    counts = json.loads(Path(fout).read_text()) if Path(fout).exists() else {}
    return line, {"counts": counts, "sent": len(warm_loop.sent) + len(loop.sent),
                  "decisions": {**warm_loop.decisions, **loop.decisions}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=64, help="emulated writers, each with one proposal in flight")
    ap.add_argument("--tables", type=int, default=1, help="local tables, all on the one proposals partition")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--seconds", type=float, default=None, help="timed part per system (default 10 s)")
    how.add_argument("--commits", type=int, default=None, help="timed proposals per system, instead of --seconds")
    ap.add_argument("--max-commits", type=int, default=60_000,
                    help="proposals staged for a --seconds run (it ends early, saying so, if they run out)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed proposals first (default 4 per writer)")
    ap.add_argument("--no-coalesce", action="store_true", help="tables with deltacoord.coalesce=false")
    ap.add_argument("--bootstrap-servers", default=None, help="a running broker (default: the bench starts its own)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--details", type=Path, default=None, help="write what every proposal got to this JSON file")
    ap.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--topic-prefix", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--floor-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--floor-offsets-every-batch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--floors", default="coordinator",
                    help="which floor loops: 'coordinator' (offsets as the coordinator commits them: in a transaction "
                         "once a second, each record carrying the next offset), 'every-batch' (send_offsets_to_transaction "
                         "in every transaction), or both, comma-separated")
    args = ap.parse_args()
    if args.serve_floor:
        serve_floor(args.bootstrap_servers, args.topic_prefix, args.floor_out, args.floor_offsets_every_batch)
        return
    for name in ("writers", "tables", "max_commits"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.commits is not None and args.commits < 1:
        ap.error(f"--commits must be at least 1, not {args.commits}")
    kinds = {"coordinator": False, "every-batch": True}
    floors = [kinds.get(f.strip()) for f in args.floors.split(",")]
    if not floors or None in floors:
        ap.error(f"--floors {args.floors!r}: give 'coordinator', 'every-batch' or both, comma-separated")
    seconds = None if args.commits is not None else (args.seconds or 10.0)
    commits = args.commits if args.commits is not None else args.max_commits
    warmup = args.warmup if args.warmup is not None else 4 * args.writers
    from deltacoord.tooling.broker import LocalBroker

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="deltacoord-capacity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker = LocalBroker(home=workdir / "broker") if args.bootstrap_servers is None else None
    bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
    try:
        lines, details = run(bootstrap, args.writers, args.tables, seconds, commits, warmup, workdir,
                             not args.no_coalesce, [f for f in floors if f is not None])
    finally:
        if broker is not None:
            broker.stop()
    cap = lines[0]["decided_per_s"]
    summary: dict[str, Any] = {"capacity_commits_per_s": cap, "visible_commits_per_s": lines[0].get("visible_per_s")}
    for line in lines[1:]:
        floor = line["decided_per_s"]
        summary[f"{line['system']}_commits_per_s"] = floor
        summary[f"capacity_to_{line['system']}"] = round(cap / floor, 2) if floor else None
    summary["target"] = ">= 1000 commits/s and >= 0.5 of the floor"
    print(json.dumps(summary), flush=True)
    if args.details is not None:
        args.details.write_text(json.dumps(details))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
