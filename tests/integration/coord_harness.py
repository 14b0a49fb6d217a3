"""Run a real coordinator (in a thread or a child process) against the test broker."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

import deltacoord.coordinator.kafka.batch_transaction as batch_transaction
from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.topics import ensure_topics
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.routing import Topics
from deltacoord.writer.group_questions import GroupQuestions as WriterGroupQuestions
from deltacoord.writer.group_questions import QuestionFailed


def fresh_topics(bootstrap: str, partitions: int = 1, reply_partitions: int = 4,
                 kafka: dict[str, str] | None = None) -> Topics:
    """New topics for one test (a few reply partitions: tests run a handful of writer processes); `kafka`: the
    admin client's other settings (a secured broker's administrator)."""
    topics = Topics.with_prefix(f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap, **(kafka or {})}), topics, partitions=partitions,
                  reply_partitions=reply_partitions)
    return topics


def coordinator_group(topics: Topics) -> str:
    """The consumer group of the harness's coordinators: `<prefix>-coordinator`, where writers look by default."""
    return f"{topics.proposals.removesuffix('.proposals')}-coordinator"


def harness_settings(bootstrap: str, topics: Topics, **overrides: object) -> CoordinatorSettings:
    """The settings `coordinator_thread` runs with (`overrides` replace fields)."""
    fields: dict[str, object] = {"max_proposal_bytes": 4 * 1024 * 1024, "group_id": coordinator_group(topics),
                                 "transactional_id_prefix": f"{topics.proposals}-tx", **overrides}
    return CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, **fields)  # type: ignore[arg-type]


@contextmanager
def coordinator_thread(bootstrap: str, topics: Topics, max_proposal_bytes: int = 4 * 1024 * 1024,
                       table_roots: tuple[str, ...] | None = None, storage_options: dict[str, str] | None = None,
                       settings_overrides: dict[str, object] | None = None,
                       before_run: Callable[[Coordinator], None] | None = None,
                       **kwargs: object) -> Iterator[Coordinator]:
    """A coordinator in this process; stopped gracefully at exit (`table_roots`, `storage_options`: its settings;
    `settings_overrides` replace other fields; `before_run` sees it before it starts). `kwargs` go to `Coordinator`."""
    settings = harness_settings(bootstrap, topics, max_proposal_bytes=max_proposal_bytes, table_roots=table_roots,
                                storage_options=dict(storage_options or {}), **(settings_overrides or {}))
    coord = Coordinator(settings, publish_fsync=False, **kwargs)  # type: ignore[arg-type]
    if before_run is not None:
        before_run(coord)
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.setdefault("code", coord.run()), daemon=True)
    t.start()
    # Group join and recovery: generous, since a loaded machine (CI runs at load 20-45) can take a minute.
    deadline = time.monotonic() + 180
    while not coord.ready and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert coord.ready, (f"coordinator did not become ready within 180 s (thread alive: {t.is_alive()}, exit code: "
                         f"{result.get('code')}; health: {coord.health()[1]})")
    try:
        yield coord
    finally:
        coord.stop_event.set()
        t.join(60)


class TransactionFaults:
    """Fails chosen transactions of the coordinators in this process just before their commit (the fault point
    `before_kafka_commit`): the transactions deciding messages (not idle offset commits) are counted from 1 once
    `failing` names any, and those it names fail. Installed with `monkeypatch` for one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        #: Which deciding transactions fail, counted from when this first names one (empty: none is counted).
        self.failing: list[int] = []
        self.seen = 0
        #: How many transactions were failed so far.
        self.failed = 0
        self._deciding = False  # whether the transaction under way decides messages
        transact = batch_transaction.BatchTransaction._transact

        def noting(txn: batch_transaction.BatchTransaction, batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._deciding = bool(batch)
            return transact(txn, batch, *args, **kwargs)

        monkeypatch.setattr(batch_transaction.BatchTransaction, "_transact", noting)
        monkeypatch.setattr(batch_transaction, "fault_point", self._fault)

    def _fault(self, name: str) -> bool:
        if name != "before_kafka_commit" or not self.failing or not self._deciding:
            return False
        self.seen += 1
        if self.seen in self.failing:
            self.failed += 1
            return True
        return False


@dataclass
class CoordinatorProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(30)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until the child logged "coordinator ready on" (a static one owns its partitions: writers' first
        commits are decided from now on, not while it still starts)."""
        deadline = time.monotonic() + timeout_s
        while b"coordinator ready on" not in self.log.read_bytes():
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])
            assert self.alive(), f"the coordinator exited {self.proc.returncode} before it was ready:\n{tail}"
            assert time.monotonic() < deadline, f"the coordinator was not ready within {timeout_s:.0f}s:\n{tail}"
            time.sleep(0.1)


_STARTED: list[subprocess.Popen[bytes]] = []


def _kill_leftovers() -> None:
    """A failing test must not leave coordinators running after the session."""
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


atexit.register(_kill_leftovers)


def start_coordinator_process(bootstrap: str, topics: Topics, log_dir: Path, *extra: str,
                              env: dict[str, str] | None = None) -> CoordinatorProcess:
    """`deltacoord coordinator run` as a child process (for SIGKILL and fencing tests)."""
    log = log_dir / f"coordinator-{uuid.uuid4().hex[:6]}.log"
    prefix = topics.proposals.removesuffix(".proposals")
    cmd = [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
           "--topic-prefix", prefix, "--group-id", coordinator_group(topics),
           "--transactional-id-prefix", f"{topics.proposals}-tx", "--no-fsync", *extra]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    _STARTED.append(proc)
    if "--partitions" not in extra:
        _wait_joined(bootstrap, coordinator_group(topics), proc)
    return CoordinatorProcess(proc, log)


def _wait_joined(bootstrap: str, group: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    """Until a member of the child's consumer group is assigned a partition: from then on writers see a
    coordinator, however long the child took to start and join on a busy machine (over 60 s at load 45). A child
    that exits or never joins is left to the test to notice."""
    with GroupQuestions({"bootstrap.servers": bootstrap}) as questions:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if any(questions.members(group)):
                return
            time.sleep(0.1)


class GroupQuestions(WriterGroupQuestions):
    """The writers' admin child process for a test's questions about a consumer group: librdkafka aborts the
    process that asks DescribeConsumerGroups when the broker connection drops (a loaded machine, a broker
    restart), and a test process that aborts takes every test after it on that xdist worker along."""

    def __enter__(self) -> GroupQuestions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def members(self, group: str, timeout_s: float = 5.0) -> list[list[tuple[str, int]]]:
        """Each member's assigned partitions; [] when Kafka gave no answer (the caller asks again)."""
        try:
            answer = self.describe([group], timeout_s)[group]
        except QuestionFailed:
            return []
        return [[(t, p) for t, p in m] for m in answer.get("members", ())]


def append_worker(bootstrap: str, prefix: str, table_path: str, writer: int, count: int, out: str,
                  storage_options: dict[str, str] | None = None) -> None:
    """Body of one writer process: `count` one-row blind appends; records versions and latencies as JSON."""
    import json

    import pyarrow as pa

    from deltacoord.writer.table import Table

    t = Table(table_path, bootstrap, topics=Topics.with_prefix(prefix), writer_name=f"w{writer}",
              storage_options=storage_options)
    results = []
    for i in range(count):
        t0 = time.monotonic()
        r = t.append(pa.table({"id": [writer * 1_000_000 + i], "date": [f"2024-01-{writer % 28 + 1:02d}"], "value": [f"w{writer}-{i}"]}))
        results.append({"version": r.version, "proposal_id": r.proposal_id, "ms": (time.monotonic() - t0) * 1000})
    t.close()
    Path(out).write_text(json.dumps(results))
