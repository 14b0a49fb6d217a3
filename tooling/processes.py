"""The supervisor of the local servers' processes (broker nodes, storage servers): whether a recorded pid is
still ours, stopping it, and the lock that keeps two starts of one home apart.

A server's pid is recorded in a state file that outlives it; the pid may since belong to anything, so a
pid counts as ours only while its command line names the server's own home.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path


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
