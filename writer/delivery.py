"""Waiting for a producer's deliveries on the main thread, where a Ctrl-C lands.

confluent-kafka runs delivery callbacks inside `Producer.flush`; when SIGINT's KeyboardInterrupt is raised
inside one of them, flush (2.16) returns without the exception set and Python raises SystemError instead,
so the caller can no longer tell an interrupt (an outcome it can name) from a crash. Here a Ctrl-C during
the wait only marks the interrupt, and it is raised between two short flushes.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

from confluent_kafka import Producer

#: One flush call's wait: below confluent-kafka's own 200 ms chunks, and the longest a Ctrl-C waits here.
FLUSH_STEP_S = 0.1


def flush_deliveries(producer: Producer, timeout_s: float) -> int:
    """`producer.flush(timeout_s)` whose Ctrl-C raises KeyboardInterrupt once no callback runs; the messages
    still queued."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return producer.flush(timeout_s)  # no KeyboardInterrupt can land here, or the program handles SIGINT
    interrupted: list[int] = []

    def mark(signum: int, _frame: FrameType | None) -> None:
        interrupted.append(signum)

    previous = signal.signal(signal.SIGINT, mark)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            left = producer.flush(max(0.0, min(FLUSH_STEP_S, deadline - time.monotonic())))
            if interrupted:
                raise KeyboardInterrupt
            if left == 0 or time.monotonic() >= deadline:
                return left
    finally:
        signal.signal(signal.SIGINT, previous)
