"""Fault injection around the history workload, and the long-form run.

One run: fresh topics (one partition; replication factor 3 and
min.insync.replicas=2 on a three-broker cluster), one table per isolation level,
a coordinator process statically owning partition 0, and writer processes
(`workload.writer_main`, multiprocessing spawn) that spread their transactions
over the tables. While they run, a controller injects faults at random moments
(triggered by progress, plus a random delay):

* **coordinator SIGKILL**, followed at once by a restart; some restarts carry
  ``DELTACOORD_FAULT=after_decide:n`` / ``after_kafka_commit:n`` so the new
  process also crashes itself at an exact point of its loop;
* **pause**: SIGSTOP, a few seconds, SIGCONT of the same coordinator;
* **zombie**: SIGSTOP of the coordinator owning the partition, a replacement
  started until it owns the partition (its init_transactions with the same
  transactional id fenced the paused one), then SIGCONT: the zombie runs on,
  must find out at its next transaction, publish nothing and exit 3 by itself.
  No later fault touches it; ``zombies_fenced`` counts those that did and
  ``zombie_run_s`` how long each ran after SIGCONT;
* **broker restart**: SIGKILL of the local broker (every node of a cluster)
  and a restart on the same ports with the same data (needs a `LocalBroker` or
  `LocalCluster`; asking for one without it is an error, never a skip);
* **partition-leader kill** (cluster only): SIGKILL of the node leading the
  proposals partition (odd kills: the commits partition), wait until another
  node leads it, restart the node; each kill first waits until every replica is
  back in sync, so the cluster never loses two nodes;
* **coordinator isolation** (cluster only): each coordinator reaches the
  brokers through one of two `netpath.NetPath` s (TCP proxies the brokers
  advertise on a listener of their own); the owner's path is cut (the first
  isolation blackholes it, the second resets every connection), a replacement
  on the other path fences it, the path is healed after ``--isolation-seconds``,
  and the isolated process must exit 3 by itself (``isolated_fenced``);
* **racing coordinators**: a second ``--partitions 0`` coordinator started
  while the first runs;
* **writer SIGKILL** after proposing and before hearing the decision (the
  writer records the delivered proposal, then kills itself): its proposal must
  still get exactly one decision, found on the commits topic. A replacement
  writer process carries on with the remaining transactions;
* **relay SIGKILL**: some writers (``--relay-writers``, by default half of
  them) commit through a relay process (`services.RelayProcess`); it is
  SIGKILLed and a new one started on the same socket. A commit call of theirs
  either says the proposal never reached Kafka (``not_sent``: it must have no
  decision) or that its outcome is unknown, and then the writer retries it with
  the same proposal id until it has an answer (as writers are told to; the
  checker accepts the coordinator's repeat of the id's first decision);
* **store outage** (``--storage s3``: the tables live in a bucket of a local
  S3 server, versitygw): the owner is paused a moment so proposals pile up,
  the S3 server is stopped, the owner resumed (it decides with no store: it
  must hold publication, or refuse with the retryable STORAGE_UNAVAILABLE),
  and after ``--store-outage-seconds`` the server restarts on the same port
  with the same data; ``store_outage_log`` says how many commit records were
  written and versions published meanwhile, and when publication resumed.

A liveness watchdog plays the part of the deployment's livenessProbe, faster:
when proposals are pending and the commits partition has not grown for 20 s
while the newest running coordinator has logged it is ready (one still starting is
given ``startup_s``, 90 s, first), it SIGKILLs and restarts the coordinator and counts a ``watchdog_restarts``
(a wedged coordinator: a liveness bug, reported, not a safety violation).
Throughout, every ``_delta_log/<v>.json`` is remembered as first seen; a file
rewritten or removed later is reported in ``delta_log_rewrites`` and fails the run.

Afterwards the controller waits until the coordinator consumed every proposal
and published every version, reads the decisions from the commits topic, and
checks each table with `checker.check_history` (reading the final table with
deltacoord's reader and with delta-rs) and `deltacoord.coordinator.delta_log.verify.verify_table`.

Long form on a three-broker cluster (starts its own cluster on free ports;
prints a JSON report and exits 1 if anything is lost, duplicated, anomalous,
falsely conflicting or rewritten)::

    .venv/bin/python -m tests.history.chaos --brokers 3 --writers 8 --transactions 1000 \\
        --coordinator-kills 50 --leader-kills 5 --isolations 2 --zombies 2

With one broker (``--brokers 1``, the default) ``--broker-restarts`` defaults
to 2 and leader kills and isolations are refused. Other options:
``--sigstops`` (pauses, default 1), ``--zombies`` (default 2),
``--isolation-seconds`` (default 12), ``--racing``, ``--writer-kills``,
``--writer-think-seconds`` (a writer's mean pause between transactions, so a
short run spans the slow faults), ``--seed``, ``--workdir`` (kept for
inspection: histories, coordinator logs, the broker or cluster, tables) and
``--bootstrap-servers`` (an external broker; then ``--broker-restarts 0``).

With relay kills and store outages, on three brokers (about 6 minutes for 1,000 transactions)::

    .venv/bin/python -m tests.history.chaos --brokers 3 --writers 8 --transactions 1000 \\
        --coordinator-kills 30 --leader-kills 4 --isolations 2 --zombies 2 \\
        --relay-kills 6 --storage s3 --store-outages 3 --store-outage-seconds 15

The report's ``commit_calls`` counts what the writers' commit calls raised before an answer (by kind:
``unknown``, ``not_sent``, ``other``; any ``other`` is a finding) and the calls retried with the same id.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from deltacoord.coordinator.delta_log.verify import verify_table
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.kafka.topics import describe_topic_config
from deltacoord.coordinator.settings import KAFKA_ENV_PREFIX, CoordinatorSettings
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import Topics
from deltacoord.storage.table import TableStorage
from deltacoord.storage.uri import StorageError
from deltacoord.tooling.broker import LocalBroker, LocalCluster
from deltacoord.tooling.storage_servers import S3Server
from tests.history.checker import Report, Row, check_history, decision_record, decisions_for, txns_from_records
from tests.history.netpath import MODES, NetPath, close_paths, start_cluster_with_paths
from tests.history.services import RelayProcess, StoreOutage, relay_socket_path
from tests.history.workload import TableSpec, WriterConfig, create_table, read_jsonl, writer_main
from tests.integration.coord_harness import (
    CoordinatorProcess,
    coordinator_group,
    fresh_topics,
    start_coordinator_process,
)

ISOLATION_LEVELS = ("Serializable", "WriteSerializable")
STORAGES = ("local", "s3")
FAULT_POINTS = ("after_decide", "after_kafka_commit")


class ChaosError(RuntimeError):
    """The run could not be carried out (not a correctness finding)."""


@dataclass(frozen=True)
class ChaosClients:
    """Kafka settings (besides bootstrap.servers) of each role. On a secured cluster each is its own principal:
    the harness's checks as the administrator, coordinators and writers with only their planned ACLs."""

    admin: dict[str, str] = field(default_factory=dict)
    coordinator: dict[str, str] = field(default_factory=dict)
    writer: dict[str, str] = field(default_factory=dict)

    def coordinator_env(self) -> dict[str, str]:
        """The coordinators' settings as `deltacoord coordinator run` reads them from the environment."""
        return {f"{KAFKA_ENV_PREFIX}{k.upper().replace('.', '_')}": v for k, v in self.coordinator.items()}


@dataclass
class ChaosConfig:
    writers: int = 8
    #: Proposals in total, split evenly over the writers (each writer spreads its own over the tables).
    transactions: int = 1000
    coordinator_kills: int = 50
    #: Plain pauses: SIGSTOP, `sigstop_s`, SIGCONT of the same process, nothing started meanwhile.
    sigstops: int = 1
    #: Real zombies: SIGSTOP, a replacement fences it, SIGCONT; it must find out and exit 3 by itself.
    zombies: int = 2
    broker_restarts: int = 2
    #: SIGKILL of the leader of the proposals (even kills) or commits (odd kills) partition, then its restart
    #: (needs a `LocalCluster`).
    leader_kills: int = 0
    #: Coordinators cut off from every broker by cutting their `NetPath` (needs two paths).
    isolations: int = 0
    isolation_s: float = 12.0
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
    #: How long the watchdog lets the newest coordinator start (import, fence its predecessor, recover: a minute at
    #: CI's load) before counting a stall; under the coordinator's own 120 s watchdog, so a hung start-up is still
    #: the harness's to restart.
    startup_s: float = 90.0
    #: How long a replacement may take to fence (and a fenced process to notice) before the run says so.
    takeover_timeout_s: float = 120.0
    #: Mean pause of a writer between its transactions (see `WriterConfig.think_s`).
    writer_think_s: float = 0.0
    #: SIGKILLs of the writers' relay, each followed by a restart on the same socket.
    relay_kills: int = 0
    #: Writers that commit through the relay (the others reach Kafka directly); None: half of them when
    #: the relay is killed, none otherwise.
    relay_writers: int | None = None
    #: Outages of the S3 server holding the tables (needs ``storage == "s3"``): stopped, restarted after
    #: `store_outage_s` on the same port with the same data.
    store_outages: int = 0
    store_outage_s: float = 10.0
    #: Where the tables live: "local" (a directory) or "s3" (a bucket of the run's local S3 server).
    storage: str = "local"

    def writers_through_relay(self) -> int:
        if self.relay_writers is not None:
            return min(self.relay_writers, self.writers)
        return max(1, self.writers // 2) if self.relay_kills else 0


@dataclass
class FaultLog:
    coordinator_sigkills: int = 0
    coordinator_restarts: int = 0
    fault_point_crashes: int = 0
    sigstops: int = 0
    zombies: int = 0
    #: Zombies that, resumed after a replacement fenced them, exited 3 on their own.
    zombies_fenced: int = 0
    #: Seconds each fenced zombie ran between SIGCONT and its exit (it really resumed).
    zombie_run_s: list[float] = field(default_factory=list)
    #: Zombies that ended otherwise (killed by a later fault, exit 0 at the end, ...): not fencing evidence.
    zombies_unresolved: list[str] = field(default_factory=list)
    broker_restarts: int = 0
    leader_kills: int = 0
    #: "proposals[0] leader node 2 SIGKILLed; node 3 led after 9.1s; node 2 back in 7.9s".
    leader_kill_log: list[str] = field(default_factory=list)
    isolations: int = 0
    #: Isolated coordinators that, reconnected, exited 3 on their own (a replacement had fenced them).
    isolated_fenced: int = 0
    isolated_unresolved: list[str] = field(default_factory=list)
    racing_coordinators: int = 0
    writer_kills: int = 0
    relay_kills: int = 0
    store_outages: int = 0
    #: "S3 down 10.0s; publication resumed 2.3s after its restart".
    store_outage_log: list[str] = field(default_factory=list)
    #: Transactions of writers added because faults were still due when the planned ones were done.
    extra_transactions: int = 0
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
    """The coordinator processes of the run (all statically owning partition 0).

    With network paths, each coordinator reaches the brokers through one path (the first one not
    cut), so cutting that path isolates it; without, it uses `bootstrap` directly.
    """

    def __init__(self, bootstrap: str, topics: Topics, log_dir: Path, faults: FaultLog,
                 paths: Mapping[str, NetPath] | None = None, clients: ChaosClients | None = None,
                 args: Sequence[str] = ()) -> None:
        self.bootstrap = bootstrap
        #: More `coordinator run` flags (the table roots and storage options of tables on S3).
        self.args = list(args)
        self.clients = clients or ChaosClients()
        self.topics = topics
        self.log_dir = log_dir
        self.faults = faults
        self.paths = dict(paths or {})
        self.procs: list[CoordinatorProcess] = []
        self._env: dict[int, dict[str, str]] = {}
        self._killed: set[int] = set()
        self._stopped: set[int] = set()
        self._reaped: set[int] = set()
        #: Coordinators SIGTERMed at the end before their first log line (still starting): not handling it yet.
        self._termed_unstarted: set[int] = set()
        self._started_at: dict[int, float] = {}
        self.path_of: dict[int, str] = {}
        #: Resumed zombies and isolated coordinators still expected to find out they are fenced, and since when.
        self.zombies: dict[int, float] = {}
        self.isolated: dict[int, float] = {}

    def start(self, env: dict[str, str] | None = None) -> CoordinatorProcess:
        path = next((n for n, p in sorted(self.paths.items()) if p.mode is None), None)
        if self.paths and path is None:
            raise ChaosError("every network path is cut: no coordinator can be started")
        bootstrap = self.paths[path].bootstrap if path is not None else self.bootstrap
        cp = start_coordinator_process(bootstrap, self.topics, self.log_dir, "--partitions", "0", *self.args,
                                       env={**self.clients.coordinator_env(), **(env or {})})
        self.procs.append(cp)
        self._started_at[cp.proc.pid] = time.monotonic()
        self._env[cp.proc.pid] = dict(env or {})
        if path is not None:
            self.path_of[cp.proc.pid] = path
        via = f" via path {path}" if path is not None else ""
        self.faults.note(f"coordinator {cp.proc.pid} started{via}{' with ' + str(env) if env else ''} ({cp.log.name})")
        return cp

    def running(self) -> list[CoordinatorProcess]:
        """Live and not stopped."""
        return [c for c in self.procs if c.alive() and c.proc.pid not in self._stopped]

    def targets(self) -> list[CoordinatorProcess]:
        """Running coordinators a fault may hit: not a zombie or an isolated one we are watching."""
        return [c for c in self.running() if c.proc.pid not in self.zombies and c.proc.pid not in self.isolated]

    def alive(self) -> list[CoordinatorProcess]:
        return [c for c in self.procs if c.alive()]

    def owner(self) -> CoordinatorProcess | None:
        """The running coordinator that fenced its predecessors last: the newest that logged it is ready."""
        ready = [c for c in self.targets() if _wait_ready(c, 0)]
        return ready[-1] if ready else None

    def starting_for(self, cp: CoordinatorProcess) -> float | None:
        """Seconds since `cp` was started while it has not yet logged it is ready; None once it has."""
        return None if _wait_ready(cp, 0) else time.monotonic() - self._started_at[cp.proc.pid]

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
            zombie_since, isolated_since = self.zombies.pop(pid, None), self.isolated.pop(pid, None)
            if pid in self._killed:
                self._unresolved(pid, zombie_since, isolated_since, "SIGKILLed by a later fault")
                continue
            self.faults.note(f"coordinator {pid} exited {code}")
            if code == 3:
                self.faults.fenced_exits += 1
                if zombie_since is not None:
                    self.faults.zombies_fenced += 1
                    self.faults.zombie_run_s.append(round(time.monotonic() - zombie_since, 1))
                if isolated_since is not None:
                    self.faults.isolated_fenced += 1
                continue
            self._unresolved(pid, zombie_since, isolated_since, f"exited {code}")
            if code == -signal.SIGKILL and self._env.get(pid, {}).get("DELTACOORD_FAULT"):
                self.faults.fault_point_crashes += 1
            elif code == -signal.SIGTERM and pid in self._termed_unstarted:
                pass  # stopped by us before its interpreter had started: the signal, not the coordinator, ended it
            elif code != 0:
                tail = "\n".join(c.log.read_text(errors="replace").splitlines()[-15:])
                self.faults.unexpected_coordinator_exits.append(f"pid {pid} exited {code} ({c.log}):\n{tail}")

    def _unresolved(self, pid: int, zombie_since: float | None, isolated_since: float | None, how: str) -> None:
        if zombie_since is not None:
            self.faults.zombies_unresolved.append(f"zombie {pid} {how}")
        if isolated_since is not None:
            self.faults.isolated_unresolved.append(f"isolated coordinator {pid} {how}")

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
                if not _wait_started(c, 180.0):
                    self._termed_unstarted.add(c.proc.pid)
                    self.faults.note(f"coordinator {c.proc.pid} SIGTERMed before its first log line (180s)")
                c.proc.send_signal(signal.SIGTERM)
        for c in self.procs:
            try:
                c.proc.wait(90)
            except Exception:
                c.proc.kill()
                c.proc.wait(10)
        self.reap()


_READY: set[int] = set()


def _wait_started(cp: CoordinatorProcess, timeout_s: float) -> bool:
    """Until the coordinator has written its first log line (or exited): from then on it handles SIGTERM (exit 0).
    Before that the interpreter is still starting, and a SIGTERM kills it by the signal (seen: a coordinator
    started for the final drain and stopped 1.5 s later, at load 20, before it had printed anything). False if
    it is alive and still silent when the time runs out."""
    deadline = time.monotonic() + timeout_s
    while cp.alive() and time.monotonic() < deadline and not cp.log.read_bytes().strip():
        time.sleep(0.1)
    return not cp.alive() or bool(cp.log.read_bytes().strip())


def _wait_ready(cp: CoordinatorProcess, timeout_s: float) -> bool:
    """True once the coordinator logged that it owns its partition (init_transactions done: the
    previous owner is fenced); False if it exited or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if cp.proc.pid in _READY:
            return True
        if b"coordinator ready on" in cp.log.read_bytes():
            _READY.add(cp.proc.pid)
            return True
        if not cp.alive() or time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


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

    def __init__(self, bootstrap: str, topics: Topics, stall_s: float, kafka: Mapping[str, str]) -> None:
        self._c = Consumer({"bootstrap.servers": bootstrap, **kafka, "group.id": coordinator_group(topics),
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

    def commits_end(self) -> int:
        return int(self._c.get_watermark_offsets(self._commits, timeout=10)[1])

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
    events += [(rng.uniform(0.1, 0.9), "zombie") for _ in range(cfg.zombies)]
    # The slow faults are spread evenly, so each one meets a cluster that recovered from the previous.
    events += [((i + 1) / (cfg.leader_kills + 1) + rng.uniform(-0.03, 0.03), "leader") for i in range(cfg.leader_kills)]
    events += [((i + 1) / (cfg.isolations + 1) + rng.uniform(-0.05, 0.05), "isolate") for i in range(cfg.isolations)]
    events += [(rng.uniform(0.05, 0.95), "relay") for _ in range(cfg.relay_kills)]
    events += [((i + 1) / (cfg.store_outages + 1) + rng.uniform(-0.05, 0.05), "store") for i in range(cfg.store_outages)]
    return sorted((max(1, int(f * total)), kind) for f, kind in events)


def _wait_drained(bootstrap: str, topics: Topics, timeout_s: float, tick: Callable[[], None],
                  kafka: Mapping[str, str]) -> bool:
    """True once the coordinators' committed proposals offset reaches the end of the partition."""
    c = Consumer({"bootstrap.servers": bootstrap, **kafka, "group.id": coordinator_group(topics),
                  "enable.auto.commit": False})
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


def _wait_topics_ready(bootstrap: str, topics: Topics, kafka: Mapping[str, str], timeout_s: float = 180.0) -> None:
    """Wait until partition 0 of the new topics has a leader that answers (a writer's first
    `CoordinatorClient.propose` does not retry NOT_LEADER_FOR_PARTITION)."""
    c = Consumer({"bootstrap.servers": bootstrap, **kafka, "group.id": f"{topics.proposals}-ready"})
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
    storage = TableStorage(spec.uri, spec.storage_options, fsync=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, StorageError):
            if storage.exists(f"_delta_log/{version:020d}.json"):
                return True
        time.sleep(0.2)
    return False


def _rows(table: Any) -> Counter[Row]:
    cols = [table.column(c).to_pylist() for c in ("p", "k", "v")]
    return Counter((int(p), int(k), int(v)) for p, k, v in zip(*cols, strict=True))


class _DeltaLogWatch:
    """Remembers each `_delta_log/<v>.json` as first seen and reports any later change.

    The publisher creates a version file once and never replaces it; a file whose
    bytes or inode change, or that disappears, means something (a zombie, an
    isolated coordinator back on the network) overwrote a published version.
    """

    def __init__(self, tables: Sequence[str]) -> None:
        self._dirs = [Path(t) / "_delta_log" for t in tables]
        self._seen: dict[Path, tuple[tuple[int, int, int], str]] = {}
        self.changes: list[str] = []
        self._next = 0.0

    @property
    def files(self) -> int:
        return len(self._seen)

    def scan(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + 1.0
        for d in self._dirs:
            try:
                names = set(os.listdir(d))
            except FileNotFoundError:
                names = set()
            for path in [p for p in self._seen if p.parent == d and p.name not in names]:
                self.changes.append(f"{path} disappeared after publication")
                del self._seen[path]
            for name in names:
                if not (len(name) == 25 and name.endswith(".json") and name[:20].isdigit()):
                    continue
                path = d / name
                try:
                    st = path.stat()
                    sig = (st.st_ino, st.st_size, st.st_mtime_ns)
                    old = self._seen.get(path)
                    if old is not None and old[0] == sig:
                        continue
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                except FileNotFoundError:
                    continue
                if old is not None:
                    same = "same bytes, replaced" if old[1] == digest else "bytes changed"
                    self.changes.append(f"{path} rewritten after publication ({same})")
                self._seen[path] = (sig, digest)


class ChaosRun:
    def __init__(self, bootstrap: str, broker: LocalBroker | LocalCluster | None, cfg: ChaosConfig, workdir: Path,
                 paths: Mapping[str, NetPath] | None = None, clients: ChaosClients | None = None,
                 on_topics: Callable[[Topics], None] | None = None, store: StoreOutage | None = None) -> None:
        """`clients`: each role's Kafka settings (default: none, an open broker); `on_topics` is called with the
        run's topics once they exist (a secured run applies its ACL plan for them there); `store`: the local S3
        server for ``cfg.storage == "s3"``."""
        if cfg.storage not in STORAGES:
            raise ChaosError(f"storage {cfg.storage!r}: choose one of {', '.join(STORAGES)}")
        if cfg.storage == "s3" and store is None:
            raise ChaosError("tables on S3 asked for, but no local S3 server was given (the long form starts one "
                             "with --storage s3)")
        if cfg.store_outages and cfg.storage != "s3":
            raise ChaosError(f"{cfg.store_outages} store outage(s) asked for, but the tables are not on the local S3 "
                             "server: add --storage s3")
        if cfg.broker_restarts and broker is None:
            raise ChaosError(f"{cfg.broker_restarts} broker restart(s) asked for, but the broker is not a LocalBroker "
                             "this run can kill and restart")
        if cfg.leader_kills and not isinstance(broker, LocalCluster):
            raise ChaosError(f"{cfg.leader_kills} partition-leader kill(s) asked for, but there is no LocalCluster "
                             "whose nodes this run can kill (the long form starts one with --brokers 3)")
        if cfg.isolations and len(paths or {}) < 2:
            raise ChaosError(f"{cfg.isolations} coordinator isolation(s) asked for, but they need two network paths "
                             "(one to cut, one for the replacement); see netpath.start_cluster_with_paths")
        self.paths = dict(paths or {})
        self.bootstrap = bootstrap
        self.clients = clients or ChaosClients()
        self.broker = broker
        self.cfg = cfg
        self.workdir = workdir
        self.rng = random.Random(cfg.seed)
        self.faults = FaultLog()
        self.hist_dir = workdir / "history"
        self.hist_dir.mkdir(parents=True, exist_ok=True)
        (workdir / "coordinators").mkdir(exist_ok=True)
        self.topics = fresh_topics(bootstrap, partitions=1, kafka=self.clients.admin)
        _wait_topics_ready(bootstrap, self.topics, self.clients.admin)
        if on_topics is not None:
            on_topics(self.topics)
        self.prefix = self.topics.proposals.removesuffix(".proposals")
        self.store = store
        coordinator_args: list[str] = []
        if store is not None and cfg.storage == "s3":
            bucket = f"chaos-{uuid.uuid4().hex[:12]}"
            store.server.create_bucket(bucket)
            options = tuple(sorted(store.info.storage_options.items()))
            self.specs = tuple(TableSpec(f"s3://{bucket}/table-{lvl.lower()}", lvl, options)
                               for lvl in cfg.isolation_levels)
            # versitygw keeps each object as a plain file under data/<bucket>/<key>: watched there.
            log_dirs = [str(store.data_dir / bucket / f"table-{lvl.lower()}") for lvl in cfg.isolation_levels]
            coordinator_args = ["--table-roots", f"s3://{bucket}"]
            for k, v in options:
                coordinator_args += ["--storage-option", f"{k}={v}"]
        else:
            self.specs = tuple(TableSpec(str((workdir / f"table-{lvl.lower()}").resolve()), lvl)
                               for lvl in cfg.isolation_levels)
            log_dirs = [spec.uri for spec in self.specs]
        self.fleet = Fleet(bootstrap, self.topics, workdir / "coordinators", self.faults, self.paths, self.clients,
                           coordinator_args)
        self._dl_watch = _DeltaLogWatch(log_dirs)
        self.relay: RelayProcess | None = None
        if cfg.writers_through_relay() or cfg.relay_kills:
            self.relay = RelayProcess(bootstrap, self.topics, relay_socket_path(), workdir / "relay.log",
                                      kafka=self.clients.writer)
        self._watchdog = _Watchdog(bootstrap, self.topics, cfg.watchdog_s, self.clients.admin)
        self.ctx = multiprocessing.get_context("spawn")
        self.writers: dict[int, tuple[BaseProcess, WriterConfig]] = {}
        self.history_files: list[Path] = [self.hist_dir / "setup.jsonl"]
        self._done_writers: list[int] = []

    # -- processes ----------------------------------------------------------------------------
    def _spawn_writer(self, writer_id: int, transactions: int, crash_at: int | None) -> None:
        out = self.hist_dir / f"writer-{writer_id}.jsonl"
        wc = WriterConfig(writer_id=writer_id, bootstrap=self.bootstrap, topic_prefix=self.prefix, tables=self.specs,
                          transactions=transactions, seed=self.cfg.seed * 1000 + writer_id, out_path=str(out),
                          decision_timeout_s=self.cfg.decision_timeout_s, crash_after_propose_at=crash_at,
                          think_s=self.cfg.writer_think_s, kafka=dict(self.clients.writer),
                          relay=self._relay_for(writer_id))
        proc = self.ctx.Process(target=writer_main, args=(wc,), name=f"history-writer-{writer_id}", daemon=True)
        proc.start()
        self.writers[writer_id] = (proc, wc)
        self.history_files.append(out)

    def _relay_for(self, writer_id: int) -> str | None:
        """The relay socket of writers 0 .. relay_writers - 1 (and of their replacements), else None."""
        if self.relay is None or writer_id % 100 >= self.cfg.writers_through_relay():
            return None
        return self.relay.socket_path

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

    def _pause(self, seconds: float) -> None:
        """Sleep while keeping the books: coordinator exits, writers, `_delta_log`."""
        deadline = time.monotonic() + seconds
        while True:
            self.fleet.reap()
            self._check_writers()
            self._dl_watch.scan()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.2, left))

    def _pause_running(self, seconds: float) -> None:
        """`_pause`, starting a coordinator whenever none is alive (one crashed at its fault point meanwhile)."""
        deadline = time.monotonic() + seconds
        while True:
            self._pause(min(0.2, max(0.0, deadline - time.monotonic())))
            self.fleet.ensure_running()
            if time.monotonic() >= deadline:
                return

    def _await_takeover(self, cp: CoordinatorProcess, of: str) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.cfg.takeover_timeout_s:
            if _wait_ready(cp, 0.5):
                self.faults.note(f"coordinator {cp.proc.pid} owns the partition ({of} fenced) after "
                                 f"{time.monotonic() - t0:.1f}s")
                return
            if not cp.alive():
                break
            self._pause(0)
        self.faults.note(f"coordinator {cp.proc.pid} did not take over from {of} "
                         f"({'exited' if not cp.alive() else 'timed out'})")

    def _owner(self) -> CoordinatorProcess:
        """The coordinator owning the partition now, after earlier zombies and isolated coordinators
        found out they were fenced (so each fault is watched alone); a new one when none owns it."""
        deadline = time.monotonic() + self.cfg.takeover_timeout_s
        while (self.fleet.zombies or self.fleet.isolated) and time.monotonic() < deadline:
            self._pause(0.2)
        if self.fleet.zombies or self.fleet.isolated:
            self.faults.note(f"still watched: zombies {sorted(self.fleet.zombies)}, isolated {sorted(self.fleet.isolated)}")
        starting = [c for c in self.fleet.targets() if not _wait_ready(c, 0)]
        if starting:  # the newest one will own the partition: let it, rather than race it
            self._await_takeover(starting[-1], "the previous owner")
        owner = self.fleet.owner()
        if owner is not None:
            return owner
        cp = self.fleet.start()
        self.faults.coordinator_restarts += 1
        self._await_takeover(cp, "nobody (no running coordinator owned the partition)")
        return cp

    def _kill(self) -> None:
        running = self.fleet.targets()
        if not running:  # e.g. the last one just exited: start one and kill it while it starts up
            running = [self.fleet.start()]
            self.faults.coordinator_restarts += 1
        victim = self.rng.choice(running)
        time.sleep(self.rng.uniform(0, 0.3))
        self.fleet.sigkill(victim)
        self.faults.coordinator_sigkills += 1
        if not self.fleet.alive():
            self.fleet.start(self._fault_env())
            self.faults.coordinator_restarts += 1

    def _sigstop(self) -> None:
        """A pause of the owner: the same process resumes; it still owns the partition."""
        victim = self._owner()
        time.sleep(self.rng.uniform(0, 0.3))
        self.fleet.sigstop(victim)
        self.faults.sigstops += 1
        self._pause(self.cfg.sigstop_s)
        self.fleet.sigcont(victim)

    def _zombie(self) -> None:
        """SIGSTOP, a replacement fences it (init_transactions with the same transactional id), SIGCONT;
        the resumed process runs on until it finds out and exits 3 (counted by `Fleet.reap`)."""
        victim = self._owner()
        time.sleep(self.rng.uniform(0, 0.3))
        self.fleet.sigstop(victim)
        self.faults.zombies += 1
        replacement = self.fleet.start()
        self.faults.coordinator_restarts += 1
        self._await_takeover(replacement, f"paused coordinator {victim.proc.pid}")
        self.fleet.zombies[victim.proc.pid] = time.monotonic()
        self.fleet.sigcont(victim)

    def _isolate(self) -> None:
        """Cut a running coordinator's network path; a replacement on another path fences it; heal after
        `isolation_s`: the isolated process must find out and exit 3 (counted by `Fleet.reap`)."""
        name = self.fleet.path_of[self._owner().proc.pid]
        mode = MODES[self.faults.isolations % len(MODES)]
        self.paths[name].cut(mode)
        self.faults.isolations += 1
        cut_off = [c.proc.pid for c in self.fleet.alive() if self.fleet.path_of.get(c.proc.pid) == name]
        for pid in cut_off:
            self.fleet.isolated[pid] = time.monotonic()
        self.faults.note(f"path {name} cut ({mode}): coordinators {cut_off} isolated from the brokers")
        replacement = self.fleet.start()
        self.faults.coordinator_restarts += 1
        self._await_takeover(replacement, f"isolated coordinator(s) {cut_off}")
        self._pause(self.cfg.isolation_s)
        self.paths[name].heal()
        self.faults.note(f"path {name} healed")

    def _leader_kill(self) -> None:
        """SIGKILL the node leading the proposals or commits partition; restart it once another leads."""
        cluster = self.broker
        assert isinstance(cluster, LocalCluster)
        lagging = cluster.wait_in_sync(120)
        if lagging:
            self.faults.note(f"replicas still out of sync before a leader kill: {lagging[:3]}")
        kind = "proposals" if self.faults.leader_kills % 2 == 0 else "commits"
        topic = getattr(self.topics, kind)
        leader = cluster.leader(topic)
        time.sleep(self.rng.uniform(0, 0.3))
        t0 = time.monotonic()
        cluster.kill_node(leader)
        self.faults.note(f"{kind}[0] leader node {leader} SIGKILLed")
        new = leader
        while new == leader and time.monotonic() - t0 < 120:
            self._pause(0.5)
            with contextlib.suppress(Exception):
                new = cluster.leader(topic, timeout_s=5)
        moved_s = time.monotonic() - t0
        self.faults.note(f"{kind}[0] led by node {new} after {moved_s:.1f}s")
        self._pause(self.rng.uniform(0.5, 3.0))
        t1 = time.monotonic()
        cluster.start_node(leader)
        self.faults.leader_kills += 1
        self.faults.leader_kill_log.append(f"{kind}[0] leader node {leader} SIGKILLed; node {new} led after "
                                           f"{moved_s:.1f}s; node {leader} back in {time.monotonic() - t1:.1f}s")
        self.faults.note(f"node {leader} restarted")
        self._watchdog.reset()

    def _broker_restart(self) -> None:
        """SIGKILL the broker (every node of a cluster) and start it again on the same ports and data."""
        assert self.broker is not None
        time.sleep(self.rng.uniform(0, 0.3))
        self.broker.kill()
        self.faults.note("broker SIGKILLed")
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.broker.start()
        self.faults.broker_restarts += 1
        self.faults.note("broker restarted")
        self._watchdog.reset()

    def _relay_kill(self) -> None:
        """SIGKILL the writers' relay and start a new one on the same socket: its writers see unknown outcomes
        (retried with the same proposal id) or refused sends, and carry on through the new relay."""
        assert self.relay is not None
        time.sleep(self.rng.uniform(0, 0.3))
        self.relay.kill()
        self.faults.relay_kills += 1
        self.faults.note("relay SIGKILLed")
        self._pause(self.rng.uniform(0.2, 2.0))
        self.relay.start()
        self.faults.note(f"relay restarted on {self.relay.socket_path}")

    def _store_outage(self) -> None:
        """Stop the S3 server for `store_outage_s`, start it on the same port and data; note how long after
        the restart a new `_delta_log` version appears (publication resumed).

        Writers cannot plan without the store (they read the table and stage files there), so only proposals
        already planned meet the outage. To make sure some do, the owning coordinator is paused for a moment
        first (writers' proposals pile up) and resumed once the store is down: it decides them with no store
        to publish to, and must hold their publication until the store is back."""
        assert self.store is not None
        owner = self._owner()
        self.fleet.sigstop(owner)
        self._pause(self.rng.uniform(1.0, 3.0))
        before = self._commit_records()
        self.store.stop()
        self.fleet.sigcont(owner)
        self._dl_watch.scan(force=True)  # what it published before the store stopped
        files = self._dl_watch.files
        self.faults.note(f"S3 server stopped for {self.cfg.store_outage_s:.0f}s")
        self._pause_running(self.cfg.store_outage_s)  # the watchdog waits: no store, no progress expected
        during = self._commit_records() - before
        self._dl_watch.scan(force=True)
        published_during = self._dl_watch.files - files
        self.store.restart()
        self.faults.store_outages += 1
        t_up = time.monotonic()
        self.faults.note(f"S3 server restarted on the same port and data ({during} commit records written and "
                         f"{published_during} versions published while it was down)")
        self._watchdog.reset()
        resumed: str = "none within 120s"
        while time.monotonic() - t_up < 120:
            if not self.writers:
                resumed = "not seen (the writers were done)"
                break
            self._dl_watch.scan(force=True)
            if self._dl_watch.files > files:
                resumed = f"{time.monotonic() - t_up:.1f}s after its restart"
                break
            self._pause_running(0.2)
            self._liveness()
        self.faults.store_outage_log.append(f"S3 down {self.cfg.store_outage_s:.1f}s: {during} commit records written, "
                                            f"{published_during} versions published meanwhile; publication resumed "
                                            f"{resumed}")
        self.faults.note(f"publication resumed {resumed}")

    def _commit_records(self) -> int:
        """The commits partition's end offset (-1 when the broker does not answer in time)."""
        try:
            return int(self._watchdog.commits_end())
        except Exception:
            return -1

    def _race(self) -> None:
        self.fleet.start()
        self.faults.racing_coordinators += 1

    def _liveness(self) -> None:
        # A coordinator still starting (importing, fencing its predecessor, recovering: a minute at CI's load)
        # decides nothing yet: the stall counts once the newest running coordinator has logged it is ready, or
        # has been starting for longer than `startup_s`.
        running = self.fleet.targets()
        starting = self.fleet.starting_for(running[-1]) if running else 0.0
        if starting is not None and starting < self.cfg.startup_s:
            self._watchdog.reset()
            return
        if not self._watchdog.wedged():
            return
        for c in self.fleet.alive():
            self.fleet.sigkill(c, f"SIGKILLed by the watchdog (no decision for {self.cfg.watchdog_s:.0f}s with proposals pending)")
        self.fleet.start()
        self.faults.watchdog_restarts += 1
        self.faults.coordinator_restarts += 1
        self._watchdog.reset()

    def _fault(self, kind: str) -> None:
        {"kill": self._kill, "sigstop": self._sigstop, "broker": self._broker_restart, "race": self._race,
         "zombie": self._zombie, "isolate": self._isolate, "leader": self._leader_kill, "relay": self._relay_kill,
         "store": self._store_outage}[kind]()
        self._watchdog.reset()

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        cfg = self.cfg
        per_writer = math.ceil(cfg.transactions / cfg.writers)
        total = per_writer * cfg.writers
        try:
            if self.relay is not None:
                self.relay.start()
            self.fleet.start()
            for spec in self.specs:
                create_table(spec, self.bootstrap, self.prefix, self.history_files[0], kafka=self.clients.writer)
            crashers = self.rng.sample(range(cfg.writers), min(cfg.writer_kills, cfg.writers))
            for w in range(cfg.writers):
                crash_at = self.rng.randint(per_writer // 4, max(per_writer // 4, 3 * per_writer // 4)) if w in crashers else None
                self._spawn_writer(w, per_writer, crash_at)
            schedule = _schedule(cfg, self.rng, total)
            progress = _Progress()
            last_progress, last_change = -1, time.monotonic()
            last_fault_at = -1
            waves = 0
            while self.writers or schedule:
                if not self.writers:
                    # Slow faults (leader kills, isolations, waiting for zombies) let the writers finish
                    # before every fault ran: keep a load on, a fault on an idle system proves little.
                    waves += 1
                    extra = max(4, per_writer // 10)
                    self.faults.note(f"writers done with {len(schedule)} fault(s) left: {cfg.writers} more writers "
                                     f"x {extra} transactions")
                    for w in range(cfg.writers):
                        self._spawn_writer(1000 * waves + w, extra, None)
                    self.faults.extra_transactions += cfg.writers * extra
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
                self._dl_watch.scan()
                self.fleet.ensure_running()
                self._liveness()
                self._check_writers()
                if time.monotonic() - t_loop > 2:
                    self.faults.note(f"controller loop took {time.monotonic() - t_loop:.1f}s "
                                     f"(watchdog errors {self._watchdog.errors}: {self._watchdog.last_error})")
                time.sleep(0.05)
            return self._finish(t0)
        finally:
            self._watchdog.close()
            for proc, _wc in self.writers.values():
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
            self.fleet.stop_all()
            if self.relay is not None:
                self.relay.stop()

    def _finish(self, t0: float) -> dict[str, Any]:
        for c in self.fleet.alive():
            self.fleet.sigcont(c)
        self.fleet.ensure_running()
        def tick() -> None:
            self.fleet.ensure_running()
            self._liveness()

        drained = _wait_drained(self.bootstrap, self.topics, 120, tick, self.clients.admin)
        # Resumed zombies and reconnected coordinators read the proposals their replacement decided,
        # try to commit their own decisions and find out they are fenced: give them the time to.
        deadline = time.monotonic() + 60
        while (self.fleet.zombies or self.fleet.isolated) and time.monotonic() < deadline:
            self._pause(0.5)
        settings = CoordinatorSettings(bootstrap_servers=self.bootstrap, topics=self.topics, group_id=f"{self.prefix}-check",
                                       kafka=dict(self.clients.admin))
        decisions: list[Decision] = list(read_decisions(settings, 0))
        records = read_jsonl([p for p in self.history_files if p.exists()])
        txns = txns_from_records(records)
        self._dl_watch.scan(force=True)
        report: dict[str, Any] = {"drained": drained, "tables": {}, "verify": {}, "cluster": self._replication()}
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

            from deltacoord.reader.snapshot import Snapshot

            opts = spec.storage_options
            final = {"deltacoord reader": _rows(Snapshot.load(spec.uri, storage_options=opts).to_pyarrow()),
                     "delta-rs": _rows(DeltaTable(spec.uri, storage_options=opts or None).to_pyarrow_table())}
            rep = check_history([t for t in txns if t.table == spec.table_id], decs, spec.isolation, table=spec.uri,
                                final_rows=final)
            reports.append(rep)
            report["tables"][spec.isolation] = {**rep.summary(), "head": head, "published": published}
            vr = verify_table(settings, spec.uri, spec.table_id, num_partitions=1, storage_options=spec.storage_options)
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
            repeat_answers=sum(r.repeat_answers for r in reports),
            commit_calls=_commit_calls(records),
            lost=sum(len(r.lost) for r in reports),
            duplicated=sum(len(r.duplicated) for r in reports),
            anomalies=sum(len(r.anomalies) for r in reports),
            false_conflicts=sum(len(r.false_conflicts) for r in reports),
            verify_ok=all(v["ok"] for v in report["verify"].values()),
            delta_log_files_watched=self._dl_watch.files,
            delta_log_rewrites=self._dl_watch.changes,
            faults={k: v for k, v in vars(self.faults).items() if k != "t0"},
            elapsed_s=round(time.monotonic() - t0, 1),
            workdir=str(self.workdir),
        )
        report["ok"] = bool(
            drained and report["verify_ok"] and all(r.ok for r in reports) and not self._dl_watch.changes
            and all(t["published"] for t in report["tables"].values())
        )
        return report


    def _replication(self) -> dict[str, Any]:
        """How the run's topics are replicated (what the cluster really gave them)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.clients.admin})
        md = admin.list_topics(timeout=30)
        out: dict[str, Any] = {"brokers": len(md.brokers)}
        for kind in ("proposals", "commits"):
            topic = getattr(self.topics, kind)
            entries = describe_topic_config(admin, topic)
            out[kind] = {"replication_factor": len(md.topics[topic].partitions[0].replicas),
                         "min_insync_replicas": int(entries["min.insync.replicas"].value)}
        return out


def _commit_calls(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the writers' commit calls raised before their outcome was known: counts by error, the retries with
    the same proposal id, and examples of anything else than the documented outcome errors (a finding)."""
    errors: Counter[str] = Counter()
    other: list[str] = []
    retried = 0
    for r in records:
        if r.get("type") != "complete":
            continue
        retried += int(r.get("attempts", 1)) > 1
        for e in r.get("errors", ()):
            kind, _, what = str(e).partition(":")
            errors[f"{kind}:{what.split(':', 1)[0]}"] += 1
            if kind not in ("unknown", "not_sent") and len(other) < 10:
                other.append(f"{r['proposal_id'][:8]}: {what}")
    return {"errors": dict(sorted(errors.items())), "retried_with_same_id": retried, "other_errors": other}


def run_chaos(bootstrap: str, broker: LocalBroker | LocalCluster | None, cfg: ChaosConfig, workdir: Path,
              paths: Mapping[str, NetPath] | None = None, clients: ChaosClients | None = None,
              on_topics: Callable[[Topics], None] | None = None, store: StoreOutage | None = None) -> dict[str, Any]:
    """Run the workload under faults and return the JSON-able report (`report["ok"]` is the verdict)."""
    return ChaosRun(bootstrap, broker, cfg, workdir, paths, clients, on_topics, store).run()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.history.chaos", description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--transactions", type=int, default=1000, help="proposals in total, over all writers")
    ap.add_argument("--coordinator-kills", type=int, default=50)
    ap.add_argument("--brokers", type=int, default=1, help="1: a single local broker; 3: a local KRaft cluster")
    ap.add_argument("--broker-restarts", type=int, default=None,
                    help="SIGKILL and restart of the broker (all nodes of a cluster); default 2 with one broker, 0 with a cluster")
    ap.add_argument("--leader-kills", type=int, default=0, help="SIGKILLs of the proposals/commits partition leader (cluster only)")
    ap.add_argument("--isolations", type=int, default=0, help="coordinators cut off from every broker (cluster only)")
    ap.add_argument("--isolation-seconds", type=float, default=12.0)
    ap.add_argument("--sigstops", type=int, default=1, help="plain pauses of a coordinator")
    ap.add_argument("--zombies", type=int, default=2, help="paused coordinators fenced by a replacement, then resumed")
    ap.add_argument("--racing", type=int, default=1, help="racing coordinators started on the same partition")
    ap.add_argument("--writer-kills", type=int, default=1)
    ap.add_argument("--writer-think-seconds", type=float, default=0.0, help="mean pause of a writer between transactions")
    ap.add_argument("--relay-kills", type=int, default=0,
                    help="SIGKILLs of the writers' relay, each restarted on the same socket")
    ap.add_argument("--relay-writers", type=int, default=None,
                    help="writers that commit through the relay (default: half of them with --relay-kills, else none)")
    ap.add_argument("--storage", choices=STORAGES, default="local",
                    help="where the tables live: a local directory, or a bucket of a local S3 server (versitygw)")
    ap.add_argument("--store-outages", type=int, default=0, help="stops of the S3 server (needs --storage s3)")
    ap.add_argument("--store-outage-seconds", type=float, default=10.0,
                    help="how long each store outage lasts before the S3 server restarts on the same port and data")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--decision-timeout", type=float, default=30.0)
    ap.add_argument("--bootstrap-servers", default=None, help="an external broker (no broker restarts then)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep histories, logs and tables here")
    args = ap.parse_args(argv)
    broker_restarts = args.broker_restarts if args.broker_restarts is not None else (2 if args.brokers == 1 else 0)
    if args.bootstrap_servers and broker_restarts:
        ap.error("broker restarts need the local broker this command starts; pass --broker-restarts 0 with --bootstrap-servers")
    if args.bootstrap_servers and (args.leader_kills or args.isolations):
        ap.error("leader kills and isolations need the local cluster this command starts (--brokers 3), not --bootstrap-servers")
    if args.brokers < 1:
        ap.error(f"--brokers must be at least 1, not {args.brokers}")
    if args.brokers == 1 and (args.leader_kills or args.isolations):
        ap.error("leader kills and isolations need a cluster: add --brokers 3")
    if args.store_outages and args.storage != "s3":
        ap.error("store outages stop the local S3 server holding the tables: add --storage s3")
    if args.relay_writers is not None and not 0 <= args.relay_writers <= args.writers:
        ap.error(f"--relay-writers must be between 0 and --writers ({args.writers}), not {args.relay_writers}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    cfg = ChaosConfig(writers=args.writers, transactions=args.transactions, coordinator_kills=args.coordinator_kills,
                      sigstops=args.sigstops, zombies=args.zombies, broker_restarts=broker_restarts,
                      leader_kills=args.leader_kills, isolations=args.isolations, isolation_s=args.isolation_seconds,
                      racing_coordinators=args.racing, writer_kills=args.writer_kills, seed=seed,
                      decision_timeout_s=args.decision_timeout, writer_think_s=args.writer_think_seconds,
                      relay_kills=args.relay_kills, relay_writers=args.relay_writers, storage=args.storage,
                      store_outages=args.store_outages, store_outage_s=args.store_outage_seconds)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="deltacoord-history-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker | LocalCluster | None = None
    paths: dict[str, NetPath] = {}
    bootstrap = args.bootstrap_servers
    s3: S3Server | None = None
    try:
        store: StoreOutage | None = None
        if args.storage == "s3":
            s3 = S3Server(home=workdir / "s3-server")
            s3.start(die_with_parent=True)
            store = StoreOutage(s3)
        if bootstrap is None and args.brokers > 1:
            broker, paths = start_cluster_with_paths(workdir / "cluster", args.brokers)
            layout = broker.layout()
            assert layout is not None
            bootstrap = layout.bootstrap_servers
        elif bootstrap is None:
            broker = LocalBroker(home=workdir / "broker")
            bootstrap = broker.start().bootstrap_servers
        report = run_chaos(bootstrap, broker, cfg, workdir, paths, store=store)
    finally:
        if broker is not None:
            broker.stop()
        close_paths(paths)
        if s3 is not None:
            s3.stop()
    report["seed"] = seed
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
