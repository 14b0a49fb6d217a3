"""Randomized transfers: concurrent writers move amounts between two tables and record each move in a third
(the aggregate), every move one multi-table transaction, while the coordinator is SIGKILLed again and again
between deciding and ratifying or between ratifying and publishing. At every consistent read
(`deltacoord.snapshots`) the totals hold; afterwards no transaction is lost or partial in any table's history,
the commits topic equals `_delta_log`, and delta-rs reads every version with the totals holding."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import deltacoord
from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.errors import DeltaConcurrentModificationException
from deltacoord.schemas.messages import TRANSACTION_KEY
from deltacoord.writer.table import Table
from tests.integration.coord_harness import fresh_topics, start_coordinator_process

SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
TOTAL = 1_000  # a's and b's amounts together, always
NAMES = ("a", "b", "agg")


def _rows(ids: list[int], amounts: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array(amounts, pa.int64())})


def _sums(tables: list[pa.Table]) -> tuple[int, int, int]:
    a, b, agg = (sum(t.column("amount").to_pylist()) for t in tables)
    return a, b, agg


def _holds(a: int, b: int, agg: int) -> bool:
    """a + b never changes, and the aggregate holds every amount moved from a to b."""
    return a + b == TOTAL and agg == b - TOTAL // 2


@pytest.mark.parametrize("seed", [37])
def test_random_transfers_survive_coordinator_kills(kafka_bootstrap: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    monkeypatch.setenv("DELTACOORD_COORDINATOR_CHECK", "0")  # static coordinators: the writers skip the check
    topics = fresh_topics(kafka_bootstrap)
    coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    tables: dict[str, Table] = {}
    for n in NAMES:
        t = Table(tmp_path / n, kafka_bootstrap, topics=topics, table_id=deltacoord.grouped_table_id("bank", n),
                  decision_timeout_s=180, publish_timeout_s=180)
        t.create(SCHEMA, properties={"deltacoord.coalesce": "false"})
        tables[n] = t
    with deltacoord.transaction(kafka_bootstrap, topics=topics) as tx:  # version 1 of each: the opening balances
        tx.table(tables["a"]).append(_rows([0], [TOTAL // 2]))
        tx.table(tables["b"]).append(_rows([0], [TOTAL // 2]))
        tx.table(tables["agg"]).append(_rows([0], [0]))
    coord.kill(15)

    writers, per_writer = 4, 5
    committed: dict[str, dict[str, int]] = {}  # transaction id -> table id -> version
    errors: list[BaseException] = []
    lock = threading.Lock()

    conflicts: list[str] = []

    def write(w: int, wrng: random.Random) -> None:
        """Even writers append compensating rows; odd ones change the opening rows in place (UPDATE), so they
        conflict with each other and retry: a refused transaction changes no table."""
        try:
            for i in range(per_writer):
                x = wrng.randint(-20, 20)
                row = w * 1000 + i + 1
                for _attempt in range(50):
                    try:
                        with deltacoord.transaction(kafka_bootstrap, topics=topics, decision_timeout_s=180,
                                                    publish_timeout_s=180) as mtx:
                            if w % 2 == 0:
                                mtx.table(tables["a"]).append(_rows([row], [-x]))
                                mtx.table(tables["b"]).append(_rows([row], [x]))
                            else:
                                mtx.table(tables["a"]).update("id = 0", {"amount": f"amount + ({-x})"})
                                mtx.table(tables["b"]).update("id = 0", {"amount": f"amount + ({x})"})
                            mtx.table(tables["agg"]).append(_rows([row], [x]))
                        break
                    except DeltaConcurrentModificationException as e:
                        if not e.retryable:
                            raise
                        conflicts.append(type(e).__name__)
                else:
                    raise AssertionError(f"writer {w}: transfer {i} conflicted 50 times")
                assert mtx.commit_result is not None
                with lock:
                    committed[mtx.id] = mtx.commit_result.versions
        except BaseException as e:  # reported by the test
            errors.append(e)

    reads: list[tuple[int, ...]] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                snaps = deltacoord.snapshots([tables[n] for n in NAMES], timeout_s=120)
                a, b, agg = _sums([s.to_pyarrow() for s in snaps])
                assert _holds(a, b, agg), f"a partial transaction was read at versions {[s.version for s in snaps]}"
                reads.append(tuple(s.version for s in snaps))
        except BaseException as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w, random.Random(rng.random()))) for w in range(writers)]
    threads.append(threading.Thread(target=read))
    kills = 0
    try:
        faults = [f"{rng.choice(['after_kafka_commit', 'after_decide'])}:{rng.randint(2, 5)}" for _ in range(3)]
        coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                          env={"DELTACOORD_FAULT": faults[0]})
        for t in threads:
            t.start()
        for fault in [*faults[1:], None]:
            while coord.alive() and any(t.is_alive() for t in threads[:-1]):
                time.sleep(0.1)
            if coord.alive():
                break  # the writers finished before this fault point was reached
            assert coord.proc.returncode == -9, f"coordinator exit {coord.proc.returncode}"
            kills += 1
            env = {"DELTACOORD_FAULT": fault} if fault is not None else {}
            coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", env=env)
        for t in threads[:-1]:
            t.join(300)
        stop.set()
        threads[-1].join(180)
        assert not errors, errors
        for t in tables.values():
            t.wait_published(1 + writers * per_writer, timeout_s=120)
    finally:
        stop.set()
        if coord.alive():
            coord.kill(15)
    assert kills >= 1, "no coordinator was killed"
    print(f"transfers: {len(committed)}, coordinator kills: {kills}, conflicts retried: {len(conflicts)}, "
          f"consistent reads: {len(reads)}")
    assert len(committed) == writers * per_writer and len(reads) > 1

    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    by_version: dict[str, dict[int, str]] = {}
    for n, t in tables.items():
        rep = verify_table(settings, str(tmp_path / n), t.table_id)
        assert_verified(rep)
        history = DeltaTable(str(tmp_path / n)).history()
        by_version[n] = {h["version"]: h[TRANSACTION_KEY]["id"] for h in history if TRANSACTION_KEY in h}
    # No transaction lost, none partial, none twice: every one at the version it was told, in every table.
    for n, t in tables.items():
        ids = list(by_version[n].values())
        assert len(ids) == len(set(ids)) == 1 + writers * per_writer, n
        for txid, versions in committed.items():
            assert by_version[n][versions[t.table_id]] == txid
    assert by_version["a"] == by_version["b"] == by_version["agg"], "each version of the three is one transaction"
    for v in range(1, 2 + writers * per_writer):  # delta-rs reads every version with the totals holding
        a, b, agg = _sums([DeltaTable(str(tmp_path / n), version=v).to_pyarrow_table() for n in NAMES])
        assert _holds(a, b, agg), (v, a, b, agg)
    for t in tables.values():
        t.close()
