"""Named crash points for fault-injection tests.

`DELTACOORD_FAULT=<point>:<n>[:hang|:fail|:latefail|:failing|:stop]` makes the process SIGKILL
itself the n-th time it reaches `<point>` (1-based), or with `:hang` block that
thread forever (as a client library stuck in a call would; the watchdog must
act), or with `:fail` have `fault_point` return True that one time, for the
caller to fail the way the point describes (`:latefail`: the same after a 2 s
pause, a failure that lands while the process stops; `:failing`: that time and
every time after), or with `:stop` SIGSTOP the whole process there (a paused zombie
that a test resumes with SIGCONT). In-process tests arm a point with `arm`.
Unset, a fault point costs one dict lookup.
Points: `after_decide` (batch decided, no Kafka transaction yet),
`before_kafka_commit` (decisions and offsets sent in the transaction, not
committed; `:fail` aborts the transaction), `after_kafka_commit` (decisions
committed, nothing published), `checkpoint_before_publish` (checkpoint Parquet
written to its temp name only), `send_offsets` (in the thread adding the
consumed offsets to the transaction), `hold` (a hold's worker thread about to load and
decide an expensive proposal; `:hang` keeps the hold open for ever), `publish` (the publisher about to write a
version; `:fail` makes publishing it fail on an unexpected error, which halts that table).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

_counts: dict[str, int] = {}
_parent: int | None = None


def crash_parent_too(pid: int) -> None:
    """In a helper process (the checkpoint worker): a kill here also kills `pid`, its coordinator."""
    global _parent
    _parent = pid


def _parse(spec: str | None) -> tuple[str, int, str] | None:
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    n, _, action = rest.partition(":")
    return name, int(n or "1"), action or "kill"


_SPEC = _parse(os.environ.get("DELTACOORD_FAULT"))


def arm(spec: str | None) -> None:
    """Set (or with None clear) this process's fault, as `DELTACOORD_FAULT` would; counts restart."""
    global _SPEC
    _SPEC = _parse(spec)
    _counts.clear()


def reached(name: str) -> int:
    """How often the armed point `name` was reached since it was armed."""
    return _counts.get(name, 0)


def fault_armed(name: str) -> bool:
    """Whether a fault is set at `name` (without counting a pass, as `fault_point` does)."""
    return _SPEC is not None and _SPEC[0] == name


def fault_point(name: str) -> bool:
    """Crash here if asked to (tests only); True when the caller is asked to fail here (`:fail`)."""
    if _SPEC is None or _SPEC[0] != name:
        return False
    _counts[name] = _counts.get(name, 0) + 1
    if _SPEC[2] in ("fail", "latefail"):
        if _counts[name] == _SPEC[1] and _SPEC[2] == "latefail":
            time.sleep(2.0)
        return _counts[name] == _SPEC[1]
    if _SPEC[2] == "failing":
        return _counts[name] >= _SPEC[1]
    if _SPEC[2] == "stop":
        if _counts[name] == _SPEC[1]:
            os.kill(os.getpid(), signal.SIGSTOP)
        return False
    if _counts[name] == _SPEC[1]:
        if _SPEC[2] == "hang":
            logging.getLogger(__name__).warning("fault point %s: this thread hangs here from now on", name)
            threading.Event().wait()
        if _parent is not None:
            os.kill(_parent, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    return False
