"""Publication notices: tell a writer that its ratified version is in `_delta_log`, without it polling the store.

After the publisher writes `_delta_log/<v>.json`, a small record (no value; headers: proposal id, table id,
version, kind `published`) goes to the reply partition the proposal named. A table whose publication halts
gets `unpublished` notices, with why, for the versions writers wait on. The producer is idempotent, not
transactional: a notice reports a fact already true in storage, and a lost one costs the writer only its
fallback (one HEAD of `<v>.json` after a bound). Expectations are bounded (`MAX_WAITING`, oldest dropped):
a notice nobody gets is what the fallback is for.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from confluent_kafka import KafkaException, Producer

from schemas.routing import H_ERROR, H_KIND, H_PROPOSAL_ID, H_TABLE_ID, H_VERSION, KIND_PUBLISHED, KIND_UNPUBLISHED

log = logging.getLogger(__name__)

#: Ratified versions awaiting publication whose notice is remembered.
MAX_WAITING = 100_000


class PublicationNotices:
    """Remembers who waits for which (table, version) and sends the notice once it is published."""

    def __init__(self, client_config: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self._producer = Producer({**client_config, "enable.idempotence": True, "acks": "all", "linger.ms": 0})
        md = self._producer.list_topics(topic, timeout=30)
        t = md.topics.get(topic)
        #: The replies topic's partition count (0: no replies topic; writers then get no routed answers).
        self.num_partitions = len(t.partitions) if t is not None and t.error is None and t.partitions else 0
        self._waiting: OrderedDict[tuple[str, int], tuple[int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def expect(self, table_id: str, version: int, partition: int, proposal_id: str) -> None:
        """Version `version` of `table_id` was ratified for `proposal_id`, whose writer reads `partition`."""
        with self._lock:
            self._waiting[(table_id, version)] = (partition, proposal_id)
            if len(self._waiting) > MAX_WAITING:
                self._waiting.popitem(last=False)

    def published(self, table_id: str, version: int) -> None:
        self._send(table_id, version, KIND_PUBLISHED, None)

    def unpublished(self, table_id: str, version: int, why: str) -> None:
        self._send(table_id, version, KIND_UNPUBLISHED, why)

    def _send(self, table_id: str, version: int, kind: bytes, why: str | None) -> None:
        with self._lock:
            target = self._waiting.pop((table_id, version), None)
        if target is None:
            return
        partition, proposal_id = target
        headers: list[tuple[str, str | bytes | None]] = [
            (H_KIND, kind), (H_PROPOSAL_ID, proposal_id.encode()), (H_TABLE_ID, table_id.encode()),
            (H_VERSION, str(version).encode())]
        if why is not None:
            headers.append((H_ERROR, why.encode("utf-8", errors="replace")[:4096]))
        try:
            self._producer.produce(self.topic, value=None, partition=partition, headers=headers)
            self._producer.poll(0)
        except (KafkaException, BufferError) as e:  # the writer falls back to a HEAD of <v>.json
            log.warning("could not send the publication notice of %s v%d: %s", table_id, version, e)

    def close(self, timeout_s: float = 5.0) -> None:
        self._producer.flush(timeout_s)


__all__ = ["MAX_WAITING", "PublicationNotices"]
