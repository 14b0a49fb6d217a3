"""Publication of ratified commits to `_delta_log`, strictly in version order.

A version is ratified once its decision is committed in Kafka; publication is
its view for Delta readers. Files are written under a temporary name and
hard-linked into place, which fails if the name exists (put-if-absent). An
existing identical file is fine (re-publication after a crash or by a fenced
peer); a different one means someone wrote around the coordinator, so the table
halts and nothing is overwritten.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reader.log import commit_file_name, log_dir, table_root
from schemas.actions import Action, commit_to_json_lines
from schemas.errors import TableHaltedError

log = logging.getLogger(__name__)


def commit_path(root: Path, version: int) -> Path:
    return log_dir(root) / commit_file_name(version)


def sweep_temp_files(table_uri: str) -> int:
    """Delete publication temp files a killed publisher left in `_delta_log`; returns how many.

    Only names this module creates (`.<name>.<32 hex>.tmp`) are touched. A
    zombie publisher whose temp file disappears just retries with a new one.
    """
    log_dir = table_root(table_uri) / "_delta_log"
    removed = 0
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(".") and name.endswith(".tmp") and len(name.rsplit(".", 2)[-2]) == 32:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_dir / name)
                removed += 1
    return removed


def put_if_absent(path: Path, data: bytes, *, fsync: bool = True) -> bool:
    """Write `data` at `path` unless it exists. True if written, False if an identical file was there.

    Raises TableHaltedError if a different file is already there.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            existing = path.read_bytes()
            if existing == data:
                return False
            raise TableHaltedError(
                f"{path} already exists with different content ({len(existing)} bytes, expected {len(data)}): "
                "something wrote to this table around the coordinator. The table is halted; nothing was overwritten."
            ) from None
        if fsync:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@dataclass(frozen=True)
class PublishTask:
    table_id: str
    table_uri: str
    version: int
    actions: tuple[Action, ...]


@dataclass
class TablePublication:
    """What the publisher knows of one table."""

    ratified: int = -1
    published: int = -1
    halted: str | None = None


#: Called after version v of a table is published: (table_id, table_uri, version, actions).
PublishedHook = Callable[[str, str, int, Sequence[Action]], None]


@dataclass
class Publisher:
    """A thread that publishes ratified versions in order, off the deciding path."""

    fsync: bool = True
    on_published: PublishedHook | None = None
    tables: dict[str, TablePublication] = field(default_factory=dict)
    _q: queue.Queue[PublishTask | None] = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _idle: threading.Condition = field(init=False)
    _pending: int = 0
    _abandoned: bool = False
    _forgotten: set[str] = field(default_factory=set)
    _halted: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._idle = threading.Condition(self._lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="deltacoord-publisher", daemon=True)
        self._thread.start()

    def submit(self, task: PublishTask) -> None:
        """Queue a ratified version; versions of a table must be submitted in order."""
        with self._lock:
            self._forgotten.discard(task.table_id)
            t = self.tables.setdefault(task.table_id, TablePublication())
            t.ratified = max(t.ratified, task.version)
            self._pending += 1
        self._q.put(task)

    def lag(self) -> int:
        """Ratified but not yet published versions, over all tables."""
        with self._lock:
            return sum(max(0, t.ratified - t.published) for t in self.tables.values() if t.halted is None)

    def behind(self, versions: Mapping[str, int]) -> list[str]:
        """Tables (of `versions`, table id -> version) whose version is not published yet and not halted."""
        with self._lock:
            return [tid for tid, v in versions.items()
                    if (t := self.tables.get(tid)) is None or (t.halted is None and t.published < v)]

    def halted(self, table_id: str) -> str | None:
        with self._lock:
            return self._halted.get(table_id)

    def halted_tables(self) -> dict[str, str]:
        """Table id -> why its publication is halted (a copy: admission reads it once per batch)."""
        with self._lock:
            return dict(self._halted)

    def halted_count(self) -> int:
        with self._lock:
            return len(self._halted)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted task was handled."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def stop(self, timeout_s: float = 60.0) -> None:
        """Publish what is queued, then end the thread."""
        if self._thread is None:
            return
        self._q.put(None)
        self._thread.join(timeout_s)
        self._thread = None

    def forget(self, table_ids: Iterable[str]) -> None:
        """Stop publishing these tables (their partition moved to another coordinator)."""
        with self._lock:
            for t in table_ids:
                self.tables.pop(t, None)
                self._halted.pop(t, None)
                self._forgotten.add(t)

    def abandon(self) -> None:
        """Drop what is queued and end the thread (a fenced coordinator publishes nothing)."""
        self._abandoned = True
        self.stop(timeout_s=5.0)

    def _run(self) -> None:
        while True:
            task = self._q.get()
            if task is None:
                return
            try:
                self._publish(task)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _publish(self, task: PublishTask) -> None:
        with self._lock:
            t = self.tables.setdefault(task.table_id, TablePublication())
            if self._abandoned or task.table_id in self._forgotten or t.halted is not None or task.version <= t.published:
                return
        data = commit_to_json_lines(task.actions)
        path = commit_path(table_root(task.table_uri), task.version)
        # Retry transient I/O errors (disk full, read-only mount) until they clear:
        # deciding goes on meanwhile and the lag metric shows the backlog.
        delay = 0.05
        while True:
            try:
                put_if_absent(path, data, fsync=self.fsync)
                break
            except TableHaltedError as e:
                log.error("halting table %s: %s", task.table_id, e)
                with self._lock:
                    t.halted = str(e)
                    self._halted[task.table_id] = str(e)
                return
            except OSError as e:
                log.warning("publishing %s failed (%s); retrying in %.2fs", path, e, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        with self._lock:
            t.published = task.version
        if self.on_published is not None:
            try:
                self.on_published(task.table_id, task.table_uri, task.version, task.actions)
            except Exception:
                log.exception("post-publication hook failed for %s v%d", task.table_id, task.version)
