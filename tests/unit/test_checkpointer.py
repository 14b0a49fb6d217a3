"""Classic checkpoints written by coordinator.delta_log.checkpointer, read back by delta-rs and by our reader."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltacoord.coordinator.delta_log.checkpointer import (
    checkpoint_actions,
    checkpoint_actions_from_snapshot,
    create_checkpoint,
    parse_interval_ms,
    write_checkpoint,
    write_last_checkpoint,
)
from deltacoord.reader.deletion_vectors import encode_roaring64, z85_encode
from deltacoord.reader.log import LastCheckpoint, list_log, read_last_checkpoint, resolve_data_path
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.action_arrow import CHECKPOINT_SCHEMA
from deltacoord.schemas.actions import (
    AddFile,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    commit_to_json_lines,
)

DAY = 86_400_000
SCHEMA_ID = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})


def _data(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array([f"k{i % 3}" for i in ids]), "v": [str(i) for i in ids]})


def _history(path: Path) -> int:
    """delta-rs table: appends, deletes, an overwrite, app txns. No checkpoints."""
    write_deltalake(path, _data(0, 12), partition_by=["p"])
    write_deltalake(path, _data(100, 6), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id="a", version=1)]))
    DeltaTable(path).delete("id < 4")
    write_deltalake(path, _data(200, 9), mode="overwrite")
    write_deltalake(path, _data(300, 3), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id="a", version=2)]))
    DeltaTable(path).delete("id = 301")
    return DeltaTable(path).version()


def _files(path: Path, version: int | None = None) -> set[str]:
    d = DeltaTable(path) if version is None else DeltaTable(path, version=version)
    return {os.path.normpath(u.removeprefix("file://")) for u in d.file_uris()}


def _our_files(s: Snapshot) -> set[str]:
    return {os.path.normpath(str(resolve_data_path(s.root, p))) for p in s.file_paths()}


def _rows(t: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pa.table(t).sort_by([("id", "ascending")]).to_pylist()
    return rows


def _checkpoint_rows(path: Path) -> list[str]:
    """Checkpoint contents as a sorted list of canonical JSON rows (order-insensitive comparison)."""
    t = pq.read_table(path)
    return sorted(json.dumps({k: v for k, v in r.items() if v is not None}, sort_keys=True, default=str) for r in t.to_pylist())


@pytest.fixture()
def table(tmp_path: Path) -> tuple[Path, int]:
    p = tmp_path / "t"
    return p, _history(p)


def test_checkpoint_read_by_delta_rs_and_us(table: tuple[Path, int], tmp_path: Path) -> None:
    path, last = table
    expected = {v: (_files(path, v), _rows(DeltaTable(path, version=v).to_pyarrow_table())) for v in range(last + 1)}
    json_only = {v: _our_files(Snapshot.load(path, version=v)) for v in range(last + 1)}
    r = create_checkpoint(path, 3, now_ms=0)
    assert r.written and r.version == 3 and r.num_of_add_files == len(expected[3][0])
    r = create_checkpoint(path, now_ms=0)  # latest, streamed from the v3 checkpoint
    assert r.version == last and r.written
    lc = read_last_checkpoint(path)
    assert lc is not None and lc.version == last and lc.size == r.size and lc.size_in_bytes == r.path.stat().st_size
    assert lc.num_of_add_files == len(expected[last][0]) and lc.checkpoint_schema is not None
    # delta-rs loads the table from our checkpoints, latest and older versions
    for v in range(last + 1):
        assert _files(path, v) == expected[v][0]
        assert _rows(DeltaTable(path, version=v).to_pyarrow_table()) == expected[v][1]
    assert DeltaTable(path).transaction_version("a") == 2
    # our reader, starting from our checkpoints, equals JSON replay
    for v in range(last + 1):
        s = Snapshot.load(path, version=v)
        assert (s.segment.checkpoint is not None) == (v >= 3)
        assert _our_files(s) == json_only[v]
        assert _rows(s.to_pyarrow()) == expected[v][1]
    assert Snapshot.load(path).app_versions == {"a": 2}
    # no temporary files left behind
    assert not [f for f in os.listdir(path / "_delta_log") if f.startswith(".") and f.endswith(".tmp")]


def test_checkpoint_content_rules(table: tuple[Path, int]) -> None:
    path, _last = table
    r = create_checkpoint(path, now_ms=0)
    t = pq.read_table(r.path)
    assert t.schema == CHECKPOINT_SCHEMA
    rows = t.to_pylist()
    assert sum(1 for x in rows if x["protocol"]) == 1 and sum(1 for x in rows if x["metaData"]) == 1
    adds = [x["add"] for x in rows if x["add"]]
    removes = [x["remove"] for x in rows if x["remove"]]
    assert adds and removes
    assert all(a["dataChange"] is False for a in adds) and all(x["dataChange"] is False for x in removes)
    assert all(isinstance(a["stats"], str) and json.loads(a["stats"])["numRecords"] >= 1 for a in adds)
    assert "stats" not in CHECKPOINT_SCHEMA.field("remove").type.names
    assert next(x["txn"] for x in rows if x["txn"])["appId"] == "a"
    assert len(rows) == r.size == 2 + len(adds) + len(removes) + 1
    # tombstones expire after delta.deletedFileRetentionDuration (default one week) past deletionTimestamp
    newest_delete = max(x["deletionTimestamp"] for x in removes)
    oldest_delete = min(x["deletionTimestamp"] for x in removes)
    later = [a for a in checkpoint_actions(path, now_ms=newest_delete + 7 * DAY + 1)]
    assert not [a for a in later if isinstance(a, RemoveFile)]
    assert all(b.column(1).null_count == b.num_rows for b in later if isinstance(b, pa.RecordBatch))
    mid = [a for a in checkpoint_actions(path, from_checkpoint=False, now_ms=oldest_delete + 7 * DAY)]
    kept = [a for a in mid if isinstance(a, RemoveFile)]
    assert kept and all((a.deletion_timestamp or 0) > oldest_delete for a in kept)


def test_streaming_equals_full_replay(tmp_path: Path) -> None:
    """Checkpoint built from previous checkpoint + commits == checkpoint built from a full JSON replay."""
    path = tmp_path / "s"
    md = Metadata(id="t", schema_string=SCHEMA_ID, configuration={"delta.deletedFileRetentionDuration": "interval 2 days"})
    log = path / "_delta_log"
    log.mkdir(parents=True)

    def commit(v: int, actions: list[Any]) -> None:
        (log / f"{v:020d}.json").write_bytes(commit_to_json_lines([CommitInfo({"timestamp": v}), *actions]))

    adds = [AddFile(f"f{i}.parquet", {}, 10 + i, 1, True, stats=f'{{"numRecords":{i + 1}}}') for i in range(40)]
    dv = DeletionVector("i", z85_encode(encode_roaring64([0])), len(encode_roaring64([0])), 1)
    commit(0, [Protocol(1, 2), md, *adds[:20], SetTransaction("x", 1, 5 * DAY), DomainMetadata("d1", "a")])
    commit(1, [*adds[20:30], adds[0].to_remove(1 * DAY), adds[1].to_remove(9 * DAY)])
    commit(2, [adds[30], DomainMetadata("d2", "b"), SetTransaction("y", 7, 9 * DAY)])
    first = create_checkpoint(path, 2, now_ms=10 * DAY, row_group_rows=7)
    assert first.written and pq.ParquetFile(first.path).metadata.num_row_groups > 1
    dv_add = AddFile("f2.parquet", {}, 12, 1, True, stats='{"numRecords":3}', deletion_vector=dv)
    commit(3, [adds[2].to_remove(10 * DAY), dv_add, adds[3].to_remove(10 * DAY), DomainMetadata("d1", "a", removed=True)])
    commit(4, [adds[0], adds[31], SetTransaction("x", 2, 10 * DAY),
               Protocol(3, 7, ("deletionVectors",), ("deletionVectors", "domainMetadata"))])
    commit(5, [adds[31].to_remove(10 * DAY), adds[4].to_remove(10 * DAY), adds[4]])  # re-added in the same commit
    now = 11 * DAY
    streamed = list(checkpoint_actions(path, 5, now_ms=now, batch_rows=4))
    assert any(isinstance(b, pa.RecordBatch) for b in streamed)  # previous checkpoint rows pass through as Arrow
    r1 = write_checkpoint(path, 5, streamed, row_group_rows=5, update_last_checkpoint=False)
    full_dir = tmp_path / "full"
    shutil.copytree(path, full_dir)
    (full_dir / "_delta_log" / f"{5:020d}.checkpoint.parquet").unlink()
    for f in (full_dir / "_delta_log").glob("*.checkpoint.parquet"):
        f.unlink()
    r2 = write_checkpoint(full_dir, 5, checkpoint_actions(full_dir, 5, now_ms=now, from_checkpoint=False))
    assert _checkpoint_rows(r1.path) == _checkpoint_rows(r2.path)
    assert r1.num_of_add_files == r2.num_of_add_files == 30 - 2 + 1  # 32 added; f2,f3 gone; f0 back; f31 gone; f2+dv
    snap = Snapshot.load(path, 5)  # loads from the streamed v5 checkpoint
    assert snap.segment.checkpoint is not None and snap.segment.checkpoint.version == 5
    assert {f.key() for f in snap.files()} == {f.key() for f in Snapshot.load(full_dir, 5).files()}
    assert snap.domains == {"d2": "b"} and snap.app_versions == {"x": 2, "y": 7}
    assert snap.protocol == Protocol(3, 7, ("deletionVectors",), ("deletionVectors", "domainMetadata"))
    # remove tombstones: within 2 days of now only
    tomb = {r.path for r in snap.tombstones()}
    assert tomb == {"f2.parquet", "f3.parquet", "f31.parquet"}  # f1 (9 days) expired at 11 days; f0 re-added
    # the snapshot-based stream gives the same checkpoint
    snap_dir = tmp_path / "snap"
    shutil.copytree(full_dir, snap_dir)
    (snap_dir / "_delta_log" / f"{5:020d}.checkpoint.parquet").unlink()
    r3 = write_checkpoint(snap_dir, 5, checkpoint_actions_from_snapshot(Snapshot.load(full_dir, 5), now_ms=now, batch_rows=3))
    assert _checkpoint_rows(r3.path) == _checkpoint_rows(r2.path)


def test_streaming_from_delta_rs_checkpoint(table: tuple[Path, int], tmp_path: Path) -> None:
    """The previous checkpoint may come from another writer (delta-rs: other schema, non-null fields)."""
    path, last = table
    dt = DeltaTable(path)
    dt.create_checkpoint()  # delta-rs checkpoint at `last`
    write_deltalake(path, _data(400, 5), mode="append")
    DeltaTable(path).delete("id = 400")
    r = create_checkpoint(path, now_ms=0)
    assert r.version == last + 2
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    for f in (copy / "_delta_log").glob("*.checkpoint.parquet"):
        f.unlink()
    (copy / "_delta_log" / "_last_checkpoint").unlink()
    r2 = create_checkpoint(copy, last + 2, now_ms=0)
    assert _checkpoint_rows(r.path) == _checkpoint_rows(r2.path)
    assert _files(path) == _our_files(Snapshot.load(path))
    assert set(Snapshot.load(copy).file_paths()) == set(Snapshot.load(path).file_paths())
    assert _rows(DeltaTable(path).to_pyarrow_table()) == _rows(Snapshot.load(path).to_pyarrow())


def test_dv_table_checkpoint_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "dv"
    path.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), path / "a.parquet")
    size = (path / "a.parquet").stat().st_size
    data = encode_roaring64([2, 5])
    dv = DeletionVector("i", z85_encode(data), len(data), 2)
    a = AddFile("a.parquet", {}, size, 1, True, stats='{"numRecords":10}')
    log = path / "_delta_log"
    log.mkdir()
    (log / f"{0:020d}.json").write_bytes(commit_to_json_lines([Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)),
                                                                 Metadata(id="t", schema_string=SCHEMA_ID), a]))
    (log / f"{1:020d}.json").write_bytes(commit_to_json_lines([a.to_remove(5), AddFile("a.parquet", {}, size, 1, True, stats='{"numRecords":10}', deletion_vector=dv)]))
    create_checkpoint(path, now_ms=0)
    s = Snapshot.load(path)
    assert s.segment.checkpoint is not None
    assert s.files()[0].deletion_vector == dv
    assert sorted(s.to_pyarrow().column("id").to_pylist()) == [0, 1, 3, 4, 6, 7, 8, 9]
    assert [r.key() for r in s.tombstones()] == [("a.parquet", None)]


def test_never_overwrites_existing_checkpoint(table: tuple[Path, int]) -> None:
    path, last = table
    r1 = create_checkpoint(path, now_ms=0)
    again = create_checkpoint(path, now_ms=0)  # deterministic: identical bytes count as written
    assert again.written and again.path.read_bytes() == r1.path.read_bytes()
    before = r1.path.read_bytes()
    r2 = create_checkpoint(path, now_ms=10**15)  # all tombstones expired: different content
    assert not r2.written and r2.path.read_bytes() == before
    assert r2.num_of_add_files is None and r2.size == pq.ParquetFile(r1.path).metadata.num_rows
    # _last_checkpoint never moves backwards
    create_checkpoint(path, 2, now_ms=0)
    lc = read_last_checkpoint(path)
    assert lc is not None and lc.version == last
    assert not write_last_checkpoint(path, LastCheckpoint(version=1, size=1))
    assert list_log(path).best_checkpoint(last) is not None


def test_write_checkpoint_validation(tmp_path: Path) -> None:
    path = tmp_path / "v"
    log = path / "_delta_log"
    log.mkdir(parents=True)
    md = Metadata(id="t", schema_string=SCHEMA_ID)
    (log / f"{0:020d}.json").write_bytes(commit_to_json_lines([Protocol(3, 7), md]))
    with pytest.raises(ValueError, match="exactly one protocol"):
        write_checkpoint(path, 0, [md])
    with pytest.raises(ValueError, match="exactly one protocol"):
        write_checkpoint(path, 0, [Protocol(1, 2), Protocol(1, 2), md])
    with pytest.raises(FileNotFoundError):
        write_checkpoint(path, 3, [Protocol(1, 2), md])
    assert not list(log.glob("*.checkpoint.parquet")) and not list(log.glob(".*tmp"))
    # commitInfo / removed domains dropped; table-features protocol gets non-null feature lists
    r = write_checkpoint(path, 0, [CommitInfo({"x": 1}), Protocol(3, 7), md, DomainMetadata("gone", "", removed=True)])
    rows = pq.read_table(r.path).to_pylist()
    assert r.size == 2 and len(rows) == 2
    proto = next(x["protocol"] for x in rows if x["protocol"])
    assert proto["readerFeatures"] == [] and proto["writerFeatures"] == []


def test_parse_interval() -> None:
    assert parse_interval_ms("interval 1 week") == 7 * DAY
    assert parse_interval_ms("interval 2 days") == 2 * DAY
    assert parse_interval_ms("1 day 12 hours") == DAY + DAY // 2
    assert parse_interval_ms("INTERVAL 30 minutes") == 30 * 60_000
    with pytest.raises(ValueError):
        parse_interval_ms("interval 3 fortnights")


BIG_SCRIPT = textwrap.dedent(
    """
    import itertools, json, resource, sys
    from pathlib import Path
    from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint, write_checkpoint
    from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol, commit_to_json_lines

    N = int(sys.argv[2])
    root = Path(sys.argv[1])
    log = root / "_delta_log"
    log.mkdir(parents=True)
    schema = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}},
                         {"name": "p", "type": "string", "nullable": True, "metadata": {}}]})
    md = Metadata(id="big", schema_string=schema, partition_columns=("p",))
    def add(i):
        return AddFile(f"p={i % 100}/part-{i:07d}.parquet", {"p": str(i % 100)}, 1000 + i, 1_700_000_000_000, True,
                       stats=json.dumps({"numRecords": 10, "minValues": {"id": i * 10}, "maxValues": {"id": i * 10 + 9},
                                         "nullCount": {"id": 0}}))
    (log / f"{0:020d}.json").write_bytes(commit_to_json_lines([CommitInfo({"timestamp": 0}), Protocol(1, 2), md]))
    (log / f"{1:020d}.json").write_bytes(commit_to_json_lines([CommitInfo({"timestamp": 1})]))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # synthetic state of version 1: N files, written through the batched writer from a generator
    r1 = write_checkpoint(root, 1, itertools.chain([Protocol(1, 2), md], (add(i) for i in range(N))))
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    removed = [add(i).to_remove(2_000_000_000_000) for i in range(0, N, 200)]
    (log / f"{2:020d}.json").write_bytes(commit_to_json_lines(removed))
    (log / f"{3:020d}.json").write_bytes(commit_to_json_lines([add(N + i) for i in range(500)] + [add(0)]))
    r3 = create_checkpoint(root, 3, now_ms=2_000_000_000_000)
    rss3 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rss_after_setup_kb": rss0, "rss_after_v1_kb": rss1, "peak_rss_kb": rss3,
                      "v1_rows": r1.size, "v3_rows": r3.size, "v3_adds": r3.num_of_add_files,
                      "v3_bytes": r3.size_in_bytes, "removed": len(removed)}))
    """
)


def test_bounded_memory_200k_files(tmp_path: Path) -> None:
    n = 200_000
    root = tmp_path / "big"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", BIG_SCRIPT, str(root), str(n)], capture_output=True, text=True, env=env, check=True)
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    removed = stats["removed"]
    expected_adds = n - removed + 500 + 1  # add(0) re-added after its removal
    assert stats["v1_rows"] == n + 2
    assert stats["v3_adds"] == expected_adds
    assert stats["v3_rows"] == expected_adds + (removed - 1) + 2  # unexpired tombstones kept, f0's replaced by its add
    print(f"\n[bounded-memory] 200k-file checkpoint: {json.dumps(stats)}")
    ckpt = root / "_delta_log" / f"{3:020d}.checkpoint.parquet"
    md = pq.ParquetFile(ckpt).metadata
    assert md.num_row_groups >= stats["v3_rows"] // 50_000
    assert all(md.row_group(i).num_rows <= 50_000 for i in range(md.num_row_groups))
    # delta-rs and our reader agree on the file set
    ours = Snapshot.load(root)
    assert ours.num_files == expected_adds
    assert len(DeltaTable(root).file_uris()) == expected_adds
    assert set(ours.file_paths()) == {u.removeprefix("file://").removeprefix(str(root) + "/") for u in DeltaTable(root).file_uris()}


def test_small_actions_are_read_from_the_row_groups_that_hold_them(tmp_path: Path) -> None:
    """Row-group statistics let the checkpoint's protocol/metaData/txn rows be found without reading every add."""
    from deltacoord.reader.checkpoint import iter_checkpoint_batches
    from deltacoord.schemas.action_arrow import SMALL_ACTION_COLUMNS

    log = tmp_path / "_delta_log"
    log.mkdir()
    md = Metadata(id="t", schema_string=SCHEMA_ID)
    adds = [AddFile(f"f{i}.parquet", {}, 10, 1, True) for i in range(5)]
    domain = DomainMetadata("d", "{}", False)
    (log / f"{0:020d}.json").write_bytes(commit_to_json_lines([Protocol(1, 2), md, *adds, SetTransaction("app", 3, None), domain]))
    # rows: [protocol, metaData] [txn, domain] [add, add] [add, add] [add] (actions are written in kind order)
    write_checkpoint(tmp_path, 0, checkpoint_actions(tmp_path, 0), row_group_rows=2)
    ckpt = [log / f"{0:020d}.checkpoint.parquet"]
    assert pq.ParquetFile(ckpt[0]).metadata.num_row_groups == 5

    every = pa.Table.from_batches(list(iter_checkpoint_batches(ckpt, SMALL_ACTION_COLUMNS, 10)))
    some = pa.Table.from_batches(list(iter_checkpoint_batches(ckpt, SMALL_ACTION_COLUMNS, 10, skip_absent=True)))
    assert every.num_rows == 9 and some.num_rows == 4
    for col in SMALL_ACTION_COLUMNS:  # nothing is missed
        assert some.column(col).drop_null().to_pylist() == every.column(col).drop_null().to_pylist() != []
    adds_only = list(iter_checkpoint_batches(ckpt, ["add"], 10, skip_absent=True))
    assert sum(b.num_rows for b in adds_only) == 5  # the protocol..domain row groups hold no add

    # A file without statistics is read whole.
    bare = tmp_path / "bare.checkpoint.parquet"
    pq.write_table(pq.read_table(ckpt[0]), bare, row_group_size=2, write_statistics=False)
    assert sum(b.num_rows for b in iter_checkpoint_batches([bare], SMALL_ACTION_COLUMNS, 10, skip_absent=True)) == 9


@pytest.mark.parametrize("policy", ["v2", "classic"])
def test_checkpoint_kind_is_chosen_from_protocol_and_metadata_given_as_arrow_batches(tmp_path: Path, policy: str) -> None:
    """The V2-or-classic choice comes from the streamed protocol and metaData, also when they arrive inside
    a checkpoint-schema batch (the written file is not read back for them)."""
    from deltacoord.coordinator.delta_log.checkpoint_v2 import FEATURE
    from deltacoord.schemas.action_arrow import actions_to_record_batch

    path = tmp_path / "t"
    log = path / "_delta_log"
    log.mkdir(parents=True)
    protocol = Protocol(3, 7, reader_features=(FEATURE,), writer_features=(FEATURE,))
    md = Metadata(id="t", schema_string=SCHEMA_ID, configuration={"delta.checkpointPolicy": policy})
    add = AddFile("a.parquet", {}, 10, 1, True)
    (log / f"{0:020d}.json").write_bytes(commit_to_json_lines([protocol, md, add]))
    r = write_checkpoint(path, 0, [actions_to_record_batch([protocol, md, add])])
    classic = log / f"{0:020d}.checkpoint.parquet"
    if policy == "v2":
        assert not classic.exists() and ".checkpoint." in r.file.key and r.file.key != f"_delta_log/{classic.name}"
    else:
        assert classic.exists() and r.written
    assert Snapshot.load(path).file_paths() == ["a.parquet"]
