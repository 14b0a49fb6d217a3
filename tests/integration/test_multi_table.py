"""Multi-table transactions against a real broker and coordinator, every version read back by delta-rs: all parts
commit or none, the tables of one transaction share a partition (a table group), `snapshots` sees a transaction
whole or not at all, and `history` names the transaction in every version it made."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import deltacoord
from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.errors import ConcurrentAppendException
from deltacoord.schemas.messages import TRANSACTION_KEY, MultiTable, Proposal
from deltacoord.schemas.routing import partition_for
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics, start_coordinator_process

SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.int64())])
PARTITIONS = 4


def _rows(ids: list[int], amounts: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array(amounts, pa.int64())})


def _create(path: Path, table_id: str, bootstrap: str, topics: deltacoord.Topics) -> Table:
    t = Table(path, bootstrap, topics=topics, table_id=table_id, decision_timeout_s=60)
    t.create(SCHEMA, properties={"deltacoord.coalesce": "false"})
    t.append(_rows([1, 2], [100, 100]))
    return t


def _delta_rows(path: Path, version: int | None = None) -> list[tuple[int, int]]:
    dt = DeltaTable(str(path), version=version) if version is not None else DeltaTable(str(path))
    t = dt.to_pyarrow_table()
    return sorted(zip(t.column("id").to_pylist(), t.column("amount").to_pylist(), strict=True))


def test_a_transaction_commits_every_table_and_history_names_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", deltacoord.grouped_table_id("ledger", "a"), kafka_bootstrap, topics)
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("ledger", "b"), kafka_bootstrap, topics)
        with deltacoord.transaction(kafka_bootstrap, topics=topics) as tx:
            tx.table(a).append(_rows([3], [-40]))
            tx.table(b).append(_rows([3], [40]))
        result = tx.commit_result
        assert result is not None and result.versions == {a.table_id: 2, b.table_id: 2}
        # Published when the block ends: plain Delta readers see both parts.
        assert _delta_rows(tmp_path / "a", 2) == [(1, 100), (2, 100), (3, -40)]
        assert _delta_rows(tmp_path / "b", 2) == [(1, 100), (2, 100), (3, 40)]
        for path in ("a", "b"):
            history = {h["version"]: h for h in DeltaTable(str(tmp_path / path)).history()}
            assert history[2][TRANSACTION_KEY] == {"id": tx.id, "tables": [a.table_id, b.table_id]}, history[2]
            assert TRANSACTION_KEY not in history[1]
        # No Kafka settings of its own: the transaction goes through the handles' client.
        with deltacoord.transaction() as tx2:
            tx2.table(a).append(_rows([4], [-1]))
            tx2.table(b).append(_rows([4], [1]))
        assert tx2.client is a.client and tx2.commit_result is not None
        assert tx2.commit_result.versions == {a.table_id: 3, b.table_id: 3}
        a.close()
        b.close()


def test_a_handle_keeps_the_snapshot_its_part_read(kafka_bootstrap: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Handles that only ever take part in transactions: the first transaction reads each table's log once, and
    the next one's blind appends read none (the handle keeps its part's snapshot, as a lone append does)."""
    from deltacoord.reader.snapshot import Snapshot

    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        for n in ("a", "b"):
            _create(tmp_path / n, deltacoord.grouped_table_id("keep", n), kafka_bootstrap, topics).close()
        a, b = (Table(tmp_path / n, kafka_bootstrap, topics=topics, table_id=deltacoord.grouped_table_id("keep", n))
                for n in ("a", "b"))
        loads: list[str] = []
        load = Snapshot.load.__func__  # type: ignore[attr-defined]

        def counted(cls: type[Snapshot], /, uri: object, *args: object, **kwargs: object) -> Snapshot:
            loads.append(str(uri))
            return load(cls, uri, *args, **kwargs)  # type: ignore[no-any-return]

        monkeypatch.setattr(Snapshot, "load", classmethod(counted))
        for i in range(2):
            before = len(loads)
            with deltacoord.transaction(client=a.client) as tx:
                tx.table(a).append(_rows([10 + i], [1]))
                tx.table(b).append(_rows([10 + i], [-1]))
            assert len(loads) - before == (2 if i == 0 else 0), loads[before:]
        assert tx.commit_result is not None and tx.commit_result.versions == {a.table_id: 3, b.table_id: 3}
        a.close()
        b.close()


@pytest.mark.parametrize("conflicting_first", [False, True])
def test_a_conflicting_part_rejects_the_whole_transaction(kafka_bootstrap: str, tmp_path: Path,
                                                          conflicting_first: bool) -> None:
    """The part on b conflicts (a concurrent delete rewrote the file it reads), whether it is the message's first
    part or its last: no table takes its part, b holds only the winner's change, and the exception names b."""
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", deltacoord.grouped_table_id("ledger", "a"), kafka_bootstrap, topics)
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("ledger", "b"), kafka_bootstrap, topics)
        c = _create(tmp_path / "c", deltacoord.grouped_table_id("ledger", "c"), kafka_bootstrap, topics)
        # The transaction commits as its block ends: the exception comes from there.
        with pytest.raises(ConcurrentAppendException) as caught, deltacoord.transaction(kafka_bootstrap,
                                                                                        topics=topics) as tx:
            if conflicting_first:
                tx.table(b).delete("id = 2")  # reads b at version 1
            tx.table(a).append(_rows([3], [-40]))
            tx.table(c).update("id = 1", {"amount": "amount + 40"})
            if not conflicting_first:
                tx.table(b).delete("id = 2")
            b.delete("id = 1")  # a concurrent winner on b: version 2, rewriting the file the part read
        assert caught.value.table == b.uri, "the exception names the table whose part failed"
        assert str(b.uri) in str(caught.value), str(caught.value)
        for n, t in (("a", a), ("c", c)):
            assert DeltaTable(str(tmp_path / n)).version() == 1, f"{n}'s part was rejected with b's"
            assert _delta_rows(tmp_path / n) == [(1, 100), (2, 100)], n
            assert [v.version for v in deltacoord.snapshots([t])] == [1], "nothing of it was ratified either"
            staged = [p.name for p in (tmp_path / n).glob("*.parquet")]
            assert len(staged) == 1, f"the rejected part's staged file is deleted: {staged}"
        assert DeltaTable(str(tmp_path / "b")).version() == 2
        assert _delta_rows(tmp_path / "b") == [(2, 100)], "b holds the winner's change and not the part's"
        # The tables go on: the same transaction, read again, commits.
        with deltacoord.transaction(kafka_bootstrap, topics=topics) as tx2:
            tx2.table(a).append(_rows([3], [-40]))
            tx2.table(b).delete("id = 2")
            tx2.table(c).update("id = 1", {"amount": "amount + 40"})
        assert _delta_rows(tmp_path / "a") == [(1, 100), (2, 100), (3, -40)]
        assert _delta_rows(tmp_path / "b") == []
        assert _delta_rows(tmp_path / "c") == [(1, 140), (2, 100)]
        for t in (a, b, c):
            t.close()


def _apart(prefix: str) -> tuple[str, str]:
    """Two table ids without a group whose partitions differ."""
    first = f"{prefix}-0"
    for i in range(1, 100):
        other = f"{prefix}-{i}"
        if partition_for(other, PARTITIONS) != partition_for(first, PARTITIONS):
            return first, other
    raise AssertionError("no two ids on different partitions")


def test_tables_on_different_partitions_are_refused_by_writer_and_coordinator(kafka_bootstrap: str,
                                                                              tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    ida, idb = _apart(uuid.uuid4().hex[:8])
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", ida, kafka_bootstrap, topics)
        b = _create(tmp_path / "b", idb, kafka_bootstrap, topics)
        with pytest.raises(deltacoord.TransactionSpansPartitionsError, match="table group") as caught, \
                deltacoord.transaction(kafka_bootstrap, topics=topics) as tx:
            tx.table(a).append(_rows([3], [1]))
            tx.table(b).append(_rows([3], [1]))
        assert "<group>::<name>" in str(caught.value) and "Nothing was sent" in str(caught.value)
        assert len(list((tmp_path / "a").glob("*.parquet"))) == 1, "the staged files are deleted"
        # A writer that skips the check: the coordinator refuses every part with the same advice.
        pa_, pb = a.begin(), b.begin()
        p1 = pa_.proposal("WRITE", True)
        p2 = pb.proposal("WRITE", True)
        mt = MultiTable("x-" + uuid.uuid4().hex, (ida, idb))
        carrier = dataclasses.replace(p1, transaction=dataclasses.replace(mt, parts=(dataclasses.replace(p2, transaction=mt),)))
        pendings = a.client.propose_transaction(carrier, wait="ratified")
        decided = [a.client.decided(p, t, 60) for p, t in zip(pendings, (ida, idb), strict=True)]
        assert [d.reason_code for d in decided] == ["TRANSACTION_SPANS_PARTITIONS"] * 2, decided
        assert "table group" in (decided[0].error_message or "")
        # One that is not well formed (its tables name the parts in another order): refused whole, and why.
        pa_, pb = a.begin(), b.begin()
        p1, p2 = pa_.proposal("WRITE", True), pb.proposal("WRITE", True)
        mt = MultiTable("y-" + uuid.uuid4().hex, (idb, ida))
        carrier = dataclasses.replace(p1, transaction=dataclasses.replace(mt, parts=(dataclasses.replace(p2, transaction=mt),)))
        pendings = a.client.propose_transaction(carrier, wait="ratified")
        decided = [a.client.decided(p, t, 60) for p, t in zip(pendings, (ida, idb), strict=True)]
        assert [d.reason_code for d in decided] == ["BAD_TRANSACTION"] * 2, decided
        assert DeltaTable(str(tmp_path / "a")).version() == 1 and DeltaTable(str(tmp_path / "b")).version() == 1
        a.close()
        b.close()


def test_snapshots_see_every_part_or_none(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Transfers move amounts from a to b (each one transaction); the total over both tables never changes at any
    consistent read, while the writer returns at ratification so reads also see unpublished versions."""
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", deltacoord.grouped_table_id("bank", "a"), kafka_bootstrap, topics)
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("bank", "b"), kafka_bootstrap, topics)
        transfers = 15
        errors: list[BaseException] = []

        def move() -> None:
            try:
                for i in range(transfers):
                    with deltacoord.transaction(kafka_bootstrap, topics=topics, wait="ratified") as tx:
                        tx.table(a).append(_rows([10 + i], [-(i + 1)]))
                        tx.table(b).append(_rows([10 + i], [i + 1]))
            except BaseException as e:  # reported by the test
                errors.append(e)

        mover = threading.Thread(target=move)
        mover.start()
        seen: set[tuple[int, int]] = set()
        try:
            while mover.is_alive() or not seen:
                sa, sb = deltacoord.snapshots([a, b])
                total = sum(sa.to_pyarrow().column("amount").to_pylist()) + sum(sb.to_pyarrow().column("amount").to_pylist())
                assert total == 400, f"a partial transaction was visible at versions {sa.version}, {sb.version}"
                assert sa.version == sb.version, (sa.version, sb.version)  # here every commit is a transfer of both
                seen.add((sa.version, sb.version))
        finally:
            mover.join(120)
        assert not errors, errors
        assert len(seen) > 1, "the reads saw the transfers go by"
        final_a, final_b = deltacoord.snapshots([a, b])
        assert final_a.version == final_b.version == 1 + transfers
        for v in range(1, 2 + transfers):  # delta-rs reads every version equal
            a.wait_published(v)
            b.wait_published(v)
            assert sum(x for _i, x in _delta_rows(tmp_path / "a", v)) + sum(
                x for _i, x in _delta_rows(tmp_path / "b", v)) == 400
        a.close()
        b.close()


def test_a_coordinator_killed_between_ratifying_and_publishing_republishes_every_part(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Coordinators here own partition 0 statically (no consumer group): the writers skip the coordinator check.
    monkeypatch.setenv("DELTACOORD_COORDINATOR_CHECK", "0")
    topics = fresh_topics(kafka_bootstrap)
    setup = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    setup.wait_ready()
    try:
        a = _create(tmp_path / "a", deltacoord.grouped_table_id("bank", "a"), kafka_bootstrap, topics)
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("bank", "b"), kafka_bootstrap, topics)
    finally:
        setup.kill(15)
    faulty = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0",
                                       env={"DELTACOORD_FAULT": "after_kafka_commit:2"})
    transfers = 4
    errors: list[BaseException] = []

    def move() -> None:
        try:
            for i in range(transfers):
                with deltacoord.transaction(kafka_bootstrap, topics=topics, decision_timeout_s=120) as tx:
                    tx.table(a).append(_rows([10 + i], [-(i + 1)]))
                    tx.table(b).append(_rows([10 + i], [i + 1]))
        except BaseException as e:  # reported by the test
            errors.append(e)

    mover = threading.Thread(target=move)
    mover.start()
    faulty.proc.wait(120)
    assert faulty.proc.returncode == -9, f"the fault point was not reached (exit {faulty.proc.returncode})"
    # Killed right after a Kafka transaction ratified both parts of a transfer, before publishing either.
    ratified = deltacoord.snapshots([a, b])
    published = [DeltaTable(str(tmp_path / n)).version() for n in ("a", "b")]
    assert [s.version for s in ratified] == [p + 1 for p in published], (ratified, published)
    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--partitions", "0")
    try:
        mover.join(180)
        assert not errors, errors
        for t in (a, b):
            t.wait_published(1 + transfers, timeout_s=60)
    finally:
        second.kill(15)
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    for t, n in ((a, "a"), (b, "b")):
        assert_verified(verify_table(settings, str(tmp_path / n), t.table_id))
        history = {h["version"]: h for h in DeltaTable(str(tmp_path / n)).history()}
        ids = {history[v][TRANSACTION_KEY]["id"] for v in range(2, 2 + transfers)}
        assert len(ids) == transfers, "each transfer is its own transaction, once"
    for v in range(1, 2 + transfers):  # delta-rs: the total holds at every version
        assert sum(x for _i, x in _delta_rows(tmp_path / "a", v)) + sum(
            x for _i, x in _delta_rows(tmp_path / "b", v)) == 400
    assert DeltaTable(str(tmp_path / "a")).version() == 1 + transfers
    a.close()
    b.close()


def test_an_existing_table_moves_into_a_group_by_release_then_adopt(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        alone = _create(tmp_path / "a", f"solo-{uuid.uuid4().hex[:8]}", kafka_bootstrap, topics)
        released = alone.release().version
        alone.close()
        a = Table(tmp_path / "a", kafka_bootstrap, topics=topics, table_id=deltacoord.grouped_table_id("g", "a"))
        assert a.adopt().version == released
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("g", "b"), kafka_bootstrap, topics)
        with deltacoord.transaction(kafka_bootstrap, topics=topics) as tx:
            tx.table(a).append(_rows([3], [1]))
            tx.table(b).append(_rows([3], [1]))
        assert tx.commit_result is not None and tx.commit_result.versions[a.table_id] > released
        assert _delta_rows(tmp_path / "a") == [(1, 100), (2, 100), (3, 1)]
        a.close()
        b.close()


def test_an_exception_in_the_block_sends_nothing_and_a_retry_by_id_commits_once(kafka_bootstrap: str,
                                                                                tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", deltacoord.grouped_table_id("g", "a"), kafka_bootstrap, topics)
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("g", "b"), kafka_bootstrap, topics)
        with pytest.raises(RuntimeError, match="changed my mind"), deltacoord.transaction(kafka_bootstrap,
                                                                                          topics=topics) as tx:
            tx.table(a).append(_rows([3], [1]))
            tx.table(b).append(_rows([3], [1]))
            raise RuntimeError("changed my mind")
        assert [DeltaTable(str(tmp_path / n)).version() for n in ("a", "b")] == [1, 1]
        assert [len(list((tmp_path / n).glob("*.parquet"))) for n in ("a", "b")] == [1, 1], "staged files deleted"
        with pytest.raises(ValueError, match="one operation per table"), deltacoord.transaction(
                kafka_bootstrap, topics=topics) as tx:
            tx.table(a).append(_rows([3], [1]))
            tx.table(a).append(_rows([4], [1]))
        with pytest.raises(ValueError, match="request of its own"), deltacoord.transaction(
                kafka_bootstrap, topics=topics) as tx:
            tx.table(a).release()
        assert DeltaTable(str(tmp_path / "a")).version() == 1
        txid = str(uuid.uuid4())
        for attempt in range(2):  # the second attempt is the retry of an outcome the caller did not learn
            with deltacoord.transaction(kafka_bootstrap, topics=topics, transaction_id=txid) as tx:
                tx.table(a).append(_rows([3], [-5]))
                tx.table(b).append(_rows([3], [5]))
            assert tx.commit_result is not None
            assert tx.commit_result.versions == {a.table_id: 2, b.table_id: 2}
            assert all(c.already_committed == (attempt == 1) for c in tx.commit_result.commits.values())
        assert _delta_rows(tmp_path / "a") == [(1, 100), (2, 100), (3, -5)], "committed once"
        assert [len(list((tmp_path / n).glob("*.parquet"))) for n in ("a", "b")] == [2, 2], \
            "the retry's own staged files are deleted"
        assert a.last_committed_version == 2, "a handle given to tx.table() learns the version"
        a.close()
        b.close()


def test_a_large_part_travels_by_reference(kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltacoord.writer import transaction as transaction_module

    monkeypatch.setattr(transaction_module, "INLINE_MAX_BYTES", 2_000)  # any part of 64 actions or more is large
    by_reference = transaction_module.Transaction._by_reference
    sent: list[bool] = []

    def spy(self: transaction_module.Transaction, p: Proposal) -> Proposal:
        out = by_reference(self, p)
        sent.append(out.staged is not None)
        return out

    monkeypatch.setattr(transaction_module.Transaction, "_by_reference", spy)
    topics = fresh_topics(kafka_bootstrap, partitions=PARTITIONS)
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", deltacoord.grouped_table_id("g", "a"), kafka_bootstrap, topics)
        b = _create(tmp_path / "b", deltacoord.grouped_table_id("g", "b"), kafka_bootstrap, topics)
        a.set_properties({"delta.targetFileSize": "1"})  # one file per row
        many = _rows(list(range(100, 180)), [1] * 80)
        with deltacoord.transaction(kafka_bootstrap, topics=topics, wait="ratified") as tx:
            tx.table(a).append(many)
            tx.table(b).append(_rows([3], [-80]))
        assert tx.commit_result is not None and tx.commit_result.versions == {a.table_id: 3, b.table_id: 2}
        assert sent[-2:] == [True, False], "a's part went by reference, b's inline"
        sa, sb = deltacoord.snapshots([a, b])
        assert (sa.version, sb.version) == (3, 2) and sa.num_files == 81
        assert sum(sa.to_pyarrow().column("amount").to_pylist()) + sum(sb.to_pyarrow().column("amount").to_pylist()) == 400
        a.wait_published(3)
        b.wait_published(2)
        assert len(_delta_rows(tmp_path / "a", 3)) == 82 and _delta_rows(tmp_path / "b", 2)[-1] == (3, -80)
        assert not list((tmp_path / "a" / "_delta_log" / "_staged_commits").glob("w-*")), "the writer's staged actions go"
        a.close()
        b.close()
