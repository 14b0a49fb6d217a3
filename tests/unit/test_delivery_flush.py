"""A Ctrl-C while a proposal's delivery is awaited is a KeyboardInterrupt, even inside a delivery callback."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from confluent_kafka import Producer

from deltacoord.writer.delivery import flush_deliveries


def _unreachable() -> Producer:
    """A producer whose messages fail delivery after 1 s (nothing listens on port 9): its callbacks run in flush."""
    return Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0, "message.timeout.ms": 1000})


def test_ctrl_c_inside_a_delivery_callback_raises_keyboard_interrupt_after_every_callback_ran() -> None:
    # Python's own SIGINT handler, whatever an earlier test of this process left installed (a program with a
    # handler of its own gets the plain flush).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        producer = _unreachable()
        ran: list[int] = []

        def on_delivery(_err: Any, _msg: Any) -> None:
            if not ran:
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs in this callback's next bytecodes
            sum(range(100_000))
            ran.append(1)

        for _ in range(5):
            producer.produce("t", b"x", on_delivery=on_delivery)
        with pytest.raises(KeyboardInterrupt):
            flush_deliveries(producer, 30)
        assert len(ran) == 5
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_an_interrupt_flush_returns_what_is_left_when_its_time_is_up() -> None:
    producer = _unreachable()
    producer.produce("t", b"x")
    assert flush_deliveries(producer, 0.3) == 1
    assert flush_deliveries(producer, 5) == 0  # failed delivery after 1 s: nothing left to wait for
