"""Fault injection around the history workload, and the long-form run.

One run: fresh topics (one partition), one table per isolation level, a
coordinator process statically owning partition 0, and writer processes
(`workload.writer_main`, multiprocessing spawn) that spread their transactions
over the tables. While they run, a controller injects faults at random moments
(triggered by progress, plus a random delay):

* **coordinator SIGKILL**, followed at once by a restart; some restarts carry
  ``DELTACOORD_FAULT=after_decide:n`` / ``after_kafka_commit:n`` so the new
  process also crashes itself at an exact point of its loop;
* **SIGSTOP / SIGCONT** of the coordinator (a pause); every second pause also
  starts a replacement while the first is stopped, so the resumed process is a
  zombie that Kafka must fence (it exits 3);
* **broker restart**: SIGKILL of the local broker and a restart on the same
  ports with the same data (needs a `LocalBroker`; asking for one without it
  is an error, never a skip);
* **racing coordinators**: a second ``--partitions 0`` coordinator started
  while the first runs;
* **writer SIGKILL** after proposing and before hearing the decision (the
  writer records the delivered proposal, then kills itself): its proposal must
  still get exactly one decision, found on the commits topic. A replacement
  writer process carries on with the remaining transactions.

A liveness watchdog plays the part of the deployment's livenessProbe, faster:
when proposals are pending and the commits partition has not grown for 20 s,
it SIGKILLs and restarts the coordinator and counts a ``watchdog_restarts``
(a wedged coordinator: a liveness bug, reported, not a safety violation).

Afterwards the controller waits until the coordinator consumed every proposal
and published every version, reads the decisions from the commits topic, and
checks each table with `checker.check_history` (reading the final table with
deltacoord's reader and with delta-rs) and `coordinator.delta_log.verify.verify_table`.

Long form (>= 1,000 transactions from 8 writer processes, >= 50 coordinator
SIGKILLs, 2 broker restarts; starts its own local broker; prints a JSON report
and exits 1 if anything is lost, duplicated, anomalous or falsely conflicting)::

    .venv/bin/python -m tests.history.chaos --writers 8 --transactions 1000 \\
        --coordinator-kills 50 --broker-restarts 2

Other options: ``--sigstops``, ``--racing``, ``--writer-kills``, ``--seed``,
``--workdir`` (kept for inspection: histories, coordinator logs, tables) and
``--bootstrap-servers`` (an external broker; then ``--broker-restarts 0``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from coordinator.delta_log.verify import verify_table
from coordinator.kafka.recovery import read_decisions
from coordinator.settings import CoordinatorSettings
from coordinator.tooling.broker import LocalBroker
from schemas.messages import Decision
from schemas.routing import Topics
from tests.history.checker import Report, Row, check_history, decision_record, decisions_for, txns_from_records
from tests.history.workload import TableSpec, WriterConfig, create_table, read_jsonl, writer_main
from tests.integration.coord_harness import CoordinatorProcess, fresh_topics, start_coordinator_process

ISOLATION_LEVELS = ("Serializable", "WriteSerializable")
FAULT_POINTS = ("after_decide", "after_kafka_commit")


class ChaosError(RuntimeError):
    """The run could not be carried out (not a correctness finding)."""


@dataclass
class ChaosConfig:
    writers: int = 8
    #: Proposals in total, split evenly over the writers (each writer spreads its own over the tables).
    transactions: int = 1000
    coordinator_kills: int = 50
    sigstops: int = 2
    broker_restarts: int = 2
    racing_coordinators: int = 1
    writer_kills: int = 1
    isolation_levels: tuple[str, ...] = ISOLATION_LEVELS
    seed: int = 0
    decision_timeout_s: float = 30.0
    sigstop_s: float = 3.0
    #: Fraction of restarts that also crash themselves at a DELTACOORD_FAULT point.
    fault_point_fraction: float = 0.2
    #: Give up when no transaction completes for this long.
    stall_timeout_s: float = 180.0
    #: Liveness watchdog (what the Kubernetes livenessProbe does in production, faster): proposals are
    #: pending but the commits partition has not grown for this long -> SIGKILL and restart the coordinator.
    watchdog_s: float = 20.0


@dataclass
class FaultLog:
    coordinator_sigkills: int = 0
    coordinator_restarts: int = 0
    fault_point_crashes: int = 0
    sigstops: int = 0
    zombies_fenced: int = 0
    broker_restarts: int = 0
    racing_coordinators: int = 0
    writer_kills: int = 0
    fenced_exits: int = 0
    #: Coordinators restarted by the liveness watchdog because they decided nothing for `watchdog_s`
    #: while proposals were pending (each one is a liveness bug: a wedged coordinator).
    watchdog_restarts: int = 0
    unexpected_coordinator_exits: list[str] = field(default_factory=list)
    writer_failures: list[str] = field(default_factory=list)
    #: What happened when (seconds since the start of the run), for reading the coordinator and broker logs.
    timeline: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic, repr=False)

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.t0:7.1f}s {what}")


class Fleet:
    """The coordinator processes of the run (all statically owning partition 0)."""

    def __init__(self, bootstrap: str, topics: Topics, log_dir: Path, faults: FaultLog) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.log_dir = log_dir
        self.faults = faults
        self.procs: list[CoordinatorProcess] = []
        self._env: dict[int, dict[str, str]] = {}
        self._killed: set[int] = set()
        self._stopped: set[int] = set()
        self._reaped: set[int] = set()
        self.zombies: set[int] = set()

    def start(self, env: dict[str, str] | None = None) -> CoordinatorProcess:
        cp = start_coordinator_process(self.bootstrap, self.topics, self.log_dir, "--partitions", "0", env=env)
        self.procs.append(cp)
        self._env[cp.proc.pid] = dict(env or {})
        self.faults.note(f"coordinator {cp.proc.pid} started{' with ' + str(env) if env else ''} ({cp.log.name})")
        return cp

    def running(self) -> list[CoordinatorProcess]:
        """Live and not stopped."""
        return [c for c in self.procs if c.alive() and c.proc.pid not in self._stopped]

    def alive(self) -> list[CoordinatorProcess]:
        return [c for c in self.procs if c.alive()]

    def sigkill(self, cp: CoordinatorProcess, why: str = "SIGKILLed") -> None:
        self._killed.add(cp.proc.pid)
        self._stopped.discard(cp.proc.pid)
        cp.proc.send_signal(signal.SIGKILL)
        cp.proc.wait(30)
        self.faults.note(f"coordinator {cp.proc.pid} {why}")

    def sigstop(self, cp: CoordinatorProcess) -> None:
        self._stopped.add(cp.proc.pid)
        cp.proc.send_signal(signal.SIGSTOP)
        self.faults.note(f"coordinator {cp.proc.pid} SIGSTOPped")

    def sigcont(self, cp: CoordinatorProcess) -> None:
        if cp.proc.pid not in self._stopped:
            return
        self._stopped.discard(cp.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            cp.proc.send_signal(signal.SIGCONT)
            self.faults.note(f"coordinator {cp.proc.pid} SIGCONTed")

    def reap(self) -> None:
        """Account for coordinators that exited on their own."""
        for c in self.procs:
            pid = c.proc.pid
            code = c.proc.poll()
            if code is None or pid in self._reaped:
                continue
            self._reaped.add(pid)
            if pid in self._killed:
                continue
            self.faults.note(f"coordinator {pid} exited {code}")
            if code == 3:
                self.faults.fenced_exits += 1
                if pid in self.zombies:
                    self.faults.zombies_fenced += 1
            elif code == -signal.SIGKILL and self._env.get(pid, {}).get("DELTACOORD_FAULT"):
                self.faults.fault_point_crashes += 1
            elif code != 0:
                tail = "\n".join(c.log.read_text(errors="replace").splitlines()[-15:])
                self.faults.unexpected_coordinator_exits.append(f"pid {pid} exited {code} ({c.log}):\n{tail}")

    def ensure_running(self) -> None:
        """Start a coordinator when none is alive (a paused one counts as alive)."""
        self.reap()
        if not self.alive():
            self.start()
            self.faults.coordinator_restarts += 1

    def stop_all(self) -> None:
        for c in self.procs:
            if c.alive():
                self.sigcont(c)
                c.proc.send_signal(signal.SIGTERM)
        for c in self.procs:
            try:
                c.proc.wait(90)
            except Exception:
                c.proc.kill()
                c.proc.wait(10)
        self.reap()


class _Progress:
    """Counts completed transactions in the writers' history files, incrementally."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self.completes = 0

    def poll(self, paths: Sequence[Path]) -> int:
        for p in paths:
            off = self._offsets.get(p, 0)
            try:
                with open(p, "rb") as fh:
                    fh.seek(off)
                    data = fh.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.completes += data[: end + 1].count(b'"type":"complete"')
            self._offsets[p] = off + end + 1
        return self.completes


class _Watchdog:
    """Detects a wedged coordinator: proposals pending, no new decision records for `stall_s`."""

    def __init__(self, bootstrap: str, topics: Topics, stall_s: float) -> None:
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topics.proposals}-coord",
                            "enable.auto.commit": False})
        self._proposals = TopicPartition(topics.proposals, 0)
        self._commits = TopicPartition(topics.commits, 0)
        self.stall_s = stall_s
        self._last_high = -1
        self._since = time.monotonic()
        self._next = 0.0
        self.errors = 0
        self.last_error = ""

    def reset(self) -> None:
        self._since = time.monotonic()

    def wedged(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + 1.0
        try:
            high = self._c.get_watermark_offsets(self._commits, timeout=5)[1]
            pending_high = self._c.get_watermark_offsets(self._proposals, timeout=5)[1]
            committed = self._c.committed([self._proposals], timeout=5)[0].offset
        except Exception as e:
            self.errors += 1
            self.last_error = repr(e)[:200]
            return False  # the broker is away: not the coordinator's fault
        if high != self._last_high or committed >= pending_high:
            self._last_high = high
            self._since = now
            return False
        return now - self._since > self.stall_s

    def close(self) -> None:
        self._c.close()


def _count_invokes(path: Path) -> int:
    try:
        return path.read_bytes().count(b'"type":"invoke"')
    except FileNotFoundError:
        return 0


def _schedule(cfg: ChaosConfig, rng: random.Random, total: int) -> list[tuple[int, str]]:
    """(completed transactions, fault) pairs, in order."""
    events: list[tuple[float, str]] = []
    events += [(rng.uniform(0.03, 0.97), "kill") for _ in range(cfg.coordinator_kills)]
    events += [(rng.uniform(0.1, 0.9), "sigstop") for _ in range(cfg.sigstops)]
    events += [((i + 1) / (cfg.broker_restarts + 1) + rng.uniform(-0.05, 0.05), "broker") for i in range(cfg.broker_restarts)]
    events += [(rng.uniform(0.15, 0.85), "race") for _ in range(cfg.racing_coordinators)]
    return sorted((max(1, int(f * total)), kind) for f, kind in events)


def _wait_drained(bootstrap: str, topics: Topics, timeout_s: float, tick: Callable[[], None]) -> bool:
    """True once the coordinators' committed proposals offset reaches the end of the partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topics.proposals}-coord", "enable.auto.commit": False})
    tp = TopicPartition(topics.proposals, 0)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            tick()
            try:
                _low, high = c.get_watermark_offsets(tp, timeout=10)
                committed = c.committed([tp], timeout=10)[0].offset
            except Exception:
                time.sleep(1)
                continue
            if committed >= high:
                return True
            time.sleep(0.5)
        return False
    finally:
        c.close()


def _wait_topics_ready(bootstrap: str, topics: Topics, timeout_s: float = 60.0) -> None:
    """Wait until partition 0 of the new topics has a leader that answers (a writer's first
    `CoordinatorClient.propose` does not retry NOT_LEADER_FOR_PARTITION)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topics.proposals}-ready"})
    deadline = time.monotonic() + timeout_s
    try:
        for topic in (topics.proposals, topics.commits):
            while True:
                try:
                    c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    finally:
        c.close()


def _wait_published(spec: TableSpec, version: int, timeout_s: float) -> bool:
    path = Path(spec.uri) / "_delta_log" / f"{version:020d}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.2)
    return False


def _rows(table: Any) -> Counter[Row]:
    cols = [table.column(c).to_pylist() for c in ("p", "k", "v")]
    return Counter((int(p), int(k), int(v)) for p, k, v in zip(*cols, strict=True))


class ChaosRun:
    def __init__(self, bootstrap: str, broker: LocalBroker | None, cfg: ChaosConfig, workdir: Path) -> None:
        if cfg.broker_restarts and broker is None:
            raise ChaosError(f"{cfg.broker_restarts} broker restart(s) asked for, but the broker is not a LocalBroker "
                             "this run can kill and restart")
        self.bootstrap = bootstrap
        self.broker = broker
        self.cfg = cfg
        self.workdir = workdir
        self.rng = random.Random(cfg.seed)
        self.faults = FaultLog()
        self.hist_dir = workdir / "history"
        self.hist_dir.mkdir(parents=True, exist_ok=True)
        (workdir / "coordinators").mkdir(exist_ok=True)
        self.topics = fresh_topics(bootstrap, partitions=1)
        _wait_topics_ready(bootstrap, self.topics)
        self.prefix = self.topics.proposals.removesuffix(".proposals")
        self.specs = tuple(TableSpec(str((workdir / f"table-{lvl.lower()}").resolve()), lvl) for lvl in cfg.isolation_levels)
        self.fleet = Fleet(bootstrap, self.topics, workdir / "coordinators", self.faults)
        self._watchdog = _Watchdog(bootstrap, self.topics, cfg.watchdog_s)
        self.ctx = multiprocessing.get_context("spawn")
        self.writers: dict[int, tuple[BaseProcess, WriterConfig]] = {}
        self.history_files: list[Path] = [self.hist_dir / "setup.jsonl"]
        self._done_writers: list[int] = []

    # -- processes ----------------------------------------------------------------------------
    def _spawn_writer(self, writer_id: int, transactions: int, crash_at: int | None) -> None:
        out = self.hist_dir / f"writer-{writer_id}.jsonl"
        wc = WriterConfig(writer_id=writer_id, bootstrap=self.bootstrap, topic_prefix=self.prefix, tables=self.specs,
                          transactions=transactions, seed=self.cfg.seed * 1000 + writer_id, out_path=str(out),
                          decision_timeout_s=self.cfg.decision_timeout_s, crash_after_propose_at=crash_at)
        proc = self.ctx.Process(target=writer_main, args=(wc,), name=f"history-writer-{writer_id}", daemon=True)
        proc.start()
        self.writers[writer_id] = (proc, wc)
        self.history_files.append(out)

    def _check_writers(self) -> None:
        for wid, (proc, wc) in list(self.writers.items()):
            if proc.is_alive() or proc.exitcode is None:
                continue
            del self.writers[wid]
            self.faults.note(f"writer {wid} exited {proc.exitcode}")
            if proc.exitcode == -signal.SIGKILL and wc.crash_after_propose_at is not None:
                self.faults.writer_kills += 1
                left = wc.transactions - _count_invokes(Path(wc.out_path))
                if left > 0:
                    self._spawn_writer(wid + 100, left, None)
            elif proc.exitcode != 0:
                self.faults.writer_failures.append(f"writer {wid} exited {proc.exitcode} (see {wc.out_path})")
            self._done_writers.append(wid)

    # -- faults -------------------------------------------------------------------------------
    def _fault_env(self) -> dict[str, str] | None:
        if self.rng.random() < self.cfg.fault_point_fraction:
            return {"DELTACOORD_FAULT": f"{self.rng.choice(FAULT_POINTS)}:{self.rng.randint(1, 4)}"}
        return None

    def _kill(self) -> None:
        running = self.fleet.running()
        if not running:  # e.g. the last one just exited: start one and kill it while it starts up
            self.fleet.ensure_running()
            running = self.fleet.running() or self.fleet.alive()
        victim = self.rng.choice(running)
        time.sleep(self.rng.uniform(0, 0.3))
        self.fleet.sigkill(victim)
        self.faults.coordinator_sigkills += 1
        if not self.fleet.alive():
            self.fleet.start(self._fault_env())
            self.faults.coordinator_restarts += 1

    def _sigstop(self) -> None:
        running = self.fleet.running()
        if not running:
            return
        victim = self.rng.choice(running)
        zombie = self.faults.sigstops % 2 == 1
        time.sleep(self.rng.uniform(0, 0.3))
        self.fleet.sigstop(victim)
        self.faults.sigstops += 1
        if zombie:
            # Another coordinator takes the partition while this one is paused.
            self.fleet.start()
            self.faults.coordinator_restarts += 1
            self.fleet.zombies.add(victim.proc.pid)
        time.sleep(self.cfg.sigstop_s)
        self.fleet.sigcont(victim)
        self._watchdog.reset()

    def _broker_restart(self) -> None:
        assert self.broker is not None
        time.sleep(self.rng.uniform(0, 0.3))
        self.broker.kill()
        self.faults.note("broker SIGKILLed")
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.broker.start()
        self.faults.broker_restarts += 1
        self.faults.note("broker restarted")
        self._watchdog.reset()

    def _race(self) -> None:
        self.fleet.start()
        self.faults.racing_coordinators += 1

    def _liveness(self) -> None:
        if not self._watchdog.wedged():
            return
        for c in self.fleet.alive():
            self.fleet.sigkill(c, f"SIGKILLed by the watchdog (no decision for {self.cfg.watchdog_s:.0f}s with proposals pending)")
        self.fleet.start()
        self.faults.watchdog_restarts += 1
        self.faults.coordinator_restarts += 1
        self._watchdog.reset()

    def _fault(self, kind: str) -> None:
        {"kill": self._kill, "sigstop": self._sigstop, "broker": self._broker_restart, "race": self._race}[kind]()
        self._watchdog.reset()

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        cfg = self.cfg
        per_writer = math.ceil(cfg.transactions / cfg.writers)
        total = per_writer * cfg.writers
        try:
            self.fleet.start()
            for spec in self.specs:
                create_table(spec, self.bootstrap, self.prefix, self.history_files[0])
            crashers = self.rng.sample(range(cfg.writers), min(cfg.writer_kills, cfg.writers))
            for w in range(cfg.writers):
                crash_at = self.rng.randint(per_writer // 4, max(per_writer // 4, 3 * per_writer // 4)) if w in crashers else None
                self._spawn_writer(w, per_writer, crash_at)
            schedule = _schedule(cfg, self.rng, total)
            progress = _Progress()
            last_progress, last_change = -1, time.monotonic()
            last_fault_at = -1
            while self.writers:
                done = progress.poll(self.history_files)
                if done != last_progress:
                    last_progress, last_change = done, time.monotonic()
                elif time.monotonic() - last_change > cfg.stall_timeout_s:
                    raise ChaosError(f"no transaction completed for {cfg.stall_timeout_s:.0f}s ({done} done); "
                                     f"coordinator logs in {self.workdir / 'coordinators'}")
                # At most one fault per completed transaction: each one hits a coordinator that got work done.
                if schedule and schedule[0][0] <= done and done > last_fault_at:
                    self._fault(schedule.pop(0)[1])
                    last_fault_at = done
                t_loop = time.monotonic()
                self.fleet.ensure_running()
                self._liveness()
                self._check_writers()
                if time.monotonic() - t_loop > 2:
                    self.faults.note(f"controller loop took {time.monotonic() - t_loop:.1f}s "
                                     f"(watchdog errors {self._watchdog.errors}: {self._watchdog.last_error})")
                time.sleep(0.05)
            self.faults.note(f"writers done; {len(schedule)} fault(s) left over, run now")
            for _at, kind in schedule:
                self._fault(kind)
                self.fleet.ensure_running()
            return self._finish(t0)
        finally:
            self._watchdog.close()
            for proc, _wc in self.writers.values():
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
            self.fleet.stop_all()

    def _finish(self, t0: float) -> dict[str, Any]:
        for c in self.fleet.alive():
            self.fleet.sigcont(c)
        self.fleet.ensure_running()
        def tick() -> None:
            self.fleet.ensure_running()
            self._liveness()

        drained = _wait_drained(self.bootstrap, self.topics, 120, tick)
        settings = CoordinatorSettings(bootstrap_servers=self.bootstrap, topics=self.topics, group_id=f"{self.prefix}-check")
        decisions: list[Decision] = list(read_decisions(settings, 0))
        txns = txns_from_records(read_jsonl([p for p in self.history_files if p.exists()]))
        report: dict[str, Any] = {"drained": drained, "tables": {}, "verify": {}}
        reports: list[Report] = []
        with open(self.workdir / "decisions.jsonl", "w", encoding="utf-8") as fh:  # for post-mortems
            for d in decisions:
                rec = decision_record(d)
                fh.write(json.dumps({"table": d.table_id, **{k: sorted(v) if isinstance(v, frozenset) else v
                                                             for k, v in vars(rec).items()}}) + "\n")
        for spec in self.specs:
            decs = decisions_for(decisions, spec.table_id)
            head = max((d.version for d in decs if d.committed and d.version is not None), default=-1)
            published = _wait_published(spec, head, 120)
            from deltalake import DeltaTable

            from reader.snapshot import Snapshot

            final = {"deltacoord reader": _rows(Snapshot.load(spec.uri).to_pyarrow()),
                     "delta-rs": _rows(DeltaTable(spec.uri).to_pyarrow_table())}
            rep = check_history([t for t in txns if t.table == spec.table_id], decs, spec.isolation, table=spec.uri,
                                final_rows=final)
            reports.append(rep)
            report["tables"][spec.isolation] = {**rep.summary(), "head": head, "published": published}
            vr = verify_table(settings, spec.uri, spec.table_id, num_partitions=1)
            report["verify"][spec.isolation] = {"ok": vr.ok, "topic_versions": vr.topic_versions,
                                                "published_versions": vr.published_versions,
                                                "rejections": vr.rejections, "problems": vr.problems[:10]}
        rejected: Counter[str] = Counter()
        unknown: Counter[str] = Counter()
        for r in reports:
            rejected.update(r.rejected)
            unknown.update(r.unknown_resolved)
        report.update(
            transactions=sum(r.transactions for r in reports),
            committed=sum(r.committed for r in reports),
            rejected=dict(sorted(rejected.items())),
            unknown_resolved=dict(sorted(unknown.items())),
            reorderings=sum(r.reorderings for r in reports),
            lost=sum(len(r.lost) for r in reports),
            duplicated=sum(len(r.duplicated) for r in reports),
            anomalies=sum(len(r.anomalies) for r in reports),
            false_conflicts=sum(len(r.false_conflicts) for r in reports),
            verify_ok=all(v["ok"] for v in report["verify"].values()),
            faults={k: v for k, v in vars(self.faults).items() if k != "t0"},
            elapsed_s=round(time.monotonic() - t0, 1),
            workdir=str(self.workdir),
        )
        report["ok"] = bool(
            drained and report["verify_ok"] and all(r.ok for r in reports)
            and all(t["published"] for t in report["tables"].values())
        )
        return report


def run_chaos(bootstrap: str, broker: LocalBroker | None, cfg: ChaosConfig, workdir: Path) -> dict[str, Any]:
    """Run the workload under faults and return the JSON-able report (`report["ok"]` is the verdict)."""
    return ChaosRun(bootstrap, broker, cfg, workdir).run()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.history.chaos", description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--transactions", type=int, default=1000, help="proposals in total, over all writers")
    ap.add_argument("--coordinator-kills", type=int, default=50)
    ap.add_argument("--broker-restarts", type=int, default=2)
    ap.add_argument("--sigstops", type=int, default=2)
    ap.add_argument("--racing", type=int, default=1, help="racing coordinators started on the same partition")
    ap.add_argument("--writer-kills", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--decision-timeout", type=float, default=30.0)
    ap.add_argument("--bootstrap-servers", default=None, help="an external broker (no broker restarts then)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep histories, logs and tables here")
    args = ap.parse_args(argv)
    if args.bootstrap_servers and args.broker_restarts:
        ap.error("broker restarts need the local broker this command starts; pass --broker-restarts 0 with --bootstrap-servers")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    cfg = ChaosConfig(writers=args.writers, transactions=args.transactions, coordinator_kills=args.coordinator_kills,
                      sigstops=args.sigstops, broker_restarts=args.broker_restarts, racing_coordinators=args.racing,
                      writer_kills=args.writer_kills, seed=seed, decision_timeout_s=args.decision_timeout)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="deltacoord-history-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | None = None
    bootstrap = args.bootstrap_servers
    if bootstrap is None:
        broker = LocalBroker(home=workdir / "broker")
        bootstrap = broker.start().bootstrap_servers
    try:
        report = run_chaos(bootstrap, broker, cfg, workdir)
    finally:
        if broker is not None:
            broker.stop()
    report["seed"] = seed
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
