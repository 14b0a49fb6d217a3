"""Kafka security for real: a broker with SASL_SSL (SCRAM-SHA-512, a generated local CA) and KRaft's
StandardAuthorizer refusing whatever no ACL allows, started by the project's own code
(`LocalBroker.start(secure=True)`). The administrator creates the topics and the SCRAM users and applies
the ACL plan (`deltacoord topics create`, `deltacoord broker user`, `deltacoord acls --apply`); then every
client connects as its own principal with nothing but the planned ACLs:

* the demo's flow works: create, concurrent appends, a real conflict, history, delta-rs reading every version;
* a writer principal cannot produce onto the commits or dead-letter topic nor take the coordinator's
  transactional id (the broker refuses; the table and the commits topic are unchanged);
* a change-feed reader reads the feed and cannot produce proposals;
* a relay principal proposes for the writers of a host;
* a wrong password, or a principal without ACLs, fails in seconds with one line naming the principal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from deltacoord.cli.main import main as cli_main
from deltacoord.coordinator.settings import KAFKA_ENV_PREFIX
from deltacoord.reader.stream import CommitStream
from deltacoord.schemas.errors import DeltaConcurrentModificationException, KafkaAccessDeniedError
from deltacoord.schemas.kafka_logs import KafkaCredentialsError
from deltacoord.schemas.routing import Topics
from deltacoord.tooling.broker import LocalBroker
from deltacoord.tooling.ports import free_port
from deltacoord.writer.table import Table
from tests.integration.coord_harness import GroupQuestions

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("amount", pa.int64())])
PASSWORDS = {"ingest": "ingest-pw", "ingest2": "ingest2-pw", "coord": "coord-pw", "feed": "feed-pw",
             "relay": "relay-pw", "nobody": "nobody-pw"}


@dataclass
class Secured:
    broker: LocalBroker
    bootstrap: str
    topics: Topics
    prefix: str
    tx_prefix: str
    group: str
    work: Path

    def conf(self, user: str, password: str | None = None) -> dict[str, str]:
        return self.broker.client_config(user, PASSWORDS[user] if password is None else password)

    def admin(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.broker.client_config()}

    def flags(self, user: str | None = None) -> list[str]:
        conf = self.broker.client_config() if user is None else self.conf(user)
        return [a for k, v in conf.items() for a in ("--kafka", f"{k}={v}")]

    def env(self, user: str) -> dict[str, str]:
        """The coordinator's settings as DELTACOORD_KAFKA_<KEY> variables (the coordinator's vocabulary)."""
        return {f"{KAFKA_ENV_PREFIX}{k.upper().replace('.', '_')}": v for k, v in self.conf(user).items()}


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli_main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    home = tmp_path_factory.mktemp("secured-broker")
    broker = LocalBroker(home)
    info = broker.start(port=free_port(), secure=True)
    try:
        prefix = f"s{uuid.uuid4().hex[:8]}"
        topics = Topics.with_prefix(prefix)
        s = Secured(broker, info.bootstrap_servers, topics, prefix, f"{prefix}-tx", f"{prefix}-coordinator",
                    tmp_path_factory.mktemp("secured-work"))
        assert json.loads(_cli("broker", "--home", str(home), "status"))["secured"] is True
        # The broker's settings hold the administrator's inter-broker login: the owner's alone.
        assert (home / "server.properties").stat().st_mode & 0o077 == 0
        for user, password in PASSWORDS.items():
            out = _cli("broker", "--home", str(home), "user", user, "--password", password)
            assert f"sasl.username={user}" in out and "security.protocol=SASL_SSL" in out, out
        _cli("topics", "create", "--bootstrap-servers", s.bootstrap, "--topic-prefix", prefix, "--partitions", "1",
             "--replication-factor", "1", "--reply-partitions", "4", "--allow-unsafe",
             *s.flags())
        out = _cli("acls", "--apply", "--bootstrap-servers", s.bootstrap, "--topic-prefix", prefix,
                   "--group-id", s.group, "--transactional-id-prefix", s.tx_prefix,
                   "--writer-principal", "User:ingest", "--writer-principal", "User:ingest2",
                   "--relay-principal", "User:relay", "--coordinator-principal", "User:coord",
                   "--reader-principal", "User:feed", *s.flags())
        assert out.startswith("applied "), out
        yield s
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def coordinator(secured: Secured) -> Iterator[subprocess.Popen[bytes]]:
    """`deltacoord coordinator run` as User:coord, its SASL settings from DELTACOORD_KAFKA_<KEY> variables."""
    s = secured
    log = s.work / "coordinator.log"
    cmd = [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", s.bootstrap,
           "--topic-prefix", s.prefix, "--group-id", s.group, "--transactional-id-prefix", s.tx_prefix, "--no-fsync"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **s.env("coord")})
    try:
        with GroupQuestions(s.admin()) as questions:
            deadline = time.monotonic() + 180
            members: list[list[tuple[str, int]]] = []
            while proc.poll() is None and time.monotonic() < deadline:
                members = questions.members(s.group)
                if members and all(members):
                    break
                time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert members and all(members), (f"the coordinator had not joined {s.group} with its partitions assigned "
                                          f"within 180 s (members: {members}):\n{log.read_text()[-3000:]}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        print(log.read_text()[-4000:])


def _table(s: Secured, path: Path, user: str = "ingest", password: str | None = None, **kw: Any) -> Table:
    return Table(path, s.bootstrap, topic_prefix=s.prefix, coordinator_group=s.group, writer_name=user,
                 **kw, **s.conf(user, password))


def _commits_end(s: Secured) -> int:
    c = Consumer({**s.admin(), "group.id": f"{s.prefix}-admin-check", "enable.auto.commit": False})
    try:
        return int(c.get_watermark_offsets(TopicPartition(s.topics.commits, 0), timeout=30)[1])
    finally:
        c.close()


def _refused(conf: dict[str, Any], topic: str, *, key: bytes = b"k", value: bytes = b"forged") -> KafkaError:
    """Produce one record as `conf`'s principal and return the broker's refusal (fails if it was accepted)."""
    results: list[KafkaError | None] = []
    p = Producer({**conf, "acks": "all", "message.timeout.ms": 20000})
    p.produce(topic, value, key, partition=0, on_delivery=lambda err, _m: results.append(err))
    p.flush(30)
    assert len(results) == 1 and results[0] is not None, f"the broker accepted a record on {topic}"
    return results[0]


def _rows(t: Table) -> int:
    return int(t.snapshot().to_pyarrow().num_rows)


def test_the_demo_flow_runs_with_only_the_planned_acls(secured: Secured, coordinator: subprocess.Popen[bytes]) -> None:
    from deltalake import DeltaTable

    from deltacoord.reader.snapshot import Snapshot

    s = secured
    path = s.work / "demo"
    table = _table(s, path)
    table.create(SCHEMA, partition_by=["date"], properties={"deltacoord.coalesce": "false"})  # a version per commit
    table.append(pa.table({"id": [0, 1, 2], "date": ["2024-01-01", "2024-01-02", "2024-01-03"], "amount": [10, 20, 30]}))

    errors: list[BaseException] = []

    def appends(user: str, w: int) -> None:
        try:
            with _table(s, path, user) as t:
                for i in range(4):
                    t.append(pa.table({"id": [100 * (w + 1) + i], "date": ["2024-01-02"], "amount": [i]}))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=appends, args=(user, w)) for w, user in enumerate(("ingest", "ingest2", "ingest"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors, errors
    assert _rows(table) == 3 + 12

    # A real conflict: an UPDATE and a DELETE of the same rows read the same snapshot; the second loses.
    snap = table.snapshot()
    won = table.update("date = '2024-01-01'", {"amount": "amount + 100"}, snapshot=snap)
    with pytest.raises(DeltaConcurrentModificationException):
        table.delete("date = '2024-01-01' AND id = 0", snapshot=snap)
    retried = table.delete("date = '2024-01-01' AND id = 0")
    assert retried.version == won.version + 1

    out = _cli("table", "history", str(path))
    assert "DELETE" in out and "UPDATE" in out and "CREATE TABLE" in out, out
    latest = Snapshot.load(table.uri).version
    assert latest == retried.version == 1 + 1 + 12 + 1
    for v in range(latest + 1):
        mine = Snapshot.load(table.uri, version=v).to_pyarrow().sort_by("id")
        theirs = DeltaTable(str(path), version=v).to_pyarrow_table().select(mine.column_names).sort_by("id")
        assert mine.cast(theirs.schema).equals(theirs), f"version {v}"
    table.close()


def test_a_writer_cannot_forge_decisions_take_the_coordinators_transactions_or_write_dead_letters(
        secured: Secured, coordinator: subprocess.Popen[bytes]) -> None:
    s = secured
    path = s.work / "forged"
    with _table(s, path) as t:
        t.create(SCHEMA)
        t.append(pa.table({"id": [1], "date": ["2024-01-01"], "amount": [1]}))
        version, log_files, end = t.snapshot().version, sorted(os.listdir(path / "_delta_log")), _commits_end(s)
        writer = {"bootstrap.servers": s.bootstrap, **s.conf("ingest")}

        # A forged "decision" onto the commits topic: refused by the authorizer.
        assert _refused(writer, s.topics.commits, key=t.table_id.encode()).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # A forged dead letter: refused too.
        assert _refused(writer, s.topics.dead_letters).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # The coordinator's transactional id (which would fence the coordinator of partition 0): refused.
        zombie = Producer({**writer, "transactional.id": f"{s.tx_prefix}-{s.topics.proposals}-0"})
        with pytest.raises(KafkaException) as e:
            zombie.init_transactions(30)
        assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

        # Nothing changed: no record on the commits topic, no new version, and the coordinator still serves.
        assert _commits_end(s) == end
        assert t.snapshot().version == version and sorted(os.listdir(path / "_delta_log")) == log_files
        assert coordinator.poll() is None
        assert t.append(pa.table({"id": [2], "date": ["2024-01-01"], "amount": [2]})).version == version + 1


def test_a_change_feed_reader_reads_the_feed_and_cannot_propose(secured: Secured,
                                                                coordinator: subprocess.Popen[bytes]) -> None:
    s = secured
    path = s.work / "feed"
    with _table(s, path) as t:
        t.create(SCHEMA)
        t.append(pa.table({"id": [1, 2], "date": ["2024-01-01"] * 2, "amount": [1, 2]}))
        proposals_end = t.snapshot().version
    feed = {"bootstrap.servers": s.bootstrap, **s.conf("feed")}
    with CommitStream(str(path), s.bootstrap, topic_prefix=s.prefix, **s.conf("feed")) as stream:
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while len(seen) < 1 and time.monotonic() < deadline:
            seen += [e.version for e in stream.poll(1.0)]
    assert seen == [proposals_end]
    assert _refused(feed, s.topics.proposals).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _refused(feed, s.topics.commits).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # As a writer, the reader principal fails at once with the line naming it and the missing grant.
    with pytest.raises(KafkaAccessDeniedError, match=r"refused User:feed (DESCRIBE|WRITE) on topic .*\.proposals"), \
            _table(s, path, "feed") as t:
        t.append(pa.table({"id": [3], "date": ["2024-01-01"], "amount": [3]}))


def test_a_relay_principal_proposes_for_the_writers_of_a_host(secured: Secured,
                                                              coordinator: subprocess.Popen[bytes]) -> None:
    s = secured
    sock = s.work / f"relay-{uuid.uuid4().hex[:6]}.sock"
    log = s.work / "relay.log"
    cmd = [sys.executable, "-m", "deltacoord.cli.main", "relay", "run", "--socket", str(sock),
           "--bootstrap-servers", s.bootstrap, "--topic-prefix", s.prefix, *s.flags("relay")]
    with open(log, "wb") as fh:
        relay = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not sock.exists() and relay.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock.exists(), log.read_text()
        path = s.work / "relayed"
        # The writer process itself holds no Kafka credentials: the relay's principal proposes.
        with Table(path, s.bootstrap, topic_prefix=s.prefix, coordinator_group=s.group, relay=str(sock)) as t:
            t.create(SCHEMA)
            assert t.append(pa.table({"id": [1], "date": ["2024-01-01"], "amount": [1]})).version == 1
    finally:
        relay.terminate()
        relay.wait(30)


def test_a_wrong_password_fails_in_seconds_with_one_line_naming_the_principal(secured: Secured) -> None:
    s = secured
    with pytest.raises(KafkaCredentialsError) as e, \
            _table(s, s.work / "wrong", "ingest", password="not-the-password", decision_timeout_s=120) as t:
        t.create(SCHEMA)
    line = str(e.value)
    assert "\n" not in line
    assert "refused the credentials of User:ingest" in line and "sasl.password" in line, line
    assert not (s.work / "wrong" / "_delta_log").exists()

    # The same from the command line: exit non-zero, one line on stderr, no traceback.
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    flags = [a for k, v in s.conf("ingest", "not-the-password").items() for a in ("--kafka", f"{k}={v}")]
    proc = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "table", "create", str(s.work / "wrong2"),
                           "--schema", "id:long", "--bootstrap-servers", s.bootstrap, "--topic-prefix", s.prefix, *flags],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "refused the credentials of User:ingest" in proc.stderr, proc.stderr


def test_a_tls_client_at_a_plaintext_listener_fails_with_one_tls_line(kafka_bootstrap: str) -> None:
    """A reset handshake counts as a refusal only once it persists; a PLAINTEXT listener resets every one."""
    from deltacoord.schemas.kafka_logs import probe

    with pytest.raises(KafkaCredentialsError) as e:
        probe({"bootstrap.servers": kafka_bootstrap, "security.protocol": "SSL"})
    line = str(e.value)
    assert "\n" not in line
    assert f"the TLS handshake with Kafka at {kafka_bootstrap} failed" in line and "security.protocol" in line, line


def test_a_principal_without_acls_fails_with_the_missing_grant(secured: Secured) -> None:
    s = secured
    with pytest.raises(KafkaAccessDeniedError) as e, _table(s, s.work / "nobody", "nobody") as t:
        t.create(SCHEMA)
    assert str(e.value).startswith(f"Kafka at {s.bootstrap} refused User:nobody DESCRIBE on topic {s.topics.proposals}")
    assert "deltacoord acls --apply --writer-principal User:nobody" in str(e.value)


@pytest.mark.parametrize("user, password, expected", [
    ("coord", "not-the-password", "refused the credentials of User:coord"),
    ("ingest", None, "refused User:ingest DESCRIBE on topic"),
])
def test_a_coordinator_without_its_credentials_or_acls_exits_with_one_line(
        secured: Secured, user: str, password: str | None, expected: str) -> None:
    s = secured
    env = {**os.environ, **{f"{KAFKA_ENV_PREFIX}{k.upper().replace('.', '_')}": v
                            for k, v in s.conf(user, password).items()}}
    proc = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run",
                           "--bootstrap-servers", s.bootstrap, "--topic-prefix", s.prefix, "--group-id", s.group,
                           "--transactional-id-prefix", s.tx_prefix, "--no-fsync", "--no-checkpoints"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr


def _secured_setup_block() -> str:
    """The bash block of docs/operations.md's "A secured local broker, end to end"."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text.split("### A secured local broker, end to end", 1)[1]
    return section.split("```bash\n", 1)[1].split("\n```", 1)[0]


def test_the_secured_setup_of_the_operations_guide_runs_as_written(tmp_path: Path) -> None:
    """Every command of the guide's block, in a fresh directory with its own broker home; the block's own
    checks (the health wait, the refused proposal of the reader) run with it, and its results are read here."""
    block = _secured_setup_block()
    home = tmp_path / "broker-home"
    env = {**os.environ, "DELTACOORD_BROKER_HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for k in [k for k in env if k.startswith(KAFKA_ENV_PREFIX) or k == "DELTACOORD_BOOTSTRAP_SERVERS"]:
        del env[k]
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        LocalBroker(home).stop()
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{(tmp_path / 'coordinator.log').read_text()[-3000:]}"
    assert "with SASL_SSL and ACLs" in proc.stdout
    assert "refused User:feed" in proc.stderr, proc.stderr
    versions = [json.loads(line)["version"] for line in (tmp_path / "feed.jsonl").read_text().splitlines()]
    assert versions == [0, 1]
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "sales")).to_pyarrow_table().to_pylist() == [{"id": 1, "amount": 10}]


@pytest.mark.spark
def test_the_spark_sink_writes_as_a_writer_principal(secured: Secured, coordinator: subprocess.Popen[bytes],
                                                     spark: Any) -> None:
    """`kafka.<key>` options carry the SASL_SSL settings to the sink's Kafka clients; a wrong password is refused
    before any data is staged, in the line that names the principal."""
    from deltalake import DeltaTable

    from deltacoord.writer import spark_sink

    s = secured
    spark_sink.register(spark)
    path = s.work / "spark"
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, value string")

    def options(password: str | None = None) -> dict[str, str]:
        return {"bootstrap.servers": s.bootstrap, "topic.prefix": s.prefix,
                **{f"kafka.{k}": v for k, v in s.conf("ingest", password).items()}}

    df.write.format("deltacoord").options(**options()).mode("append").save(str(path))
    df.write.format("deltacoord").options(**options()).mode("append").save(str(path))
    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == [1, 1, 2, 2]
    before = DeltaTable(str(path)).version()
    with pytest.raises(Exception, match="refused the credentials of User:ingest"):
        df.write.format("deltacoord").options(**options("not-the-password")).mode("append").save(str(path))
    assert DeltaTable(str(path)).version() == before
