"""One `Table` shared by several threads, each committing through it at once (a thread pool writing one table).

What is asserted is what a writer is promised, against the real broker and a real coordinator: every call returns,
or raises a documented error, long before any client timeout (a stuck thread fails the test with its stack); every
acknowledged row is read back by delta-rs exactly once; the versions the calls were told are those of the table, each
once, with no gap; and the conflicts Delta's rules call for are raised.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltacoord.coordinator.kafka.partition import PartitionCoordinator
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import DeltaConcurrentModificationException
from deltacoord.schemas.routing import Topics
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import CommitResult
from tests.integration.coord_harness import TransactionFaults, coordinator_thread, fresh_topics
from tests.integration.test_big_commits import SCHEMA, file_copies, one_row

#: The longest the threads of one test may take, all together (a call of the held form took up to 160 s at load 48): below
#: the handles' 300 s decision timeout, so a commit that waits for an answer that never comes fails here, with its
#: stack, and not as a timeout.
BOUND_S = 200.0
ROWS = pa.schema([("id", pa.int64()), ("date", pa.string())])
#: The partition the delete and the overwrite replace, and appends sometimes write to.
SCRATCH = "scratch"


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap)


def _stacks(threads: list[threading.Thread]) -> str:
    frames = sys._current_frames()
    return "\n".join(f"--- thread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
                     for t in threads if t.ident is not None and t.ident in frames)


def run_together(bodies: dict[str, Callable[[], None]], bound_s: float = BOUND_S) -> None:
    """Run each body on a thread of its own, all at once; fail naming the stack of any thread still running after
    `bound_s`, and re-raise the first error a body raised."""
    errors: dict[str, BaseException] = {}
    start = threading.Barrier(len(bodies))

    def run(name: str, body: Callable[[], None]) -> None:
        try:
            start.wait(30)
            body()
        except BaseException as e:
            errors[name] = e

    threads = [threading.Thread(target=run, args=(name, body), name=name, daemon=True) for name, body in bodies.items()]
    for t in threads:
        t.start()
    deadline = threading.Event()
    timer = threading.Timer(bound_s, deadline.set)
    timer.start()
    try:
        for t in threads:
            while t.is_alive() and not deadline.is_set():
                t.join(0.5)
    finally:
        timer.cancel()
    stuck = [t for t in threads if t.is_alive()]
    if stuck:
        pytest.fail(f"{len(stuck)} thread(s) still inside a call after {bound_s:.0f}s:\n{_stacks(stuck)}")
    for name, e in errors.items():
        raise AssertionError(f"thread {name} raised {type(e).__name__}: {e}") from e


@dataclass
class Ledger:
    """What the calls were told: each version, the rows each call added there and, for a replacement of the scratch
    partition, the version it read. Appends may share a version (the coordinator coalesces them), nothing else."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: version -> [(ids added, the read version of a replacement of the scratch partition, else None)]
    versions: dict[int, list[tuple[list[int], int | None]]] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    def told(self, version: int, ids: list[int], replaced_at: int | None = None) -> None:
        with self.lock:
            calls = self.versions.setdefault(version, [])
            calls.append((ids, replaced_at))
            assert len(calls) == 1 or all(r is None for _ids, r in calls), f"version {version} told to {calls}"

    def ids(self) -> list[int]:
        return sorted(i for calls in self.versions.values() for ids, _r in calls for i in ids)

    def expected_ids(self, scratch_ids: dict[int, bool]) -> list[int]:
        """The ids the table must hold: every acknowledged row, but a scratch row (`scratch_ids`: id -> in the
        scratch partition) only if no replacement read a version holding it. Appends are blind, so a replacement
        commits past one made after its read version (WriteSerializable) and leaves its row."""
        replaced = [r for calls in self.versions.values() for _ids, r in calls if r is not None]
        return sorted(i for v, calls in self.versions.items() for ids, _r in calls for i in ids
                      if not (scratch_ids[i] and any(r >= v for r in replaced)))


def rows(ids: list[int], date: str) -> pa.Table:
    return pa.table({"id": ids, "date": [date] * len(ids)}, schema=ROWS)


def delta_rs_ids(root: Path) -> list[int]:
    return sorted(DeltaTable(str(root)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def check_versions(root: Path, ledger: Ledger, first: int) -> None:
    """The versions told are the table's versions after `first`, each once and in order, with none missing."""
    latest = DeltaTable(str(root)).version()
    assert sorted(ledger.versions) == list(range(first + 1, latest + 1)), (sorted(ledger.versions), latest)


@pytest.fixture
def shared(kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> Iterator[Table]:
    with coordinator_thread(kafka_bootstrap, topics), \
            Table(tmp_path / "t", kafka_bootstrap, topics=topics, decision_timeout_s=300) as t:
        t.create(ROWS, partition_by=["date"])
        yield t


@pytest.mark.parametrize("writers", [2, 4])
def test_appends_deletes_and_overwrites_through_one_table_from_several_threads(shared: Table, writers: int) -> None:
    t = shared
    ledger = Ledger()
    scratch_ids: dict[int, bool] = {}
    rounds = 12

    def appender(k: int) -> Callable[[], None]:
        def body() -> None:
            for i in range(rounds):
                row_id = k * 1_000 + i
                date = SCRATCH if i % 3 == 0 else f"w{k}"
                scratch_ids[row_id] = date == SCRATCH
                ledger.told(t.append(rows([row_id], date)).version, [row_id])
        return body

    def replace(row_id: int, snap: Snapshot) -> CommitResult:
        """Delete (an even `row_id`) or overwrite (an odd one, with that row) the scratch partition as of `snap`
        (both read it: a concurrent replacement conflicts); the version told is recorded."""
        if row_id % 2 == 0:
            ids: list[int] = []
            r = t.delete(f"date = '{SCRATCH}'", snapshot=snap)
        else:
            ids = [row_id]
            scratch_ids[ids[0]] = True
            r = t.overwrite(rows(ids, SCRATCH), replace_where=f"date = '{SCRATCH}'", snapshot=snap)
        if not r.noop:  # a delete of an empty partition commits nothing
            ledger.told(r.version, ids, replaced_at=snap.version)
        return r

    def replacer() -> None:
        # Every third round conflicts for certain: an overwrite (which adds a row, so it is never a no-op) while
        # another overwrite commits between its snapshot and its commit.
        for i in range(rounds):
            snap = t.snapshot()
            if i % 3 == 0:
                replace(700_001 + 2 * i, t.snapshot())
            try:
                replace(600_001 + 2 * i if i % 3 == 0 else 800_000 + i, snap)
            except DeltaConcurrentModificationException as e:
                with ledger.lock:
                    ledger.conflicts.append(type(e).__name__)
                continue
            assert i % 3 != 0, "a replacement committed over another one made after its snapshot"

    bodies = {f"appender-{k}": appender(k) for k in range(1, writers)}
    bodies["replacer"] = replacer
    run_together(bodies)
    assert len(ledger.conflicts) >= (rounds + 2) // 3, ledger.conflicts
    check_versions(t.root, ledger, first=0)
    assert delta_rs_ids(t.root) == ledger.expected_ids(scratch_ids), "every acknowledged row once"
    assert t.last_committed_version == max(ledger.versions), "the handle's floor is its newest commit"
    assert t.snapshot().version == max(ledger.versions)


@pytest.mark.parametrize("failing", [(), (1, 3)], ids=["recorded", "failed-transactions"])
def test_appends_through_one_table_while_its_large_commit_is_held(
        kafka_bootstrap: str, topics: Topics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        failing: tuple[int, ...]) -> None:
    """One thread commits a few thousand files by reference (held: decided off the coordinator's deciding thread)
    while three others append through the same handle: their appends wait behind the hold, on the producer and reply
    partition of the large commit. With `failing`, the first hold's transactions of those numbers fail (counted from
    when an append waits behind it): the one recording the hold's decision (the proposal is held again) and then one
    deciding what waited (it waits again)."""
    files, rounds, appenders = 1_500, 2, 3
    held_with_waiting: list[int] = []
    faults = TransactionFaults(monkeypatch)
    decide = PartitionCoordinator._decide_held

    def gated(self: PartitionCoordinator, x):  # type: ignore[no-untyped-def]
        # Decide the hold once an append of its table waits behind it (given up after 20 s: the test then fails,
        # saying that no append waited).
        pause = threading.Event()
        for _ in range(400):
            if self.holds.waiting:
                held_with_waiting.append(len(self.holds.waiting))
                if not faults.failing:
                    faults.failing.extend(failing)
                break
            pause.wait(0.05)
        return decide(self, x)

    monkeypatch.setattr(PartitionCoordinator, "_decide_held", gated)
    ledger = Ledger()
    big_done = threading.Event()
    with coordinator_thread(kafka_bootstrap, topics, settings_overrides={"hold_min_actions": 1_000}) as coord, \
            Table(tmp_path / "t", kafka_bootstrap, topics=topics, decision_timeout_s=300) as t:
        t.create(SCHEMA)

        def large() -> None:
            try:
                for r in range(rounds):
                    tx = t.begin()
                    tx.stage(file_copies(t, files, f"r{r}"))
                    ledger.told(tx.commit("WRITE", parameters={"mode": "Append"}).version, [7] * files)
            finally:
                big_done.set()

        def appender(k: int) -> Callable[[], None]:
            def body() -> None:
                i = 0
                while not big_done.is_set():
                    i += 1
                    row_id = k * 100_000 + i
                    ledger.told(t.append(one_row(row_id)).version, [row_id])
            return body

        run_together({"large": large, **{f"appender-{k}": appender(k) for k in range(1, appenders + 1)}})
        holds = coord.metrics.registry.get_sample_value("deltacoord_holds_total", {"why": "actions"})
        failures = coord.metrics.registry.get_sample_value("deltacoord_transaction_failures_total")
    assert len(held_with_waiting) >= rounds, f"an append waited behind each hold: {held_with_waiting}"
    assert holds == rounds + (1 if 1 in failing else 0), "each large commit was held (again after its record failed)"
    assert failures == len(failing), failures
    check_versions(t.root, ledger, first=0)
    assert delta_rs_ids(t.root) == ledger.ids(), "every acknowledged row once"
