"""Ports for the servers tests start themselves (the one chooser: `coordinator/tooling/ports.py`).

A broker started without a port prefers 19092, and a restarted one takes its old port only if it is
still free, else another. So a test broker on 19092 that is stopped for a while can lose its port to
another test's broker starting meanwhile, and its clients reconnect to that other cluster (seen as
"reports different ClusterId" and topics whose partitions vanish). Tests that stop and restart a
broker start it on a free port below the ephemeral range, which nothing else asks for by number.
"""

from __future__ import annotations

from coordinator.tooling.ports import free_port

__all__ = ["free_port"]
