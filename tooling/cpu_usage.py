"""CPU time of local processes, read from /proc: what the bench's coordinator and broker spend per commit.

A commit through deltacoord costs CPU in three places (the writer, the coordinator with its checkpoint
process, the broker) where delta-rs spends it in the writer alone; on a machine with few cores the
sum, not the path length, bounds commits per second. Linux only, as the bench's memory figures;
elsewhere, and for a process that is not on this machine, a figure is None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_LISTEN = "0A"  # TCP state of a listening socket in /proc/net/tcp


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (f := _stat_fields(int(entry))) is not None:
            kids.setdefault(int(f[1]), []).append(int(entry))
    return kids


def process_tree_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of `pid`, its live descendants and the children it has reaped."""
    kids = _children()
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        f = _stat_fields(p)
        if f is None:
            if p == pid:
                return None
            continue  # a descendant that just ended
        # utime, stime, cutime, cstime (fields 14-17 of proc(5); the list starts at field 3)
        total += sum(int(x) for x in f[11:15]) / _TICKS
        todo.extend(kids.get(p, []))
    return total


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def listener_pid(port: int) -> int | None:
    """The local process listening on TCP `port` (a broker behind a bootstrap address), if any."""
    sockets = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not sockets:
        return None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in sockets:
                    return int(entry)
            except OSError:
                continue
    return None


def broker_pid(bootstrap_servers: str) -> int | None:
    """The process of the first bootstrap address served on this machine (None for a remote broker)."""
    local = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", os.uname().nodename if hasattr(os, "uname") else ""}
    for address in bootstrap_servers.split(","):
        host, _, port = address.strip().rpartition(":")
        if host.split("://")[-1] in local and port.isdigit() and (pid := listener_pid(int(port))) is not None:
            return pid
    return None


@dataclass
class ServiceCpu:
    """CPU seconds each named process tree spent between `start()` and `stop()` (None: not measurable)."""

    pids: dict[str, int | None]
    used: dict[str, float | None] = field(default_factory=dict)
    _at_start: dict[str, float | None] = field(default_factory=dict)

    def start(self) -> None:
        self._at_start = {name: None if pid is None else process_tree_cpu_s(pid) for name, pid in self.pids.items()}

    def stop(self) -> None:
        for name, pid in self.pids.items():
            before = self._at_start.get(name)
            after = None if pid is None else process_tree_cpu_s(pid)
            self.used[name] = None if before is None or after is None else max(0.0, after - before)
