"""`deltacoord relay run`: one Kafka producer and one reply partition for every writer process on a host.

Why: a writer process on its own holds a producer and two consumers (the reply
lease and its reader), and every commit costs the broker a Produce for the
proposal, a Produce for the reply (one partition per request) and a Fetch of it,
per writer. With many writer processes on one machine (Spark executors, a
worker pool) those requests, not the decisions, fill the cores. A relay
serves them all over a Unix socket: proposals of every local writer share the
relay's Produce requests, the answers of one coordinator transaction to this host
land on one reply partition (one Produce and one Fetch for all of them), and the
writer processes run no Kafka client on the commit path.

The relay also gathers (group commit): a proposal from one writer waits, at most
GATHER_S (10 ms), for the next proposals of the other active writers that have
just been answered, so they reach the coordinator together and are decided in
one Kafka transaction. A lone writer, or one whose peers all have proposals in
flight, never waits.

A writer still receives only its own answers: the relay forwards each reply to
the connection that sent the proposal. The relay holds nothing a commit depends
on. Proposals it produces keep their id, table, signature and wait headers; it
only sets the reply partition. If it dies, a proposal it has not confirmed has an
unknown delivery (the writer says so), and answers still due are found by the
writers in the commits topic (as after a lost reply); a restarted relay serves
new proposals. Writers choose it with `relay=` or DELTACOORD_RELAY.

The socket is created mode 0600 by default: only the relay's user may connect
(every connection may produce proposals with the relay's Kafka credentials; the
coordinator still checks writer signatures when it requires them). Give a group
of writer users access with `socket_mode=0o660` and the socket directory's group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from deltacoord.schemas import client_settings, kafka_logs
from deltacoord.schemas.errors import RelayRefusedError
from deltacoord.schemas.routing import H_PROPOSAL_ID, H_REPLY_PARTITION, H_WAIT, Topics, header
from deltacoord.writer import relay_wire
from deltacoord.writer.client import NOT_WRITTEN, ReplyPartitions, partition_count, proposal_producer
from deltacoord.writer.relay_limits import RelayLimits
from deltacoord.writer.replies import check_wait

log = logging.getLogger(__name__)

#: Gathering (group commit): a proposal waits at most this long for the proposals other active writers are
#: about to send, so they reach the coordinator together and are decided in one transaction.
GATHER_S = 0.010
#: A writer that proposed within this long is active: the relay may wait (up to GATHER_S) for its next proposal.
ACTIVE_S = 1.0
#: Frames waiting to be written to one writer before the relay drops that connection (a writer that stopped reading).
MAX_QUEUED_FRAMES = 10_000
#: A refused connection is logged at most once in this many seconds (with the count refused meanwhile).
REFUSAL_LOG_S = 60.0


class _Stalled(Exception):
    """A connection sent part of a frame (or no greeting) and nothing more for the frame timeout."""


class _Refused(Exception):
    """A frame the relay will not read (too large, or no room for it in time): its connection is closed."""


class _Budget:
    """Bytes of frames held by the relay, over every connection, up to a limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()

    def take(self, n: int, deadline: float) -> bool:
        """Reserve `n` bytes, waiting for room until `deadline`; False if there was none."""
        with self._cond:
            while self.used + n > self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


def _recv_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly `n` bytes from `sock` before `deadline` (_Stalled if they do not come; RelayClosedError at its end)."""
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while n:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise _Stalled()
        try:
            chunk = sock.recv(min(n, 1 << 20), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            continue
        if not chunk:
            raise relay_wire.RelayClosedError("the relay connection was closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class _Connection:
    """One writer process. A frame to it is written at once when the socket takes it whole without blocking
    (the usual case: no thread hand-off per reply); otherwise the rest, and every frame after it, goes through a
    queue and a thread of this connection, so a slow writer stalls only itself, never the reply reader or the
    delivery thread that serve every writer on the host."""

    def __init__(self, sock: socket.socket, on_close: Callable[[_Connection], None]) -> None:
        self.sock = sock
        #: Proposals of this writer whose answers it still takes (until it forgets them).
        self.pids: set[bytes] = set()
        #: Those not answered yet: a writer with none, in a commit loop, is about to propose again.
        self.unanswered: set[bytes] = set()
        self.last_proposed = float("-inf")
        self._out: queue.Queue[bytes | None] = queue.Queue()
        #: Frames (or their rest) handed to the writer thread and not yet written: while any is, later frames
        #: queue behind it, so the writer reads them in order.
        self._backlog = 0
        self._send_lock = threading.Lock()
        self._on_close = on_close
        self._closed = threading.Event()
        #: Started with the first frame the socket does not take at once: an idle writer costs no thread for it.
        self._writer: threading.Thread | None = None

    def send(self, head: dict[str, Any], body: bytes = b"") -> None:
        if self._closed.is_set():
            return
        frame = relay_wire.frame(head, body)
        rest: bytes | None = frame  # what is left to write: None once the writer process is gone
        with self._send_lock:
            if self._backlog == 0:
                try:
                    rest = frame[self.sock.send(frame, socket.MSG_DONTWAIT):]
                except (BlockingIOError, InterruptedError):
                    pass  # the socket's buffer is full: the writer thread waits for room
                except OSError:
                    rest = None
            if rest and self._backlog < MAX_QUEUED_FRAMES:
                self._backlog += 1
                self._out.put(rest)
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write, name="deltacoord-relay-out", daemon=True)
                    self._writer.start()
                return
        if rest == b"":
            return
        if rest is not None:
            log.warning("a writer stopped reading its relay connection (%d frames queued); closing it", MAX_QUEUED_FRAMES)
        self.close()

    @property
    def threads(self) -> int:
        """Threads this connection runs besides the one reading it (0 or 1)."""
        return 0 if self._writer is None else 1

    def _write(self) -> None:
        while True:
            data = self._out.get()
            if data is None:
                return
            try:
                self.sock.sendall(data)
            except OSError:
                self.close()
                return
            with self._send_lock:
                self._backlog -= 1

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._out.put(None)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._on_close(self)


@dataclass
class _Queued:
    """A proposal gathered for the next batch of Produce calls."""

    conn: _Connection
    pid: str
    partition: int
    key: bytes
    value: bytes
    headers: list[tuple[str, str | bytes | None]]
    reply_partition: int
    at: float
    #: Bytes of the relay's buffer budget the frame holds until produced.
    reserved: int = 0


def expected_soon(conns: Iterable[_Connection], now: float) -> int:
    """How many writers are likely to propose within moments: active ones with nothing in flight (a writer in a
    commit loop that just got its answer stages its next proposal)."""
    return sum(1 for c in conns if not c.unanswered and now - c.last_proposed < ACTIVE_S)


class _ForwardingReplies(ReplyPartitions):
    """The relay's reply partition: each record goes to the connection whose proposal it answers."""

    def __init__(self, conf: dict[str, Any], topic: str, group_id: str, num_partitions: int) -> None:
        self._owners: dict[bytes, _Connection] = {}
        super().__init__(conf, topic, group_id, num_partitions)

    def own(self, proposal_id: str, conn: _Connection) -> None:
        with self._lock:
            self._owners[proposal_id.encode()] = conn
            conn.pids.add(proposal_id.encode())
            conn.unanswered.add(proposal_id.encode())

    def waiting(self) -> int:
        """Proposals whose answers are still forwarded (each writer's forgotten ones leave with its next proposal)."""
        with self._lock:
            return len(self._owners)

    def disown(self, proposal_id: bytes, conn: _Connection) -> None:
        """`conn` no longer takes `proposal_id`'s answers (only its owner can end them: a writer forgetting another
        writer's proposal id changes nothing)."""
        with self._lock:
            if self._owners.get(proposal_id) is conn:
                del self._owners[proposal_id]
                self._pending.pop(proposal_id, None)
            conn.pids.discard(proposal_id)
            conn.unanswered.discard(proposal_id)

    def route(self, m: Any) -> None:
        pid = header(m, H_PROPOSAL_ID)
        with self._lock:
            self.counts.records += 1
            conn = self._owners.get(pid) if pid is not None else None
            if conn is None:
                if pid is None or pid not in self._ours:
                    self.counts.foreign += 1
                return
            conn.unanswered.discard(pid)  # a proposal gets one reply (the coordinator's notices)
        value = m.value()
        conn.send({"op": "reply", "headers": relay_wire.encode_headers(list(m.headers() or ())), "null": value is None},
                  value or b"")


class Relay:
    """Serve the writer processes of this host on a Unix socket (see the module's docstring)."""

    def __init__(self, socket_path: str, bootstrap_servers: str | None = None, *, topics: Topics | None = None,
                 topic_prefix: str | None = None, reply_group: str | None = None, socket_mode: int = 0o600,
                 limits: RelayLimits | None = None, **kafka_config: Any) -> None:
        self.path = socket_path
        self.limits = limits or RelayLimits()
        self._budget = _Budget(self.limits.max_buffered_bytes)
        #: Connections refused for `max_connections`, frames refused for `max_frame_bytes`, connections closed
        #: for want of buffer room or for stalling mid-frame (or before their greeting).
        self.refused_connections = 0
        self.refused_frames = 0
        self.buffer_full_closed = 0
        self.stalled_closed = 0
        self._last_refusal_log = float("-inf")
        self._refused_since_log = 0
        self.topics = client_settings.topics_of(topic_prefix, topics)
        self._conf = kafka_logs.kafka_config({"bootstrap.servers": client_settings.bootstrap_servers(bootstrap_servers),
                                              **kafka_config})
        servers = str(self._conf["bootstrap.servers"])
        self._producer = proposal_producer(self._conf)
        self.proposal_partitions = partition_count(self._producer, self.topics.proposals, servers, conf=self._conf)
        self.replies = _ForwardingReplies(self._conf, self.topics.replies,
                                          reply_group or f"deltacoord-writer-{self.topics.replies}",
                                          partition_count(self._producer, self.topics.replies, servers, conf=self._conf))
        self.proposals = 0
        #: Gathered batches produced (proposals / batches: how many writers' proposals travel together).
        self.batches = 0
        self._stop = threading.Event()
        self._conns: set[_Connection] = set()
        self._lock = threading.Lock()
        self._queued: list[_Queued] = []
        self._gathering = threading.Condition()
        self._server = self._listen(socket_path, socket_mode)
        self._inode = os.stat(socket_path).st_ino  # ours: removed on close only while it is still this socket
        self._threads = [threading.Thread(target=self._accept, name="deltacoord-relay-accept", daemon=True),
                         threading.Thread(target=self._deliver, name="deltacoord-relay-deliver", daemon=True),
                         threading.Thread(target=self._send, name="deltacoord-relay-send", daemon=True)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _listen(path: str, mode: int) -> socket.socket:
        if os.path.exists(path):
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                raise FileExistsError(f"{path} exists and is not a socket: choose another --socket path")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # left by a relay that is gone
            else:
                raise FileExistsError(f"a relay already answers at {path}: stop it first, or choose another --socket path")
            finally:
                probe.close()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~mode)  # created with `mode` from the start, never wider for a moment
        try:
            server.bind(path)
        finally:
            os.umask(old)
        server.listen(128)
        return server

    def serve_forever(self) -> None:
        """Serve until `close()` (from another thread or a signal handler)."""
        self._stop.wait()

    # -- connections -----------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._conns) >= self.limits.max_connections
            if full:
                self._refuse(sock)
                continue
            conn = _Connection(sock, self._closed)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="deltacoord-relay-in", daemon=True).start()

    def _refuse(self, sock: socket.socket) -> None:
        """Answer a connection over `max_connections` with a refusal in place of the greeting, and close it
        (from the accepting thread: the frame fits the socket's buffer, nothing waits for the writer)."""
        n = self.limits.max_connections
        self.refused_connections += 1
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_refusal_log >= REFUSAL_LOG_S:
            log.warning("refused %d writer connection(s): this relay serves at most %d at once (--max-connections)",
                        self._refused_since_log, n)
            self._last_refusal_log, self._refused_since_log = now, 0
        with contextlib.suppress(OSError):
            sock.send(relay_wire.frame({"op": "hello", "ok": False, "error": (
                f"the relay serves at most {n} connections at once and all are taken (--max-connections); "
                "try again later, or raise the relay's limit")}), socket.MSG_DONTWAIT)
            sock.shutdown(socket.SHUT_WR)
        sock.close()

    def stats(self) -> dict[str, int]:
        """The relay's gauges and counters (also in its `counts` answer): connections and their threads, bytes
        of frames held (now and at most), and what the limits refused or closed."""
        with self._lock:
            conns = list(self._conns)
        return {"connections": len(conns), "connection_threads": len(conns) + sum(c.threads for c in conns),
                "buffered_bytes": self._budget.used, "buffered_peak_bytes": self._budget.peak,
                "refused_connections": self.refused_connections, "refused_frames": self.refused_frames,
                "buffer_full_closed": self.buffer_full_closed, "stalled_closed": self.stalled_closed}

    def _receive(self, conn: _Connection, greeted: bool) -> tuple[dict[str, Any], bytes, int]:
        """The connection's next frame and the buffer bytes it holds (the caller gives them back). A greeted
        connection may wait for ever before a frame; once a frame starts (and for the greeting, from the
        connection's start) the whole frame must arrive within `frame_timeout_s`."""
        lim = self.limits
        first = b""
        if greeted:
            first = conn.sock.recv(relay_wire.LENGTHS_SIZE)
            if not first:
                raise relay_wire.RelayClosedError("the relay connection was closed")
        deadline = time.monotonic() + lim.frame_timeout_s
        prefix = first + _recv_by(conn.sock, relay_wire.LENGTHS_SIZE - len(first), deadline)
        head_len, body_len = relay_wire.lengths(prefix)
        size = head_len + body_len
        if size > lim.max_frame_bytes:
            self.refused_frames += 1
            log.warning("refused a writer's frame of %d bytes (over --max-frame-bytes %d) and closed its connection",
                        size, lim.max_frame_bytes)
            conn.send({"op": "error", "error": (
                f"a frame of {size} bytes is over this relay's limit of {lim.max_frame_bytes} bytes "
                "(--max-frame-bytes); nothing of it was produced and the connection is closed")})
            raise _Refused()
        if not self._budget.take(size, deadline):
            self.buffer_full_closed += 1
            log.warning("closed a writer connection: no room for its %d-byte frame within %.0fs (%d of %d buffered "
                        "bytes held, --max-buffered-bytes)", size, lim.frame_timeout_s, self._budget.used,
                        lim.max_buffered_bytes)
            conn.send({"op": "error", "error": (
                f"the relay's buffer ({lim.max_buffered_bytes} bytes, --max-buffered-bytes) had no room for a "
                f"{size}-byte frame for {lim.frame_timeout_s:.0f}s; nothing of it was produced")})
            raise _Refused()
        try:
            head = relay_wire.parse_head(_recv_by(conn.sock, head_len, deadline))
            body = _recv_by(conn.sock, body_len, deadline) if body_len else b""
        except BaseException:
            self._budget.give(size)
            raise
        return head, body, size

    def _closed(self, conn: _Connection) -> None:
        with self._lock:
            self._conns.discard(conn)
        for pid in list(conn.pids):
            self.replies.disown(pid, conn)

    def _serve(self, conn: _Connection) -> None:
        try:
            head, _, size = self._receive(conn, greeted=False)
            self._budget.give(size)
            if head.get("op") != "hello" or not self._greet(conn, head):
                return
            while True:
                head, body, size = self._receive(conn, greeted=True)
                try:
                    op = head.get("op")
                    if op == "propose":
                        self._forget(conn, head.get("forget"))
                        if self._propose(conn, head, body, size):
                            size = 0  # held until produced
                    elif op == "forget":  # `pid`: one id, as writers before batched forgets sent it
                        self._forget(conn, head.get("pids", [head["pid"]] if "pid" in head else None))
                    elif op == "counts":
                        c = self.replies.counts
                        conn.send({"op": "counts", "records": c.records, "foreign": c.foreign, "rx_bytes": c.rx_bytes,
                                   "proposals": self.proposals, "batches": self.batches,
                                   "waiting": self.replies.waiting(), **self.stats()})
                finally:
                    if size:
                        self._budget.give(size)
        except _Stalled:
            self.stalled_closed += 1
            log.warning("closed a writer connection that sent part of a frame (or no greeting) and then nothing for "
                        "%.0fs (--frame-timeout-seconds)", self.limits.frame_timeout_s)
            conn.send({"op": "error", "error": (
                f"the relay closed this connection: a frame was not complete within {self.limits.frame_timeout_s:.0f}s")})
        except _Refused:
            pass  # logged and answered where refused
        except Exception as e:  # whatever a writer sends ends its own connection, never the relay
            log.debug("relay connection ended: %s", e)
        finally:
            conn.close()

    def _forget(self, conn: _Connection, pids: Any) -> None:
        """Proposals the writer no longer waits for: their answers are not forwarded any more."""
        if pids is None:
            return
        if not isinstance(pids, list):
            raise ValueError(f"forget must list proposal ids, got {type(pids).__name__}")
        for pid in pids:
            self.replies.disown(str(pid).encode(), conn)

    def _greet(self, conn: _Connection, head: dict[str, Any]) -> bool:
        want = (head.get("proposals"), head.get("replies"))
        if want != (self.topics.proposals, self.topics.replies):
            conn.send({"op": "hello", "ok": False, "error": (
                f"this relay serves topics {self.topics.proposals} and {self.topics.replies}, the writer uses {want[0]} "
                f"and {want[1]}: run a relay per deployment, with the writers' topic prefix")})
            return False
        self.replies.wait_leased(5.0)  # the first writer after start: the relay's own reply partition
        leased = self.replies.leased()
        # `forget_pids`: this relay takes forgotten ids in propose frames and lists (writers tell older relays
        # one id per frame).
        conn.send({"op": "hello", "ok": True, "partitions": self.proposal_partitions,
                   "reply_partition": min(leased) if leased else -1, "forget_pids": True,
                   "max_frame": self.limits.max_frame_bytes})
        return True

    # -- proposals -------------------------------------------------------------------------------
    def _propose(self, conn: _Connection, head: dict[str, Any], body: bytes, reserved: int = 0) -> bool:
        """Queue a proposal for production; True when it was queued (it then holds `reserved` buffer bytes until
        produced), False when it was answered at once."""
        pid = str(head["pid"])
        partition = int(head["partition"])
        if head.get("topic") != self.topics.proposals or not 0 <= partition < self.proposal_partitions:
            conn.send({"op": "delivered", "pid": pid, "not_written": True, "error": (
                f"{head.get('topic')}[{partition}] is not a partition of {self.topics.proposals} "
                f"(0..{self.proposal_partitions - 1})")})
            return False
        given = relay_wire.decode_headers(head.get("headers"))
        wait_raw = next((v for k, v in given if k == H_WAIT), None)
        try:
            wait = check_wait((wait_raw or b"published").decode("ascii", errors="replace"))
        except ValueError as e:
            conn.send({"op": "delivered", "pid": pid, "not_written": True, "error": str(e)})
            return False
        pending = self.replies.expect(pid, wait)
        self.replies.own(pid, conn)
        headers: list[tuple[str, str | bytes | None]] = [(k, v) for k, v in given if k not in (H_REPLY_PARTITION, H_WAIT)]
        headers += pending.headers
        now = time.monotonic()
        conn.last_proposed = now
        with self._gathering:
            self._queued.append(_Queued(conn, pid, partition, str(head.get("key", "")).encode("latin-1"), body, headers,
                                        pending.reply_partition, now, reserved))
            self._gathering.notify()
        return True

    def _send(self) -> None:
        """Produce gathered proposals: at once when no other active writer is about to propose (one writer never
        waits), else once they all have or GATHER_S after the first (many writers: fewer, larger batches and
        Kafka transactions, where the two cores of a busy host go)."""
        while not self._stop.is_set():
            with self._gathering:
                while not self._queued:
                    if self._stop.is_set():
                        return
                    self._gathering.wait(0.1)
                while not self._stop.is_set():
                    left = self._queued[0].at + GATHER_S - time.monotonic()
                    with self._lock:
                        expected = expected_soon(self._conns, time.monotonic())
                    if left <= 0 or expected == 0:
                        break
                    self._gathering.wait(left)
                batch, self._queued = self._queued, []
            self.batches += 1
            for q in batch:
                try:
                    self._produce(q)
                finally:
                    self._budget.give(q.reserved)  # librdkafka holds its own copy now

    def _produce(self, q: _Queued) -> None:
        conn, pid, reply_partition = q.conn, q.pid, q.reply_partition

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                conn.send({"op": "delivered", "pid": pid, "reply_partition": reply_partition})
            else:
                self.replies.disown(pid.encode(), conn)
                conn.send({"op": "delivered", "pid": pid, "error": str(err), "not_written": err.code() in NOT_WRITTEN})

        try:
            self._producer.produce(self.topics.proposals, value=q.value, key=q.key, partition=q.partition,
                                   headers=q.headers, on_delivery=on_delivery)
        except Exception as e:  # refused before anything was sent (a full queue, a bad record)
            self.replies.disown(pid.encode(), conn)
            conn.send({"op": "delivered", "pid": pid, "not_written": True, "error": str(e)})
            return
        self.proposals += 1

    def _deliver(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)  # runs the delivery callbacks

    def close(self) -> None:
        """Stop serving: confirm what was produced, close every connection and remove the socket."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._gathering:
            self._gathering.notify_all()
        with contextlib.suppress(OSError):
            self._server.close()
        # At once, so new writers fail fast (or reach a new relay) instead of waiting on this one; never a
        # new relay's socket that took the path meanwhile.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        for t in self._threads:
            t.join(5)
        self._producer.flush(10)  # writers learn the delivery of what they handed over
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.close()
        self.replies.close()


def relay_counts(path: str, topics: Topics, timeout_s: float = 10.0) -> dict[str, int]:
    """What a running relay has done: reply records read (`records`, `foreign`), their bytes (`rx_bytes`, with the
    relay's `statistics.interval.ms` set) and proposals produced."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
        head = relay_wire.greet(sock, topics)
        if not head.get("ok"):
            raise RelayRefusedError(f"the relay at {path} refused: {head.get('error')}")
        relay_wire.send(sock, {"op": "counts"})
        while True:
            head, _ = relay_wire.receive(sock)
            if head.get("op") == "counts":
                return {k: int(v) for k, v in head.items() if k != "op"}
    finally:
        sock.close()
