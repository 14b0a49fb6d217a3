"""Checkpoints written in a child process, so they never hold the deciding thread's GIL.

A checkpoint of a large table is seconds of Python and Arrow work. On a thread
of the coordinator it takes the GIL from the deciding loop each time that loop
comes back from a Kafka call, which shows up directly in decision latency. A
single spawned worker process (never forked: librdkafka's threads do not
survive a fork) writes them instead. If the worker dies, the next checkpoint
starts a new one; the lost checkpoint is only an optimisation that the next
interval or the restart scan (`Coordinator._schedule_missing_checkpoints`)
writes again.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from coordinator import faults

log = logging.getLogger(__name__)


def _init_worker(parent_pid: int) -> None:
    # A fault point reached here stands for the coordinator crashing mid-checkpoint.
    faults.crash_parent_too(parent_pid)
    # The worker holds both ends of its task pipe, so it never sees EOF when the
    # coordinator dies (SIGKILL, OOM): watch the parent and end with it.
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="deltacoord-parent-watch", daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


def _warm() -> int:
    import coordinator.checkpointer  # noqa: F401 - pyarrow, the reader: seconds of imports

    return os.getpid()


def _checkpoint(table_uri: str, version: int) -> int:
    from coordinator.checkpointer import create_checkpoint

    return create_checkpoint(table_uri, version).version


class CheckpointWorker:
    """A `CheckpointFn` that runs `create_checkpoint` in one spawned child process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker, initargs=(os.getpid(),),
                )
            return self._pool

    def start(self) -> int:
        """Spawn the worker and import what it needs now, at coordinator start-up, not during
        the first checkpoint (where a second of imports would compete with deciding). Returns its pid."""
        return self._executor().submit(_warm).result()

    def __call__(self, table_uri: str, version: int) -> int:
        pool = self._executor()
        try:
            return pool.submit(_checkpoint, table_uri, version).result()
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False)
            raise RuntimeError(f"the checkpoint worker died while checkpointing {table_uri} at version {version}") from None

    def close(self, wait: bool = True) -> None:
        """Stop the worker; with `wait`, after the checkpoint it is writing."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)
