"""Live files of a snapshot loaded from a checkpoint: every AddFile field survives the Arrow round trip,
partition-value dicts are shared between files, and superseded checkpoint rows are dropped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltacoord.reader.checkpoint import CheckpointReadError
from deltacoord.reader.log import checkpoint_file_name, commit_file_name
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.action_arrow import ADD_TYPE, actions_to_record_batch, adds_from_struct, adds_to_struct
from deltacoord.schemas.actions import (
    AddFile,
    DeletionVector,
    Metadata,
    Protocol,
    SetTransaction,
    commit_to_json_lines,
)

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "p", "type": "string", "nullable": True, "metadata": {}},
    {"name": "q", "type": "string", "nullable": True, "metadata": {}},
]})


def _adds(n: int) -> list[AddFile]:
    dv = DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 10, 2, offset=1, max_row_index=9)
    return [
        AddFile(f"p={i % 3}/f-{i}.parquet", {"p": str(i % 3), "q": None if i % 2 else "x"}, 100 + i, 1_000 + i, True,
                stats=f'{{"numRecords":{i}}}', tags={"t": str(i)} if i % 4 == 0 else None,
                deletion_vector=dv if i % 5 == 0 else None, base_row_id=i if i % 2 else None,
                default_row_commit_version=3 if i % 2 else None)
        for i in range(n)
    ]


def test_every_add_field_survives_the_arrow_round_trip_in_order() -> None:
    adds = _adds(40)
    # Every field is set on some file, so a field read into the wrong position cannot go unnoticed.
    for f in dataclasses.fields(AddFile):
        if f.name == "clustering_provider":
            continue  # not a column of the checkpoint's add struct (ADD_TYPE)
        assert any(getattr(a, f.name) not in (None, {}) for a in adds), f.name
    arr = actions_to_record_batch(adds, columns=["add"], checkpoint_form=False).column(0)
    back = adds_from_struct(arr)
    assert back == adds
    assert adds_from_struct(arr.slice(13, 9)) == adds[13:22]


def test_adds_built_from_buffers_equal_the_generic_conversion() -> None:
    adds = _adds(40)
    generic = actions_to_record_batch(adds, columns=["add"], checkpoint_form=False).column(0)
    built = adds_to_struct(adds)
    built.validate(full=True)
    assert built.type == ADD_TYPE and built.equals(generic)
    assert adds_from_struct(built) == adds
    plain = [AddFile("f.parquet", {}, 1, 2, False)]
    assert adds_to_struct(plain).equals(actions_to_record_batch(plain, columns=["add"], checkpoint_form=False).column(0))
    assert len(adds_to_struct([])) == 0


def test_files_share_partition_value_dicts_and_drop_superseded_rows(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    md = Metadata(id="t", schema_string=SCHEMA, partition_columns=("p", "q"))
    adds = _adds(30_000)  # several batches of the checkpoint's add column
    batch = actions_to_record_batch([Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), md, *adds])
    pq.write_table(pa.Table.from_batches([batch]), log / checkpoint_file_name(0), row_group_size=7_000)
    gone = [adds[5], adds[20_001], adds[29_999]]
    new = AddFile("p=9/new.parquet", {"p": "9", "q": None}, 1, 1, True)
    (log / commit_file_name(1)).write_bytes(commit_to_json_lines([*(a.to_remove(5) for a in gone), new]))
    snap = Snapshot.load(tmp_path / "t")
    files = snap.files()
    # A checkpoint's adds carry dataChange=false.
    expected = [dataclasses.replace(a, data_change=False) for a in adds if a not in gone] + [new]
    assert files == expected
    assert snap.num_files == len(expected) == len(snap.add_files_struct())
    assert snap.file_paths() == [a.path for a in expected]
    from_checkpoint = files[:-1]
    assert len({id(a.partition_values) for a in from_checkpoint}) <= 6 * 5  # 3 x 2 distinct maps per batch at most
    assert {r.path for r in snap.tombstones()} == {a.path for a in gone}


def test_arrow_and_objects_agree_before_and_after_files_converts_the_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    md = Metadata(id="t", schema_string=SCHEMA, partition_columns=("p", "q"))
    adds = _adds(20_000)
    batch = actions_to_record_batch([Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), md, *adds])
    pq.write_table(pa.Table.from_batches([batch]), log / checkpoint_file_name(0))
    snap = Snapshot.load(tmp_path / "t")
    arrow_before = snap.add_files_struct()
    paths_before = snap.file_paths()
    files = snap.files()  # the checkpoint's adds are now held as objects only
    assert len(files) == snap.num_files == 20_000
    assert snap.add_files_struct().equals(arrow_before)
    assert snap.file_paths() == paths_before == [a.path for a in files]
    assert snap.files() == files
    # Moving forward from a converted snapshot drops the touched files from the objects.
    later = snap.with_commits([(1, [files[3].to_remove(9)])])
    assert later.num_files == 19_999 and files[3] not in later.files()
    assert len(later.add_files_struct()) == 19_999


def test_files_on_demand_are_read_at_first_use_and_equal_the_files_read_at_load(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    md = Metadata(id="t", schema_string=SCHEMA, partition_columns=("p", "q"))
    adds = _adds(3_000)
    batch = actions_to_record_batch([Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), md,
                                     SetTransaction("app", 4, 1), *adds])
    pq.write_table(pa.Table.from_batches([batch]), log / checkpoint_file_name(0), row_group_size=1_000)
    new = AddFile("p=9/new.parquet", {"p": "9", "q": None}, 1, 1, True)
    (log / commit_file_name(1)).write_bytes(commit_to_json_lines([adds[7].to_remove(5), new, SetTransaction("b", 2, 1)]))
    eager = Snapshot.load(tmp_path / "t")
    lazy = Snapshot.load(tmp_path / "t", files_on_demand=True)
    # What a blind append reads is exact without the checkpoint's add column.
    assert (lazy.version, lazy.protocol, lazy.metadata, lazy.app_versions) == (
        eager.version, eager.protocol, eager.metadata, eager.app_versions) == (1, eager.protocol, md, {"app": 4, "b": 2})
    assert not lazy._checkpoint_adds.in_memory and eager._checkpoint_adds.in_memory
    later = lazy.with_commits([(2, [adds[9].to_remove(6)])])
    assert not later._checkpoint_adds.in_memory  # moving forward keeps the files on demand
    assert lazy.num_files == eager.num_files == 3_000 and lazy._checkpoint_adds.in_memory
    assert lazy.add_files_struct().equals(eager.add_files_struct())
    assert lazy.files() == eager.files() and lazy.file_paths() == eager.file_paths()
    assert later.files() == [f for f in eager.files() if f.path != adds[9].path]


def test_files_on_demand_of_a_lost_checkpoint_raise_when_asked_for(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    md = Metadata(id="t", schema_string=SCHEMA, partition_columns=("p", "q"))
    batch = actions_to_record_batch([Protocol(1, 2), md, *_adds(10)])
    pq.write_table(pa.Table.from_batches([batch]), log / checkpoint_file_name(0))
    lazy = Snapshot.load(tmp_path / "t", files_on_demand=True)
    (log / checkpoint_file_name(0)).unlink()  # log cleanup between the load and the first use
    with pytest.raises(CheckpointReadError, match=r"at version 0 were left to read when first asked for.*load the snapshot again"):
        lazy.files()
