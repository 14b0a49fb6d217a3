"""Crashes and zombies: SIGKILL at chosen points, and two coordinators on one partition.

Whatever happens, no version is lost, duplicated or published twice, every
proposal gets exactly one decision, and `_delta_log` equals the commits topic.
The crash and fencing tests run with the table in a local directory and on the
local S3 server (the SIGKILL at a checkpoint also on Azure and GCS); the zombie
that resumes after being fenced runs on S3, where only the conditional write
keeps it from replacing a published version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.routing import Topics
from deltacoord.writer.table import Table
from tests.conftest import StoreServer, TablePlace, make_place
from tests.integration.coord_harness import (
    CoordinatorProcess,
    TransactionFaults,
    coordinator_thread,
    fresh_topics,
    start_coordinator_process,
)

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string())])


@pytest.fixture(autouse=True)
def _static_coordinators(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every coordinator here owns partition 0 statically and joins no consumer group, so the writers' check that
    a coordinator serves the partition cannot see it: the writers skip the check."""
    monkeypatch.setenv("DELTACOORD_COORDINATOR_CHECK", "0")


def _wait_until(cond: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _appenders(bootstrap: str, topics: Topics, path: str, writers: int, per_writer: int,
               results: list[int], errors: list[BaseException], storage_options: dict[str, str]) -> list[threading.Thread]:
    def body(w: int) -> None:
        try:
            with Table(path, bootstrap, topics=topics, decision_timeout_s=120, storage_options=storage_options) as t:
                for i in range(per_writer):
                    r = t.append(pa.table({"id": [w * 10_000 + i], "date": [f"2024-01-0{w % 3 + 1}"]}))
                    results.append(r.version)
        except BaseException as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    return threads


def _settings(bootstrap: str, topics: Topics) -> CoordinatorSettings:
    return CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id="verify")


_POINTS = [("after_decide", 4), ("after_kafka_commit", 4), ("checkpoint_before_publish", 1)]


@pytest.mark.parametrize("kind,point,n", [
    *[("local", p, n) for p, n in _POINTS],
    *[("s3", p, n) for p, n in _POINTS],
    ("azure", "checkpoint_before_publish", 1),
    ("gcs", "checkpoint_before_publish", 1),
])
def test_sigkill_at_a_chosen_point_then_restart(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest,
                                                kind: str, point: str, n: int) -> None:
    place: TablePlace = make_place(request, kind, tmp_path)
    topics = fresh_topics(kafka_bootstrap)
    path = place.uri("t")
    log = place.storage(path)
    opts = place.storage_options
    # Static assignment (--partitions 0): the restarted coordinator takes over at once,
    # without waiting for the group to expire the killed member's session.
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", *place.coordinator_args,
                                      env={"DELTACOORD_FAULT": f"{point}:{n}"})
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120, storage_options=opts) as t:
        t.create(SCHEMA, partition_by=["date"], properties={"delta.checkpointInterval": "5", "deltacoord.coalesce": "false"})
    _wait_until(lambda: log.exists(f"_delta_log/{0:020d}.json"), 60, "publication of version 0")
    results: list[int] = []
    errors: list[BaseException] = []
    threads = _appenders(kafka_bootstrap, topics, path, writers=4, per_writer=8, results=results, errors=errors,
                         storage_options=opts)
    first.proc.wait(120)
    assert first.proc.returncode == -9, f"the fault point {point} was not reached (exit {first.proc.returncode})"
    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", *place.coordinator_args)
    try:
        for th in threads:
            th.join(180)
        assert not errors, errors
        assert sorted(results) == list(range(1, 33)), "every append commits exactly once at contiguous versions"
        # The killed coordinator may have answered every writer: the restarted one must
        # still finish its recovery (sweep, re-publication, checkpoints) before it stops.
        _wait_until(lambda: "coordinator ready" in second.log.read_text(errors="replace"), 120, "the restarted coordinator")
        _wait_until(lambda: log.exists(f"_delta_log/{32:020d}.json"), 60, "publication of the last version")
        if point == "checkpoint_before_publish":
            # The restarted coordinator writes the newest due checkpoint at the table's own
            # interval (5, known from the recovered state), even if the killed process had
            # already published past it; intermediate ones may be skipped, as Delta allows.
            # Wait while it runs: the writers may all have been answered by the killed one.
            last = "_delta_log/_last_checkpoint"
            _wait_until(lambda: log.exists(f"_delta_log/{30:020d}.checkpoint.parquet"), 120, "checkpoint 30")
            _wait_until(lambda: log.exists(last) and json.loads(log.get(last))["version"] == 30, 60, "_last_checkpoint at 30")
    finally:
        second.kill(15)
    rep = verify_table(_settings(kafka_bootstrap, topics), path, place.table_id(path), storage_options=opts)
    assert_verified(rep)
    assert rep.topic_versions == 33 and rep.published_versions == 33
    assert not [k for k, _ in log.list_keys("_delta_log") if ".json." in k and k.endswith(".tmp")], \
        "no half-written commit file is left visible"
    assert place.delta_table(path).to_pyarrow_table().num_rows == 32
    if point == "checkpoint_before_publish":
        assert place.delta_table(path, version=30).to_pyarrow_table().num_rows == 30


def test_second_coordinator_fences_the_first(kafka_bootstrap: str, tmp_path: Path, table_place: TablePlace) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = table_place.uri("t")
    log = table_place.storage(path)
    # Two coordinators statically assigned the same partition: the zombie case the
    # consumer group normally prevents. Kafka's transactional fencing must still hold.
    a: CoordinatorProcess = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                                      *table_place.coordinator_args)
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120, storage_options=table_place.storage_options) as t:
        t.create(SCHEMA, partition_by=["date"])
        _wait_until(lambda: log.exists(f"_delta_log/{0:020d}.json"), 60, "publication of version 0")
        for i in range(5):
            t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
        b = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", *table_place.coordinator_args)
        try:
            # Once B owns the partition (its init_transactions fenced A), both consume it and only B's
            # transactions can commit; A learns it is fenced at its next transaction.
            _wait_until(lambda: "coordinator ready" in b.log.read_text(errors="replace"), 120, "the second coordinator")
            for i in range(5, 15):
                t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
            _wait_until(lambda: not a.alive(), 60, "the fenced coordinator to exit")
            assert a.proc.returncode == 3, f"fenced coordinator exit code {a.proc.returncode}"
            assert "fenced" in a.log.read_text()
            assert b.alive()
            for i in range(15, 20):
                t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
            _wait_until(lambda: log.exists(f"_delta_log/{20:020d}.json"), 60, "publication")
        finally:
            b.kill(15)
    rep = verify_table(_settings(kafka_bootstrap, topics), path, table_place.table_id(path),
                       storage_options=table_place.storage_options)
    assert_verified(rep)
    assert rep.topic_versions == 21
    assert sorted(table_place.delta_table(path).to_pyarrow_table().column("id").to_pylist()) == list(range(20))


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_fenced_zombie_never_replaces_a_published_version_on_s3(kafka_bootstrap: str, tmp_path: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    """A coordinator paused between its Kafka commit and the publication of that version resumes
    after a successor fenced it and published the version: its conditional write is refused, the
    object is not replaced, it stops as fenced, and `deltacoord verify` finds nothing wrong."""
    place = make_place(request, "s3", tmp_path)
    topics = fresh_topics(kafka_bootstrap)
    path = place.uri("t")
    log = place.storage(path)
    v2 = f"_delta_log/{2:020d}.json"
    # The third batch (create, append, append) stops the process right after its Kafka commit.
    a = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", *place.coordinator_args,
                                  env={"DELTACOORD_FAULT": "after_kafka_commit:3:stop"})
    b: CoordinatorProcess | None = None
    try:
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120, storage_options=place.storage_options,
                   wait="ratified") as t:  # version 2 is published only once the successor runs
            t.create(SCHEMA, partition_by=["date"])
            t.append(pa.table({"id": [0], "date": ["2024-01-01"]}))
            assert t.append(pa.table({"id": [1], "date": ["2024-01-01"]})).version == 2  # ratified by A, then A stops
            _wait_until(lambda: _state(a.proc.pid) == "T", 60, "the first coordinator to stop after its Kafka commit")
            assert not log.exists(v2), "the paused coordinator published nothing after its commit"
            b = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", *place.coordinator_args)
            _wait_until(lambda: log.exists(v2), 120, "the successor to publish version 2 from the commits topic")
            ratified = log.get(v2)
            # The object as the S3 server stores it (versitygw's posix backend: one file per object);
            # a replacement would be a new file (another inode) even with the same bytes.
            server: StoreServer = request.getfixturevalue("s3_server")
            backing = server.server.data_dir / place.root.removeprefix("s3://") / "t" / v2
            before = os.stat(backing)
            os.kill(a.proc.pid, signal.SIGCONT)
            # Resumed, A publishes its version 2 once Kafka shows its decision (refused: the object exists).
            # Only then more proposals, which reach both coordinators: A is fenced on its next transaction.
            # (Proposals sent while A was paused would race its publisher, which now asks Kafka first: A's
            # loop could decide them, find version 3 written by B and halt the table before publishing.)
            attempt = f"version 2 of {t.uri} was already published with the same content"
            _wait_until(lambda: attempt in a.log.read_text(errors="replace"), 60,
                        "the resumed coordinator's attempt to publish version 2")
            for i in range(2, 8):
                t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
            a.proc.wait(60)
            assert a.proc.returncode == 3, f"the zombie's exit code {a.proc.returncode}"
            after = os.stat(backing)
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "version 2 was replaced"
            assert log.get(v2) == ratified
            _wait_until(lambda: log.exists(f"_delta_log/{8:020d}.json"), 60, "publication of version 8")
    finally:
        if a.alive():
            os.kill(a.proc.pid, signal.SIGCONT)
            a.kill()
        if b is not None:
            b.kill(15)
    prefix = topics.proposals.removesuffix(".proposals")
    storage_args = [x for k, v in place.storage_options.items() for x in ("--storage-option", f"{k}={v}")]
    verify = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "verify", path, "--bootstrap-servers",
                             kafka_bootstrap, "--topic-prefix", prefix, *storage_args], capture_output=True, text=True,
                            timeout=300)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    report = json.loads(verify.stdout)
    assert report["ok"] and report["problems"] == [] and report["published_versions"] == 9


def test_watchdog_exits_a_coordinator_whose_loop_is_stuck(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A loop stuck inside a client call (seen: librdkafka after a broker restart) must not hang forever."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # 60 s, not less: the watchdog also watches start-up, whose steps (topic checks, the consumer, recovery) each
    # beat once they answer; at load 20 on two cores one of them took over 4 s and a 4 s watchdog exited before
    # the coordinator had decided anything, and CI runs at load 20-45.
    stuck = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--watchdog-seconds", "60",
                                      env={"DELTACOORD_FAULT": "after_decide:2:hang"})
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=600) as t:
        t.create(SCHEMA)
        result: list[int] = []
        th = threading.Thread(target=lambda: result.append(t.append(pa.table({"id": [1], "date": ["d"]})).version))
        th.start()
        stuck.proc.wait(300)  # start-up, two decisions, then the 60 s the watchdog allows the hung loop
        assert stuck.proc.returncode == 4, f"watchdog exit code {stuck.proc.returncode}"
        assert "no progress" in stuck.log.read_text()
        # A restarted coordinator decides the proposal the stuck one never committed.
        fresh = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
        try:
            th.join(600)
            assert result == [1], f"the append was not decided by the restarted coordinator: {result}"
        finally:
            fresh.kill(15)


@pytest.mark.slow
def test_a_stuck_send_offsets_call_gets_its_producer_replaced(kafka_bootstrap: str, tmp_path: Path) -> None:
    """librdkafka can block in send_offsets_to_transaction for ever when the group coordinator's
    broker dies (seen on the three-broker cluster when that broker was killed): the coordinator
    replaces its producer after `send_offsets_timeout_s` and carries on, in the same process."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # The loop stalls send_offsets_timeout_s (20 s) + 5 s: the watchdog must not be what acts. The group's offset
    # in every transaction (--group-offset-seconds 0), so the second call is the first append's.
    coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--watchdog-seconds", "90",
                                      "--group-offset-seconds", "0", env={"DELTACOORD_FAULT": "send_offsets:2:hang"})
    try:
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
            t.create(SCHEMA)
            versions = [t.append(pa.table({"id": [i], "date": ["d"]})).version for i in range(4)]
        assert versions == [1, 2, 3, 4]
        assert coord.alive(), coord.log.read_text(errors="replace")[-3000:]
        log = coord.log.read_text(errors="replace")
        assert "send_offsets_to_transaction still blocked" in log and "replacing the transactional producer" in log
        _wait_until(lambda: (path / "_delta_log" / f"{4:020d}.json").exists(), 60, "publication of version 4")
    finally:
        coord.kill(15)
    assert coord.proc.returncode == 0
    rep = verify_table(_settings(kafka_bootstrap, topics), path.as_uri(), path.resolve().as_uri())
    assert_verified(rep)
    assert rep.topic_versions == 5


def _dying_abort(monkeypatch: pytest.MonkeyPatch, faults: TransactionFaults) -> list[int]:
    """The coordinators' producers raise, at the first abort after a transaction `faults` failed, the fatal
    INVALID_TXN_STATE with which the broker answers an EndTxn that came before the transaction's AddPartitionsToTxn
    was done; how many times they did (a list of one count)."""
    import deltacoord.coordinator.kafka.batch_transaction as batch_transaction

    killed = [0]

    class DyingAbort(Producer):
        def abort_transaction(self, *args: object) -> None:
            if faults.failed and not killed[0]:
                killed[0] += 1
                raise KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction: Broker: "
                                                "Producer attempted a transactional operation in an invalid state",
                                                fatal=True))
            super().abort_transaction(*args)

    monkeypatch.setattr(batch_transaction, "Producer", DyingAbort)
    return killed


def test_an_abort_that_kills_the_producer_without_a_newer_owner_replaces_it(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka can send a failed transaction's abort before the broker has added the transaction's partitions;
    the broker's INVALID_TXN_STATE is then fatal to the producer although no newer coordinator fenced it. The
    coordinator replaces its producer and decides on, in the same process, instead of stopping as if fenced (its
    writers would wait out their timeouts)."""
    faults = TransactionFaults(monkeypatch)
    killed = _dying_abort(monkeypatch, faults)
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics) as coord, \
            Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=60) as t:
        t.create(SCHEMA)
        faults.failing.append(1)  # the first append's transaction
        versions = [t.append(pa.table({"id": [i], "date": ["d"]})).version for i in range(3)]
        failures = coord.metrics.registry.get_sample_value("deltacoord_transaction_failures_total")
    assert (faults.failed, killed[0]) == (1, 1), "one transaction failed, and its abort killed the producer"
    assert versions == [1, 2, 3]
    assert failures == 1
    rep = verify_table(_settings(kafka_bootstrap, topics), path.as_uri(), path.resolve().as_uri())
    assert_verified(rep)
    assert rep.topic_versions == 4


def test_an_abort_that_kills_the_producer_while_recording_a_hold_decides_the_held_proposal_once(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same abort after the transaction recording a held proposal's decision: the partition is rebuilt and
    consumes the held proposal again, which is decided once (not also kept waiting, to be answered again)."""
    from deltacoord.coordinator.kafka.recovery import read_decisions
    from tests.integration.test_big_commits import SCHEMA as WIDE
    from tests.integration.test_big_commits import delta_rs_count, file_copies

    faults = TransactionFaults(monkeypatch)
    killed = _dying_abort(monkeypatch, faults)
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides={"hold_min_actions": 1_000}) as coord, \
            Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=60) as t:
        t.create(WIDE)
        tx = t.begin()
        tx.stage(file_copies(t, 1_500, "h"))
        faults.failing.append(1)  # the transaction recording the hold's decision
        version = tx.commit("WRITE", parameters={"mode": "Append"}).version
        holds = coord.metrics.registry.get_sample_value("deltacoord_holds_total", {"why": "actions"})
    assert (faults.failed, killed[0]) == (1, 1)
    assert version == 1 and holds == 2, (version, holds)
    decisions = [d for d in read_decisions(_settings(kafka_bootstrap, topics), 0) if d.table_id == t.table_id]
    assert [(d.version, d.duplicate_of) for d in decisions] == [(0, None), (1, None)], "each proposal decided once"
    assert delta_rs_count(path) == (1_500, 7 * 1_500)
    assert_verified(verify_table(_settings(kafka_bootstrap, topics), path.as_uri(), path.resolve().as_uri()))


@pytest.mark.slow
def test_a_stuck_coordinator_whose_partition_was_taken_meanwhile_leaves_it_to_the_new_owner(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A coordinator cut off from the brokers gets stuck in send_offsets_to_transaction while a replacement takes
    its partition and decides on. When the stuck call gives up, a new producer's init_transactions would fence the
    replacement back (seen in the secured chaos test: the isolated coordinator took the partition again and the
    replacement exited 3). The group's offset shows that someone else committed beyond what this one did: it
    exits 3 as a fenced coordinator, and the replacement keeps serving."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # The stuck call gives up after 100 + 5 s: time enough for the replacement to start and commit on a loaded
    # machine (at the default 20 s, a CI run's replacement had not even started when the stuck one gave up).
    stuck = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--watchdog-seconds", "300",
                                      "--send-offsets-timeout-seconds", "100", "--group-offset-seconds", "0",
                                      env={"DELTACOORD_FAULT": "send_offsets:2:hang"})
    new_owner: CoordinatorProcess | None = None
    try:
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
            t.create(SCHEMA)
            first: dict[str, int] = {}
            appender = threading.Thread(target=lambda: first.setdefault(
                "v", t.append(pa.table({"id": [1], "date": ["d"]})).version), daemon=True)
            appender.start()  # its transaction is where the first coordinator gets stuck
            _wait_until(lambda: "fault point send_offsets: this thread hangs" in stuck.log.read_text(errors="replace"), 60,
                        "the first coordinator to reach its stuck call")
            new_owner = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                                  "--group-offset-seconds", "0")
            appender.join(120)
            assert first.get("v") == 1, new_owner.log.read_text(errors="replace")[-3000:]
            assert "still blocked" not in stuck.log.read_text(errors="replace"), "the stuck call gave up too early"
            _wait_until(lambda: not stuck.alive(), 180, "the stuck coordinator to leave")
            assert stuck.proc.returncode == 3, stuck.log.read_text(errors="replace")[-3000:]
            assert "leaving the partition to it" in stuck.log.read_text(errors="replace")
            assert t.append(pa.table({"id": [2], "date": ["d"]})).version == 2
        assert new_owner.alive(), new_owner.log.read_text(errors="replace")[-3000:]
    finally:
        for c in (stuck, new_owner):
            if c is not None and c.alive():
                c.kill(15)
    rep = verify_table(_settings(kafka_bootstrap, topics), path.as_uri(), path.resolve().as_uri())
    assert_verified(rep)
    assert rep.topic_versions == 3


def _group_offset(bootstrap: str, topics: Topics) -> int:
    from confluent_kafka import Consumer, TopicPartition

    from tests.integration.coord_harness import coordinator_group

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": coordinator_group(topics), "enable.auto.commit": False})
    try:
        return max(0, c.committed([TopicPartition(topics.proposals, 0)], timeout=30)[0].offset)
    finally:
        c.close()


def test_restart_resumes_after_the_offset_the_records_carry_not_the_lagging_group_offset(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A transaction records the proposals offset it consumed up to in its commits-topic records
    (`deltacoord.next_offset`) and commits it to the group only every second (or when idle). A coordinator
    killed right after a transaction leaves the group's offset behind its records; the next one resumes
    after the records' offset: no proposal is decided twice, every version commits once, and once idle
    the group's offset catches up with the proposals topic."""
    from confluent_kafka import Consumer, TopicPartition

    from deltacoord.coordinator.kafka.recovery import read_decisions_at

    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    # No offset committed to the group for an hour: the records alone say where to resume.
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--group-offset-seconds",
                                      "3600", env={"DELTACOORD_FAULT": "after_kafka_commit:6"})
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
        t.create(SCHEMA, partition_by=["date"], properties={"deltacoord.coalesce": "false"})  # one version per commit
    results: list[int] = []
    errors: list[BaseException] = []
    threads = _appenders(kafka_bootstrap, topics, path, writers=2, per_writer=6, results=results, errors=errors,
                         storage_options={})
    first.proc.wait(120)
    assert first.proc.returncode == -9, f"the fault point was not reached (exit {first.proc.returncode})"
    nexts: list[int] = []
    recorded = [d.proposal_id for d, _ in read_decisions_at(_settings(kafka_bootstrap, topics), 0, on_next_offset=nexts.append)]
    assert len(recorded) >= 6 and nexts, "the killed coordinator's transactions recorded their offsets"
    lagging = _group_offset(kafka_bootstrap, topics)
    assert lagging < max(nexts), f"the group's offset ({lagging}) lags the records' ({max(nexts)}): the case under test"
    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    try:
        for th in threads:
            th.join(180)
        assert not errors, errors
        assert sorted(results) == list(range(1, 13)), "every append commits exactly once at contiguous versions"
        log_text = second.log.read_text(errors="replace")
        assert f"resuming at proposals offset {max(nexts)} (the group's committed offset is {lagging})" in log_text, \
            log_text[-2000:]
        c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "probe", "enable.auto.commit": False})
        try:
            high = c.get_watermark_offsets(TopicPartition(topics.proposals, 0), timeout=30)[1]
        finally:
            c.close()
        _wait_until(lambda: _group_offset(kafka_bootstrap, topics) == high, 30, "the group's offset to catch up when idle")
    finally:
        second.kill(15)
    ids = [d.proposal_id for d, _ in read_decisions_at(_settings(kafka_bootstrap, topics), 0)]
    assert len(ids) == len(set(ids)) == 13, "one decision per proposal: the create and 12 appends, none decided twice"
    rep = verify_table(_settings(kafka_bootstrap, topics), path, Path(path).resolve().as_uri(), storage_options={})
    assert_verified(rep)
