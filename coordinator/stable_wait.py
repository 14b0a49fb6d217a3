"""Waiting until Kafka's read_committed readers see a decision (see `deltacoord.coordinator.kafka.stability`).

The publisher and the replies both wait this way before showing anything of a
decision this process recorded; the check itself (a ListOffsets request) is the
Kafka edge's, so this module stays free of Kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: (commits partition, offset) -> whether `read_committed` readers see that record; may raise when Kafka is away.
StableCheck = Callable[[int, int], bool]

#: After this long waiting for a record to become readable, a warning, repeated at this interval.
WARN_AFTER_S = 10.0


@dataclass
class StableWait:
    """Blocks until records are readable; `waiting` says on what, and since when, while it blocks."""

    check: StableCheck
    #: What waits, for the log ("publication", "replies").
    what: str
    waiting: tuple[int, int, float] | None = None

    def until(self, need: Mapping[int, int], give_up: Callable[[float], bool]) -> bool:
        """Wait until each commits partition's record at `need[partition]` is readable. False as soon as
        `give_up(seconds waited)` says so while one is not."""
        left = dict(need)
        started = time.monotonic()
        delay, warned_at = 0.001, started
        failure: str | None = None
        try:
            while left:
                for p, o in list(left.items()):
                    try:
                        ok = self.check(p, o)
                    except Exception as e:  # Kafka is away: keep asking, show nothing meanwhile
                        log.debug("asking for the last stable offset of commits partition %d failed: %s", p, e)
                        failure, ok = f"{type(e).__name__}: {e}", False
                    else:
                        failure = None
                    if ok:
                        del left[p]
                if not left:
                    return True
                now = time.monotonic()
                p, o = next(iter(left.items()))
                self.waiting = (p, o, started)
                if give_up(now - started):
                    return False
                if now - warned_at >= WARN_AFTER_S:
                    warned_at = now
                    if failure is not None:
                        log.warning("%s waits: asking Kafka whether offset %d of commits partition %d is readable "
                                    "fails (%s) and has for %.0fs; nothing of it is shown before the answer", self.what,
                                    o, p, failure, now - started)
                    else:
                        log.warning("%s waits: the transaction holding offset %d of commits partition %d committed "
                                    "%.0fs ago but Kafka does not show it to read_committed readers yet (its markers "
                                    "are not written); nothing of it is shown before they are", self.what, o, p,
                                    now - started)
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            return True
        finally:
            self.waiting = None

    def waited(self, now: float | None = None) -> tuple[int, int, float] | None:
        """(partition, offset, seconds) while it waits."""
        w = self.waiting
        if w is None:
            return None
        return w[0], w[1], (time.monotonic() if now is None else now) - w[2]


__all__ = ["WARN_AFTER_S", "StableCheck", "StableWait"]
