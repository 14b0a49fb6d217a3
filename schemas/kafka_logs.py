"""librdkafka's log lines through Python logging, deduplicated, and one clear error for an unreachable Kafka.

librdkafka writes every failed connection attempt to stderr by itself (`%3|...|FAIL|rdkafka#producer-1|...`),
hundreds of lines a minute while a broker is down. Every client this project creates passes
`kafka_config(...)`, which routes those lines to the `deltacoord.kafka` logger (confluent-kafka's `logger`
setting). That logger drops repeats of one message (numbers and addresses aside) for `REPEAT_INTERVAL_S`
and then says how many it dropped, so an outage costs a line per minute, not a line per retry. It has a
NullHandler: an application that configures logging sees the lines, a CLI user sees none.

`probe(...)` answers "can this client reach Kafka?" within seconds, so a command with a wrong
`--bootstrap-servers` fails with one line instead of waiting for a 30 s metadata timeout.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from deltacoord.schemas.errors import ProposalNotSentError

LOGGER_NAME = "deltacoord.kafka"
#: A message already logged is dropped for this long, then logged again with the count of its repeats.
REPEAT_INTERVAL_S = 60.0
_VARYING = re.compile(r"\d+(?:\.\d+)*|#\w+-\d+")


class UnreachableKafkaError(ProposalNotSentError):
    """No broker of `bootstrap.servers` answered: a wrong address, a stopped broker, a network in the way.

    A commit call raises it before anything was sent (it asks before proposing): nothing can commit, and a
    retry is safe, so it is a `ProposalNotSentError`."""


class KafkaCredentialsError(UnreachableKafkaError):
    """The brokers answered but refused the client's credentials (SASL) or its TLS handshake."""


class RepeatFilter(logging.Filter):
    """Drop a message seen in the last `interval_s` (digits, ports and client numbers do not count)."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = _VARYING.sub("#", record.getMessage())
        now = time.monotonic()
        with self._lock:
            last, dropped = self._seen.get(key, (-1e18, 0))
            if now - last < self.interval_s:
                self._seen[key] = (last, dropped + 1)
                return False
            self._seen[key] = (now, 0)
            if len(self._seen) > 10_000:  # bounded: forget the oldest half
                for k, _ in sorted(self._seen.items(), key=lambda kv: kv[1][0])[:5_000]:
                    del self._seen[k]
        if dropped:
            record.msg = f"{record.getMessage()} (and {dropped} more like it in the last {self.interval_s:.0f}s)"
            record.args = None
        return True


def kafka_logger() -> logging.Logger:
    """The `deltacoord.kafka` logger, with its repeat filter and a NullHandler (set up once)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
        logger.addHandler(logging.NullHandler())
    return logger


def kafka_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A client configuration whose librdkafka logs go to `kafka_logger()` (unless the caller set a logger)."""
    out = dict(conf)
    out.setdefault("logger", kafka_logger())
    return out


def probe(conf: Mapping[str, Any], timeout_s: float = 8.0) -> None:
    """Raise UnreachableKafkaError unless a broker of `conf["bootstrap.servers"]` answers within `timeout_s`."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[tuple[float, str]] = []

    def on_error(err: KafkaError) -> None:
        if err.code() != KafkaError._ALL_BROKERS_DOWN:  # "0/2 brokers are down" sums up the causes, names none
            errors.append((time.monotonic(), err.str()))

    bootstrap = str(conf.get("bootstrap.servers", ""))
    admin_conf: dict[str, Any] = {**kafka_config(conf), "error_cb": on_error, "socket.connection.setup.timeout.ms": 5000}
    admin = AdminClient(admin_conf)
    start = time.monotonic()
    last: Exception | None = None
    while True:
        try:
            admin.list_topics(timeout=1.0)
            return
        except KafkaException as e:
            last = e
        admin.poll(0)  # serves error_cb
        now = time.monotonic()
        refused_login = login_refusal(errors, start, now)
        if refused_login is not None:
            raise KafkaCredentialsError(_credentials_message(conf, bootstrap, refused_login))
        elapsed = now - start
        refused = any("refused" in x.lower() or "resolve" in x.lower() for _, x in errors)
        if elapsed >= timeout_s or (refused and elapsed >= 3.0):
            break
    why = errors[-1][1] if errors else str(last)
    raise UnreachableKafkaError(
        f"cannot reach Kafka at {bootstrap}: {_short(why)}. Check --bootstrap-servers "
        "(or DELTACOORD_BOOTSTRAP_SERVERS) and that the brokers run; `deltacoord broker start` runs a local one."
    )


#: Answers that only a refusal gives: wrong SASL credentials, a certificate the client does not trust.
_AUTH_FAILED = re.compile(r"SASL authentication error|Authentication failed|certificate verify failed", re.IGNORECASE)
#: librdkafka words a cut-off handshake either way ("SSL handshake failed: ...", "... (after 1ms in state SSL_HANDSHAKE)").
_HANDSHAKE = re.compile(r"SSL handshake failed|in state SSL_HANDSHAKE", re.IGNORECASE)
#: How long handshake failures alone must last before they are taken for a misconfiguration.
HANDSHAKE_PERSIST_S = 3.0


def login_refusal(errors: Sequence[tuple[float, str]], start: float, now: float) -> str | None:
    """The error that shows the brokers refuse this client's login or TLS, or None while that is not shown.

    A refused SASL login or an untrusted certificate is final at once. A TLS handshake cut off by a reset is what a
    PLAINTEXT listener answers a TLS client, but also what a broker that is shutting down answers any client, so
    it counts only when nothing else was heard for `HANDSHAKE_PERSIST_S`: every error since the start is one.
    """
    final = next((x for _, x in errors if _AUTH_FAILED.search(x)), None)
    if final is not None:
        return final
    if not errors or now - start < HANDSHAKE_PERSIST_S or not all(_HANDSHAKE.search(x) for _, x in errors):
        return None
    return errors[-1][1]


def _credentials_message(conf: Mapping[str, Any], bootstrap: str, why: str) -> str:
    from deltacoord.schemas.errors import kafka_principal

    principal = kafka_principal(conf)
    low = why.lower()
    if "sasl authentication" not in low and "authentication failed" not in low:
        return (f"the TLS handshake with Kafka at {bootstrap} failed for {principal}: {why.split(': ', 2)[-1]}. "
                "Check ssl.ca.location (the CA that signed the brokers' certificates) and security.protocol")
    return (f"Kafka at {bootstrap} refused the credentials of {principal} "
            f"(sasl.mechanism={conf.get('sasl.mechanism', 'GSSAPI')}): a wrong sasl.password or no such user. "
            "Fix sasl.username / sasl.password in the Kafka client settings")


def _short(why: str) -> str:
    """librdkafka's reason without its thread and client prefixes: 'connection refused', 'resolve failed', ..."""
    low = why.lower()
    for phrase in ("connection refused", "failed to resolve", "timed out", "no route to host", "ssl handshake failed",
                   "authentication"):
        if phrase in low:
            return phrase
    return why.split(": ")[-1].strip() or why


__all__ = ["LOGGER_NAME", "REPEAT_INTERVAL_S", "KafkaCredentialsError", "RepeatFilter", "UnreachableKafkaError", "kafka_config", "kafka_logger",
           "login_refusal", "probe"]
