"""Writes to _delta_log: one put-if-absent for commits and checkpoints, and what happens without hard links."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from coordinator.delta_log import files
from coordinator.delta_log.files import HardLinksRefusedError, Put, put_if_absent, sweep_temp_files, temp_path
from coordinator.delta_log.publisher import Publisher, PublishTask
from reader import storage_local
from reader.log import commit_path, log_file_names
from schemas.actions import CommitInfo, Protocol, commit_to_json_lines


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
    assert sweep_temp_files(str(tmp_path)) == 1
    assert log_file_names(tmp_path) == [".not-ours.tmp", "00000000000000000003.json"]


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
