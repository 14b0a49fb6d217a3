"""A writer's connection to its host's relay (`deltacoord.writer.relay`): proposals out, this writer's answers in.

The relay produces each proposal with its own reply partition and forwards this
connection the replies to the proposals it sent, so the writer process holds no
Kafka producer or consumer on the commit path. A proposal is confirmed sent once
the relay reports the broker's acknowledgement. When the connection ends, an
unconfirmed proposal's delivery is unknown (it may have been written) and
answers still due are looked for in the commits topic, as for a lost reply
(`CoordinatorClient.decided`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

from deltacoord.schemas.errors import ProposalNotSentError, ProposalUnconfirmedError
from deltacoord.schemas.routing import Topics
from deltacoord.writer import relay_wire
from deltacoord.writer.replies import Pending, Routing

#: How long connecting and the relay's greeting may take (it waits for its reply lease on its first client).
CONNECT_TIMEOUT_S = 15.0
#: Forgotten proposal ids a writer holds back at most before telling the relay without waiting for a proposal.
FORGET_BATCH = 64


class RelayUnavailableError(ProposalNotSentError):
    """No relay answers at the configured socket: nothing was sent."""


class RelayLink(Routing):
    """One writer process's connection to the relay, with the proposals it waits for."""

    def __init__(self, path: str, topics: Topics) -> None:
        super().__init__()
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            self._sock.connect(path)
            head = relay_wire.greet(self._sock, topics)
        except (OSError, relay_wire.RelayClosedError) as e:
            self._sock.close()
            raise RelayUnavailableError(
                f"no deltacoord relay answers at {path} ({e}): start one with `deltacoord relay run --socket {path}` "
                "(same bootstrap servers and topic prefix as the writers), or unset DELTACOORD_RELAY") from None
        if not head.get("ok"):
            self._sock.close()
            raise RelayUnavailableError(f"the relay at {path} refused this writer: {head.get('error')}")
        self._sock.settimeout(None)
        self.partitions = int(head["partitions"])
        self.reply_partition = int(head.get("reply_partition", -1))
        #: The relay takes forgotten ids with the next proposal (else, a relay older than that, one frame per id).
        self._batch_forgets = head.get("forget_pids") is True
        #: The largest frame the relay reads (it closes a connection that sends a larger one); None: not told.
        self.max_frame = int(head["max_frame"]) if isinstance(head.get("max_frame"), int) else None
        #: Why the relay closed this connection, when it said so (a refused frame, a stall).
        self.error: str | None = None
        self._deliveries: dict[str, Future[None]] = {}
        #: Proposals forgotten here that the relay has not heard of yet (see `forget`).
        self._forgotten: list[str] = []
        self._send_lock = threading.Lock()
        self.closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="deltacoord-relay-link", daemon=True)
        self._reader.start()

    # -- the Routing interface the client uses ------------------------------------------------
    def expect(self, proposal_id: str, wait: str = "published") -> Pending:
        with self._lock:
            return self.register(proposal_id, self.reply_partition, wait)

    def leased(self) -> frozenset[int]:
        return frozenset({self.reply_partition}) if self.reply_partition >= 0 else frozenset()

    def wait_leased(self, timeout_s: float) -> bool:
        return self.reply_partition >= 0

    def forget(self, proposal_id: str) -> None:
        """Stop waiting for `proposal_id`'s answers. The relay hears of it with this writer's next proposal (one
        frame fewer per commit), or at once once FORGET_BATCH ids wait; meanwhile an answer it still forwards is
        dropped here, as one for a forgotten proposal."""
        super().forget(proposal_id)
        if not self._batch_forgets:
            with contextlib.suppress(OSError):
                self._send({"op": "forget", "pid": proposal_id})
            return
        with self._lock:
            self._forgotten.append(proposal_id)
            if len(self._forgotten) < FORGET_BATCH:
                return
            gone, self._forgotten = self._forgotten, []
        with contextlib.suppress(OSError):
            self._send({"op": "forget", "pids": gone})

    # -- proposals ------------------------------------------------------------------------------
    def produce(self, proposal_id: str, topic: str, partition: int, key: bytes, value: bytes,
                headers: list[tuple[str, str | bytes | None]]) -> Future[None]:
        """Hand a proposal to the relay; the future resolves once the broker acknowledged it (or fails)."""
        done: Future[None] = Future()
        with self._lock:
            self._deliveries[proposal_id] = done
            gone, self._forgotten = self._forgotten, []
        head: dict[str, Any] = {"op": "propose", "pid": proposal_id, "topic": topic, "partition": partition,
                                "key": key.decode("latin-1"), "headers": relay_wire.encode_headers(headers)}
        if gone:
            head["forget"] = gone
        if self.max_frame is not None:
            size = len(relay_wire.frame(head)) - relay_wire.LENGTHS_SIZE + len(value)
            if size > self.max_frame:
                with self._lock:
                    self._deliveries.pop(proposal_id, None)
                    self._forgotten = gone + self._forgotten  # told with the next proposal instead
                raise ProposalNotSentError(
                    f"proposal {proposal_id} takes a {size}-byte frame, over the {self.max_frame}-byte limit of the "
                    f"relay at {self.path} (its --max-frame-bytes); nothing was sent")
        try:
            self._send(head, value)
        except OSError as e:
            with self._lock:
                self._deliveries.pop(proposal_id, None)
            # A frame cut off mid-way is never produced by the relay: nothing was sent.
            raise RelayUnavailableError(f"the relay at {self.path} is gone ({e}); nothing was sent") from None
        return done

    def _send(self, head: dict[str, Any], body: bytes = b"") -> None:
        if self.closed.is_set():
            raise OSError("the relay connection is closed")
        with self._send_lock:
            relay_wire.send(self._sock, head, body)

    def _read(self) -> None:
        try:
            while True:
                head, body = relay_wire.receive(self._sock)
                op = head.get("op")
                if op == "reply":
                    self.route(relay_wire.Record(relay_wire.decode_headers(head.get("headers")),
                                                 None if head.get("null") else body))
                elif op == "delivered":
                    self._delivered(head)
                elif op == "error":  # the relay closes the connection after it
                    self.error = str(head.get("error"))
        except (OSError, relay_wire.RelayClosedError):
            pass
        finally:
            self.closed.set()
            with self._lock:
                open_, self._deliveries = self._deliveries, {}
            said = f" (the relay said: {self.error})" if self.error else ""
            for pid, done in open_.items():
                with contextlib.suppress(InvalidStateError):
                    done.set_exception(ProposalUnconfirmedError(
                        f"the relay at {self.path} closed before confirming proposal {pid}{said}: it may or may not "
                        "have reached Kafka"))

    def _delivered(self, head: dict[str, Any]) -> None:
        pid = str(head.get("pid"))
        with self._lock:
            done = self._deliveries.pop(pid, None)
            pending = self._pending.get(pid.encode())
        if pending is not None and "reply_partition" in head:
            pending.reply_partition = int(head["reply_partition"])
        if done is None:
            return
        error = head.get("error")
        with contextlib.suppress(InvalidStateError):
            if error is None:
                done.set_result(None)
            elif head.get("not_written"):
                done.set_exception(ProposalNotSentError(f"proposal {pid} was refused by Kafka: {error}"))
            else:
                done.set_exception(ProposalUnconfirmedError(f"proposal {pid} was not delivered: {error}"))

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(5)
