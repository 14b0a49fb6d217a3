"""Ports for the brokers tests start themselves.

A broker started without a port prefers 19092, and a restarted one takes its old port only if it is
still free, else another. So a test broker on 19092 that is stopped for a while can lose its port to
another test's broker starting meanwhile, and its clients reconnect to that other cluster (seen as
"reports different ClusterId" and topics whose partitions vanish). Tests that stop and restart a
broker start it on a free port the OS picks, which nothing else asks for by name.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
