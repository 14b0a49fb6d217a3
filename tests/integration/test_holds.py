"""Holds: an expensive proposal is decided off the deciding thread while the partition's other tables go on
(`deltacoord.coordinator.kafka.holds`).

Every test puts two tables on one proposals partition: table A gets the expensive proposal, a writer keeps
appending to table B. What is asserted is order on the topics, never time: B's commits proposed after A's proposal
are decided before A's decision. A gate on the hold's worker (in-process tests) or a hanging fault point (the crash
test) keeps the hold open until B has committed a few times, so that order is certain on any machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from deltacoord.coordinator.delta_log.verify import verify_table
from deltacoord.coordinator.kafka.control import RELEASE, control_kind
from deltacoord.coordinator.kafka.partition import PartitionCoordinator
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.codec import decode_proposal
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import CONTROL_RELEASE, Topics
from deltacoord.writer import staging
from deltacoord.writer.table import Table
from deltacoord.writer.table_control import control
from tests.integration.coord_harness import (
    TransactionFaults,
    coordinator_thread,
    fresh_topics,
    start_coordinator_process,
)
from tests.integration.test_big_commits import SCHEMA, delta_rs_count, file_copies, one_row

#: Files of table A's large commit: a few seconds of loading and deciding here; far above `hold_min_actions`.
HOLD_FILES = 30_000
#: B's commits that must be decided while A is held.
PASSING = 3


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap)  # one partition: A and B share it


def _proposal_offsets(bootstrap: str, topics: Topics) -> dict[str, int]:
    """Proposal id -> its offset on the proposals partition (the first, for a resent id)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "holds-test", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        tp = TopicPartition(topics.proposals, 0, 0)
        _low, high = c.get_watermark_offsets(tp, timeout=10)
        c.assign([tp])
        out: dict[str, int] = {}
        deadline = time.monotonic() + 60
        seen = -1
        while seen < high - 1 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None or m.error() is not None:
                continue
            offset = m.offset()
            assert offset is not None
            seen = offset
            try:
                out.setdefault(decode_proposal(m.value() or b"").proposal_id, offset)
            except Exception:  # a control request or junk: not a proposal of these tests
                continue
        return out
    finally:
        c.close()


def _decisions(bootstrap: str, topics: Topics) -> list[Decision]:
    return list(read_decisions(CoordinatorSettings(bootstrap_servers=bootstrap, topics=topics, group_id="verify"), 0))


def _passed_while_held(bootstrap: str, topics: Topics, held: str, other: str) -> list[Decision]:
    """`other`'s commits proposed after `held`'s proposal (a version of table `held`) and recorded before its
    decision."""
    offsets = _proposal_offsets(bootstrap, topics)
    decisions = _decisions(bootstrap, topics)
    at = next(i for i, d in enumerate(decisions) if d.table_id == held and d.holds_version and d.version == 1)
    start = offsets[decisions[at].proposal_id]
    return [d for d in decisions[:at] if d.table_id == other and d.holds_version and offsets[d.proposal_id] > start]


class Appender:
    """A writer appending one row at a time to a table until stopped; the versions it was told."""

    def __init__(self, bootstrap: str, topics: Topics, root: Path, **table_options: object) -> None:
        self.versions: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                with Table(root, bootstrap, topics=topics, **table_options) as t:  # type: ignore[arg-type]
                    i = 0
                    while not self.stop.is_set():
                        i += 1
                        self.versions.append(t.append(one_row(i)).version)
            except BaseException as e:
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait_for(self, n: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.versions) < n and self.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.error is None, self.error
        assert len(self.versions) >= n, f"table B made {len(self.versions)} commits, not {n}"

    def finish(self) -> int:
        self.stop.set()
        self.thread.join(180)
        assert self.error is None, self.error
        return len(self.versions)


def _gate(monkeypatch: pytest.MonkeyPatch, until: Callable[[PartitionCoordinator], None]) -> list[dict[str, object]]:
    """Hold each hold's worker until `until` returns (given the partition); what `/healthz` showed of the hold then."""
    decide = PartitionCoordinator._decide_held
    shown: list[dict[str, object]] = []

    def gated(self: PartitionCoordinator, x):  # type: ignore[no-untyped-def]
        until(self)
        shown.append(dict(self.holds.describe() or {}))
        return decide(self, x)

    monkeypatch.setattr(PartitionCoordinator, "_decide_held", gated)
    return shown


def _create(bootstrap: str, topics: Topics, *roots: Path, check: bool = True) -> None:
    for root in roots:
        with Table(root, bootstrap, topics=topics, coordinator_check=check) as t:
            t.create(SCHEMA)


@pytest.fixture
def two_tables(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield tmp_path / "a", tmp_path / "b"


@pytest.mark.slow  # 30,000 files written, staged, loaded and decided: about 15 s here, more under load
def test_a_large_commit_by_reference_holds_only_its_table(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a_root, b_root = two_tables
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        _create(kafka_bootstrap, topics, a_root, b_root)
        b = Appender(kafka_bootstrap, topics, b_root)
        b.wait_for(1)
        shown = _gate(monkeypatch, lambda _w: b.wait_for(len(b.versions) + PASSING))
        a_id = _large_commit(kafka_bootstrap, topics, a_root, HOLD_FILES)
        b_commits = b.finish()
        holds = coord.metrics.registry.get_sample_value("deltacoord_holds_total", {"why": "actions"})
    assert holds == 1, "the large commit was held"
    assert shown and shown[0]["table"] == a_id and shown[0]["why"] == "actions", shown
    b_id = Table(b_root, kafka_bootstrap, topics=topics).table_id
    passed = _passed_while_held(kafka_bootstrap, topics, a_id, b_id)
    assert len(passed) >= PASSING, "B's commits proposed after A's proposal were decided before A's decision"
    assert delta_rs_count(a_root) == (HOLD_FILES, 7 * HOLD_FILES), "A's commit is whole, read by delta-rs"
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2), "every B commit once"
    assert b.versions == list(range(1, b_commits + 1))


def test_pathological_predicates_in_a_burst_hold_only_their_table(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a_root, b_root = two_tables
    # Four predicates of 16 KiB (the largest the rules accept) per proposal: decided, off the deciding thread.
    predicates = [" OR ".join(f"(date = '2026-{i % 12 + 1:02d}-{i % 28 + 1:02d}' AND date <> 'x{k}{i}')"
                              for i in range(360)) for k in range(4)]
    assert all(15_000 < len(p) <= 16_384 for p in predicates), [len(p) for p in predicates]
    with coordinator_thread(kafka_bootstrap, topics) as coord:  # predicates hold by default
        _create(kafka_bootstrap, topics, b_root)
        with Table(a_root, kafka_bootstrap, topics=topics) as a:
            a.create(SCHEMA, partition_by=["date"])
        b = Appender(kafka_bootstrap, topics, b_root)
        b.wait_for(1)
        gates = iter([lambda: b.wait_for(len(b.versions) + PASSING)])
        shown = _gate(monkeypatch, lambda _w: next(gates, lambda: None)())
        a_id, results = _commit_at_once(kafka_bootstrap, topics, a_root, [predicates] * 10)
        b_commits = b.finish()
        holds = coord.metrics.registry.get_sample_value("deltacoord_holds_total", {"why": "predicates"})
    # Each of the ten was decided off the deciding thread; those that came together shared a hold.
    assert holds == len(shown) and sum(int(str(h["messages"])) for h in shown) == 10, shown
    committed = [r for r in results if isinstance(r, int)]
    assert len(results) == 10 and committed, results
    b_id = Table(b_root, kafka_bootstrap, topics=topics).table_id
    assert len(_passed_while_held(kafka_bootstrap, topics, a_id, b_id)) >= PASSING
    assert delta_rs_count(a_root)[0] == len(committed), "A's committed proposals, each once"
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2)


#: Table A's proposals in the flood, each with a predicate to parse above the default `hold_predicate_chars`.
FLOOD = 30


def test_a_flood_of_large_predicates_for_one_table_shares_holds(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first hold is kept open until every proposal of the flood is consumed: what came with it in its batch went
    into it, the rest waited behind it and goes into the next one. Two holds at most, each recorded once, whatever
    the fetches looked like; every proposal decided once, in order."""
    a_root, b_root = two_tables

    def predicate(n: int) -> str:  # distinct (no compiled predicate reused), on partitions A's appends never touch
        return " OR ".join(f"(date = '2025-{i % 12 + 1:02d}-{i % 28 + 1:02d}' AND date <> 'f{n}x{i}')" for i in range(130))

    assert all(4096 < len(predicate(n)) <= 16_384 for n in range(FLOOD))
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        _create(kafka_bootstrap, topics, b_root)
        with Table(a_root, kafka_bootstrap, topics=topics) as a:
            a.create(SCHEMA, partition_by=["date"])
        b = Appender(kafka_bootstrap, topics, b_root)
        b.wait_for(1)

        def all_consumed(w: PartitionCoordinator) -> None:
            _until(lambda: w.holds.hold is not None and len(w.holds.hold.items) + len(w.holds.waiting) >= FLOOD,
                   "the flood to be consumed")
            b.wait_for(len(b.versions) + PASSING)

        gates = iter([all_consumed])
        shown = _gate(monkeypatch, lambda w: next(gates, lambda _w: None)(w))
        a_id, results = _commit_at_once(kafka_bootstrap, topics, a_root, [[predicate(i)] for i in range(1, FLOOD + 1)],
                                        first_row=1)
        b_commits = b.finish()
        holds = coord.metrics.registry.get_sample_value("deltacoord_holds_total", {"why": "predicates"})
    assert holds == len(shown) <= 2 and sum(int(str(h["messages"])) for h in shown) == FLOOD, shown
    assert len(results) == FLOOD and all(isinstance(r, int) for r in results), results
    assert sorted(results) == list(range(1, FLOOD + 1)), "each committed once (the predicates read other partitions)"
    decisions = _decisions(kafka_bootstrap, topics)
    ids = [d.proposal_id for d in decisions if d.table_id == a_id and d.holds_version]
    assert len(ids) == len(set(ids)) == FLOOD + 1, "A's creation and its flood, each decided once"
    b_id = Table(b_root, kafka_bootstrap, topics=topics).table_id
    assert len(_passed_while_held(kafka_bootstrap, topics, a_id, b_id)) >= PASSING
    assert delta_rs_count(a_root) == (FLOOD, FLOOD * (FLOOD + 1) // 2)
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2)


def _commit_at_once(bootstrap: str, topics: Topics, root: Path, predicates: list[list[str]],
                    first_row: int = 0) -> tuple[str, list[object]]:
    """Appends to table `root` (one row each, ids from `first_row`), one reading each list of `predicates`, committed
    at once from a thread each; the table id and each one's outcome (`_outcome`)."""
    results: list[object] = []
    with Table(root, bootstrap, topics=topics, decision_timeout_s=300) as a:
        txs = []
        for i, read in enumerate(predicates, start=first_row):
            tx = a.begin()
            for p in read:
                tx.read_predicate(p)
            tx.add(*staging.write_data_files(a.storage, one_row(i), ["date"]))
            txs.append(tx)
        threads = [threading.Thread(target=lambda tx=tx: results.append(
            _outcome(lambda: tx.commit("WRITE", parameters={"mode": "Append"})))) for tx in txs]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        return a.table_id, results


def _outcome(commit: Callable[[], Any]) -> object:
    """The version a commit got, or the name of the conflict it lost with."""
    try:
        return commit().version
    except Exception as e:
        return type(e).__name__


def test_a_crash_while_a_hold_is_open_decides_everything_once(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], tmp_path: Path) -> None:
    a_root, b_root = two_tables
    # The hold's worker hangs: the hold stays open while B's commits are decided past it, until the SIGKILL.
    first = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                      env={"DELTACOORD_FAULT": "hold:1:hang"})
    second = None
    try:
        _create(kafka_bootstrap, topics, a_root, b_root, check=False)
        b = Appender(kafka_bootstrap, topics, b_root, decision_timeout_s=300, coordinator_check=False)
        b.wait_for(1)
        out: dict[str, object] = {}
        with Table(a_root, kafka_bootstrap, topics=topics, decision_timeout_s=300, coordinator_check=False) as a:
            a_id = a.table_id
            th = _propose_large(a, 12_000, "c", out, "r")
            deadline = time.monotonic() + 120
            while "is decided off the deciding thread" not in first.log.read_text(errors="replace"):
                assert time.monotonic() < deadline and first.alive(), first.log.read_text(errors="replace")[-3000:]
                time.sleep(0.1)
            b.wait_for(len(b.versions) + 5)
            first.kill()
            second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
            th.join(300)
        b.wait_for(len(b.versions) + 2)
        b_commits = b.finish()
    finally:
        if second is not None:
            second.kill(15)
        if first.alive():
            first.kill()
    assert out.get("r") == 1, out
    decisions = _decisions(kafka_bootstrap, topics)
    b_id = Table(b_root, kafka_bootstrap, topics=topics).table_id
    for tid in (a_id, b_id):
        versions = [d.version for d in decisions if d.table_id == tid and d.holds_version]
        assert versions == list(range(len(versions))), f"{tid}: every version once, in order"
        ids = [d.proposal_id for d in decisions if d.table_id == tid and d.holds_version]
        assert len(ids) == len(set(ids)), "no proposal decided twice"
    replayed = [d for d in decisions if d.table_id == b_id and d.duplicate_of is not None]
    assert replayed, "the restart consumed again from the held proposal: B's commits past it were answered as decided"
    assert delta_rs_count(a_root) == (12_000, 7 * 12_000)
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2), "every acknowledged B row once"
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    for root, tid in ((a_root, a_id), (b_root, b_id)):
        rep = verify_table(settings, root.resolve().as_uri(), tid)
        assert rep.ok, rep.problems


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _propose_large(t: Table, files: int, tag: str, out: dict[str, object], key: str) -> threading.Thread:
    """Table `t`'s commit of `files` files by reference, committing in a thread that puts its outcome in `out[key]`."""
    tx = t.begin()
    tx.stage(file_copies(t, files, tag))
    th = threading.Thread(target=lambda: out.update(
        {key: _outcome(lambda: tx.commit("WRITE", parameters={"mode": "Append"}))}))
    th.start()
    return th


def _large_commit(bootstrap: str, topics: Topics, root: Path, files: int = 12_000) -> str:
    """Table `root`'s large commit by reference (version 1); its table id."""
    out: dict[str, object] = {}
    with Table(root, bootstrap, topics=topics, decision_timeout_s=300) as a:
        _propose_large(a, files, "h", out, "v").join(300)
        assert out.get("v") == 1, out
        return a.table_id


def test_at_most_hold_runahead_decisions_pass_a_held_proposal(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a_root, b_root = two_tables
    bound = 3
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides={"hold_runahead": bound}):
        _create(kafka_bootstrap, topics, a_root, b_root)
        b = Appender(kafka_bootstrap, topics, b_root)
        b.wait_for(1)
        # The worker goes on once B's commits reached the bound: the loop then waits for the hold, B with it.
        _gate(monkeypatch, lambda w: _until(lambda: w.holds.runahead >= bound, "decisions past the hold"))
        a_id = _large_commit(kafka_bootstrap, topics, a_root)
        b.wait_for(len(b.versions) + 1)
        b_commits = b.finish()
    b_id = Table(b_root, kafka_bootstrap, topics=topics).table_id
    assert len(_passed_while_held(kafka_bootstrap, topics, a_id, b_id)) == bound, "exactly the bound passed"
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2)


def test_a_control_request_for_a_held_table_waits_for_it_while_other_tables_go_on(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    a_root, b_root = two_tables
    held = threading.Event()
    with coordinator_thread(kafka_bootstrap, topics):
        _create(kafka_bootstrap, topics, a_root, b_root)
        b = Appender(kafka_bootstrap, topics, b_root)
        b.wait_for(1)

        def release_waits(w: PartitionCoordinator) -> None:
            held.set()
            _until(lambda: any(x.request == CONTROL_RELEASE for _m, x in w.holds.waiting), "the release behind the hold")
            b.wait_for(len(b.versions) + PASSING)

        _gate(monkeypatch, release_waits)
        out: dict[str, object] = {}
        with Table(a_root, kafka_bootstrap, topics=topics, decision_timeout_s=300) as a:
            a_id = a.table_id
            big = _propose_large(a, 12_000, "r", out, "commit")
            assert held.wait(180), "the large commit was not held"
            out["release"] = _outcome(lambda: control(a, CONTROL_RELEASE, "RELEASE TABLE", 300))
            big.join(300)
        b_commits = b.finish()
    assert out == {"commit": 1, "release": 1}, out
    decisions = _decisions(kafka_bootstrap, topics)
    at = next(i for i, d in enumerate(decisions) if d.table_id == a_id and d.holds_version and d.version == 1)
    release = next(i for i, d in enumerate(decisions) if d.table_id == a_id and control_kind(d) == RELEASE)
    assert release > at, "the release was answered after the held commit"
    offsets = _proposal_offsets(kafka_bootstrap, topics)
    release_offset = offsets[decisions[release].proposal_id]
    b_id = Table(b_root, kafka_bootstrap, topics=topics).table_id
    assert any(d.table_id == b_id and d.holds_version and offsets[d.proposal_id] > release_offset
               for d in decisions[:at]), "B's commits proposed after the release were decided while it waited"
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2)


def test_failed_transactions_around_a_hold_decide_everything_once(
        kafka_bootstrap: str, topics: Topics, two_tables: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The transaction recording a hold's decision fails (the proposal is held and decided again), and so does the
    one deciding what waited behind it (it waits again): every commit still lands once."""
    a_root, b_root = two_tables
    faults = TransactionFaults(monkeypatch)
    out: dict[str, object] = {}
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        _create(kafka_bootstrap, topics, a_root, b_root)
        b = Appender(kafka_bootstrap, topics, b_root)
        b.wait_for(1)
        with Table(a_root, kafka_bootstrap, topics=topics, decision_timeout_s=300) as a:
            a_id = a.table_id
            queued: list[threading.Thread] = []

            def append_one() -> Any:  # a writer of its own (its own Kafka clients), as another process would be
                with Table(a_root, kafka_bootstrap, topics=topics, decision_timeout_s=300) as t:
                    return t.append(one_row(1))

            def once(w: PartitionCoordinator) -> None:
                if not faults.failing:  # the first hold: B passes it, then the transaction recording it fails
                    b.wait_for(len(b.versions) + PASSING)
                    b.finish()  # nothing else in flight: the next transactions are the hold's, then what waited
                    faults.failing.extend([1, 3])  # the hold's record, then (after it is decided again) what waited
                elif not queued:  # held again: A's append comes after the hold took its messages, and waits
                    queued.append(threading.Thread(target=lambda: out.update(append=_outcome(append_one))))
                    queued[0].start()
                    _until(lambda: len(w.holds.waiting) == 1, "A's append behind the hold")

            _gate(monkeypatch, once)
            big = _propose_large(a, 12_000, "f", out, "commit")
            big.join(300)
            _until(lambda: bool(queued), "the append proposed")
            queued[0].join(300)
        failures = coord.metrics.registry.get_sample_value("deltacoord_transaction_failures_total")
        holds = coord.metrics.registry.get_sample_value("deltacoord_holds_total", {"why": "actions"})
    assert out == {"commit": 1, "append": 2}, out
    assert failures == 2 and holds == 2, (failures, holds)
    assert delta_rs_count(a_root) == (12_001, 7 * 12_000 + 1)
    b_commits = len(b.versions)
    assert delta_rs_count(b_root) == (b_commits, b_commits * (b_commits + 1) // 2)
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    assert verify_table(settings, a_root.resolve().as_uri(), a_id).ok
