"""A writer's proposals in flight and the answers routed to them.

Kept apart from how the answers arrive: a writer process reads its own reply
partition (`deltacoord.writer.client`), or a per-host relay reads one for every writer on
the machine and forwards each writer its answers over a Unix socket
(`deltacoord.writer.relay`). Both hand each reply record to `Routing.route`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from deltacoord.schemas.codec import decode_decision
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.messages import Decision
from deltacoord.schemas.routing import (
    H_ERROR,
    H_KIND,
    H_PROPOSAL_ID,
    H_REPLY_PARTITION,
    H_TIMES,
    H_VERSION,
    H_WAIT,
    KIND_DECISION,
    KIND_PUBLISHED,
    KIND_UNPUBLISHED,
    header,
)


class ProposalNotPublishedError(DeltaCoordError, RuntimeError):
    """The coordinator says a ratified version will not be published (its table is halted)."""


@dataclass
class Pending:
    """A proposal in flight: its decision, then (for a new commit) its publication notice."""

    proposal_id: str
    reply_partition: int
    #: `published`: one reply once the version is in `_delta_log`; `ratified`: the decision at once.
    wait: str = "published"
    #: When the proposal was produced (ms since the epoch): a commits-topic scan starts near it.
    proposed_ms: int = 0
    decision: Future[Decision] = field(default_factory=Future)
    #: Epoch seconds: the proposal handed to the producer, acknowledged by the broker, its reply received.
    sent_at: float = 0.0
    produced_at: float = 0.0
    replied_at: float = 0.0
    #: The coordinator's epoch seconds from the reply (`consumed`, `ratified`, `published`).
    coordinator_times: dict[str, float] = field(default_factory=dict)
    #: The published version; fails with ProposalNotPublishedError when the coordinator will not publish it.
    published: Future[int] = field(default_factory=Future)

    def result(self, timeout_s: float | None = None) -> Decision:
        """The decision (waits up to `timeout_s`; TimeoutError after)."""
        return self.decision.result(timeout_s)

    @property
    def header(self) -> tuple[str, bytes]:
        """The proposal header that routes its answers here (for tools producing proposals themselves)."""
        return (H_REPLY_PARTITION, str(self.reply_partition).encode())

    @property
    def headers(self) -> list[tuple[str, str | bytes | None]]:
        """Every routing header of the proposal: the reply partition and when to answer."""
        return [self.header, (H_WAIT, self.wait.encode())]


def parse_times(raw: bytes | None) -> dict[str, float]:
    """The coordinator's `name=epoch-ms;...` times header, as epoch seconds by name."""
    out: dict[str, float] = {}
    for part in (raw or b"").decode("ascii", errors="replace").split(";"):
        name, _, ms = part.partition("=")
        with contextlib.suppress(ValueError):
            out[name] = float(ms) / 1000
    return out


def check_wait(wait: str) -> str:
    if wait not in ("published", "ratified"):
        raise ValueError(f"wait={wait!r}: use 'published' or 'ratified'")
    return wait


@dataclass
class ReplyCounts:
    """What this writer's reply consumer fetched: every record, and those answering a proposal not its own."""

    records: int = 0
    foreign: int = 0
    #: Bytes the reply reader received from the brokers (librdkafka's `rxbytes`; needs the client
    #: option `statistics.interval.ms`, and is as fresh as the last statistics report).
    rx_bytes: int = 0


class Routing:
    """The proposals this process waits for, and the routing of each reply record to its proposal."""

    #: Proposal ids remembered as ours, to tell own late answers (a notice after `wait="ratified"`) from foreign ones.
    KEEP_IDS = 100_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[bytes, Pending] = {}
        self._ours: OrderedDict[bytes, None] = OrderedDict()
        self.counts = ReplyCounts()

    def register(self, proposal_id: str, partition: int, wait: str) -> Pending:
        """A new proposal waiting for answers on `partition` (call with `_lock` held)."""
        pending = Pending(proposal_id, partition, wait, int(time.time() * 1000))
        key = proposal_id.encode()
        self._pending[key] = pending
        self._ours[key] = None
        if len(self._ours) > self.KEEP_IDS:
            self._ours.popitem(last=False)
        return pending

    def forget(self, proposal_id: str) -> None:
        with self._lock:
            self._pending.pop(proposal_id.encode(), None)

    def route(self, m: Any) -> None:
        """Settle the futures of the proposal a reply record (`headers()`, `value()`) answers."""
        pid = header(m, H_PROPOSAL_ID)
        kind = header(m, H_KIND) or KIND_DECISION
        replied_at = time.time()
        with self._lock:
            self.counts.records += 1
            if pid is None or pid not in self._ours:
                self.counts.foreign += 1
                return
            pending = self._pending.get(pid)
            if pending is None:
                return
            if kind != KIND_DECISION:
                self._pending.pop(pid, None)  # a notice is the last answer a proposal gets
        value = m.value()
        if not pending.replied_at:
            pending.replied_at = replied_at
            pending.coordinator_times.update(parse_times(header(m, H_TIMES)))
        if value is not None and not pending.decision.done():  # every reply carries the decision
            with contextlib.suppress(InvalidStateError):  # a commits-topic scan found it first
                try:
                    decision = decode_decision(value)
                except Exception as e:  # a decision we cannot read is still not an outcome we may invent
                    pending.decision.set_exception(e)
                else:
                    pending.decision.set_result(decision)
        if kind == KIND_DECISION:
            return
        if kind == KIND_PUBLISHED and not pending.published.done():
            version = header(m, H_VERSION)
            pending.published.set_result(int(version) if version else -1)
        elif kind == KIND_UNPUBLISHED and not pending.published.done():
            why = header(m, H_ERROR)
            pending.published.set_exception(ProposalNotPublishedError(
                why.decode("utf-8", errors="replace") if why else "the coordinator will not publish this version"))
