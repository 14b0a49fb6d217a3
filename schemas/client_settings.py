"""The settings every client shares (Python, the CLI, Spark) and their `DELTACOORD_*` variables.

One name per setting (docs/settings.md lists each with its Python keyword, CLI flag, variable and Spark
option): a value given explicitly wins, else the variable, else the default, in every front door alike.
"""

from __future__ import annotations

import os

from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.routing import Topics

BOOTSTRAP_SERVERS_ENV = "DELTACOORD_BOOTSTRAP_SERVERS"
TOPIC_PREFIX_ENV = "DELTACOORD_TOPIC_PREFIX"
#: The coordinators' consumer group (the coordinator reads the same variable).
GROUP_ID_ENV = "DELTACOORD_GROUP_ID"
#: `0`/`false`/`no`/`off` turns off the writers' check that a coordinator serves the table's partition.
COORDINATOR_CHECK_ENV = "DELTACOORD_COORDINATOR_CHECK"
#: Seconds a write waits for its decision before the outcome is unknown.
TIMEOUT_ENV = "DELTACOORD_TIMEOUT"
#: The Unix socket of the host's relay (`deltacoord relay run`); unset: each writer talks to Kafka itself.
RELAY_ENV = "DELTACOORD_RELAY"
DEFAULT_TOPIC_PREFIX = "deltacoord"
DEFAULT_TIMEOUT_S = 60.0

_FALSE = frozenset({"0", "false", "no", "off"})
_TRUE = frozenset({"1", "true", "yes", "on"})


class ClientSettingError(DeltaCoordError, ValueError):
    """A setting with no default was given neither as an argument nor through its variable."""


def bootstrap_servers(given: str | None) -> str:
    """The Kafka bootstrap servers: `given`, else DELTACOORD_BOOTSTRAP_SERVERS."""
    value = (given or os.environ.get(BOOTSTRAP_SERVERS_ENV) or "").strip()
    if not value:
        raise ClientSettingError(
            f"no Kafka bootstrap servers: pass bootstrap_servers='host:port[,host:port...]' or set {BOOTSTRAP_SERVERS_ENV} "
            "(the same Kafka cluster the coordinator uses)")
    return value


def topic_prefix(given: str | None) -> str:
    """The deployment's topic prefix: `given`, else DELTACOORD_TOPIC_PREFIX, else `deltacoord`."""
    value = (given or os.environ.get(TOPIC_PREFIX_ENV) or DEFAULT_TOPIC_PREFIX).strip()
    if not value:
        raise ClientSettingError(f"an empty topic prefix: pass topic_prefix= or set {TOPIC_PREFIX_ENV}")
    return value


def topics_of(prefix: str | None, topics: Topics | None) -> Topics:
    """The deployment's topics from `topics` (an explicit `Topics`) or a prefix (see `topic_prefix`); not both."""
    if topics is not None:
        if prefix is not None:
            raise ValueError("give topic_prefix= or topics=, not both (topics=Topics.with_prefix(p) is topic_prefix=p)")
        return topics
    return Topics.with_prefix(topic_prefix(prefix))


def prefix_of(topics: Topics) -> str:
    """The prefix `topics` were named from (the proposals topic without `.proposals`)."""
    return topics.proposals.removesuffix(".proposals")


def decision_timeout(given: float | None) -> float:
    """Seconds a write waits for its decision: `given`, else DELTACOORD_TIMEOUT, else 60."""
    if given is not None:
        value: float = given
    else:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        try:
            value = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ClientSettingError(f"{TIMEOUT_ENV}={raw!r}: give the seconds to wait for a decision, e.g. 60") from None
    if not value > 0:
        raise ClientSettingError(f"a decision timeout of {value} s: give a positive number of seconds")
    return value


def coordinator_group(given: str | None, topics: Topics) -> str:
    """The coordinators' consumer group: `given`, else DELTACOORD_GROUP_ID, else `<prefix>-coordinator` (as the
    coordinator names it)."""
    return (given or os.environ.get(GROUP_ID_ENV) or f"{prefix_of(topics)}-coordinator").strip()


def coordinator_check(given: bool | None) -> bool:
    """Whether writers check that a coordinator serves a partition before proposing: `given`, else
    DELTACOORD_COORDINATOR_CHECK, else on."""
    if given is not None:
        return given
    raw = os.environ.get(COORDINATOR_CHECK_ENV, "").strip().lower()
    if not raw or raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ClientSettingError(f"{COORDINATOR_CHECK_ENV}={raw!r}: use 1/true/on or 0/false/off")


def relay(given: str | None) -> str | None:
    """The Unix socket of the host's relay: `given`, else DELTACOORD_RELAY, else none (writers talk to Kafka
    themselves). An empty `given` turns the relay off even when the variable is set."""
    if given is not None:
        return given.strip() or None
    return os.environ.get(RELAY_ENV, "").strip() or None
