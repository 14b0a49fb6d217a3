"""Replies: each writer's answers, sent to the reply partition its proposal names, after the transaction.

Replies are not part of the coordinator's Kafka transaction: adding up to one reply partition per
writer to every transaction (AddPartitionsToTxn, a commit marker per partition) would cost the
coordinator's throughput. The commits topic, written in the transaction, stays the source of truth;
a reply is a copy of a fact already true there, sent with an idempotent (not transactional) producer
once the transaction committed, so a reply never tells of a decision that could still be undone.

What a proposal gets (its header `deltacoord.wait` says which):

- `published` (default): one reply, kind `published`, carrying the decision (without its actions)
  once `_delta_log/<v>.json` exists; rejections and duplicates get their decision (kind `decision`)
  right after the transaction; a version whose table halts gets kind `unpublished` with why.
- `ratified`: the decision (kind `decision`) right after the transaction, nothing more.

Nothing is sent before Kafka's `read_committed` readers see the decision's record (see
`deltacoord.coordinator.kafka.stability`): `published` replies follow publication, which waits for it; the
others (`decided_when_stable`) wait on this module's own thread, so a slow store never delays them.

A reply can be lost (the coordinator dies between its transaction and the reply): a writer that
hears nothing within a bound looks for its proposal id in the commits topic itself. Expectations are
bounded (`MAX_WAITING`, oldest dropped): a reply nobody gets is what that fallback is for.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Any

from confluent_kafka import KafkaException, Producer

from deltacoord.coordinator.stable_wait import StableCheck, StableWait
from deltacoord.schemas.codec import encode_decision
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import (
    H_ERROR,
    H_KIND,
    H_OUTCOME,
    H_PROPOSAL_ID,
    H_TABLE_ID,
    H_TIMES,
    H_VERSION,
    KIND_DECISION,
    KIND_PUBLISHED,
    KIND_UNPUBLISHED,
)

log = logging.getLogger(__name__)

#: Ratified versions awaiting publication whose reply is remembered.
MAX_WAITING = 100_000
#: How long `close` still waits for Kafka to make held replies' decisions readable; then they are dropped.
CLOSE_WAIT_S = 5.0

_Headers = list[tuple[str, str | bytes | None]]


@dataclasses.dataclass(frozen=True)
class _Reply:
    partition: int
    value: bytes
    headers: _Headers


def _times(times: dict[str, float]) -> bytes:
    return ";".join(f"{k}={v * 1000:.3f}" for k, v in times.items()).encode()


def _reply_of(d: Decision, partition: int, times: dict[str, float]) -> _Reply:
    """The writer's copy of a decision: without its actions (the writer has them; the commits topic keeps them)."""
    h: _Headers = [(H_PROPOSAL_ID, d.proposal_id.encode()), (H_TABLE_ID, d.table_id.encode()),
                   (H_OUTCOME, d.outcome.value.encode()), (H_TIMES, _times(times))]
    if d.committed and d.version is not None:
        h.append((H_VERSION, str(d.version).encode()))
    return _Reply(partition, encode_decision(dataclasses.replace(d, actions=()) if d.actions else d), h)


class PublicationNotices:
    """Sends each writer its reply: at once (`decided`), or once its version is published (`expect`, then
    `published` / `unpublished` from the publisher's hooks)."""

    def __init__(self, client_config: dict[str, Any], topic: str, stable: StableCheck | None = None) -> None:
        self.topic = topic
        # linger 0: a reply is what a writer waits on; batching it behind others only delays it.
        self._producer = Producer({**client_config, "enable.idempotence": True, "acks": "all", "linger.ms": 0})
        md = self._producer.list_topics(topic, timeout=30)
        t = md.topics.get(topic)
        #: The replies topic's partition count (0: no replies topic; writers then get no routed answers).
        self.num_partitions = len(t.partitions) if t is not None and t.error is None and t.partitions else 0
        #: Per (table, version), the replies to send once it is published (several: a coalesced version), as
        #: (decision, reply partition, times): encoded when sent, by the publisher's thread, not the deciding one.
        self._waiting: OrderedDict[tuple[str, int], list[tuple[Decision, int, dict[str, float]]]] = OrderedDict()
        self._lock = threading.Lock()
        #: Replies held until their decision is readable: ((partition, offset), decision, reply partition, times).
        self._held: queue.Queue[tuple[tuple[int, int], Decision, int, dict[str, float]] | None] = queue.Queue()
        self._closing = False
        self.wait = None if stable is None else StableWait(stable, "replies")
        self._thread: threading.Thread | None = None
        if self.wait is not None:
            self._thread = threading.Thread(target=self._send_held, name="deltacoord-replies", daemon=True)
            self._thread.start()

    def decided(self, d: Decision, partition: int, times: dict[str, float]) -> None:
        """Send `d` now (the transaction that recorded it has committed); `times`: name -> epoch seconds."""
        r = _reply_of(d, partition, times)
        self._produce(r.partition, r.value, [*r.headers, (H_KIND, KIND_DECISION)], d.table_id, d.version)

    def decided_when_stable(self, stable_at: tuple[int, int], d: Decision, partition: int,
                            times: dict[str, float]) -> None:
        """Send `d` once the commits-topic record at `stable_at` (partition, offset) is readable, in call order."""
        if self.wait is None:
            self.decided(d, partition, times)
        else:
            self._held.put((stable_at, d, partition, times))

    def _send_held(self) -> None:
        assert self.wait is not None
        while True:
            first = self._held.get()
            if first is None:
                return
            items, stop = [first], False
            while True:
                try:
                    nxt = self._held.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                items.append(nxt)
            need: dict[int, int] = {}
            for (p, o), *_ in items:
                need[p] = max(need.get(p, -1), o)
            if self.wait.until(need, lambda waited: self._closing and waited > CLOSE_WAIT_S):
                for _at, d, partition, times in items:
                    self.decided(d, partition, times)
            else:  # the writers fall back to the commits topic
                log.error("closing with %d replies whose decisions Kafka does not show yet; not sent", len(items))
            if stop:
                return

    def expect(self, d: Decision, partition: int, times: dict[str, float]) -> None:
        """Send `d` (committed as a new version, or coalesced into one) once its version is published."""
        assert d.version is not None
        with self._lock:
            self._waiting.setdefault((d.table_id, d.version), []).append((d, partition, times))
            if len(self._waiting) > MAX_WAITING:
                self._waiting.popitem(last=False)

    def published(self, table_id: str, version: int) -> None:
        self._send(table_id, version, KIND_PUBLISHED, None)

    def unpublished(self, table_id: str, version: int, why: str) -> None:
        self._send(table_id, version, KIND_UNPUBLISHED, why)

    def _send(self, table_id: str, version: int, kind: bytes, why: str | None) -> None:
        with self._lock:
            rs = self._waiting.pop((table_id, version), None)
        published = _times({"published": time.time()})
        for d, partition, times in rs or ():
            r = _reply_of(d, partition, times)
            headers = [*r.headers, (H_KIND, kind)]
            if kind == KIND_PUBLISHED:
                headers = [(k, v + b";" + published if k == H_TIMES and isinstance(v, bytes) else v) for k, v in headers]
            if why is not None:
                headers.append((H_ERROR, why.encode("utf-8", errors="replace")[:4096]))
            self._produce(r.partition, r.value, headers, table_id, version)

    def _produce(self, partition: int, value: bytes, headers: _Headers, table_id: str, version: int | None) -> None:
        try:
            self._producer.produce(self.topic, value=value, partition=partition, headers=headers)
            self._producer.poll(0)
        except (KafkaException, BufferError) as e:  # the writer falls back to the commits topic
            log.warning("could not send the reply for %s v%s: %s", table_id, version, e)

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._closing = True
            self._held.put(None)
            self._thread.join(CLOSE_WAIT_S + timeout_s)
        self._producer.flush(timeout_s)


__all__ = ["MAX_WAITING", "PublicationNotices"]
