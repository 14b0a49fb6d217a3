"""Randomized transfers: concurrent writers move amounts between two tables (a two-table transaction) or pay
amounts into both and record them in a third, the aggregate (a three-table transaction), while the coordinator
is SIGKILLed again and again: between deciding and ratifying, between ratifying and publishing, and between
publishing one part of a transaction and the next. At every consistent read (`deltacoord.snapshots`) the total
holds; afterwards the multi-table history check finds no transaction lost, partial or doubled, the commits topic
equals `_delta_log`, delta-rs reads every table at every version equal to deltacoord's reader and to what each
consistent read saw, and the total holds at every transaction's cut as delta-rs reads it."""

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
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.errors import DeltaConcurrentModificationException
from deltacoord.schemas.messages import TRANSACTION_KEY
from deltacoord.writer.table import Table
from tests.history.multi_table import check_multi_table
from tests.integration.coord_harness import fresh_topics, start_coordinator_process

SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
TOTAL = 1_000  # a + b - agg, always
NAMES = ("a", "b", "agg")

Rows = list[tuple[int, int]]


def _rows(ids: list[int], amounts: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array(amounts, pa.int64())})


def _sorted(t: pa.Table) -> Rows:
    return sorted(zip(t.column("id").to_pylist(), t.column("amount").to_pylist(), strict=True))


def _holds(a: Rows, b: Rows, agg: Rows) -> bool:
    """A move between a and b keeps a + b; a payment into a and b adds its sum to agg. Each amount is positive
    and every part of a transaction changes a + b - agg by a non-zero amount, so a partial one breaks it."""
    return sum(x for _i, x in a) + sum(x for _i, x in b) - sum(x for _i, x in agg) == TOTAL


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
    ids = {n: t.table_id for n, t in tables.items()}
    with deltacoord.transaction(kafka_bootstrap, topics=topics) as tx:  # version 1 of each: the opening balances
        tx.table(tables["a"]).append(_rows([0], [TOTAL // 2]))
        tx.table(tables["b"]).append(_rows([0], [TOTAL // 2]))
        tx.table(tables["agg"]).append(_rows([0], [0]))
    assert tx.commit_result is not None
    coord.kill(15)

    writers, per_writer = 4, 5
    committed: dict[str, dict[str, int]] = {tx.id: tx.commit_result.versions}  # transaction id -> table id -> version
    sent: list[str] = [tx.id]
    refused: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def write(w: int, wrng: random.Random) -> None:
        """Even writers append rows; odd ones change the opening rows in place (UPDATE), so they conflict with
        each other and retry: a refused transaction changes no table."""
        try:
            for i in range(per_writer):
                pay = wrng.random() < 0.5  # three tables: pay x into a, y into b, x + y into agg
                x, y = wrng.randint(1, 20), wrng.randint(1, 20)
                deltas = {"a": x, "b": y, "agg": x + y} if pay else {"a": -x, "b": x}
                row = w * 1000 + i + 1
                for _attempt in range(50):
                    mtx = deltacoord.transaction(kafka_bootstrap, topics=topics, decision_timeout_s=180,
                                                 publish_timeout_s=180)
                    with lock:
                        sent.append(mtx.id)
                    try:
                        with mtx:
                            for n, d in deltas.items():
                                if w % 2 == 0:
                                    mtx.table(tables[n]).append(_rows([row], [d]))
                                else:
                                    mtx.table(tables[n]).update("id = 0", {"amount": f"amount + ({d})"})
                        break
                    except DeltaConcurrentModificationException as e:
                        if not e.retryable:
                            raise
                        with lock:
                            refused.append(mtx.id)
                else:
                    raise AssertionError(f"writer {w}: transfer {i} conflicted 50 times")
                assert mtx.commit_result is not None
                assert set(mtx.commit_result.versions) == {ids[n] for n in deltas}
                with lock:
                    committed[mtx.id] = mtx.commit_result.versions
        except BaseException as e:  # reported by the test
            errors.append(e)

    reads: list[tuple[tuple[int, ...], tuple[Rows, ...]]] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                snaps = deltacoord.snapshots([tables[n] for n in NAMES], timeout_s=120)
                rows = tuple(_sorted(s.to_pyarrow()) for s in snaps)
                versions = tuple(s.version for s in snaps)
                assert _holds(*rows), f"a partial transaction was read at versions {versions}"
                assert versions[0] == versions[1], f"every transaction changes a and b: {versions}"
                reads.append((versions, rows))
        except BaseException as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w, random.Random(rng.random()))) for w in range(writers)]
    threads.append(threading.Thread(target=read))
    kills: list[str] = []
    unpublished_at_kill = 0  # kills that left ratified versions unpublished, seen by a consistent read
    torn_at_kill = 0  # of them, kills between publishing two parts of one transaction (a's and b's versions differ)
    try:
        # Killed: after a Kafka transaction ratified a batch (nothing published), before the n-th version is
        # published (often between two parts of one transaction), and after deciding (nothing ratified).
        faults = [f"after_kafka_commit:{rng.randint(2, 4)}", f"publish:{rng.randint(3, 7)}",
                  f"after_decide:{rng.randint(2, 4)}", f"publish:{rng.randint(3, 7)}",
                  f"after_kafka_commit:{rng.randint(2, 4)}"]
        coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                          env={"DELTACOORD_FAULT": faults[0]})
        for t in threads:
            t.start()
        for fault, following in zip(faults, [*faults[1:], None], strict=True):
            while coord.alive() and any(t.is_alive() for t in threads[:-1]):
                time.sleep(0.1)
            if coord.alive():
                break  # the writers finished before this fault point was reached
            assert coord.proc.returncode == -9, f"coordinator exit {coord.proc.returncode}"
            kills.append(fault)
            ratified = deltacoord.snapshots([tables[n] for n in NAMES], timeout_s=120)
            published = [DeltaTable(str(tmp_path / n)).version() for n in NAMES]
            unpublished_at_kill += any(s.version > p for s, p in zip(ratified, published, strict=True))
            torn_at_kill += published[0] != published[1]
            env = {"DELTACOORD_FAULT": following} if following is not None else {}
            coord = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0", env=env)
        for t in threads[:-1]:
            t.join(300)
        stop.set()
        threads[-1].join(180)
        assert not errors, errors
        final = deltacoord.snapshots([tables[n] for n in NAMES], timeout_s=120)
        for t, s in zip(tables.values(), final, strict=True):
            t.wait_published(s.version, timeout_s=120)
    finally:
        stop.set()
        if coord.alive():
            coord.kill(15)
    print(f"transfers: {len(committed) - 1}, coordinator kills: {kills}, kills with ratified versions unpublished: "
          f"{unpublished_at_kill} (between two parts: {torn_at_kill}), conflicts retried: {len(refused)}, consistent reads: {len(reads)}, "
          f"final versions: {[s.version for s in final]}")
    assert "after_kafka_commit" in kills[0] and len(kills) >= 2, kills
    assert unpublished_at_kill >= 1, "no kill left a ratified version unpublished"
    assert len(committed) == 1 + writers * per_writer and len(reads) > 1

    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    stamps: dict[str, dict[int, dict[str, object] | None]] = {}
    for n, t in tables.items():
        assert_verified(verify_table(settings, str(tmp_path / n), t.table_id))  # the commits topic equals the log
        stamps[t.table_id] = {h["version"]: h.get(TRANSACTION_KEY) for h in DeltaTable(str(tmp_path / n)).history()}
    report = check_multi_table(stamps, committed, sent=sent, refused=refused)
    assert report.ok, report
    assert report.transactions == len(committed)
    # delta-rs reads every version of every table as deltacoord's reader does.
    delta_rs: dict[tuple[str, int], Rows] = {}
    for n, s in zip(NAMES, final, strict=True):
        for v in range(s.version + 1):
            delta_rs[n, v] = _sorted(DeltaTable(str(tmp_path / n), version=v).to_pyarrow_table())
            assert delta_rs[n, v] == _sorted(Snapshot.load(str(tmp_path / n), version=v).to_pyarrow()), (n, v)
    # Every consistent read is what delta-rs reads at those versions.
    for versions, rows in reads:
        assert tuple(delta_rs[n, v] for n, v in zip(NAMES, versions, strict=True)) == rows, versions
    # Every transaction changes a and b, so a's and b's versions are one order; agg follows it.
    assert final[0].version == final[1].version == writers * per_writer + 1
    txn_at = {n: {v: st["id"] for v, st in stamps[ids[n]].items() if st is not None} for n in NAMES}
    assert txn_at["a"] == txn_at["b"]
    agg_version = {txid: v for v, txid in txn_at["agg"].items()}
    g = 0
    for v in range(1, final[0].version + 1):  # the total holds at every transaction's cut, as delta-rs reads it
        if txn_at["a"][v] in agg_version:
            assert agg_version[txn_at["a"][v]] == g + 1, "agg's versions follow a's order"
            g += 1
        assert _holds(delta_rs["a", v], delta_rs["b", v], delta_rs["agg", g]), (v, g)
    assert g == final[2].version
    for t in tables.values():
        t.close()
