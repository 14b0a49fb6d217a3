"""Crashes and zombies: SIGKILL at chosen points, and two coordinators on one partition.

Whatever happens, no version is lost, duplicated or published twice, every
proposal gets exactly one decision, and `_delta_log` equals the commits topic.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator.delta_log.verify import assert_verified, verify_table
from coordinator.settings import CoordinatorSettings
from schemas.routing import Topics
from tests.integration.coord_harness import CoordinatorProcess, fresh_topics, start_coordinator_process
from writer.table import Table

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string())])


def _wait_until(cond: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _appenders(bootstrap: str, topics: Topics, path: Path, writers: int, per_writer: int,
               results: list[int], errors: list[BaseException]) -> list[threading.Thread]:
    def body(w: int) -> None:
        try:
            with Table(path, bootstrap, topics=topics, decision_timeout_s=120) as t:
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


@pytest.mark.parametrize("point,n", [("after_decide", 4), ("after_kafka_commit", 4), ("checkpoint_before_publish", 1)])
def test_sigkill_at_a_chosen_point_then_restart(kafka_bootstrap: str, tmp_path: Path, point: str, n: int) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # Static assignment (--partitions 0): the restarted coordinator takes over at once,
    # without waiting for the group to expire the killed member's session.
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                      env={"DELTACOORD_FAULT": f"{point}:{n}"})
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
        t.create(SCHEMA, partition_by=["date"], properties={"delta.checkpointInterval": "5"})
    _wait_until(lambda: (path / "_delta_log" / f"{0:020d}.json").exists(), 60, "publication of version 0")
    results: list[int] = []
    errors: list[BaseException] = []
    threads = _appenders(kafka_bootstrap, topics, path, writers=4, per_writer=8, results=results, errors=errors)
    first.proc.wait(120)
    assert first.proc.returncode == -9, f"the fault point {point} was not reached (exit {first.proc.returncode})"
    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    try:
        for th in threads:
            th.join(180)
        assert not errors, errors
        assert sorted(results) == list(range(1, 33)), "every append commits exactly once at contiguous versions"
        # The killed coordinator may have answered every writer: the restarted one must
        # still finish its recovery (sweep, re-publication, checkpoints) before it stops.
        _wait_until(lambda: "coordinator ready" in second.log.read_text(errors="replace"), 120, "the restarted coordinator")
        _wait_until(lambda: (path / "_delta_log" / f"{32:020d}.json").exists(), 60, "publication of the last version")
        if point == "checkpoint_before_publish":
            # The restarted coordinator writes the newest due checkpoint at the table's own
            # interval (5, known from the recovered state), even if the killed process had
            # already published past it; intermediate ones may be skipped, as Delta allows.
            # Wait while it runs: the writers may all have been answered by the killed one.
            last = path / "_delta_log" / "_last_checkpoint"
            _wait_until(lambda: (path / "_delta_log" / f"{30:020d}.checkpoint.parquet").exists(), 120, "checkpoint 30")
            _wait_until(lambda: last.exists() and json.loads(last.read_text())["version"] == 30, 60, "_last_checkpoint at 30")
    finally:
        second.kill(15)
    rep = verify_table(_settings(kafka_bootstrap, topics), path.as_uri(), path.resolve().as_uri())
    assert_verified(rep)
    assert rep.topic_versions == 33 and rep.published_versions == 33
    assert not list((path / "_delta_log").glob("*.json.*.tmp")), "no half-written commit file is left visible"
    from deltalake import DeltaTable

    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 32
    if point == "checkpoint_before_publish":
        assert DeltaTable(str(path), version=30).to_pyarrow_table().num_rows == 30


def test_second_coordinator_fences_the_first(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # Two coordinators statically assigned the same partition: the zombie case the
    # consumer group normally prevents. Kafka's transactional fencing must still hold.
    a: CoordinatorProcess = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
        t.create(SCHEMA, partition_by=["date"])
        _wait_until(lambda: (path / "_delta_log" / f"{0:020d}.json").exists(), 60, "publication of version 0")
        for i in range(5):
            t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
        b = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
        try:
            # Both now consume the partition; only B's transactions can commit.
            time.sleep(3)
            for i in range(5, 15):
                t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
            _wait_until(lambda: not a.alive(), 60, "the fenced coordinator to exit")
            assert a.proc.returncode == 3, f"fenced coordinator exit code {a.proc.returncode}"
            assert "fenced" in a.log.read_text()
            assert b.alive()
            for i in range(15, 20):
                t.append(pa.table({"id": [i], "date": ["2024-01-01"]}))
            _wait_until(lambda: (path / "_delta_log" / f"{20:020d}.json").exists(), 60, "publication")
        finally:
            b.kill(15)
    rep = verify_table(_settings(kafka_bootstrap, topics), path.as_uri(), path.resolve().as_uri())
    assert_verified(rep)
    assert rep.topic_versions == 21
    from deltalake import DeltaTable

    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == list(range(20))


def test_watchdog_exits_a_coordinator_whose_loop_is_stuck(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A loop stuck inside a client call (seen: librdkafka after a broker restart) must not hang forever."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    stuck = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--watchdog-seconds", "4",
                                      env={"DELTACOORD_FAULT": "after_decide:2:hang"})
    with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
        t.create(SCHEMA)
        result: list[int] = []
        th = threading.Thread(target=lambda: result.append(t.append(pa.table({"id": [1], "date": ["d"]})).version))
        th.start()
        stuck.proc.wait(60)
        assert stuck.proc.returncode == 4, f"watchdog exit code {stuck.proc.returncode}"
        assert "no progress" in stuck.log.read_text()
        # A restarted coordinator decides the proposal the stuck one never committed.
        fresh = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
        try:
            th.join(120)
            assert result == [1]
        finally:
            fresh.kill(15)


def test_a_stuck_send_offsets_call_gets_its_producer_replaced(kafka_bootstrap: str, tmp_path: Path) -> None:
    """librdkafka can block in send_offsets_to_transaction for ever when the group coordinator's
    broker dies (seen on the three-broker cluster when that broker was killed): the coordinator
    replaces its producer after `send_offsets_timeout_s` and carries on, in the same process."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # The loop stalls send_offsets_timeout_s (20 s) + 5 s: the watchdog must not be what acts.
    coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", "--watchdog-seconds", "90",
                                      env={"DELTACOORD_FAULT": "send_offsets:2:hang"})
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
