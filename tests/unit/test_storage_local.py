"""The storage edge on local paths: reads, writes, listings, atomic put-if-absent and its fallbacks."""

from __future__ import annotations

import errno
import multiprocessing
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltacoord.storage import local as storage_local
from deltacoord.storage import table as storage_module
from deltacoord.storage.table import (
    AtomicPutUnsupportedError,
    ObjectNotFoundError,
    StorageUriError,
    TableStorage,
)


@pytest.fixture
def store(tmp_path: Path) -> TableStorage:
    return TableStorage(tmp_path / "table")


def test_put_get_head_delete(store: TableStorage, tmp_path: Path) -> None:
    store.put("_delta_log/_last_checkpoint", b'{"version":1}')
    assert store.get("_delta_log/_last_checkpoint") == b'{"version":1}'
    assert (tmp_path / "table" / "_delta_log" / "_last_checkpoint").read_bytes() == b'{"version":1}'
    store.put("_delta_log/_last_checkpoint", b'{"version":2}')
    info = store.head("_delta_log/_last_checkpoint")
    assert (info.key, info.size) == ("_delta_log/_last_checkpoint", 13)
    assert info.last_modified.tzinfo is not None
    assert store.get_range("_delta_log/_last_checkpoint", 2, 7) == b'version'
    assert store.exists("_delta_log/_last_checkpoint")
    store.delete("_delta_log/_last_checkpoint")
    store.delete("_delta_log/_last_checkpoint")  # idempotent
    assert not store.exists("_delta_log/_last_checkpoint")


def test_missing_objects_raise_not_found(store: TableStorage) -> None:
    for call in (lambda: store.get("nope"), lambda: store.head("nope"), lambda: store.get_range("nope", 0, 1),
                 lambda: store.open_input("nope")):
        with pytest.raises(ObjectNotFoundError, match="nope"):
            call()
    store.put("dir/file", b"x")
    with pytest.raises(ObjectNotFoundError):
        store.get("dir")
    with pytest.raises(FileNotFoundError):  # the not-found error is also a FileNotFoundError
        store.get("nope")


def test_bad_keys_are_refused(store: TableStorage) -> None:
    for key in ("../escape", "/abs", "a//b", ""):
        with pytest.raises(StorageUriError):
            store.put(key, b"x")


def test_list_is_sorted_recursive_and_honours_start_after(store: TableStorage) -> None:
    keys = [f"_delta_log/{v:020d}.json" for v in (10, 2, 0, 1)] + ["_delta_log/_last_checkpoint", "part-1.parquet",
                                                                      "a=1/part-0.parquet", "_delta_log/_sidecars/s.parquet"]
    for k in keys:
        store.put(k, k.encode())
    assert [o.key for o in store.list()] == sorted(keys)
    log = [o.key for o in store.list("_delta_log")]
    assert log == sorted(k for k in keys if k.startswith("_delta_log/"))
    assert [o.key for o in store.list("_delta_log/", start_after=f"_delta_log/{1:020d}.json")] == [
        f"_delta_log/{2:020d}.json", f"_delta_log/{10:020d}.json", "_delta_log/_last_checkpoint",
        "_delta_log/_sidecars/s.parquet",
    ]
    assert store.list("missing") == []
    assert [o.size for o in store.list("a=1")] == [len(b"a=1/part-0.parquet")]


def test_put_if_absent_creates_once(store: TableStorage) -> None:
    assert store.put_if_absent("_delta_log/00000000000000000000.json", b"first") is True
    assert store.put_if_absent("_delta_log/00000000000000000000.json", b"first") is False
    assert store.put_if_absent("_delta_log/00000000000000000000.json", b"other") is False
    assert store.get("_delta_log/00000000000000000000.json") == b"first"
    assert [o.key for o in store.list()] == ["_delta_log/00000000000000000000.json"], "no temp file is left behind"


def race(n: int, attempt: Callable[[int], bool]) -> list[bool]:
    """Run attempt(0..n-1) in n threads released together; their results by index."""
    barrier = threading.Barrier(n)
    results = [False] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = attempt(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_put_if_absent_race_between_threads(store: TableStorage) -> None:
    for round_ in range(20):
        key = f"_delta_log/{round_:020d}.json"
        results = race(8, lambda i, key=key: store.put_if_absent(key, f"writer {i}".encode()))  # type: ignore[misc]
        assert results.count(True) == 1, results
        assert store.get(key) == f"writer {results.index(True)}".encode()


def _contend_in_process(root: str, key: str, i: int, start: Any) -> bool:
    start.wait()
    return TableStorage(root, fsync=False).put_if_absent(key, f"process {i}".encode())


def test_put_if_absent_race_between_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("forkserver")
    root = str(tmp_path / "table")
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        for round_ in range(3):
            key = f"_delta_log/{round_:020d}.json"
            start = manager.Event()
            pending = [pool.apply_async(_contend_in_process, (root, key, i, start)) for i in range(4)]
            start.set()
            results = [p.get(timeout=120) for p in pending]
            assert results.count(True) == 1, results
            winner = results.index(True)
            assert TableStorage(root).get(key) == f"process {winner}".encode()


def _refuse_links(src: str, dst: str) -> None:
    raise OSError(errno.EPERM, "Operation not permitted", dst)


def test_falls_back_to_rename_noreplace_without_hard_links(store: TableStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_local, "hard_link", _refuse_links)
    renames: list[str] = []
    real = storage_local.rename_noreplace

    def counting(src: str, dst: str) -> None:
        renames.append(dst)
        real(src, dst)

    monkeypatch.setattr(storage_local, "rename_noreplace", counting)
    assert store.put_if_absent("k", b"one") is True
    assert store.get("k") == b"one"
    assert len(renames) == 1
    # A taken name: False without writing (checked before), and False from renameat2 itself on a race.
    assert store.put_if_absent("k", b"two") is False
    monkeypatch.setattr(os.path, "lexists", lambda p: False)
    assert store.put_if_absent("k", b"three") is False
    assert store.get("k") == b"one"
    assert [o.key for o in store.list()] == ["k"]


def test_raises_when_neither_hard_links_nor_noreplace_work(store: TableStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_local, "hard_link", _refuse_links)

    def unsupported(src: str, dst: str) -> None:
        raise OSError(errno.EINVAL, "Invalid argument", dst)

    monkeypatch.setattr(storage_local, "rename_noreplace", unsupported)
    with pytest.raises(AtomicPutUnsupportedError, match="cannot do an atomic put-if-absent"):
        store.put_if_absent("k", b"x")
    assert not store.exists("k")
    assert store.list() == [], "the temp file is removed"


def test_fsync_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    TableStorage(tmp_path / "a", fsync=False).put_if_absent("_delta_log/0.json", b"x")
    TableStorage(tmp_path / "a", fsync=False).put("_delta_log/_last_checkpoint", b"x")
    assert calls == []
    TableStorage(tmp_path / "b").put_if_absent("_delta_log/0.json", b"x")
    # the file, its directory, and the parents of the two directories created
    assert len(calls) >= 3


def test_writer_is_all_or_nothing(store: TableStorage) -> None:
    with store.open_output("part-0.parquet") as out:
        out.write(b"abc")
        assert not store.exists("part-0.parquet"), "nothing is visible before close"
        out.write(memoryview(b"def"))
        assert out.tell() == 6
    assert store.get("part-0.parquet") == b"abcdef"
    with pytest.raises(RuntimeError), store.open_output("part-1.parquet") as out:
        out.write(b"partial")
        raise RuntimeError("writer failed")
    assert not store.exists("part-1.parquet")
    assert [o.key for o in store.list()] == ["part-0.parquet"]


def test_parquet_round_trip_and_ranged_reads(store: TableStorage) -> None:
    rng = np.random.default_rng(7)
    table = pa.table({"id": np.arange(200_000, dtype=np.int64), "v": rng.random(200_000)})
    size = store.write_parquet("part-0.parquet", table, row_group_size=50_000, compression="none")
    assert size == store.head("part-0.parquet").size
    pf = store.read_parquet_file("part-0.parquet")
    assert pf.metadata.num_row_groups == 4
    assert pf.read_row_group(2).column("id")[0].as_py() == 100_000
    assert pq.read_table(store.open_input("part-0.parquet")).equals(table)


@pytest.mark.parametrize("buffered_up_to", [storage_module.BUFFERED_PARQUET_BYTES, 0], ids=["buffered", "streamed"])
def test_write_parquet_in_memory_or_streamed_stores_the_same_object(
    store: TableStorage, buffered_up_to: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small table is encoded in memory and put once, a large one streams; either way one whole object,
    and a failing encoder leaves nothing behind."""
    monkeypatch.setattr(storage_module, "BUFFERED_PARQUET_BYTES", buffered_up_to)
    table = pa.table({"id": [1, 2, 3], "value": ["a", "b", None]})
    size = store.write_parquet("d/part-0.parquet", table, compression="snappy")
    assert size == store.head("d/part-0.parquet").size
    assert pq.read_table(store.open_input("d/part-0.parquet")).equals(table)
    with pytest.raises((ValueError, OSError, pa.ArrowException)):
        store.write_parquet("d/part-1.parquet", table, compression="no-such-codec")
    assert [o.key for o in store.list("d/")] == ["d/part-0.parquet"]
    assert os.listdir(store.local_path("d")) == ["part-0.parquet"], "no temp file left behind"
