"""An adopted table's state read from its `_delta_log` is the state the rules would hold had they decided
every version; adopt and release records fold as control records; state snapshots keep released tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from deltacoord.coordinator.delta_log.adoption import (
    PublishedState,
    StateLoadError,
    adoption_problems,
    load_published_state,
)
from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker
from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.kafka.control import (
    ADOPT,
    RELEASE,
    adoption_record,
    control_kind,
    is_request_id,
    release_record,
)
from deltacoord.coordinator.kafka.recovery import Recovered, _fold_adoption
from deltacoord.coordinator.kafka.state_snapshots import PartitionSnapshot, decode_snapshot, encode_snapshot
from deltacoord.coordinator.rules.conflicts import decide
from deltacoord.coordinator.rules.outcomes import Accepted
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import (
    Action,
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
from deltacoord.schemas.routing import CONTROL_PREFIX
from deltacoord.storage.table import TableStorage
from tests.unit.builders import DOMAINS_PROTOCOL, NOW, TABLE_ID, TABLE_URI, proposal

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


def _add(path: str, dv: DeletionVector | None = None) -> AddFile:
    return AddFile(path=path, partition_values={}, size=10, modification_time=NOW, data_change=True, deletion_vector=dv)


def _dv(tag: str, offset: int | None = None) -> DeletionVector:
    return DeletionVector(storage_type="u" if offset is not None else "i", path_or_inline_dv=tag, offset=offset,
                          size_in_bytes=4, cardinality=1)


def _history() -> list[list[Action]]:
    """Versions 0..4: files with and without deletion vectors (inline and in files, with offsets), removes,
    an app transaction and domains; a checkpoint goes after version 2."""
    md = Metadata(id="m-1", schema_string=SCHEMA, configuration={"delta.checkpointInterval": "100"})
    return [
        [CommitInfo({"operation": "CREATE TABLE", "timestamp": NOW}), DOMAINS_PROTOCOL, md],
        [CommitInfo({"operation": "WRITE", "timestamp": NOW + 1}), _add("a.parquet"), _add("b.parquet"),
         _add("c.parquet", _dv("abcd")), DomainMetadata("app.one", "{}")],
        [CommitInfo({"operation": "DELETE", "timestamp": NOW + 2}), RemoveFile("b.parquet", NOW, True, size=10),
         RemoveFile("c.parquet", NOW, True, size=10, deletion_vector=_dv("abcd")), _add("c.parquet", _dv("x/dv", 7)),
         SetTransaction("pipe", 5, NOW)],
        [CommitInfo({"operation": "WRITE", "timestamp": NOW + 3}), _add("d.parquet"), _add("e parquet/ü.parquet"),
         DomainMetadata("app.one", "{}", removed=True), DomainMetadata("app.two", "{}")],
        [CommitInfo({"operation": "DELETE", "timestamp": NOW + 4, "inCommitTimestamp": NOW + 40}),
         RemoveFile("a.parquet", NOW, True, size=10)],
    ]


def _write(root: Path, history: list[list[Action]], checkpoint_at: int | None) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    for v, actions in enumerate(history):
        (log / f"{v:020d}.json").write_bytes(commit_to_json_lines(actions))
        if v == checkpoint_at:
            create_checkpoint(str(root), v)


def load_storage(root: Path) -> TableStorage:
    return TableStorage(str(root))


def _decided(history: list[list[Action]]) -> TableState:
    st = TableState.empty("t", "file:///t")
    for v, actions in enumerate(history):
        st.apply(v, actions)
    return st


@pytest.mark.parametrize("checkpoint_at", [None, 2, 4])
def test_the_published_state_is_what_deciding_every_version_builds(tmp_path: Path, checkpoint_at: int | None) -> None:
    history = _history()
    _write(tmp_path, history, checkpoint_at)
    loaded = load_published_state(load_storage(tmp_path))
    decided = _decided(history).export()
    assert loaded.version == 4 and loaded.checkpoint_version == checkpoint_at
    assert np.array_equal(loaded.live_hashes, decided.live_hashes) and loaded.num_files == 3
    assert loaded.protocol == DOMAINS_PROTOCOL and loaded.metadata.id == "m-1"
    assert dict(loaded.app_versions) == {"pipe": 5} and [d.domain for d in loaded.domains] == ["app.two"]
    assert (loaded.last_ict, loaded.last_commit_timestamp) == (NOW + 40, NOW + 4)
    st = loaded.table_state(TABLE_ID, TABLE_URI)
    assert st.version == 4 and st.live_file_count == 3 and st.is_live(_add("c.parquet", _dv("x/dv", 7)))
    assert not st.is_live(_add("c.parquet", _dv("abcd"))) and not st.is_live(_add("a.parquet"))
    r = decide(st, proposal(4, [SetTransaction("pipe", 5, NOW)]), NOW)  # the recorded app version holds
    assert not isinstance(r, Accepted) and r.reason == "STALE_TXN_VERSION"
    assert isinstance(decide(st, proposal(4, [_add("f.parquet")]), NOW), Accepted)
    older = load_published_state(load_storage(tmp_path), 3)
    assert older.version == 3 and np.array_equal(older.live_hashes, _decided(history[:4]).export().live_hashes)


def test_the_checkpoint_worker_loads_the_same_state_and_says_why_not(tmp_path: Path) -> None:
    history = _history()
    _write(tmp_path / "t", history, 2)
    (tmp_path / "empty").mkdir()
    worker = CheckpointWorker()
    try:
        here = load_published_state(load_storage(tmp_path / "t"))
        there = worker.load_state(load_storage(tmp_path / "t"), None)
        assert there.version == here.version and np.array_equal(there.live_hashes, here.live_hashes)
        assert there.protocol == here.protocol and there.metadata == here.metadata
        with pytest.raises(StateLoadError) as missing:
            worker.load_state(load_storage(tmp_path / "empty"), None)
        assert missing.value.kind == "missing"
        with pytest.raises(StateLoadError) as unreadable:
            worker.load_state(load_storage(tmp_path / "t"), 9)
        assert unreadable.value.kind == "unreadable"
    finally:
        worker.close()


def test_adoption_problems_name_the_features() -> None:
    md = Metadata(id="m", schema_string=SCHEMA)
    assert adoption_problems(Protocol(1, 2), md) == []
    assert adoption_problems(DOMAINS_PROTOCOL, md) == []
    problems = adoption_problems(Protocol(4, 7, ("x",), ("appendOnly", "somethingNew")), md)
    assert any("somethingNew" in p for p in problems) and any("reader version 4" in p for p in problems)
    mapped = Metadata(id="m", schema_string=SCHEMA, configuration={"delta.columnMapping.mode": "name"})
    assert adoption_problems(Protocol(2, 5), mapped) == []  # name and id modes are written with physical names
    undefined = Metadata(id="m", schema_string=SCHEMA, configuration={"delta.columnMapping.mode": "names"})
    assert any("columnMapping" in p for p in adoption_problems(Protocol(2, 5), undefined))
    cdf = Metadata(id="m", schema_string=SCHEMA, configuration={"delta.enableChangeDataFeed": "true"})
    assert adoption_problems(Protocol(1, 4), cdf) == []  # appends owe no change data, DELETE & co. write it


def test_adopt_and_release_records_are_control_records() -> None:
    rid = f"{CONTROL_PREFIX}{ADOPT}:0b6f5c1e"
    a = adoption_record("t", "file:///t", rid, 4, "adopted", NOW)
    r = release_record("t", "file:///t", f"{CONTROL_PREFIX}{RELEASE}:1", 9, NOW)
    assert (control_kind(a), a.winning_version, a.committed) == (ADOPT, 4, False)
    assert (control_kind(r), r.winning_version) == (RELEASE, 9)
    assert is_request_id(rid, ADOPT) and not is_request_id(rid, RELEASE)
    assert not is_request_id(f"{CONTROL_PREFIX}{ADOPT}:", ADOPT) and not is_request_id("p-1", ADOPT)


def test_a_state_snapshot_keeps_released_tables() -> None:
    snap = PartitionSnapshot(commits_topic="c", partition=0, offset=3, last=(2, "p"), released={"t": ("file:///t", 7)})
    assert decode_snapshot(encode_snapshot(snap)).released == {"t": ("file:///t", 7)}


def _published(tmp_path: Path) -> PublishedState:
    _write(tmp_path, _history(), 2)
    return load_published_state(load_storage(tmp_path))


def test_recovery_folds_adoptions_as_the_live_coordinator_applied_them(tmp_path: Path) -> None:
    """`_fold_adoption`: a halt and a release are lifted, the state read at the adopted version; an answer to a
    repeated request changes nothing; a log that cannot give the version halts the table."""
    published = _published(tmp_path)
    loads: list[tuple[str, int]] = []

    def load(uri: str, version: int) -> PublishedState:
        loads.append((uri, version))
        if uri == "file:///gone":
            raise StateLoadError("unreadable", "version 4 cannot be built")
        return published

    seen: list[str] = []
    rec = Recovered(halted={TABLE_ID: (TABLE_URI, "a creation onto a foreign log")}, released={TABLE_ID: (TABLE_URI, 1)})
    adopt = adoption_record(TABLE_ID, TABLE_URI, f"{CONTROL_PREFIX}{ADOPT}:1", 4, "adopted", NOW)
    _fold_adoption(rec, adopt, load, lambda tid, uri: seen.append(tid), set())
    st = rec.states[TABLE_ID]
    assert (st.version, st.live_file_count, loads, seen) == (4, 3, [(TABLE_URI, 4)], [TABLE_ID])
    assert rec.halted == {} and rec.released == {}
    again = dataclasses.replace(adoption_record(TABLE_ID, TABLE_URI, f"{CONTROL_PREFIX}{ADOPT}:2", 4, "again", NOW),
                                duplicate_of=4)
    rec.halted[TABLE_ID] = (TABLE_URI, "halted later")
    _fold_adoption(rec, again, load, lambda tid, uri: None, set())
    assert len(loads) == 1 and TABLE_ID in rec.halted and rec.states[TABLE_ID] is st  # nothing changed
    _fold_adoption(rec, adopt, load, lambda tid, uri: None, set())  # the state already at 4: the halt is lifted
    assert len(loads) == 1 and TABLE_ID not in rec.halted and rec.states[TABLE_ID] is st

    broken: set[str] = set()
    lost = adoption_record("t-gone", "file:///gone", f"{CONTROL_PREFIX}{ADOPT}:3", 4, "adopted", NOW)
    _fold_adoption(rec, lost, load, lambda tid, uri: None, broken)
    assert "t-gone" not in rec.states and broken == {"t-gone"}
    assert "version 4 cannot be built" in rec.halted["t-gone"][1] and "deltacoord table adopt" in rec.halted["t-gone"][1]
