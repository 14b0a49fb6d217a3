"""Each table publishes in a lane of its own: its versions in order, tables in parallel, a stalled store
holding back only its own table (`deltacoord.coordinator.delta_log.publisher`)."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from deltacoord.coordinator.delta_log import publisher as publisher_module
from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.reader.log import commit_path
from deltacoord.schemas.actions import CommitInfo, Protocol, commit_to_json_lines


def _task(root: Path, v: int) -> PublishTask:
    actions = (CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2)) if v == 0 else (CommitInfo({"operation": "WRITE"}),)
    return PublishTask(root.name, root.as_uri(), v, actions)


class Published:
    """The versions each table published, in the order the hook saw them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_table: dict[str, list[int]] = {}

    def __call__(self, table_id: str, _uri: str, version: int, _actions: Any, _count: int) -> None:
        with self.lock:
            self.by_table.setdefault(table_id, []).append(version)

    def of(self, table_id: str) -> list[int]:
        with self.lock:
            return list(self.by_table.get(table_id, []))


def _until(cond: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def stalled(monkeypatch: pytest.MonkeyPatch) -> dict[str, threading.Event]:
    """Table name -> an event its store waits for before each write (a store that does not answer)."""
    gates: dict[str, threading.Event] = {}

    def gate(storage: Any) -> None:
        name = str(storage.uri).rstrip("/").rsplit("/", 1)[-1]
        if name in gates:
            assert gates[name].wait(30), f"the stalled store of {name} was never released"

    real_put, real_many = publisher_module.put_if_absent, publisher_module.put_many_if_absent

    def put_if_absent(path: Any, data: bytes, fsync: bool = True) -> Any:
        gate(path.storage)
        return real_put(path, data, fsync=fsync)

    def put_many_if_absent(storage: Any, items: Any, fsync: bool = True) -> Any:
        gate(storage)
        return real_many(storage, items, fsync=fsync)

    monkeypatch.setattr(publisher_module, "put_if_absent", put_if_absent)
    monkeypatch.setattr(publisher_module, "put_many_if_absent", put_many_if_absent)
    return gates


def test_a_stalled_store_holds_back_only_its_own_table(tmp_path: Path, stalled: dict[str, threading.Event]) -> None:
    slow, a, b = tmp_path / "slow", tmp_path / "a", tmp_path / "b"
    stalled["slow"] = threading.Event()
    published = Published()
    p = Publisher(fsync=False, on_published=published, lanes=4)
    p.start()
    try:
        for v in range(5):  # interleaved as a partition decides them
            for root in (slow, a, b):
                p.submit(_task(root, v))
        assert _until(lambda: published.of("a") == [0, 1, 2, 3, 4] and published.of("b") == [0, 1, 2, 3, 4])
        assert published.of("slow") == [] and not commit_path(slow, 0).exists()
        assert p.lag() == 5  # the stalled table's versions, and only them
        stalled["slow"].set()
        assert p.wait_idle(10)
        assert published.of("slow") == [0, 1, 2, 3, 4] and commit_path(slow, 4).exists()
        assert p.lag() == 0
    finally:
        stalled.get("slow", threading.Event()).set()
        p.stop()


def test_more_stalled_tables_than_lanes_wait_but_lose_nothing(tmp_path: Path, stalled: dict[str, threading.Event]) -> None:
    """With every lane held by a stalled store the other tables wait (the bound on requests in flight), and
    publish once a lane frees."""
    roots = [tmp_path / f"s{i}" for i in range(2)] + [tmp_path / "free"]
    for root in roots[:2]:
        stalled[root.name] = threading.Event()
    published = Published()
    p = Publisher(fsync=False, on_published=published, lanes=2)
    p.start()
    try:
        for root in roots:
            p.submit(_task(root, 0))
        time.sleep(0.3)
        assert published.of("free") == []  # both lanes are held
        stalled["s0"].set()
        assert _until(lambda: published.of("free") == [0] and published.of("s0") == [0])
        assert published.of("s1") == []
        stalled["s1"].set()
        assert p.wait_idle(10) and published.of("s1") == [0]
    finally:
        for ev in stalled.values():
            ev.set()
        p.stop()


@pytest.mark.parametrize("lanes", [1, 3, 16])
def test_every_table_publishes_its_versions_in_order(tmp_path: Path, lanes: int) -> None:
    rng = random.Random(lanes)
    roots = [tmp_path / f"t{i}" for i in range(8)]
    next_v = dict.fromkeys(roots, 0)
    published = Published()
    p = Publisher(fsync=False, on_published=published, lanes=lanes)
    p.start()
    try:
        for _ in range(400):  # a partition's decisions: tables interleaved at random, each table's in order
            root = rng.choice(roots)
            p.submit(_task(root, next_v[root]))
            next_v[root] += 1
            if rng.random() < 0.05:
                time.sleep(0.005)  # batches of different sizes
        assert p.wait_idle(30)
        for root in roots:
            assert published.of(root.name) == list(range(next_v[root])), root.name
            assert commit_path(root, next_v[root] - 1).exists()
    finally:
        p.stop()


def test_stop_publishes_what_the_lanes_hold(tmp_path: Path) -> None:
    published = Published()
    p = Publisher(fsync=False, on_published=published, lanes=4)
    p.start()
    for v in range(20):
        for name in ("x", "y", "z"):
            p.submit(_task(tmp_path / name, v))
    p.stop()
    for name in ("x", "y", "z"):
        assert published.of(name) == list(range(20))


def test_lanes_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="lanes"):
        Publisher(lanes=0).start()


def test_a_stalled_table_is_lagging_until_its_versions_are_published(tmp_path: Path,
                                                                    stalled: dict[str, threading.Event]) -> None:
    """What commit coalescing reads: a table with ratified versions its store has not taken is lagging (by how
    many), until they are published."""
    slow, idle = tmp_path / "slow", tmp_path / "idle"
    stalled["slow"] = threading.Event()
    p = Publisher(fsync=False, lanes=2)
    p.start()
    try:
        p.submit(_task(idle, 0))
        assert p.wait_idle(10)
        p.submit(_task(slow, 0))
        assert p.lagging(["slow", "idle", "unknown"]) == {"slow"}
        assert p.lagging(["slow"], by=2) == frozenset()  # one version in flight
        p.submit(_task(slow, 1))
        assert p.lagging(["slow"], by=2) == {"slow"}  # and one queued behind it
        stalled["slow"].set()
        assert p.wait_idle(10) and p.lagging(["slow"]) == frozenset()
    finally:
        stalled.get("slow", threading.Event()).set()
        p.stop()


def test_a_table_is_paced_until_a_version_decided_now_would_reach_its_lane_as_the_one_in_flight_lands(
        tmp_path: Path, stalled: dict[str, threading.Event]) -> None:
    """What the daemon's linger reads: with a version queued behind the one in flight, a table is paced until one
    lands; with one in flight, until its PUT has run for the store's PUT time less the hand-over time (from the
    batch's decision to the lane); an idle lane, or a store faster than the hand-over, is never paced."""
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    stalled["slow"] = threading.Event()
    p = Publisher(fsync=False, lanes=2)
    p.start()
    try:
        held_s = 0.3
        p.submit(dataclasses.replace(_task(slow, 0), decided_at=time.time() - 0.05))
        assert _until(lambda: p.tables["slow"].trying_since is not None)
        time.sleep(held_s)
        stalled["slow"].set()
        assert p.wait_idle(10)
        put_s, handover_s = p.tables["slow"].put_s, p.handover_s
        assert put_s is not None and put_s >= held_s, "the PUT time is measured from its first try to its success"
        assert handover_s is not None and handover_s >= 0.05, "the hand-over is measured from the batch's decision"
        assert p.paced(["slow", "unknown"]) == frozenset(), "an idle lane paces nothing"

        p.tables["slow"].put_s, p.handover_s = 1.0, 0.2  # a PUT of 1 s, a hand-over of 0.2 s
        stalled["slow"].clear()
        p.submit(_task(slow, 1))
        assert _until(lambda: p.tables["slow"].trying_since is not None)
        started = p.tables["slow"].trying_since
        assert started is not None
        assert p.paced(["slow"], now=started + 0.5) == {"slow"}, "decided now, v2 would wait 0.3 s for the lane"
        assert p.paced(["slow"], now=started + 0.9) == frozenset(), "decided now, v2 reaches the lane as v1 lands"
        p.submit(_task(slow, 2))
        assert p.paced(["slow"], now=started + 5.0) == {"slow"}, "one version queued: paced until one lands"

        p.submit(_task(fast, 0))  # a local disk: faster than the hand-over, so deciding at once costs nothing
        assert _until(lambda: p.published_version("fast") == 0)
        fast_put = p.tables["fast"].put_s
        assert fast_put is not None and fast_put < 0.2, f"a local write took {fast_put} s"
        stalled["fast"] = threading.Event()
        p.submit(_task(fast, 1))
        assert _until(lambda: p.tables["fast"].trying_since is not None)
        assert p.paced(["fast"]) == frozenset()
    finally:
        for gate in stalled.values():
            gate.set()
        p.stop()


@pytest.mark.parametrize("together", [False, True], ids=["one-put-each", "flushed-together"])
def test_the_next_version_is_free_since_the_start_of_the_put_that_created_the_one_before(tmp_path: Path,
                                                                                        together: bool) -> None:
    """`free_since(v)`: `<v-1>.json` was created by this publisher (so `<v>.json` was absent when that PUT began):
    from before the first attempt; nothing for a version found already there, a version not the newest, or one
    recovery marked published."""
    root, again = tmp_path / "t", tmp_path / "again"
    p = Publisher(fsync=False, lanes=1)
    p.start()
    try:
        before = time.monotonic()
        if together:  # queued at once: one flush of versions 0 to 2 on a local disk
            p.submit_all([_task(root, v) for v in range(3)])
        else:
            for v in range(3):
                p.submit(_task(root, v))
                assert p.wait_idle(10)
        assert p.wait_idle(10) and p.published_version(root.name) == 2
        since = p.free_since(root.name, 3)
        assert since is not None and before <= since <= time.monotonic()
        assert p.free_since(root.name, 2) is None and p.free_since(root.name, 4) is None
        # The same versions published again (a re-publication after a crash: the bytes were there) prove nothing.
        commit_path(again, 0).parent.mkdir(parents=True)
        for v in range(2):
            commit_path(again, v).write_bytes(commit_to_json_lines(_task(again, v).actions))
        q = Publisher(fsync=False, lanes=1)
        q.start()
        try:
            for v in range(2):
                q.submit(_task(again, v))
            assert q.wait_idle(10) and q.published_version(again.name) == 1
            assert q.free_since(again.name, 2) is None
            q.submit(_task(again, 2))  # created now
            assert q.wait_idle(10) and q.free_since(again.name, 3) is not None
            q.mark_published(again.name, 5)  # what recovery found further on
            assert q.free_since(again.name, 3) is None and q.free_since(again.name, 6) is None
        finally:
            q.stop()
    finally:
        p.stop()


@pytest.mark.parametrize("then", ["dropped", "halted"])
def test_a_version_still_retried_when_its_table_is_dropped_or_halted_is_never_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str) -> None:
    """A store that does not answer keeps a version retrying; once its table is dropped (`reset`: a table re-created
    at the location must not get the old version) or halted (reported unpublished), the retries stop and the
    version is not written when the store answers again."""
    root = tmp_path / "t"
    answering = threading.Event()
    attempts: list[str] = []
    real = publisher_module.put_if_absent

    def put_if_absent(path: Any, data: bytes, fsync: bool = True) -> Any:
        attempts.append(path.key)
        if not answering.is_set():
            raise OSError("the store does not answer")
        return real(path, data, fsync=fsync)

    monkeypatch.setattr(publisher_module, "put_if_absent", put_if_absent)
    unpublished: list[int] = []
    p = Publisher(fsync=False, lanes=1, on_unpublished=lambda task, _why: unpublished.append(task.version))
    p.start()
    try:
        p.submit(_task(root, 0))
        assert _until(lambda: len(attempts) >= 2)
        if then == "dropped":
            p.reset(root.name)
        else:
            p.halt(root.name, root.as_uri(), "halted for the test", notify=False)
        answering.set()
        assert p.wait_idle(30)
        assert not commit_path(root, 0).exists()
        assert unpublished == ([0] if then == "halted" else [])
    finally:
        answering.set()
        p.stop()
