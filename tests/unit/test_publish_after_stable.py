"""The publisher shows nothing of a decision before Kafka's read_committed readers see it.

`stable` stands for the commits partition's last stable offset (its real query is
tested against the broker in tests/integration/test_stable_offsets.py): a version
decided at an offset the partition does not show yet stays out of `_delta_log`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from deltacoord.coordinator.delta_log import publisher as publisher_module
from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.reader.log import commit_path
from deltacoord.schemas.actions import CommitInfo, Protocol


class Stability:
    """The last stable offset of each commits partition, moved by the test."""

    def __init__(self) -> None:
        self.lso: dict[int, int] = {}
        self.asked = 0
        self.lock = threading.Lock()

    def __call__(self, partition: int, offset: int) -> bool:
        with self.lock:
            self.asked += 1
            return self.lso.get(partition, 0) > offset


def _task(root: Path, v: int, at: int | None) -> PublishTask:
    actions = (CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2)) if v == 0 else (CommitInfo({"operation": "WRITE"}),)
    return PublishTask("t", root.as_uri(), v, actions, None if at is None else (0, at))


def _until(cond: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return True
        time.sleep(0.01)
    return False


def test_a_version_waits_for_the_last_stable_offset(tmp_path: Path) -> None:
    stable = Stability()
    published: list[int] = []
    p = Publisher(fsync=False, stable=stable, on_published=lambda _t, _u, v, _a, _n: published.append(v))
    p.start()
    try:
        p.submit(_task(tmp_path, 0, 10))
        assert _until(lambda: stable.asked >= 3), "the publisher does not ask whether the decision is readable"
        p.submit(_task(tmp_path, 1, 11))  # the next transaction's version
        time.sleep(0.2)
        assert not commit_path(tmp_path, 0).exists() and published == []
        assert p.lag() == 2 and p.unstable_for() is not None
        with stable.lock:
            stable.lso[0] = 11  # version 0's record is readable, version 1's not yet
        assert _until(lambda: published == [0])
        time.sleep(0.2)
        assert published == [0] and not commit_path(tmp_path, 1).exists()
        with stable.lock:
            stable.lso[0] = 12
        assert p.wait_idle(10) and published == [0, 1]
        assert p.unstable_for() is None and p.lag() == 0
    finally:
        p.stop()


def test_versions_read_back_from_kafka_are_not_held(tmp_path: Path) -> None:
    stable = Stability()  # shows nothing: only versions this process decided are held
    p = Publisher(fsync=False, stable=stable)
    p.start()
    try:
        p.submit(_task(tmp_path, 0, None))
        assert p.wait_idle(10) and commit_path(tmp_path, 0).exists()
        assert stable.asked == 0
    finally:
        p.stop()


def test_a_failing_query_publishes_nothing_until_it_answers(tmp_path: Path) -> None:
    calls: list[int] = []

    def flaky(partition: int, offset: int) -> bool:
        calls.append(offset)
        if len(calls) < 4:
            raise RuntimeError("broker away")
        return True

    p = Publisher(fsync=False, stable=flaky)
    p.start()
    try:
        p.submit(_task(tmp_path, 0, 5))
        assert p.wait_idle(10) and commit_path(tmp_path, 0).exists() and len(calls) == 4
    finally:
        p.stop()


def test_a_stop_leaves_an_unreadable_decision_unpublished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "STOP_WAIT_S", 0.3)
    p = Publisher(fsync=False, stable=Stability())
    p.start()
    p.submit(_task(tmp_path, 0, 3))
    started = time.monotonic()
    p.stop(timeout_s=120)
    assert time.monotonic() - started < 60  # it gave up after STOP_WAIT_S, far from waiting out its timeout
    assert not commit_path(tmp_path, 0).exists()
    assert p.published_version("t") == -1 and p.tables["t"].ratified == 0  # reported as unpublished at exit
