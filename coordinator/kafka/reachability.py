"""Whether this coordinator reaches Kafka, for `/healthz`.

The proposals consumer polls every `poll_timeout_s` whether or not anything
arrives, so a poll that returns nothing says nothing about the brokers. Its
librdkafka statistics do: every `statistics.interval.ms` they list each broker
connection with its state, and a coordinator with no connection `UP` reaches no
broker. librdkafka's `_ALL_BROKERS_DOWN` error marks the same moment at once,
and its transport errors name the cause (connection refused, timed out, ...).
Both callbacks are served by the consumer's `poll` on the deciding thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from confluent_kafka import KafkaError

log = logging.getLogger(__name__)

#: statistics.interval.ms of the proposals consumer unless the Kafka settings give one.
STATS_INTERVAL_MS = 2000
#: Errors that say why brokers cannot be reached (kept as the reason's cause).
_CAUSES = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE,
                     KafkaError._AUTHENTICATION, KafkaError._SSL})


class KafkaReachability:
    """Fed by a client's `stats_cb` and `error_cb`; `unreachable_for` says since when no broker answers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._error: str | None = None
        #: Broker connections seen in the last statistics (name -> state), for the reason.
        self._brokers: dict[str, str] = {}

    def on_stats(self, stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
            brokers = {str(b.get("name", name)): str(b.get("state", "?"))
                       for name, b in (stats.get("brokers") or {}).items() if isinstance(b, dict)}
        except (ValueError, AttributeError):
            return
        up = any(state == "UP" for state in brokers.values())
        with self._lock:
            self._brokers = brokers
            if up:
                if self._down_since is not None:
                    log.info("Kafka is reachable again (after %.0fs)", time.monotonic() - self._down_since)
                self._down_since, self._error = None, None
            elif self._down_since is None:
                self._down_since = time.monotonic()

    def on_error(self, err: KafkaError) -> None:
        if err.code() not in _CAUSES:
            return
        with self._lock:
            self._error = err.str()
            if err.code() == KafkaError._ALL_BROKERS_DOWN and self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("no Kafka broker is reachable: %s", err.str())

    def unreachable_for(self, now: float | None = None) -> tuple[float, str] | None:
        """(seconds, why) while no broker is reachable; None while one is (or nothing is known yet)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._down_since is None:
                return None
            states = ", ".join(f"{name} {state}" for name, state in sorted(self._brokers.items())) or "none known"
            why = f"brokers: {states}" + (f"; last error: {self._error}" if self._error else "")
            return now - self._down_since, why
