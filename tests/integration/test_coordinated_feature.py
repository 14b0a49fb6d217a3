"""The project's own writer feature, `deltacoord-coordinated`: Delta writers refuse a coordinated table, readers read it.

Against a real broker and coordinator. A table created through deltacoord, or adopted, names the writer feature
in its protocol (writer version 7); delta-rs (`write_deltalake(..., mode="append")`) and Delta on Spark
(`df.write.format("delta").mode("append")`) refuse to append to it by themselves, while their readers read it
and deltacoord's own writers (Python, the `deltacoord` Spark data source) go on committing. `release` drops the
feature, so the same appends then succeed; adopting the table again puts the feature back. A version delta-rs
writes during the adoption (before the feature is in) halts the table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.table_features import COORDINATED
from deltacoord.writer import staging, table_control
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction as WriterTransaction
from tests.integration.coord_harness import coordinator_thread, fresh_topics

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])
#: A (1, 2) table with the feature: the legacy writer version's features listed, as PROTOCOL.md requires at 7.
COORDINATED_1_2 = Protocol(1, 7, writer_features=("appendOnly", "invariants", COORDINATED))


def _rows(ids: list[int], s: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "s": pa.array([s] * len(ids))}, schema=SCHEMA)


def _delta_rs_rows(path: Path) -> list[tuple[Any, ...]]:
    """What delta-rs reads of the latest version."""
    return sorted((r["id"], r["s"]) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def _log_versions(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def _delta_rs_append_refused(path: Path) -> None:
    """delta-rs refuses the append itself, naming the feature; nothing is committed."""
    versions = _log_versions(path)
    with pytest.raises(Exception, match=r"Unsupported table features required: \[Unknown\(\"deltacoord-coordinated\"\)\]"):
        write_deltalake(str(path), _rows([99], "rs"), mode="append")
    assert _log_versions(path) == versions


@pytest.fixture
def env(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics):
        yield kafka_bootstrap, topics


def test_delta_rs_refuses_to_append_to_a_coordinated_table_until_it_is_released(env: tuple[str, Any],
                                                                                tmp_path: Path) -> None:
    bootstrap, topics = env
    path = tmp_path / "t"
    with Table(path, bootstrap, topics=topics) as t:
        # Created through deltacoord: the feature is in version 0.
        assert t.create(SCHEMA).version == 0
        assert Snapshot.load(str(path), version=0).protocol == COORDINATED_1_2
        assert t.append(_rows([1, 2], "dc")).version == 1
        assert DeltaTable(str(path)).protocol().writer_features == ["appendOnly", "invariants", COORDINATED]
        _delta_rs_append_refused(path)
        assert _delta_rs_rows(path) == [(1, "dc"), (2, "dc")]  # delta-rs reads the coordinated table

        # Released: a DROP FEATURE commit (version 2) takes the feature out, back to (1, 2); delta-rs appends.
        released = t.release()
        assert (released.version, released.operation) == (2, "RELEASE TABLE")
        snap = Snapshot.load(str(path))
        assert (snap.version, snap.protocol) == (2, Protocol(1, 2))
        assert DeltaTable(str(path)).history(1)[0]["operation"] == "DROP FEATURE"
        write_deltalake(str(path), _rows([3], "rs"), mode="append")
        assert DeltaTable(str(path)).version() == 3
        assert _delta_rs_rows(path) == [(1, "dc"), (2, "dc"), (3, "rs")]

        # Adopted again: adopted at 3 (what delta-rs wrote), the feature added at 4 (UPGRADE PROTOCOL).
        adopted = t.adopt()
        assert (adopted.version, adopted.already_committed) == (3, False)
        snap = Snapshot.load(str(path))
        assert (snap.version, snap.protocol) == (4, COORDINATED_1_2)
        assert DeltaTable(str(path)).history(1)[0]["operation"] == "UPGRADE PROTOCOL"
        assert t.adopt().already_committed  # asked again: nothing more is committed
        assert Snapshot.load(str(path)).version == 4
        _delta_rs_append_refused(path)
        assert t.append(_rows([4], "dc")).version == 5
        assert _delta_rs_rows(path) == [(1, "dc"), (2, "dc"), (3, "rs"), (4, "dc")]

        assert t.release().version == 6
        write_deltalake(str(path), _rows([5], "rs"), mode="append")
    assert _delta_rs_rows(path) == [(1, "dc"), (2, "dc"), (3, "rs"), (4, "dc"), (5, "rs")]
    assert DeltaTable(str(path)).protocol().min_writer_version == 2


def test_a_legacy_table_with_more_features_keeps_them_listed_and_gets_them_back_on_release(env: tuple[str, Any],
                                                                                            tmp_path: Path) -> None:
    """A delta-rs table at (1, 4) (the change data feed on): adoption raises it to (1, 7) listing the features
    writer version 4 implies; release brings back (1, 4), and delta-rs writes it with its change data."""
    bootstrap, topics = env
    path = tmp_path / "cdf"
    write_deltalake(str(path), _rows([1], "rs"), configuration={"delta.enableChangeDataFeed": "true"})
    assert Snapshot.load(str(path)).protocol == Protocol(1, 4)
    with Table(path, bootstrap, topics=topics) as t:
        assert t.adopt().version == 0
        assert Snapshot.load(str(path)).protocol == Protocol(1, 7, writer_features=(
            "appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns", COORDINATED))
        _delta_rs_append_refused(path)
        assert t.delete("id = 1").version == 2  # deltacoord honours the change data feed as before
        assert t.release().version == 3
    assert Snapshot.load(str(path)).protocol == Protocol(1, 4)
    write_deltalake(str(path), _rows([2], "rs"), mode="append")
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=2, ending_version=4).read_all()).to_pylist()
    assert sorted((r["id"], r["_change_type"], r["_commit_version"]) for r in feed) == [(1, "delete", 2), (2, "insert", 4)]


def test_adopting_a_table_coordinated_without_the_feature_adds_it(env: tuple[str, Any], tmp_path: Path) -> None:
    """A table a deltacoord of before the feature created (a plain (1, 2) protocol): `adopt` answers that it is
    coordinated already and commits the feature; from then on delta-rs refuses it."""
    bootstrap, topics = env
    path = tmp_path / "old"
    with Table(path, bootstrap, topics=topics) as t:
        md = Metadata(id=str(uuid.uuid4()), schema_string=staging.schema_string(SCHEMA), created_time=0)
        tx = WriterTransaction(t, -1)
        tx.add(Protocol(1, 2), md)
        assert tx.commit("CREATE TABLE", changes_data=False).version == 0
        assert t.append(_rows([1], "dc")).version == 1
        again = t.adopt()
        assert (again.version, again.already_committed) == (1, True)
        snap = Snapshot.load(str(path))
        assert (snap.version, snap.protocol) == (2, COORDINATED_1_2)
        _delta_rs_append_refused(path)
        assert t.append(_rows([2], "dc")).version == 3
    assert _delta_rs_rows(path) == [(1, "dc"), (2, "dc")]


def test_a_version_written_during_the_adoption_halts_the_table(kafka_bootstrap: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-rs appends between the adoption record (at N) and the commit that adds the feature (N + 1): its
    version N + 1 was written around the coordinator, so that commit is refused and the table halts, in /healthz,
    instead of the coordinator ratifying a version readers would never see."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "raced"
    write_deltalake(str(path), _rows([1], "rs"))
    real = table_control.set_coordinated

    def racing(table: Any, on: bool, timeout_s: float | None) -> bool:
        write_deltalake(str(path), _rows([2], "rs"), mode="append")  # version 1, by delta-rs, not ratified
        return real(table, on, timeout_s)

    monkeypatch.setattr(table_control, "set_coordinated", racing)
    with coordinator_thread(kafka_bootstrap, topics) as coord, Table(path, kafka_bootstrap, topics=topics) as t:
        with pytest.raises(InvalidProposalError) as refused:
            t.adopt()
        assert refused.value.reason == "TABLE_HALTED" and "written around the coordinator" in str(refused.value)
        halted = coord.health()[1]["halted_tables"]
        assert list(halted) == [path.resolve().as_uri()], halted
    assert _log_versions(path) == [0, 1] and _delta_rs_rows(path) == [(1, "rs"), (2, "rs")], "nothing overwritten"
