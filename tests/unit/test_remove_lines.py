"""Removes written in bulk (`deltacoord.schemas.remove_lines`, `Transaction.remove_all`) are byte for byte the
removes written one action at a time: from a checkpoint's Arrow adds, from a commit's AddFiles, staged by
reference or sent inline."""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.action_arrow import adds_to_struct
from deltacoord.schemas.actions import (
    AddFile,
    CommitInfo,
    DeletionVector,
    Metadata,
    Protocol,
    RemoveFile,
    commit_to_json_lines,
    parse_commit,
)
from deltacoord.schemas.errors import BadFilePathError
from deltacoord.schemas.remove_lines import RemovedFiles
from deltacoord.storage.table import TableStorage
from deltacoord.writer.transaction import Transaction

TS = 1_700_000_000_123
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "d", "type": "string", "nullable": True, "metadata": {}},
    {"name": "k", "type": "string", "nullable": True, "metadata": {}}]})
#: Pieces of names and values: quotes, backslashes, controls, non-ASCII, percent-encoding, line separators.
PIECES = ["a", "é", '"q"', "b\\s", "tab\there", "nl\n", "\u2028", "\x7f", "\x85", "%20", "x y", "😀", "{}", "null"]
#: Those a data file's path may hold (the writer refuses controls in paths before sending).
PATH_PIECES = [p for p in PIECES if not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in p)]


def _text(rng: random.Random, pieces: list[str] = PIECES) -> str:
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))


def _adds(n: int, seed: int = 7, *, any_paths: bool = False) -> list[AddFile]:
    """Adds of a partitioned table with deletion vectors, stats, tags and row tracking, in every combination."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pv = rng.choice([{"d": "2024-01-01", "k": "1"}, {"d": None, "k": "x"}, {"d": _text(rng), "k": _text(rng)}])
        dv = rng.choice([None, None, DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 3, offset=rng.choice([None, 1]),
                                                    max_row_index=rng.choice([None, 9])),
                         DeletionVector("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@(ha", 40, 2)])
        stats = rng.choice([None, '{"numRecords":1}', json.dumps(
            {"numRecords": i, "minValues": {"id": i, "d": _text(rng)}, "maxValues": {"id": i, "d": _text(rng)},
             "nullCount": {"id": 0, "d": 0}}, ensure_ascii=False, separators=(",", ":"))])
        name = f"d={i % 3}/part-{i:05d}-{_text(rng, PIECES if any_paths else PATH_PIECES)}.snappy.parquet"
        out.append(AddFile(name, pv, rng.choice([0, 1000, 2**40]), 1, rng.random() < 0.9, stats=stats,
                           tags=rng.choice([None, None, {}, {"INSERTION_TIME": _text(rng)}]), deletion_vector=dv,
                           base_row_id=rng.choice([None, i * 10]), default_row_commit_version=rng.choice([None, 3])))
    return out


def _one_by_one(adds: list[AddFile], data_change: bool = True) -> bytes:
    return commit_to_json_lines([a.to_remove(TS, data_change=data_change) for a in adds])


@pytest.mark.parametrize("data_change", [True, False])
def test_the_lines_of_arrow_adds_and_of_addfiles_are_the_one_by_one_removes(data_change: bool) -> None:
    adds = _adds(3_000, any_paths=True)
    want = _one_by_one(adds, data_change)
    from_objects = RemovedFiles((adds,), TS, data_change)
    from_arrow = RemovedFiles((adds_to_struct(adds[:1_000]), adds_to_struct(adds[1_000:]).slice(0), ), TS, data_change)
    assert b"".join(from_objects.lines()) == want
    assert b"".join(from_arrow.lines()) == want
    assert list(from_arrow.actions()) == list(from_objects.actions()) == [a.to_remove(TS, data_change) for a in adds]
    assert len(from_arrow) == len(from_objects) == 3_000
    # A slice of an Arrow chunk (offsets not at zero) and rows without any optional field.
    plain = [AddFile(f"p-{i}.parquet", {}, i, 1, True) for i in range(50)]
    assert b"".join(RemovedFiles((adds_to_struct(adds).slice(1_234, 700), adds_to_struct(plain)), TS).lines()) == (
        _one_by_one(adds[1_234:1_934]) + _one_by_one(plain))


def test_the_removes_of_a_checkpointed_table_are_the_one_by_one_removes(tmp_path: Path) -> None:
    """A real checkpoint's `add` column (Arrow, as a snapshot holds it) and later commits' AddFiles, in order."""
    storage = TableStorage(str(tmp_path))
    adds = _adds(2_500, seed=3)
    storage.put("_delta_log/00000000000000000000.json", commit_to_json_lines([
        CommitInfo({"operation": "CREATE TABLE", "timestamp": 1}), Protocol(3, 7, ("deletionVectors",),
                                                                           ("deletionVectors", "rowTracking")),
        Metadata(id="d0000000-0000-4000-8000-000000000000", schema_string=SCHEMA, partition_columns=("d", "k"))]))
    storage.put("_delta_log/00000000000000000001.json", commit_to_json_lines([CommitInfo({"timestamp": 2}), *adds[:2_000]]))
    create_checkpoint(storage, 1)
    storage.put("_delta_log/00000000000000000002.json", commit_to_json_lines([CommitInfo({"timestamp": 3}), *adds[2_000:]]))
    snap = Snapshot.load(str(tmp_path))
    parts = snap.file_parts()
    assert parts[:-1] and all(isinstance(p, pa.Array) for p in parts[:-1]), "the checkpoint's adds as Arrow"
    assert parts[-1] == adds[2_000:]
    bulk = b"".join(RemovedFiles(tuple(parts), TS).lines())
    files = snap.files()
    assert sorted(a.path for a in files) == sorted(a.path for a in adds)
    assert bulk == _one_by_one(files)
    assert b"".join(RemovedFiles(tuple(snap.file_parts()), TS).lines()) == bulk, "the same once converted"


class _Table(types.SimpleNamespace):
    pass


def _transaction(tmp_path: Path) -> Transaction:
    storage = TableStorage(str(tmp_path))
    return Transaction(_Table(table_id="t", uri=storage.location, writer_name=None, storage=storage), 4, "p-1")  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [10, 100, 2_000])
def test_a_commit_removing_in_bulk_stages_or_sends_what_removing_one_by_one_did(tmp_path: Path, n: int) -> None:
    """Small commits go inline with the same actions; large ones by reference with the same staged bytes."""
    adds = _adds(n, seed=n)
    new = AddFile("d=1/new.parquet", {"d": "1", "k": "a"}, 10, 1, True, stats='{"numRecords":1}')
    meta = Metadata(id="d0000000-0000-4000-8000-000000000000", schema_string=SCHEMA, partition_columns=("d", "k"))
    bulk, single = _transaction(tmp_path / "bulk"), _transaction(tmp_path / "single")
    for tx in (bulk, single):
        tx.add(meta)
    assert bulk.remove_all([adds_to_struct(adds[: n // 2]), adds[n // 2:]]) == n
    for a in adds:
        single.actions.append(a.to_remove(bulk._bulk[0][1].deletion_timestamp))
    for tx in (bulk, single):
        tx.stage([new])
    assert bulk.action_counts() == single.action_counts() == {"numAddedFiles": 1, "numRemovedFiles": n,
                                                              "numAddedBytes": 10}
    sent = [tx._by_reference(tx._proposal("WRITE", True, {"mode": "Overwrite"})) for tx in (bulk, single)]
    assert sent[0].actions == sent[1].actions
    assert sent[0].staged == sent[1].staged
    assert (sent[0].staged is None) == (n < 1_000)
    if sent[0].staged is not None:
        assert bulk.staged_commit is not None and single.staged_commit is not None
        staged = [(tmp_path / d / k).read_bytes() for d, k in (("bulk", bulk.staged_commit),
                                                                ("single", single.staged_commit))]
        assert staged[0] == staged[1]
        assert parse_commit(staged[0]) == [meta, *single.actions[1:]]
    assert bulk.proposal("WRITE", True).actions == single.proposal("WRITE", True).actions, "the public form: inline"


@pytest.mark.parametrize("path", ["part-\n1.parquet", "part-%0A1.parquet", "part-\x851.parquet"])
@pytest.mark.parametrize("arrow", [True, False])
def test_a_control_character_in_a_removed_path_is_refused_before_sending(tmp_path: Path, path: str, arrow: bool) -> None:
    adds = [*_adds(100), AddFile(path, {}, 1, 1, True)]
    tx = _transaction(tmp_path)
    tx.remove_all([adds_to_struct(adds) if arrow else adds])
    with pytest.raises(BadFilePathError, match=r"RemoveFile path .* control character.*nothing was sent"):
        tx._proposal("WRITE", True)
    assert RemovedFiles((adds_to_struct([a for a in adds if a.path != path]),), TS).bad_path() is None
    assert isinstance(next(RemovedFiles((adds,), TS).actions()), RemoveFile)
