"""Checkpoints written in a child process, so they never hold the deciding thread's GIL.

A checkpoint of a large table is seconds of Python and Arrow work. On a thread
of the coordinator it takes the GIL from the deciding loop each time that loop
comes back from a Kafka call, which shows up directly in decision latency. A
single spawned worker process (never forked: librdkafka's threads do not
survive a fork) writes them instead, one request at a time over a pipe.

The worker is a daemon process the coordinator fully controls: a checkpoint
that takes longer than `timeout_s` gets the worker killed, `close()` never
waits unboundedly, and the worker exits when its coordinator dies. A lost
checkpoint is only a missed optimisation: the next interval, or the restart
scan (`Coordinator._schedule_missing_checkpoints`), writes one again.

The worker runs at a lower CPU priority (`nice`, default +10). When the machine
is saturated, deciding and Kafka go first; checkpoints then lag, and the
daemon's queue keeps only the newest request per table, so a slow worker
writes fewer checkpoints instead of falling further behind.
"""

from __future__ import annotations

import importlib.abc
import logging
import multiprocessing
import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from deltacoord.coordinator import faults
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.storage.table import TableStorage

if TYPE_CHECKING:
    from deltacoord.coordinator.delta_log.adoption import PublishedState

log = logging.getLogger(__name__)

#: A checkpoint of 1,000,000 files takes about 2.5 s here; this only catches a stuck worker.
DEFAULT_TIMEOUT_S = 1800.0
#: Added to the worker's niceness: checkpoints yield the CPU to deciding when both want it.
DEFAULT_NICE = 10


class CheckpointWorkerError(DeltaCoordError, RuntimeError):
    """The worker failed, died or timed out; the checkpoint was not written (or not confirmed)."""


class CheckpointFailedError(CheckpointWorkerError):
    """Writing the checkpoint itself failed (not an I/O error, not the worker): a fault of that table, which halts it."""


def _serve(conn: Connection, parent_pid: int, nice: int = 0) -> None:
    """The worker's loop: ("warm",), ("checkpoint", uri, storage options, version) or ("state", uri, storage options,
    version) in, ("ok"|"io-error"|"error"|"state-error", value) out."""
    if nice:
        try:
            os.nice(nice)
        except OSError as e:  # a platform or sandbox without it: run at the parent's priority
            log.warning("checkpoint worker: cannot lower its priority: %s", e)
    # A fault point reached here stands for the coordinator crashing mid-checkpoint.
    faults.crash_parent_too(parent_pid)
    # A busy worker does not read its pipe, so it would not notice its parent's death by EOF.
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="deltacoord-parent-watch", daemon=True).start()
    _lean_arrow()
    from deltacoord.coordinator.delta_log.checkpointer import (
        create_checkpoint,  # seconds of imports: pyarrow, the reader
    )
    from deltacoord.storage.table import StorageError, TableStorage

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            if msg[0] == "warm":
                reply: tuple[str, Any] = ("ok", os.getpid())
            elif msg[0] == "state":
                reply = _load_state(*msg[1:])
            else:
                _kind, uri, options, version = msg
                reply = ("ok", create_checkpoint(TableStorage(uri, options), version).version)
        except (OSError, StorageError) as e:  # transient storage trouble: the next checkpoint tries again
            reply = ("io-error", f"{type(e).__name__}: {e}")
        except Exception as e:  # reported to the coordinator, which halts the table
            reply = ("error", f"{type(e).__name__}: {e}")
        conn.send(reply)


def _load_state(uri: str, options: dict[str, str], version: int) -> tuple[str, Any]:
    """An adopted table's state, or its StateLoadError as the adopter's answer. Imported on the first
    adoption: its rules (SQL parsing among them) are ~10 MB a worker that only checkpoints never needs."""
    from deltacoord.coordinator.delta_log.adoption import StateLoadError, load_published_state

    try:
        return ("ok", load_published_state(TableStorage(uri, options), version))
    except StateLoadError as e:
        return ("state-error", (e.kind, str(e)))


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses `import pandas` in this process (see `_lean_arrow`)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError("the checkpoint worker does not use pandas")
        return None


def _lean_arrow() -> None:
    """Refuse pandas in the worker: `pyarrow.array(list)` imports it, when installed, only to
    ask whether the list is a pandas object, 50 MB the worker never uses."""
    sys.meta_path.insert(0, _NoPandas())


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


class CheckpointWorker:
    """A `CheckpointFn` that runs `create_checkpoint` in one spawned child process."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, nice: int = DEFAULT_NICE) -> None:
        # Arrow's jemalloc pool hands freed pages back to the system; the default (mimalloc)
        # kept them, so a checkpoint's peak was the sum of its phases' buffers (255 MB -> 165 MB
        # checkpointing 1M files, with `_lean_arrow`). Arrow reads this variable once, when it
        # starts; the spawned worker inherits it. Set here, before the coordinator starts any
        # Kafka client thread; a value the operator set is kept.
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
        self.timeout_s = timeout_s
        self.nice = nice
        self._lock = threading.Lock()
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._closed = False

    def _ensure(self) -> Connection:
        if self._closed:
            raise CheckpointWorkerError("the checkpoint worker is closed")
        if self._proc is None or not self._proc.is_alive() or self._conn is None:
            self._kill()
            ctx = multiprocessing.get_context("spawn")
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, os.getpid(), self.nice), name="deltacoord-checkpoint-worker", daemon=True)
            proc.start()
            theirs.close()  # only the worker holds its end: its death is EOF here
            self._proc, self._conn = proc, ours
        return self._conn

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
            self._proc = None

    def _request(self, msg: tuple[Any, ...], what: str) -> Any:
        """Send one request and wait for its reply.

        A worker that dies under a request (or was dying when it was sent: a
        killed multi-threaded process is not reaped at once) gets one fresh
        successor and the request again; a checkpoint is idempotent, since the
        file is put-if-absent and an identical one counts as written.
        """
        with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._ensure()
                    conn.send(msg)
                    if not conn.poll(self.timeout_s):
                        self._kill()
                        raise CheckpointWorkerError(f"the checkpoint worker took over {self.timeout_s:.0f}s {what}; it was killed")
                    reply = conn.recv()
                    break
                except (EOFError, OSError):
                    self._kill()
                    if attempt == 2:
                        raise CheckpointWorkerError(f"the checkpoint worker died while {what}") from None
                    log.warning("the checkpoint worker died; retrying %s on a new one", what)
        kind, value = reply
        if kind == "state-error":
            from deltacoord.coordinator.delta_log.adoption import StateLoadError

            raise StateLoadError(*value)
        if kind == "error":
            raise CheckpointFailedError(f"{what} failed: {value}")
        if kind != "ok":
            raise CheckpointWorkerError(f"{what} failed: {value}")
        return value

    def start(self) -> int:
        """Spawn the worker and import what it needs now, at coordinator start-up, not during
        the first checkpoint (where a second of imports would compete with deciding). Returns its pid."""
        return int(self._request(("warm",), "starting"))

    def __call__(self, table: str | TableStorage, version: int) -> int:
        """Checkpoint `table` (a URI, or its `TableStorage` whose options travel with the request) at `version`."""
        if isinstance(table, TableStorage):
            uri, options = table.location, dict(table.storage_options)
        else:
            uri, options = table, {}
        return int(self._request(("checkpoint", uri, options, version), f"checkpointing {uri} at version {version}"))

    def load_state(self, table: TableStorage, version: int | None) -> PublishedState:
        """`adoption.load_published_state` in the worker (Arrow stays out of the deciding process); a worker that
        fails is `StateLoadError` `unavailable`. Waits for a checkpoint being written first."""
        from deltacoord.coordinator.delta_log.adoption import PublishedState, StateLoadError

        what = f"loading {table.location} at version {'latest' if version is None else version}"
        try:
            state = self._request(("state", table.location, dict(table.storage_options), version), what)
        except CheckpointWorkerError as e:
            raise StateLoadError("unavailable", str(e)) from e
        assert isinstance(state, PublishedState)
        return state

    def close(self, wait: bool = True, grace_s: float = 60.0) -> None:
        """Stop the worker; with `wait`, let a running checkpoint finish for up to `grace_s`. Never reopens."""
        self._closed = True
        acquired = self._lock.acquire(timeout=grace_s if wait else 0)
        try:
            if wait and acquired and self._conn is not None and self._proc is not None:
                try:
                    self._conn.send(None)
                    self._proc.join(grace_s)
                except OSError:
                    pass
            # Not acquired: a request is still running on the checkpoint thread; the kill ends it.
            proc = self._proc
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join(5)
            if acquired:
                self._kill()
        finally:
            if acquired:
                self._lock.release()
