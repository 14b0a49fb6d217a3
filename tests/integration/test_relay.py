"""The per-host relay: writer processes commit through one Kafka producer and one reply partition.

What a writer sees must not change: a default commit is visible to delta-rs when it returns, each writer gets
only its own answers (the relay forwards each reply to the connection that proposed), and a relay that dies
loses nothing acknowledged: answers still due are found in the commits topic, and a restarted relay serves
the next commit. A writer pointed at no relay fails fast, before anything is proposed.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltacoord.schemas.errors import ProposalNotSentError
from deltacoord.schemas.routing import Topics
from deltacoord.writer import relay_wire
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.relay import Relay, relay_counts
from deltacoord.writer.relay_link import FORGET_BATCH, RelayLink, RelayUnavailableError
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.string())])


def _row(i: int) -> pa.Table:
    return pa.table({"id": [i], "value": [f"v{i}"]})


def _socket_path() -> str:
    # Unix socket paths are limited to about 100 bytes: pytest's tmp_path can be longer.
    return f"/tmp/dc-relay-test-{uuid.uuid4().hex[:10]}.sock"


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap)


@pytest.fixture
def relay(kafka_bootstrap: str, topics: Topics) -> Iterator[Relay]:
    r = Relay(_socket_path(), kafka_bootstrap, topics=topics)
    try:
        assert r.replies.wait_leased(60), "the relay leased no reply partition"
        yield r
    finally:
        r.close()


def test_writers_through_a_relay_see_their_commits_and_only_their_answers(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, relay: Relay, tmp_path: Path) -> None:
    uri = table_place.of(tmp_path / "t")
    tables = [Table(uri, kafka_bootstrap, topics=topics, storage_options=table_place.storage_options, relay=relay.path)
              for _ in range(3)]
    errors: list[BaseException] = []
    versions: list[list[int]] = [[] for _ in tables]

    def write(w: int) -> None:
        try:
            for i in range(8):
                r = tables[w].append(_row(w * 100 + i))
                # No sleep, no retry: the version is in _delta_log when append() returns.
                assert table_place.delta_table(uri).version() >= r.version
                versions[w].append(r.version)
        except BaseException as e:
            errors.append(e)

    try:
        with coordinator_thread(kafka_bootstrap, topics, **table_place.coordinator_settings):
            assert tables[0].client._producer is None  # no Kafka producer in a relayed writer
            assert tables[0].create(SCHEMA, properties={"deltacoord.coalesce": "false"}).version == 0
            threads = [threading.Thread(target=write, args=(w,)) for w in range(len(tables))]
            for th in threads:
                th.start()
            for th in threads:
                th.join(300)
        assert not errors, errors
        assert sorted(v for vs in versions for v in vs) == list(range(1, 25))
        assert table_place.delta_table(uri).to_pyarrow_table().num_rows == 24
        # Each connection was forwarded exactly its own answers: one per proposal (the create too for the first).
        for w, t in enumerate(tables):
            counts = t.client.reply_counts
            assert counts.foreign == 0
            assert counts.records == 8 + (1 if w == 0 else 0), (w, counts)
        seen = relay_counts(relay.path, topics)
        assert seen["proposals"] == 25 and seen["records"] == 25 and seen["foreign"] == 0, seen
        # A writer's forgotten proposals leave the relay with its next proposal: only each one's last is held.
        assert seen["waiting"] == len(tables), seen
        link = tables[0].client._link()
        for i in range(FORGET_BATCH - 1):  # ... or once FORGET_BATCH wait, without a proposal
            link.forget(f"never-proposed-{i}")
        deadline = time.monotonic() + 30
        while relay_counts(relay.path, topics)["waiting"] != len(tables) - 1:
            assert time.monotonic() < deadline, relay_counts(relay.path, topics)
            time.sleep(0.05)
    finally:
        for t in tables:
            t.close()


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
def test_a_writer_pointed_at_no_relay_fails_before_proposing(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, tmp_path: Path) -> None:
    path = _socket_path()
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics, relay=path)
    try:
        with pytest.raises(RelayUnavailableError) as ei:
            t.create(SCHEMA)
        assert isinstance(ei.value, ProposalNotSentError)  # nothing was sent: safe to retry
        assert path in str(ei.value) and "deltacoord relay run" in str(ei.value)
        assert not (tmp_path / "t" / "_delta_log").exists()
    finally:
        t.close()


def test_a_relay_refuses_writers_of_other_topics_and_a_second_relay_on_its_socket(
        kafka_bootstrap: str, relay: Relay) -> None:
    other = Topics.with_prefix("someone-else")
    with pytest.raises(RelayUnavailableError, match="topic prefix"):
        CoordinatorClient(kafka_bootstrap, topics=other, relay=relay.path).partition_of("x")
    with pytest.raises(FileExistsError, match="already answers"):
        Relay(relay.path, kafka_bootstrap, topics=relay.topics)
    assert os.stat(relay.path).st_mode & 0o777 == 0o600  # by default only the relay's user may connect
    shared = Relay(_socket_path(), kafka_bootstrap, topics=relay.topics, socket_mode=0o660)
    try:
        assert os.stat(shared.path).st_mode & 0o777 == 0o660  # and its group's writers
    finally:
        shared.close()
    assert not os.path.exists(shared.path)


def _start_relay_process(bootstrap: str, topics: Topics, path: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltacoord.cli.main", "relay", "run", "--socket", path, "--bootstrap-servers",
             bootstrap, "--topic-prefix", topics.proposals.removesuffix(".proposals")], stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while True:  # until it answers (a dead relay's socket file may still be there)
        assert proc.poll() is None, f"the relay exited {proc.returncode}: {log.read_text()}"
        try:
            relay_counts(path, topics)
            return proc
        except OSError:
            assert time.monotonic() < deadline, f"the relay did not answer on its socket within 180 s: {log.read_text()}"
            time.sleep(0.05)


@pytest.mark.parametrize("table_place", ["local"], indirect=True)
@pytest.mark.slow
def test_a_killed_relay_loses_no_commit_and_a_restarted_one_serves_the_next(
        kafka_bootstrap: str, topics: Topics, table_place: TablePlace, tmp_path: Path) -> None:
    """The relay is SIGKILLed after confirming a proposal that no coordinator has decided yet: its answer can
    no longer come through the relay, so the writer finds the decision in the commits topic; a new relay on the
    same socket (the dead one's file is still there) serves the next commit."""
    path, log = _socket_path(), tmp_path / "relay.log"
    proc = _start_relay_process(kafka_bootstrap, topics, path, log)
    t = Table(tmp_path / "t", kafka_bootstrap, topics=topics, relay=path, coordinator_check=False)
    try:
        with coordinator_thread(kafka_bootstrap, topics):
            assert t.create(SCHEMA).version == 0
        # No coordinator now: the proposal is confirmed by the broker and waits, undecided.
        result: dict[str, object] = {}

        def commit() -> None:
            try:
                result["r"] = t.append(_row(1))
            except BaseException as e:
                result["e"] = e

        th = threading.Thread(target=commit)
        th.start()
        link = t.client._replies_
        assert isinstance(link, RelayLink)
        deadline = time.monotonic() + 30
        while not any(p.produced_at for p in list(link._pending.values())):  # its delivery confirmed by the relay
            assert time.monotonic() < deadline, "the relay never confirmed the second proposal"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert os.path.exists(path)  # a dead relay leaves its socket file
        with coordinator_thread(kafka_bootstrap, topics):
            th.join(120)
            assert not th.is_alive()
            assert "e" not in result, result.get("e")
            assert getattr(result["r"], "version", None) == 1
            assert DeltaTable(str(tmp_path / "t")).version() == 1
            proc = _start_relay_process(kafka_bootstrap, topics, path, log)
            assert t.append(_row(2)).version == 2  # through a new connection to the new relay
            assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().num_rows == 2
    finally:
        t.close()
        proc.terminate()
        proc.wait(30)
    assert not os.path.exists(path)  # a relay that stops removes its socket


def test_what_a_writer_sends_harms_only_its_own_connection(relay: Relay) -> None:
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(relay.path)
        return s

    bad = connect()
    bad.sendall(struct.pack(">II", 5, 0) + b"{nope")  # not a frame's JSON head
    assert bad.recv(1) == b"", "the relay keeps a connection that sent garbage"
    bad.close()
    odd = connect()
    relay_wire.send(odd, {"op": "hello", "proposals": relay.topics.proposals, "replies": relay.topics.replies})
    assert relay_wire.receive(odd)[0]["ok"] is True
    # A proposal for a partition the topic does not have is refused, not produced.
    relay_wire.send(odd, {"op": "propose", "pid": "x", "topic": relay.topics.proposals, "partition": 10**6,
                          "key": "k", "headers": []}, b"value")
    head, _ = relay_wire.receive(odd)
    assert head["op"] == "delivered" and head["not_written"] is True and "not a partition" in head["error"]
    # Nonsense fields end that connection only.
    relay_wire.send(odd, {"op": "propose", "pid": "y", "partition": {"a": 1}})
    assert odd.recv(1) == b""
    odd.close()
    # So does a forget that lists no ids (a forget of ids the relay never saw is nothing).
    for forget in ({"op": "forget", "pids": ["never-seen"]}, {"op": "forget", "pid": "never-seen"}):
        quiet = connect()
        assert relay_wire.greet(quiet, relay.topics)["ok"] is True
        relay_wire.send(quiet, forget)
        relay_wire.send(quiet, {"op": "counts"})
        assert relay_wire.receive(quiet)[0]["op"] == "counts"
        quiet.close()
    odd = connect()
    assert relay_wire.greet(odd, relay.topics)["ok"] is True
    relay_wire.send(odd, {"op": "forget", "pids": 5})
    assert odd.recv(1) == b""
    odd.close()
    assert relay_counts(relay.path, relay.topics)["proposals"] == 0  # still serving, nothing produced


def test_a_writer_cannot_forget_another_writers_proposal(relay: Relay) -> None:
    """Only the connection that proposed can end the relay's wait for the answers: a forget naming another
    writer's proposal id (batched or not) leaves that writer's answers on their way to it."""
    def greeted() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(relay.path)
        assert relay_wire.greet(s, relay.topics)["ok"] is True
        return s

    victim, other = greeted(), greeted()
    try:
        relay_wire.send(victim, {"op": "propose", "pid": "victims-proposal", "topic": relay.topics.proposals,
                                 "partition": 0, "key": "t", "headers": []}, b"value")
        head, _ = relay_wire.receive(victim)
        assert head["op"] == "delivered" and "error" not in head, head
        relay_wire.send(other, {"op": "forget", "pids": ["victims-proposal"]})
        relay_wire.send(other, {"op": "forget", "pid": "victims-proposal"})
        relay_wire.send(other, {"op": "counts"})
        assert relay_wire.receive(other)[0]["waiting"] == 1  # the other's frames were all handled
        assert b"victims-proposal" in relay.replies._pending, "another writer's forget dropped the victim's wait"
        relay_wire.send(victim, {"op": "forget", "pids": ["victims-proposal"]})
        relay_wire.send(victim, {"op": "counts"})
        assert relay_wire.receive(victim)[0]["waiting"] == 0
        assert b"victims-proposal" not in relay.replies._pending
    finally:
        victim.close()
        other.close()

