"""The limits of a relay (`deltacoord.writer.relay`): light, so the command line can show their defaults without Kafka."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class RelayLimits:
    """What one relay accepts from its writers (`deltacoord relay run --max-...`); see docs/operations.md."""

    #: A frame (a proposal with its headers) larger than this is refused unread and its connection closed. A
    #: proposal never needs more than the coordinator's max_proposal_bytes (4 MiB) plus headers: larger commits
    #: travel by reference.
    max_frame_bytes: int = 8 * 1024 * 1024
    #: Bytes of frames being read or waiting to be produced, over every connection: a frame that would go over
    #: waits (at most `frame_timeout_s`) for room, then its connection is closed.
    max_buffered_bytes: int = 64 * 1024 * 1024
    #: Connections served at once; one more is answered with a refusal its writer raises, and closed.
    max_connections: int = 256
    #: A connection that sends no greeting, or part of a frame and then nothing, for this long is closed.
    #: (A greeted connection idle between frames is kept: a writer holds it across commits.)
    frame_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"relay limit {f.name} must be above 0, got {getattr(self, f.name)}")
        if self.max_frame_bytes > self.max_buffered_bytes:
            raise ValueError(f"max_frame_bytes ({self.max_frame_bytes}) must not exceed max_buffered_bytes "
                             f"({self.max_buffered_bytes}): such a frame could never be read")


__all__ = ["RelayLimits"]
