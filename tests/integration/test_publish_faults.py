"""Publication faults: the filesystem refuses writes, a writer dies mid-commit.

Deciding never depends on `_delta_log` being writable: Kafka is the source of
truth, the publisher retries I/O errors while the coordinator keeps deciding,
the lag shows the backlog, and once the fault clears every ratified version is
published and the table verifies against the commits topic.

(a) An unwritable `_delta_log`. The tests run as root, where chmod does not stop
    writes, so the directory is swapped for a regular file of the same name:
    every publication fails with FileExistsError/NotADirectoryError (OSError).
(b) A full disk, simulated without root-only tricks by RLIMIT_FSIZE on a child
    coordinator: any write past a few bytes fails with EFBIG (CPython ignores
    SIGXFSZ), the same OSError path as ENOSPC, including a half-written temp file.
(c) A writer SIGKILLed after proposing, before hearing the decision: its proposal
    still gets exactly one decision, found with `lookup_decision`; a committed
    one's staged file is live, a rejected one's is an orphan `verify_table` lists.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import resolve_data_path
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.routing import Topics
from deltacoord.tooling.ports import free_port
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics, start_coordinator_process

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string())])
ROOT_DIR = Path(__file__).resolve().parents[2]


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _settings(bootstrap: str, topics: Topics) -> CoordinatorSettings:
    return CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id="publish-faults-verify")


def _commit_file(root: Path, v: int) -> Path:
    return root / "_delta_log" / f"{v:020d}.json"


@contextmanager
def _delta_log_replaced_by_a_file(root: Path) -> Iterator[None]:
    log = root / "_delta_log"
    away = root / "_delta_log.away"
    os.rename(log, away)
    log.write_bytes(b"not a directory")
    try:
        yield
    finally:
        log.unlink()
        os.rename(away, log)


def test_unwritable_delta_log_lags_then_catches_up(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    # wait="ratified": commits return while nothing can be published (a default commit would wait for it).
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint) as coord, \
            Table(root, kafka_bootstrap, topics=topics, wait="ratified") as t:
        t.create(SCHEMA, partition_by=["date"], properties={"delta.checkpointInterval": "4"})
        for i in range(3):
            t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
        # The writer can read its decision before the coordinator hands the version to the
        # publisher, so an idle publisher alone does not mean version 3 is out yet.
        _wait(lambda: (root / "_delta_log" / f"{3:020d}.json").exists(), 30, "publication of version 3")
        assert coord.wait_published(30) and coord.publisher.lag() == 0
        with _delta_log_replaced_by_a_file(root):
            versions = []
            # A blind append reuses the handle's cached snapshot, so it does not wait for publication.
            for i in range(3, 11):
                versions.append(t.append(pa.table({"id": [i], "date": ["2024-01-02"]})).version)
            assert versions == list(range(4, 12)), "deciding goes on while nothing can be published"
            _wait(lambda: coord.publisher.lag() == 8, 10, "the lag to reach the 8 unpublished versions")
            assert coord.metrics.publish_lag._value.get() >= 7  # set after each batch; the last may precede a publish
            ok, health = coord.health()
            assert ok and health["publish_lag"] == 8 and not health["halted_tables"], health
            time.sleep(1.0)  # the publisher keeps retrying; nothing is halted or lost meanwhile
            assert coord.publisher.lag() == 8 and coord.ready and not coord.fenced
        # The directory is back: the retries (backoff <= 5 s) publish everything in order.
        _wait(lambda: coord.publisher.lag() == 0, 30, "the backlog to be published")
        assert coord.wait_published(30)
        _wait(lambda: (root / "_delta_log" / f"{8:020d}.checkpoint.parquet").exists(), 30, "the checkpoint of version 8")
        assert coord.metrics.publish_lag._value.get() == 0
    rep = verify_table(_settings(kafka_bootstrap, topics), root.as_uri(), root.as_uri())
    assert_verified(rep)
    assert rep.published_versions == 12 and 8 in rep.checkpoints_checked
    assert not [p for p in (root / "_delta_log").iterdir() if p.name.endswith(".tmp")]
    from deltalake import DeltaTable

    assert sorted(DeltaTable(str(root)).to_pyarrow_table().column("id").to_pylist()) == list(range(11))



def _publish_lag(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("deltacoord_publish_lag_versions "))
    return float(line.split()[1])


def test_disk_full_simulated_with_a_file_size_limit(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    port = free_port()
    proc = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--no-checkpoints",
                                     "--metrics-port", str(port))
    proc.wait_ready()
    try:
        # Commits return while unpublished; the static coordinator joins no group, so the writers' check cannot see it.
        with Table(root, kafka_bootstrap, topics=topics, wait="ratified", coordinator_check=False) as t:
            t.create(SCHEMA, partition_by=["date"])
            t.append(pa.table({"id": [0], "date": ["2024-01-01"]}))
            t.wait_published(1, 30)
            soft, hard = resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE)
            # Every commit file is longer than 16 bytes: each write stops there with EFBIG, like a full disk.
            resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (16, hard))
            try:
                versions = [t.append(pa.table({"id": [i], "date": ["2024-01-01"]})).version for i in range(1, 6)]
                assert versions == list(range(2, 7))
                _wait(lambda: _publish_lag(port) >= 4, 15, "publish_lag to show the backlog")
                assert not _commit_file(root, 2).exists() and proc.alive()
            finally:
                resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
            _wait(lambda: _commit_file(root, 6).exists(), 30, "the backlog to be published")
            _wait(lambda: _publish_lag(port) == 0, 10, "publish_lag to return to 0")
    finally:
        proc.kill(signal.SIGTERM)
    rep = verify_table(_settings(kafka_bootstrap, topics), root.as_uri(), root.as_uri())
    assert_verified(rep)
    assert rep.published_versions == 7
    assert not [p for p in (root / "_delta_log").iterdir() if p.name.endswith(".tmp")], "half-written temp files are removed"


_WRITER = """
import json, sys, time
import pyarrow as pa
from deltacoord.schemas.routing import Topics
from deltacoord.writer import staging
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction

root, bootstrap, prefix, mode, row = sys.argv[1:6]
t = Table(root, bootstrap, topics=Topics.with_prefix(prefix))
snap = t.snapshot()
if mode == "stale-read":
    # It read the files of version 1; version 2 deleted them: ConcurrentDeleteReadException.
    tx = Transaction(t, 1)
    tx.read_files_from(t.snapshot(1).files())
else:
    tx = Transaction(t, snap.version)
adds = staging.write_data_files(t.root, pa.table({"id": [int(row)], "date": ["2024-01-02"]}), ["date"])
tx.stage(adds)
p = tx.proposal("WRITE", True)
t.client.propose(p)  # produced and flushed; the decision is never awaited
print(json.dumps({"proposal_id": p.proposal_id, "staged": [a.path for a in adds]}), flush=True)
time.sleep(600)
"""


def _propose_and_die(bootstrap: str, topics: Topics, root: Path, mode: str, row: int) -> dict[str, object]:
    prefix = topics.proposals.removesuffix(".proposals")
    # No coordinator runs while it proposes: the writer's check for one is off, or it would propose nothing.
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root), bootstrap, prefix, mode, str(row)],
                            stdout=subprocess.PIPE, cwd=ROOT_DIR,
                            env={**os.environ, "PYTHONPATH": str(ROOT_DIR), "DELTACOORD_COORDINATOR_CHECK": "0"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the writer died before proposing"
        info: dict[str, object] = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return info


def test_writer_killed_before_hearing_its_decision(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    with coordinator_thread(kafka_bootstrap, topics), Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA, partition_by=["date"])
        t.append(pa.table({"id": [1], "date": ["2024-01-01"]}))
        t.delete("date = '2024-01-01'")
        t.wait_published(2, 30)
    # No coordinator runs while the writers propose and die: nobody can have heard a decision.
    committed = _propose_and_die(kafka_bootstrap, topics, root, "append", 100)
    rejected = _propose_and_die(kafka_bootstrap, topics, root, "stale-read", 200)
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        try:
            pid_ok, pid_bad = str(committed["proposal_id"]), str(rejected["proposal_id"])
            decisions = {}
            for pid in (pid_ok, pid_bad):
                deadline = time.monotonic() + 60
                while (d := client.lookup_decision(root.as_uri(), pid, timeout_s=10)) is None:
                    assert time.monotonic() < deadline, f"no decision for {pid}"
                    time.sleep(0.2)
                decisions[pid] = d
        finally:
            client.close()
        assert decisions[pid_ok].committed and decisions[pid_ok].version == 3
        assert not decisions[pid_bad].committed and decisions[pid_bad].error_type == "ConcurrentDeleteReadException"
        assert coord.wait_published(30)
    settings = _settings(kafka_bootstrap, topics)
    per_pid = Counter(d.proposal_id for d in read_decisions(settings, 0))
    assert per_pid[pid_ok] == 1 and per_pid[pid_bad] == 1, "exactly one decision each"

    live = {a.path for a in Snapshot.load(root.as_uri()).files()}
    staged_ok = [str(p) for p in committed["staged"]]  # type: ignore[attr-defined]
    staged_bad = [str(p) for p in rejected["staged"]]  # type: ignore[attr-defined]
    assert set(staged_ok) <= live, "the committed proposal's staged file is part of the table"
    assert all(resolve_data_path(root, p).exists() for p in staged_bad), "nobody was left to delete the loser's file"
    rep = verify_table(settings, root.as_uri(), root.as_uri())
    assert_verified(rep)
    assert rep.orphan_files == staged_bad, "the rejected proposal's staged file is reported as an orphan"
    from deltalake import DeltaTable

    assert sorted(DeltaTable(str(root)).to_pyarrow_table().column("id").to_pylist()) == [100]
