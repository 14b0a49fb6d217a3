"""Checkpoints off the deciding process: the hinted log segment, the worker process, coalescing."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker, CheckpointWorkerError
from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.kafka.daemon import Coordinator, _CheckpointRequest
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import commit_file_name, list_log, log_segment, segment_from_last_checkpoint


def _table(path: Path, commits: int) -> None:
    for i in range(commits):
        write_deltalake(path, pa.table({"id": pa.array([i], pa.int64())}), mode="append")


def _rows(path: Path) -> list[str]:
    return sorted(json.dumps({k: v for k, v in r.items() if v is not None}, sort_keys=True, default=str)
                  for r in pq.read_table(path).to_pylist())


def test_hinted_segment_equals_the_listed_one(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 8)  # versions 0..7
    create_checkpoint(path, 3, now_ms=0)
    hinted = segment_from_last_checkpoint(path, 7)
    listed = log_segment(list_log(path), 7)
    assert hinted is not None and listed.checkpoint is not None and hinted.checkpoint is not None
    assert hinted.checkpoint.version == listed.checkpoint.version == 3
    assert hinted.checkpoint.paths == listed.checkpoint.paths
    assert [v for v, _ in hinted.commits] == [v for v, _ in listed.commits] == [4, 5, 6, 7]
    assert [p.name for _, p in hinted.commits] == [p.name for _, p in listed.commits]


def test_checkpoint_through_the_hint_equals_one_through_a_listing(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 12)
    create_checkpoint(path, 5, now_ms=0)
    other = tmp_path / "copy"
    shutil.copytree(path, other)
    (other / "_delta_log" / "_last_checkpoint").unlink()  # forces the full listing
    a = create_checkpoint(path, 11, now_ms=0)
    b = create_checkpoint(other, 11, now_ms=0)
    assert _rows(a.path) == _rows(b.path)
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 12


@pytest.mark.parametrize("case", ["newer_than_target", "missing_commit", "missing_checkpoint", "multi_part", "absent"])
def test_hint_that_does_not_lead_there_falls_back(tmp_path: Path, case: str) -> None:
    path = tmp_path / "t"
    _table(path, 8)
    create_checkpoint(path, 3, now_ms=0)
    ld = path / "_delta_log"
    lc = json.loads((ld / "_last_checkpoint").read_text())
    if case == "newer_than_target":
        assert segment_from_last_checkpoint(path, 2) is None
        return
    if case == "missing_commit":
        (ld / commit_file_name(5)).rename(ld / "moved-away")
    elif case == "missing_checkpoint":
        next(ld.glob("*.checkpoint.parquet")).unlink()
    elif case == "multi_part":
        (ld / "_last_checkpoint").write_text(json.dumps({**lc, "parts": 2}))
    else:
        (ld / "_last_checkpoint").unlink()
    assert segment_from_last_checkpoint(path, 7) is None


def test_worker_writes_the_checkpoint_in_a_child_process(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 11)
    worker = CheckpointWorker()
    try:
        pid = worker.start()
        assert pid != os.getpid() and [c.pid for c in multiprocessing.active_children()] == [pid]
        assert worker(str(path), 10) == 10
        assert [c.pid for c in multiprocessing.active_children()] == [pid], "one worker serves every checkpoint"
    finally:
        worker.close()
    assert not multiprocessing.active_children(), "close() ends the worker process"
    assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()
    dt = DeltaTable(str(path))
    assert dt.version() == 10 and dt.to_pyarrow_table().num_rows == 11


def test_the_worker_runs_lean_arrow(tmp_path: Path) -> None:
    """Arrow's jemalloc pool (it returns freed pages) and no pandas, which pyarrow would import for nothing;
    a worker that only checkpointed has not loaded Kafka's client or Avro (the reader's ratified-versions
    source) either: each is megabytes at the checkpoint peak."""
    path = tmp_path / "t"
    _table(path, 11)
    worker = CheckpointWorker()
    try:
        pid = worker.start()
        assert worker(str(path), 10) == 10  # converts Python lists to Arrow, which looks for pandas
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        maps = Path(f"/proc/{pid}/maps").read_text()
    finally:
        worker.close()
    assert b"ARROW_DEFAULT_MEMORY_POOL=jemalloc" in environ
    assert "libarrow" in maps and "/pandas/" not in maps
    assert "/confluent_kafka/" not in maps and "/fastavro/" not in maps


def test_the_worker_runs_at_a_lower_priority_than_its_coordinator() -> None:
    worker = CheckpointWorker(nice=7)
    try:
        pid = worker.start()
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.nice(0) + 7)
    finally:
        worker.close()


def test_a_worker_that_died_idle_is_replaced_for_the_next_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 21)
    worker = CheckpointWorker()
    try:
        first = worker.start()
        os.kill(first, signal.SIGKILL)
        _wait_gone(first)
        assert worker(str(path), 10) == 10, "the request is not lost with the dead worker"
        (child,) = multiprocessing.active_children()
        assert child.pid != first
    finally:
        worker.close()
    assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()


def test_a_checkpoint_over_the_timeout_kills_the_worker(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 11)
    worker = CheckpointWorker(timeout_s=0.0)
    try:
        with pytest.raises(CheckpointWorkerError, match="it was killed"):
            worker(str(path), 10)
        assert not multiprocessing.active_children()
        worker.timeout_s = 120
        assert worker(str(path), 10) == 10
    finally:
        worker.close()


def test_a_closed_worker_never_starts_again(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 11)
    worker = CheckpointWorker()
    worker.start()
    worker.close()
    with pytest.raises(CheckpointWorkerError, match="closed"):
        worker(str(path), 10)
    assert not multiprocessing.active_children()


def test_a_hung_worker_does_not_block_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 11)
    code = textwrap.dedent(f"""
        import threading, time
        from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker, CheckpointWorkerError
        w = CheckpointWorker()
        w.start()
        threading.Thread(target=lambda: w({str(path)!r}, 10), daemon=True).start()
        time.sleep(3)  # the worker now hangs at its fault point
        w.close(wait=True, grace_s=1)
        print("closed", flush=True)
    """)
    env = {**os.environ, "DELTACOORD_FAULT": "checkpoint_before_publish:1:hang"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "closed" in proc.stdout, proc.stderr[-2000:]
    assert not (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_pending_checkpoints_coalesce_to_the_newest_per_table() -> None:
    c = Coordinator(CoordinatorSettings(bootstrap_servers="127.0.0.1:1"))
    for req in [_CheckpointRequest("b", "file:///b", 10), _CheckpointRequest("a", "file:///a", 30),
                _CheckpointRequest("b", "file:///b", 30), _CheckpointRequest("a", "file:///a", 20), None]:
        c._ckpt_q.put(req)
    first = _CheckpointRequest("a", "file:///a", 10)
    out = c._coalesce(first)
    assert out[-1] is None, "a stop request stays last"
    assert sorted((r.table_id, r.version) for r in out if r is not None) == [("a", 30), ("b", 30)]
    assert c._ckpt_q.empty()


def test_checkpoints_of_a_table_are_spaced_by_checkpoint_min_seconds() -> None:
    """Requests arriving within `checkpoint_min_seconds` of the last round wait for it and are coalesced: a
    table committing hundreds of versions a second gets about one checkpoint a second, of its newest version."""
    done: list[tuple[float, str, int]] = []
    c = Coordinator(CoordinatorSettings(bootstrap_servers="127.0.0.1:1", checkpoint_min_interval_s=0.5),
                    checkpoint_fn=lambda storage, version: done.append((time.monotonic(), storage.uri, version)))
    loop = threading.Thread(target=c._checkpoint_loop, daemon=True)
    loop.start()
    started = time.monotonic()
    c._ckpt_q.put(_CheckpointRequest("a", "file:///tmp/a", 10))
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [v for _t, _u, v in done] == [10], "the first checkpoint is not held back"
    for v in (20, 30, 40):
        c._ckpt_q.put(_CheckpointRequest("a", "file:///tmp/a", v))
    c._ckpt_q.put(None)
    loop.join(10)
    assert not loop.is_alive()
    assert [v for _t, _u, v in done] == [10, 40], "the requests met while waiting are coalesced to the newest"
    assert done[1][0] - done[0][0] >= 0.45 or done[1][0] - started >= 0.45, "the second round waited for the spacing"


def test_a_stop_cuts_the_checkpoint_spacing_short() -> None:
    done: list[int] = []
    c = Coordinator(CoordinatorSettings(bootstrap_servers="127.0.0.1:1", checkpoint_min_interval_s=60),
                    checkpoint_fn=lambda storage, version: done.append(version))
    loop = threading.Thread(target=c._checkpoint_loop, daemon=True)
    loop.start()
    c._ckpt_q.put(_CheckpointRequest("a", "file:///tmp/a", 10))
    c._ckpt_q.put(_CheckpointRequest("a", "file:///tmp/a", 20))
    time.sleep(0.3)
    c.stop_event.set()
    c._ckpt_q.put(None)
    loop.join(10)
    assert not loop.is_alive(), "a stopping coordinator does not wait out the spacing"
    assert done in ([10, 20], [20]), done


def test_the_worker_ends_when_its_coordinator_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table(path, 11)
    code = textwrap.dedent(f"""
        import multiprocessing, sys, time
        from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker, CheckpointWorkerError
        w = CheckpointWorker()
        w({str(path)!r}, 10)
        print(multiprocessing.active_children()[0].pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.kill()  # SIGKILL: no atexit, no pool shutdown
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the checkpoint worker outlived its coordinator"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stop_writes_due_checkpoints_for_a_bounded_time_and_leaves_the_rest() -> None:
    """A stopping coordinator writes the due checkpoints (newest per table) only until `stop_checkpoints_s` has
    passed since the stop: the rest are left to the next checkpoint interval, so a slow store cannot hold a
    stop past a supervisor's grace period."""
    done: list[str] = []

    def slow(storage: object, version: int) -> None:
        time.sleep(0.3)
        done.append(str(getattr(storage, "uri", storage)))

    c = Coordinator(CoordinatorSettings(bootstrap_servers="127.0.0.1:1", checkpoint_min_interval_s=60),
                    checkpoint_fn=slow, stop_checkpoints_s=0.5)
    loop = threading.Thread(target=c._checkpoint_loop, daemon=True)
    c.stop_event.set()
    for t in "abcdefgh":
        c._ckpt_q.put(_CheckpointRequest(t, f"file:///tmp/{t}", 10))
    c._ckpt_q.put(None)
    loop.start()
    loop.join(10)
    assert not loop.is_alive()
    assert 1 <= len(done) <= 3, f"checkpoints written after the stop: {done}"


@pytest.mark.parametrize(("version", "count", "after", "due"), [
    (3, 9_999, 10_000, False),   # neither on the interval nor large
    (3, 10_000, 10_000, True),   # a large version is checkpointed whatever its number
    (3, 10_000, 0, False),       # 0: off
    (20, 1, 10_000, True),       # the interval as before
    (0, 50_000, 10_000, False),  # never the table's creation
])
def test_a_version_of_many_actions_is_checkpointed_whatever_its_number(version: int, count: int, after: int,
                                                                        due: bool) -> None:
    c = Coordinator(CoordinatorSettings(bootstrap_servers="127.0.0.1:1", checkpoint_after_actions=after),
                    checkpoint_fn=lambda storage, version: None)
    c._on_published("a", "file:///tmp/a", version, (), count)
    queued = [] if c._ckpt_q.empty() else [c._ckpt_q.get_nowait()]
    assert [r.version for r in queued if r is not None] == ([version] if due else [])
