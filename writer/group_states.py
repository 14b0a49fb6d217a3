"""Which consumer groups are in a given state, asked of Kafka's admin API in this process.

ListGroups goes to each broker in turn (librdkafka's fan-out path), not through the
group-coordinator path (FindCoordinator, then the request) whose error handling aborts the
process when a broker connection drops (librdkafka issue #4605, see `deltacoord.writer.group_questions`).
So it is asked here, without a child process to start: a fresh writer learns in one round trip
per broker that its coordinators' group is Stable, where the child's interpreter and imports
alone take a few hundred milliseconds. `tests/integration/test_admin_abort.py` asks it while
the broker is SIGKILLed and restarted.
"""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

# Imported with the module, not on the first question: a fresh writer asks it on a start-up thread while its
# first commit reads the table's log, and an import there holds the interpreter lock (about 8 ms) meanwhile.
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

#: Seconds the answer may take beyond the request's own timeout before it is given up.
MARGIN_S = 2.0


class ListingFailed(Exception):
    """Kafka gave no answer to the listing (unreachable brokers, a timeout)."""


@dataclass(frozen=True)
class GroupListing:
    """The groups found in the states asked for; `complete` is False when a broker did not answer (a group it
    coordinates may be missing)."""

    states: dict[str, str]
    complete: bool


def groups_in_states(conf: dict[str, Any], states: list[str], timeout_s: float) -> GroupListing:
    """{group id: state name} of the cluster's consumer groups in one of `states` (ConsumerGroupState names)."""
    admin = AdminClient(conf)  # one per question: an idle admin client would reconnect for ever
    try:
        future = admin.list_consumer_groups(states={ConsumerGroupState[s] for s in states},
                                            request_timeout=timeout_s)
        listed = future.result(timeout=timeout_s + MARGIN_S)
    except (KafkaException, FutureTimeout) as e:
        raise ListingFailed(f"listing consumer groups: {e.args[0] if e.args else 'no answer'}") from None
    found = {g.group_id: getattr(getattr(g, "state", None), "name", "UNKNOWN") for g in listed.valid or ()}
    return GroupListing(found, complete=not listed.errors)


__all__ = ["GroupListing", "ListingFailed", "groups_in_states"]
