"""Retrying an unknown outcome with its proposal id can never commit twice; an interrupt leaves nothing behind.

An unknown outcome here is made the way it happens: the coordinator decided the
append and died (or froze) before recording the decision, so the writer hears
nothing; a new coordinator decides the proposal again and commits it. The retry
carries the same proposal id, which the coordinator decides once: it is answered
with the first commit, and the retry's own staged files are deleted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltacoord.cli.tables import register
from deltacoord.schemas.errors import CommitOutcomeUnknownError, NoCoordinatorError
from deltacoord.schemas.routing import Topics
from deltacoord.tooling.ports import free_port
from deltacoord.writer.table import Table
from tests.integration.coord_harness import (
    CoordinatorProcess,
    coordinator_thread,
    fresh_topics,
    start_coordinator_process,
)

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.int64())])
#: The CLI in a child that makes Ctrl-C raise KeyboardInterrupt itself (the disposition inherited at exec may be
#: "ignored" when a thread of the test process held SIGINT ignored at that instant).
CLI_CHILD = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); import click; "
             "from deltacoord.cli.tables import register; g = click.Group(); register(g); g()")


def _prefix(topics: Topics) -> str:
    return topics.proposals.removesuffix(".proposals")


def _ids(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())


def _orphans(path: Path) -> set[str]:
    """Parquet files no version references."""
    referenced = set()
    for f in (path / "_delta_log").glob("*.json"):
        for line in f.read_text().splitlines():
            add = json.loads(line).get("add")
            if add:
                referenced.add(unquote(add["path"]))
    files = {str(p.relative_to(path)) for p in path.rglob("*.parquet") if "_delta_log" not in p.parts}
    return files - referenced


def _wait_serving(t: Table, timeout_s: float = 120.0) -> None:
    """Until a coordinator (a child process still starting) holds the table's partition."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            t.client.ensure_coordinator(t.table_id)
            return
        except NoCoordinatorError:
            if time.monotonic() > deadline:
                raise


def _wait_stopped(pid: int, timeout_s: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until every thread of `pid` is stopped: a SIGSTOP stops a process only once one of its threads is
    scheduled and takes the signal, and until then the others run on (`proc`: fail at once if it exits)."""
    deadline = time.monotonic() + timeout_s
    while (states := _states(pid)) != {"T"}:
        assert proc is None or proc.poll() is None, f"process {pid} exited instead of stopping"
        assert time.monotonic() < deadline, f"process {pid} did not stop: its threads are {states}"
        time.sleep(0.01)


@pytest.fixture
def table(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[Topics, Path]]:
    """A table holding row 1, made by a coordinator that has stopped again."""
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        # Files of at most 1 MB of rows: a chunk of JSON lines is staged as it arrives (what a Ctrl-C must delete).
        t.create(SCHEMA, properties={"delta.targetFileSize": "1mb"})
        t.append(pa.table({"id": [1]}, schema=SCHEMA))
    yield topics, path


def _stop(proc: CoordinatorProcess) -> None:
    if proc.alive():
        proc.kill(signal.SIGKILL)


def test_a_retry_with_the_proposal_id_of_an_unknown_outcome_commits_once(kafka_bootstrap: str, tmp_path: Path,
                                                                           table: tuple[Topics, Path]) -> None:
    topics, path = table
    # This coordinator dies right after deciding its first batch, before recording anything in Kafka.
    dying = start_coordinator_process(kafka_bootstrap, topics, tmp_path, env={"DELTACOORD_FAULT": "after_decide:1"})
    try:
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=3) as t:
            _wait_serving(t)
            files = set(path.rglob("*.parquet"))
            with pytest.raises(CommitOutcomeUnknownError) as ei:
                t.append(pa.table({"id": [2]}, schema=SCHEMA))
        pid = ei.value.proposal_id
        assert dying.proc.wait(60) == -signal.SIGKILL
        text = str(ei.value)
        assert f"deltacoord table lookup {path} {pid}" in text and f"proposal_id={pid!r}" in text, text
        assert len(set(path.rglob("*.parquet")) - files) == 1, "an unknown outcome keeps its staged file"
    finally:
        _stop(dying)

    # A new coordinator decides the proposal again (it was never recorded) and commits it. The retry with the same
    # proposal id is answered with that commit, whenever it arrives; a plain re-run would have added row 2 twice.
    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path)
    try:
        with Table(path, kafka_bootstrap, topics=topics, decision_timeout_s=120) as t:
            again = t.append(pa.table({"id": [2]}, schema=SCHEMA), proposal_id=pid)
            assert again.proposal_id == pid and again.already_committed and again.version == 2, again
            assert t.lookup_decision(pid, timeout_s=30).version == 2  # type: ignore[union-attr]
            # Once more, for good measure: still the first commit, still once.
            assert t.append(pa.table({"id": [2]}, schema=SCHEMA), proposal_id=pid).version == 2
            assert t.append(pa.table({"id": [3]}, schema=SCHEMA)).version == 3
    finally:
        second.kill(signal.SIGTERM)
    assert _ids(path) == [1, 2, 3]
    assert _orphans(path) == set(), "the retries' own staged files are deleted (the first attempt's are committed)"


def test_ctrl_c_while_waiting_names_the_proposal_and_a_cli_retry_with_it_commits_once(
        kafka_bootstrap: str, tmp_path: Path, table: tuple[Topics, Path]) -> None:
    topics, path = table
    args = ["table", "append", str(path), "--json-rows", '[{"id": 2}]', "--topic-prefix", _prefix(topics)]
    # This coordinator freezes (SIGSTOP) right after deciding its first batch, before recording it.
    frozen = start_coordinator_process(kafka_bootstrap, topics, tmp_path, env={"DELTACOORD_FAULT": "after_decide:1:stop"})
    try:
        with Table(path, kafka_bootstrap, topics=topics) as t:
            _wait_serving(t)
        child = subprocess.Popen([sys.executable, "-c", CLI_CHILD, *args], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "DELTACOORD_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                      "PYTHONPATH": str(REPO)})
        try:
            _wait_stopped(frozen.proc.pid, 120, frozen.proc)  # the append is proposed and decided, not recorded: its writer waits
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        assert child.returncode == 3, (child.returncode, out, err)
        m = re.search(r"interrupted while waiting for the decision of proposal ([0-9a-f-]{36})", err)
        assert m is not None, err
        pid = m.group(1)
        assert re.search(rf"deltacoord table lookup {re.escape(str(path))} .*{pid}", err), err
        assert f"re-run the same command with --proposal-id {pid}" in err, err
        assert "Traceback" not in err and out == ""
    finally:
        _stop(frozen)

    second = start_coordinator_process(kafka_bootstrap, topics, tmp_path)
    try:
        cli = click.Group("deltacoord")
        register(cli)
        retry = CliRunner().invoke(cli, [*args, "--proposal-id", pid], env={"DELTACOORD_BOOTSTRAP_SERVERS": kafka_bootstrap})
        assert retry.exit_code == 0, retry.output
        result = json.loads(retry.stdout)
        assert result["proposalId"] == pid and result["version"] == 2 and result["alreadyCommitted"] is True, result
    finally:
        second.kill(signal.SIGTERM)
    assert _ids(path) == [1, 2]
    assert _orphans(path) == set()


def test_ctrl_c_before_anything_is_proposed_leaves_no_staged_file(kafka_bootstrap: str, tmp_path: Path,
                                                                  table: tuple[Topics, Path]) -> None:
    """The append streams JSON lines from stdin; interrupted after staging its first chunk, it deletes that file."""
    from deltacoord.cli.tables import JSON_CHUNK_ROWS

    topics, path = table
    before = set(path.rglob("*.parquet"))
    with coordinator_thread(kafka_bootstrap, topics):
        child = subprocess.Popen([sys.executable, "-c", CLI_CHILD, "table", "append", str(path), "--json-rows", "-",
                                  "--topic-prefix", _prefix(topics)],
                                 cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "DELTACOORD_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                                 "PYTHONPATH": str(REPO)})
        try:
            assert child.stdin is not None
            child.stdin.write("".join(f'{{"id": {i}}}\n' for i in range(100, 100 + JSON_CHUNK_ROWS)))
            child.stdin.flush()  # one whole chunk: staged as a file, then the child waits for more input
            deadline = time.monotonic() + 120
            while not set(path.rglob("*.parquet")) - before:
                assert child.poll() is None, child.communicate()
                assert time.monotonic() < deadline, "the first chunk was never staged"
                time.sleep(0.05)
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        assert child.returncode == 130, (child.returncode, out, err)
        assert "interrupted before anything was proposed" in err and "Traceback" not in err, err
        assert set(path.rglob("*.parquet")) == before, "the staged file is deleted"
        with Table(path, kafka_bootstrap, topics=topics) as t:
            assert t.append(pa.table({"id": [2]}, schema=SCHEMA)).version == 2  # nothing else was proposed
    assert _ids(path) == [1, 2]


def test_a_broker_that_freezes_after_the_proposal_went_out_gives_an_unknown_outcome_and_a_retry_commits_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that stops answering (SIGSTOP: a long GC pause, a frozen VM) while a proposal is being delivered:
    the writer cannot know whether it was written, so the call raises CommitOutcomeUnknownError with the proposal
    id, never a raw Kafka or timeout error. The producer keeps the proposal and delivers it once the broker is
    back; the retry with the id is answered with that commit, and the row is there once."""
    from deltacoord.tooling.broker import LocalBroker
    from deltacoord.writer import client as client_module

    broker = LocalBroker(tmp_path / "broker")
    info = broker.start(port=free_port())
    bootstrap = info.bootstrap_servers
    try:
        topics = fresh_topics(bootstrap)
        path = tmp_path / "t"
        with coordinator_thread(bootstrap, topics), Table(path, bootstrap, topics=topics, decision_timeout_s=5) as t:
            t.create(SCHEMA)
            t.append(pa.table({"id": [1]}, schema=SCHEMA))
            monkeypatch.setattr(client_module, "DELIVERY_WAIT_S", 3.0)
            # Proposed only once every thread is stopped: until then the broker serves on, at load 30 long enough
            # to answer a whole commit.
            os.kill(info.pid, signal.SIGSTOP)
            try:
                _wait_stopped(info.pid)
                with pytest.raises(CommitOutcomeUnknownError) as ei:
                    answered = t.append(pa.table({"id": [2]}, schema=SCHEMA))
                    pytest.fail(f"answered while the broker was frozen: {answered}; broker {info.pid} is "
                                f"{_states(info.pid)}, port {info.port} is served by {_listeners(info.port)}")
            finally:
                os.kill(info.pid, signal.SIGCONT)
            pid = ei.value.proposal_id
            # The broker froze before the proposal went out: its delivery is never confirmed, the outcome is
            # unknown, and said with the id.
            text = str(ei.value)
            assert "did not confirm its delivery" in text, text
            assert f"proposal_id={pid!r}" in text, text
            monkeypatch.setattr(client_module, "DELIVERY_WAIT_S", 30.0)
            t.decision_timeout_s = 120  # the coordinator recovers from the freeze first (its transaction timed out)
            again = t.append(pa.table({"id": [2]}, schema=SCHEMA), proposal_id=pid)
            assert again.proposal_id == pid and again.version == 2, again
            assert t.append(pa.table({"id": [3]}, schema=SCHEMA)).version == 3
        assert _ids(path) == [1, 2, 3]
    finally:
        if _alive(info.pid):
            os.kill(info.pid, signal.SIGCONT)
        broker.stop()


def _states(pid: int) -> set[str]:
    """The scheduler states of every thread of `pid` (`T`: stopped)."""
    states = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.add(stat.read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return states


def _listeners(port: int) -> list[int]:
    """The processes with a socket listening on 127.0.0.1:`port` (from /proc: who really serves it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # a JVM listens on an IPv6 socket
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
        except OSError:
            continue  # a process that ended or is not ours to read
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
