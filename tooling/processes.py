"""The supervisor of the local servers' processes (broker nodes, storage servers): the state a server records
when it starts, whether its recorded pid is still ours, stopping it, and the lock that keeps two starts of one
home apart.

A server's pid is recorded in a state file that outlives it; the pid may since belong to anything, so a
pid counts as ours only while its command line names the server's own home.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar


class _Recorded(Protocol):
    """A server's recorded state: a dataclass with the server's pid."""

    @property
    def pid(self) -> int: ...


_S = TypeVar("_S", bound=_Recorded)


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie child counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def runs_with(pid: int, marker: Path | str) -> bool:
    """Whether `pid` is alive and its command line names `marker` (guards against recycled pids)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return str(marker).encode() in cmdline


def record(state_file: Path, info: Any) -> None:
    """Record a started server's state (`info`, a dataclass) in `state_file`, as JSON."""
    state_file.write_text(json.dumps(asdict(info), indent=2) + "\n")


def recorded(state_file: Path, kind: Callable[..., _S]) -> _S | None:
    """The state a server recorded in `state_file` (the fields of `kind`), or None when none is readable."""
    try:
        return kind(**json.loads(state_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running(state_file: Path, kind: Callable[..., _S], marker: Path | str) -> _S | None:
    """The recorded state of a server that still runs: None when none is recorded or its pid is no longer the
    server's (its command line does not name `marker`, the server's own config or data folder)."""
    info = recorded(state_file, kind)
    return info if info is not None and runs_with(info.pid, marker) else None


def terminate(pid: int, timeout_s: float, poll_s: float = 0.1) -> None:
    """SIGTERM `pid`, reap it, and SIGKILL it if it outlives `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(poll_s)
    kill(pid)


def kill(pid: int) -> None:
    """SIGKILL `pid` if it runs, and reap it when it is our child."""
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created with its folder), held for the block, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def die_with_parent() -> None:
    """Run in the child before exec: SIGTERM when the starting process dies (Linux prctl)."""
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
