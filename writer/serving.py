"""Is a coordinator serving a proposals partition? Asked before proposing.

Without a coordinator a proposal waits for a decision nobody makes and ends as an
unknown outcome that may commit later (when one starts), so a retry could commit
the rows twice. A writer therefore asks Kafka first and refuses to propose when no
coordinator serves the table's partition: `NoCoordinatorError`, nothing sent.

First a quick look, in this process (`deltacoord.writer.group_states`): is the coordinators'
group Stable? Coordinators subscribe the whole proposals topic, and a Stable group
has every partition of its subscription assigned to a live member, so the answer
holds for every partition. Only when the group is not Stable (no coordinator, one
starting, a rebalance, coordinators under another group id) does the writer ask the
exact question (`describe_consumer_groups`: is a live member assigned this
partition?) in a child process (`deltacoord.writer.group_questions`: that admin call can abort
its process), waiting as below before it says no.

Either answer is kept for `TRUSTED_S`, and every reply from a coordinator renews
it, so a busy writer never asks again; an idle one asks at most once per
`TRUSTED_S`. A group whose members do not hold the partition yet (a rebalance: a
coordinator joining or leaving) is asked again for up to `REBALANCE_WAIT_S`; with
no member at all, for `SETTLE_S` (a coordinator started a moment ago joins within
about a second or two). When the named group has no member, the writer looks
through the cluster's active groups once for coordinators under another group id
(and asks that group from then on). When Kafka cannot answer (no permission to
describe the group, a timeout), the writer proposes as before. Coordinators given a
static partition list join no group, so this check cannot see them: writers of such
a deployment turn it off (`coordinator_check=False`, `DELTACOORD_COORDINATOR_CHECK=0`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from deltacoord.schemas.client_settings import prefix_of
from deltacoord.schemas.errors import NoCoordinatorError
from deltacoord.schemas.routing import Topics
from deltacoord.writer.group_questions import GroupQuestions, QuestionFailed
from deltacoord.writer.group_states import ListingFailed, groups_in_states

log = logging.getLogger(__name__)

#: How long a partition found served (or answered by a coordinator) is trusted without asking again.
TRUSTED_S = 10.0
#: How long a group with no member at all is asked again before the answer is no (a coordinator starting).
SETTLE_S = 5.0
#: How long a group with members, none of them holding the partition yet (a rebalance), is asked again.
REBALANCE_WAIT_S = 30.0
#: Seconds between those questions, and the bound of each admin request.
RETRY_S = 0.5
REQUEST_TIMEOUT_S = 5.0
#: Active groups looked at, at most, when searching for coordinators under another group id.
MAX_GROUPS_SCANNED = 500

_ACTIVE = ("STABLE", "PREPARING_REBALANCING", "COMPLETING_REBALANCING")
#: The state in which every partition the members subscribe is assigned to one of them (the quick look's yes).
_ASSIGNED = "STABLE"


class _CannotTell(Exception):
    """Kafka gave no usable answer (an authorization error, a timeout): propose as without the check."""


class CoordinatorCheck:
    """The per-partition answer to "does a live coordinator hold this proposals partition?", cached."""

    def __init__(self, conf: dict[str, Any], topics: Topics, group_id: str, *, enabled: bool = True) -> None:
        self._conf = {k: v for k, v in conf.items() if k != "statistics.interval.ms"}
        self.topics = topics
        self.group_id = group_id
        self.enabled = enabled
        self._lock = threading.Lock()
        self._trusted_until: dict[int, float] = {}
        #: Until when the quick look's "the group is Stable" stands for every partition.
        self._group_trusted_until = 0.0
        self._warned = False
        #: Broker questions asked so far (describe or list calls, quick looks included), for tests and diagnostics.
        self.questions = 0
        #: Quick looks asked so far (in this process, `deltacoord.writer.group_states`), for tests and diagnostics.
        self.quick_looks = 0
        #: Asked in a child process: a librdkafka abort of the admin API must not end the writer
        #: (`deltacoord.writer.group_questions`).
        self.kafka = GroupQuestions(self._conf)

    def close(self) -> None:
        """Stop the child process that asks Kafka (started again by the next question)."""
        self.kafka.close()

    def served(self, partition: int) -> None:
        """A coordinator just answered for `partition`: trust that it is served for another TRUSTED_S."""
        with self._lock:
            self._trusted_until[partition] = time.monotonic() + TRUSTED_S

    def ensure(self, partition: int) -> None:
        """Return when a coordinator serves `partition` (or Kafka cannot tell); NoCoordinatorError when none does."""
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            if now < self._trusted_until.get(partition, 0.0) or now < self._group_trusted_until:
                return
        try:
            found = self._look() or self._ask(partition)
        except _CannotTell as e:
            if not self._warned:
                self._warned = True
                log.warning("cannot check whether a coordinator serves %s[%d] (%s); proposing without the check",
                            self.topics.proposals, partition, e)
            found = True
        if not found:
            raise NoCoordinatorError(self.topics.proposals, partition, self.group_id,
                                     str(self._conf.get("bootstrap.servers")), prefix_of(self.topics))
        self.served(partition)

    def warm(self) -> None:
        """Ask once which proposals partitions the coordinators hold, and trust them for TRUSTED_S: a new
        client asks in the background, so its first commit need not (a fresh admin client's round trips)."""
        if not self.enabled:
            return
        with contextlib.suppress(_CannotTell):
            if not self._look():
                self._describe([self.group_id], -1, trust=True)

    # -- asking Kafka ----------------------------------------------------------------------
    def _look(self) -> bool:
        """The quick look: True (and every partition trusted for TRUSTED_S) when the named group is Stable."""
        self.questions += 1
        self.quick_looks += 1
        try:
            listing = groups_in_states(self._conf, [_ASSIGNED], REQUEST_TIMEOUT_S)
        except ListingFailed as e:
            raise _CannotTell(str(e)) from None
        if listing.states.get(self.group_id) != _ASSIGNED:
            return False
        with self._lock:
            self._group_trusted_until = time.monotonic() + TRUSTED_S
        return True

    def _ask(self, partition: int) -> bool:
        start = time.monotonic()
        scans = 0
        while True:
            serving, active = self._describe([self.group_id], partition)
            if serving is not None:
                return True
            waited = time.monotonic() - start
            last = waited + RETRY_S > (REBALANCE_WAIT_S if active else SETTLE_S)
            if not active and (scans == 0 or (last and scans == 1)):
                # The named group has no member: coordinators may run under another group id (asked at the
                # first and the last look, in case one was starting).
                scans += 1
                other = self._search(partition)
                if other is not None:
                    log.info("coordinators of %s run in consumer group %s (not %s); checking that group from now on",
                             self.topics.proposals, other, self.group_id)
                    self.group_id = other
                    return True
            if last:
                return False
            time.sleep(RETRY_S)  # a coordinator may be starting, or its group rebalancing

    def _describe(self, group_ids: list[str], partition: int, trust: bool = False) -> tuple[str | None, bool]:
        """(a group of `group_ids` with a member assigned the partition, whether any of them has live members);
        with `trust`, every proposals partition a member holds is trusted as served."""
        self.questions += 1
        active = False
        try:
            groups = self.kafka.describe(group_ids, REQUEST_TIMEOUT_S)
        except QuestionFailed as e:
            raise _CannotTell(f"describing consumer groups {group_ids[:3]}: {e}") from None
        for group_id in group_ids:
            desc = groups.get(group_id, {"error": "no answer"})
            if "error" in desc:
                if len(group_ids) == 1:
                    raise _CannotTell(f"describing consumer group {group_id}: {desc['error']}")
                continue  # scanning: a group that vanished or that we may not describe is not ours
            members = desc["members"]
            live = desc["state"] in _ACTIVE
            if members and live:
                active = True
            for assignment in members:
                if trust and live:
                    for topic, p in assignment:
                        if topic == self.topics.proposals:
                            self.served(p)
                if any(topic == self.topics.proposals and p == partition for topic, p in assignment):
                    return group_id, True
        return None, active

    def _search(self, partition: int) -> str | None:
        """An active group (other than the named one) whose members hold the partition, if any (listed in this
        process, `deltacoord.writer.group_states`; the members asked of the child)."""
        self.questions += 1
        try:
            listed = groups_in_states(self._conf, list(_ACTIVE), REQUEST_TIMEOUT_S).states
        except ListingFailed as e:
            log.debug("cannot list consumer groups: %s", e)
            return None
        ids = sorted(g for g in listed if g != self.group_id)[:MAX_GROUPS_SCANNED]
        if not ids:
            return None
        group, _active = self._describe(ids, partition)
        return group
