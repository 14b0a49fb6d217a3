"""A coordinator process: partition loops, the publisher, checkpoints, metrics and signals."""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from confluent_kafka.admin import AdminClient

from coordinator.metrics import Metrics, MetricsServer
from coordinator.publisher import Publisher
from coordinator.service import CoordinatorSettings, FencedError, PartitionCoordinator
from coordinator.topics import ensure_topics
from schemas.actions import Action, Metadata

log = logging.getLogger(__name__)

#: Writes the checkpoint of (table_uri, version); returns nothing, raises on failure.
CheckpointFn = Callable[[str, int], object]


@dataclass
class _CheckpointRequest:
    table_id: str
    table_uri: str
    version: int


@dataclass
class Coordinator:
    """Runs one `PartitionCoordinator` per owned proposals partition in a single deciding thread."""

    settings: CoordinatorSettings
    partitions: Sequence[int] | None = None
    num_partitions: int = 1
    metrics_port: int | None = None
    publish_fsync: bool = True
    checkpoint_fn: CheckpointFn | None = None
    metrics: Metrics = field(default_factory=Metrics)
    stop_event: threading.Event = field(default_factory=threading.Event)
    fenced: bool = False
    ready: bool = False
    _workers: list[PartitionCoordinator] = field(default_factory=list)
    _last_loop: float = 0.0
    _intervals: dict[str, int] = field(default_factory=dict)
    _ckpt_q: queue.Queue[_CheckpointRequest | None] = field(default_factory=queue.Queue)
    _server: MetricsServer | None = None

    def __post_init__(self) -> None:
        self.publisher = Publisher(fsync=self.publish_fsync, on_published=self._on_published)

    # -- checkpoints (never on the deciding thread) -------------------------------
    def _on_published(self, table_id: str, table_uri: str, version: int, actions: Sequence[Action]) -> None:
        for a in actions:
            if isinstance(a, Metadata):
                self._intervals[table_id] = _checkpoint_interval(a)
        interval = self._intervals.get(table_id, 10)
        if self.checkpoint_fn is not None and version > 0 and version % interval == 0:
            self._ckpt_q.put(_CheckpointRequest(table_id, table_uri, version))
        self.metrics.publish_lag.set(self.publisher.lag())

    def _checkpoint_loop(self) -> None:
        while True:
            req = self._ckpt_q.get()
            if req is None:
                return
            assert self.checkpoint_fn is not None
            t0 = time.monotonic()
            try:
                self.checkpoint_fn(req.table_uri, req.version)
                self.metrics.checkpoint_duration.observe(time.monotonic() - t0)
            except Exception:
                log.exception("checkpoint of %s at version %d failed", req.table_uri, req.version)

    # -- health --------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, object]]:
        stale = time.monotonic() - self._last_loop if self._last_loop else None
        ok = self.ready and not self.fenced and stale is not None and stale < 30
        halted = {t: p.halted for t, p in self.publisher.tables.items() if p.halted}
        return ok, {
            "ready": self.ready, "fenced": self.fenced, "partitions": [w.partition for w in self._workers],
            "publish_lag": self.publisher.lag(), "halted_tables": halted,
        }

    # -- run -------------------------------------------------------------------------
    def run(self) -> int:
        """Run until `stop_event` is set (graceful) or this coordinator is fenced. Returns an exit code."""
        admin = AdminClient(self.settings.client())
        n = ensure_topics(admin, self.settings.topics, partitions=self.num_partitions)
        del admin  # an idle admin client would keep reconnecting for the life of the process
        parts = list(self.partitions) if self.partitions is not None else list(range(n))
        if self.metrics_port is not None:
            self._server = MetricsServer(self.metrics, self.health, self.metrics_port)
            self._server.start()
        self.publisher.start()
        ckpt = threading.Thread(target=self._checkpoint_loop, name="deltacoord-checkpointer", daemon=True)
        ckpt.start()
        self._workers = [PartitionCoordinator(self.settings, p, self.publisher, self.metrics) for p in parts]
        code = 0
        try:
            for w in self._workers:
                w.start()
            self.ready = True
            log.info("coordinator ready on %s partitions %s", self.settings.topics.proposals, parts)
            while not self.stop_event.is_set():
                self._last_loop = time.monotonic()
                for w in self._workers:
                    w.step()
        except FencedError as e:
            # A newer coordinator owns the partition: publish nothing more, exit at once.
            log.error("fenced: %s; stopping without publishing", e)
            self.fenced = True
            code = 3
        finally:
            self.ready = False
            for w in self._workers:
                w.close()
            if self.fenced:
                self.publisher.abandon()
            else:
                self.publisher.stop()
            self._ckpt_q.put(None)
            ckpt.join(300 if not self.fenced else 0.1)
            if self._server is not None:
                self._server.stop()
        return code

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: finish the current batch, commit it, publish, exit."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping after the current batch", signum)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _checkpoint_interval(md: Metadata) -> int:
    try:
        return max(1, int(md.configuration.get("delta.checkpointInterval", "10")))
    except ValueError:
        return 10
