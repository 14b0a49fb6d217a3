"""The relay waits for other writers' proposals only when some active writer is about to send one."""

from __future__ import annotations

import socket

from deltacoord.writer.relay import ACTIVE_S, _Connection, expected_soon


def _conn(last_proposed: float, unanswered: int = 0) -> _Connection:
    a, _b = socket.socketpair()
    c = _Connection(a, lambda _c: None)
    c.last_proposed = last_proposed
    c.unanswered = {f"p{i}".encode() for i in range(unanswered)}
    return c


def test_only_active_writers_with_nothing_in_flight_are_waited_for() -> None:
    now = 100.0
    waiting = _conn(now - 0.001, unanswered=1)  # its proposal is queued or being decided: nothing more from it
    answered = _conn(now - 0.040)  # just got its answer, staging the next proposal
    idle = _conn(now - ACTIVE_S - 1)  # connected, not committing: never waited for
    never = _conn(float("-inf"))
    conns = [waiting, answered, idle, never]
    try:
        assert expected_soon(conns, now) == 1
        # A lone writer never waits: its own proposal is in flight.
        assert expected_soon([waiting], now) == 0
    finally:
        for c in conns:
            c.close()
