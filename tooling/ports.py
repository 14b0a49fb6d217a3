"""Listening ports for the local servers (broker, storage servers, metrics) and the tests that start them.

A port asked of the OS with bind(0) comes from the ephemeral range, the same range every outgoing
connection takes its local port from. Such a port is free when chosen and bound by a JVM seconds
later; meanwhile any client connecting anywhere can take it as its local end (seen in CI: a broker's
controller failed with "Address already in use" on a port chosen free). Ports below the ephemeral
range are never handed out for outgoing connections, so a free one stays free unless someone asks for
it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and outside the range outgoing connections use."""
    high = _ephemeral_low()
    if high - _LOWEST > 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_LOWEST, high)
            if port_free(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a machine with an unusual range
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
