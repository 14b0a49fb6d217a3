"""Writes to _delta_log: one put-if-absent for commits and checkpoints, and what happens without hard links."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from deltacoord.coordinator.delta_log import files
from deltacoord.coordinator.delta_log.files import (
    HardLinksRefusedError,
    Put,
    put_if_absent,
    sweep_temp_files,
    temp_path,
)
from deltacoord.coordinator.delta_log.publisher import Publisher, PublishTask
from deltacoord.reader.log import commit_path, log_file_names
from deltacoord.schemas.actions import CommitInfo, Protocol, commit_to_json_lines
from deltacoord.schemas.staged import STAGED_DIR
from deltacoord.storage import local as storage_local
from deltacoord.storage.table import TableStorage


def test_put_if_absent_never_overwrites(tmp_path: Path) -> None:
    path = commit_path(tmp_path, 0)
    assert put_if_absent(path, b"one\n") is Put.WRITTEN
    assert put_if_absent(path, b"one\n") is Put.IDENTICAL
    assert put_if_absent(path, b"two\n") is Put.DIFFERENT
    assert path.read_bytes() == b"one\n"
    streamed = temp_path(path)
    streamed.write_bytes(b"two\n")
    assert put_if_absent(path, streamed, fsync=False) is Put.DIFFERENT  # a checkpoint written to a temp file first
    assert not streamed.exists() and path.read_bytes() == b"one\n"
    assert log_file_names(tmp_path) == ["00000000000000000000.json"]  # no temp file left


def test_sweep_removes_only_temp_files(tmp_path: Path) -> None:
    path = commit_path(tmp_path, 3)
    put_if_absent(path, b"x\n")
    temp_path(path).write_bytes(b"left by a killed publisher")
    (path.parent / ".not-ours.tmp").write_bytes(b"")
    staged = TableStorage(str(tmp_path)).temp_for(f"{STAGED_DIR}staging.json")  # a staged commit being written
    Path(staged).write_bytes(b"left by a killed coordinator")
    (tmp_path / STAGED_DIR / "w-1.json").write_bytes(b"")
    assert sweep_temp_files(str(tmp_path)) == 2
    assert log_file_names(tmp_path) == [".not-ours.tmp", "00000000000000000003.json"]
    assert sorted(p.name for p in (tmp_path / STAGED_DIR).iterdir()) == ["w-1.json"]


@pytest.fixture
def no_hard_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem that refuses link(2), as some network and FUSE filesystems do, and has no
    renameat2(RENAME_NOREPLACE) either (the storage edge's fallback)."""

    def refuse(src: object, dst: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    def unsupported(src: str, dst: str) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), dst)

    monkeypatch.setattr(files.os, "link", refuse)
    monkeypatch.setattr(storage_local, "rename_noreplace", unsupported)


@pytest.mark.usefixtures("no_hard_links")
def test_without_hard_links_put_if_absent_refuses_at_once(tmp_path: Path) -> None:
    path = commit_path(tmp_path, 0)
    with pytest.raises(HardLinksRefusedError, match="refuses hard links") as e:
        put_if_absent(path, b"data\n")
    assert isinstance(e.value, OSError) and e.value.errno == errno.EPERM
    assert log_file_names(tmp_path) == []  # nothing written, no temp file left


@pytest.mark.usefixtures("no_hard_links")
def test_without_hard_links_the_publisher_halts_the_table_instead_of_retrying(tmp_path: Path) -> None:
    p = Publisher(fsync=False)
    p.start()
    try:
        p.submit(PublishTask("t", tmp_path.as_uri(), 0, (CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2))))
        assert p.wait_idle(60), "the publisher is still retrying"
        why = p.halted_tables()["t"]
        assert "refuses hard links" in why and "halted" in why
        assert p.halted_count() == 1 and p.lag() == 0
    finally:
        p.stop()
    assert not commit_path(tmp_path, 0).exists()


def test_a_different_file_at_a_version_halts_the_table(tmp_path: Path) -> None:
    actions = (CommitInfo({"operation": "CREATE TABLE"}), Protocol(1, 2))
    put_if_absent(commit_path(tmp_path, 0), b"written around the coordinator\n")
    p = Publisher(fsync=False)
    p.start()
    try:
        p.submit(PublishTask("t", tmp_path.as_uri(), 0, actions))
        assert p.wait_idle(60)
        assert "different content" in p.halted_tables()["t"]
    finally:
        p.stop()
    assert commit_path(tmp_path, 0).read_bytes() != commit_to_json_lines(actions)


def _versions(n: int, start: int = 0) -> list[tuple[str, bytes]]:
    return [(f"_delta_log/{v:020d}.json", commit_to_json_lines((CommitInfo({"operation": "WRITE", "v": v}),)))
            for v in range(start, start + n)]


@pytest.mark.parametrize("fsync", [True, False])
def test_put_many_if_absent_writes_every_version_in_order(tmp_path: Path, fsync: bool) -> None:
    from deltacoord.storage.table import TableStorage

    items = _versions(5)
    assert files.put_many_if_absent(TableStorage(tmp_path), items, fsync=fsync) == [Put.WRITTEN] * 5
    assert [(tmp_path / k).read_bytes() for k, _ in items] == [d for _, d in items]
    assert log_file_names(tmp_path) == [k.split("/")[1] for k, _ in items]  # no temp file left


@pytest.mark.parametrize(("there", "outcome"), [("same", Put.IDENTICAL), ("other", Put.DIFFERENT)])
def test_put_many_if_absent_stops_at_a_taken_name(tmp_path: Path, there: str, outcome: Put) -> None:
    from deltacoord.storage.table import TableStorage

    items = _versions(5)
    taken_key, taken_data = items[2]
    put_if_absent(tmp_path / taken_key, taken_data if there == "same" else b"written around\n")
    assert files.put_many_if_absent(TableStorage(tmp_path), items) == [Put.WRITTEN, Put.WRITTEN, outcome]
    assert not (tmp_path / items[3][0]).exists(), "nothing after a taken name is linked"
    assert len(log_file_names(tmp_path)) == 3


def _publish_all(tmp_path: Path, tasks: list[PublishTask]) -> tuple[Publisher, list[tuple[str, int]]]:
    seen: list[tuple[str, int]] = []
    p = Publisher(fsync=True, on_published=lambda tid, _uri, v, _a, _n: seen.append((tid, v)))
    for t in tasks:
        p.submit(t)  # queued before the thread starts: it takes them as one batch
    p.start()
    assert p.wait_idle(60)
    p.stop()
    return p, seen


def test_the_publisher_publishes_queued_versions_of_several_tables_together(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    tasks = [PublishTask(tid, root.as_uri(), v, (CommitInfo({"operation": "WRITE", "v": v}),))
             for v in range(12) for tid, root in (("a", a), ("b", b))]
    p, seen = _publish_all(tmp_path, tasks)
    assert [v for tid, v in seen if tid == "a"] == list(range(12)) == [v for tid, v in seen if tid == "b"]
    assert p.published_version("a") == p.published_version("b") == 11 and p.lag() == 0
    assert log_file_names(a) == [f"{v:020d}.json" for v in range(12)]


def test_a_batch_goes_on_past_an_identical_version_and_halts_at_a_different_one(tmp_path: Path) -> None:
    def task(v: int) -> PublishTask:
        return PublishTask("t", tmp_path.as_uri(), v, (CommitInfo({"operation": "WRITE", "v": v}),))

    put_if_absent(commit_path(tmp_path, 3), commit_to_json_lines(task(3).actions))  # a re-publication
    put_if_absent(commit_path(tmp_path, 7), b"written around the coordinator\n")
    p, seen = _publish_all(tmp_path, [task(v) for v in range(10)])
    assert [v for _, v in seen] == list(range(7))
    assert "different content" in p.halted_tables()["t"]
    assert not commit_path(tmp_path, 8).exists() and p.published_version("t") == 6
