"""The coordinator shows a decision only once Kafka's read_committed readers see it.

A broker restarted between a transaction's commit and its markers can lose the
markers (coordinator.kafka.stability); the decision is then not on the commits
topic for any reader, and may be aborted later. So publication to `_delta_log`
and every reply wait for the commits partition's last stable offset to pass the
decision's record. Here the real check is wrapped so the test can hold it: while
it is held, Kafka already shows the decision, but nothing of it leaves the
coordinator; released, the writer gets its answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltacoord.coordinator.kafka.daemon import Coordinator
from deltacoord.coordinator.kafka.stability import StableOffsets
from deltacoord.writer import client as client_module
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])


class HeldStability:
    """The coordinator's real check, which the test can hold (answer 'not yet')."""

    def __init__(self, bootstrap: str, commits_topic: str) -> None:
        self.real = StableOffsets({"bootstrap.servers": bootstrap}, commits_topic)
        self.holding = threading.Event()
        self.asked: list[tuple[int, int]] = []

    def __call__(self, partition: int, offset: int) -> bool:
        self.asked.append((partition, offset))
        return not self.holding.is_set() and self.real(partition, offset)


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _held_then_released(held: HeldStability, fn: Callable[[], object]) -> dict[str, object]:
    """Run `fn` while the check is held: it must not return; then release it and return what `fn` did."""
    held.asked.clear()
    held.holding.set()
    t, out = _in_thread(fn)
    deadline = time.monotonic() + 120
    while not held.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.asked, "the coordinator did not ask within 120 s whether its decision is readable"
    time.sleep(1.0)  # the writer waits only for the reply here (REPLY_WAIT_S is raised by the test)
    assert t.is_alive(), f"the call returned while its decision was held: {out}"
    partition, offset = held.asked[-1]
    assert held.real(partition, offset), "Kafka does not show the decision: only the hold should keep it back"
    held.holding.clear()
    t.join(120)
    assert not t.is_alive(), "the call did not return within 120 s of the release"
    return out


def test_publication_and_replies_wait_until_kafka_shows_the_decision(kafka_bootstrap: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # After REPLY_WAIT_S with no reply a writer looks in the commits topic itself, where Kafka already shows the
    # held decision: the call would return for a reason this test does not hold back. Only the reply is waited for.
    monkeypatch.setattr(client_module, "REPLY_WAIT_S", 600.0)
    topics = fresh_topics(kafka_bootstrap)
    held = HeldStability(kafka_bootstrap, topics.commits)

    def install(c: Coordinator) -> None:
        c.publisher.stable = held

    with coordinator_thread(kafka_bootstrap, topics, before_run=install):
        path = tmp_path / "t"
        t = Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=600)
        ratified = Table(path, kafka_bootstrap, topics=topics, wait="ratified", decision_timeout_s=600)
        try:
            assert t.create(SCHEMA).version == 0

            # A default commit: not in _delta_log, not answered, until Kafka shows it.
            def append() -> object:
                assert not (path / "_delta_log" / f"{1:020d}.json").exists()
                return t.append(pa.table({"id": [1]})).version

            out = _held_then_released(held, append)
            assert out == {"result": 1}
            assert DeltaTable(str(path)).version() == 1

            # A reply sent right after the transaction (a ratified-only commit; rejections take the same path)
            # waits too.
            out = _held_then_released(held, lambda: ratified.append(pa.table({"id": [2]})).version)
            assert out == {"result": 2}

        finally:
            t.close()
            ratified.close()
