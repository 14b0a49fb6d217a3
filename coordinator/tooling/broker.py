"""A local single-node Apache Kafka broker (KRaft) run from Maven Central jars, no Docker.

One combined broker+controller on 127.0.0.1 with the single-node settings that
transactions need. Its home (default `~/.cache/deltacoord/broker`) keeps the
data directory across restarts, the log and `broker.json` (pid, ports, log path).
The same class backs `deltacoord broker start|stop|status` and the test fixture.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from coordinator.tooling import jars

DEFAULT_PORT = 19092
KAFKA_HEAP = "-Xmx768m"
#: The local broker serves development, tests, the demo and the bench, and it is
#: often freshly started: C1 alone compiles its hot paths within seconds, where
#: C2 spends the first minutes of load compiling on the same two cores the
#: writers and the coordinator need. Override (or add) with DELTACOORD_BROKER_JAVA_OPTS.
LOCAL_JIT = "-XX:TieredStopAtLevel=1"

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class BrokerError(RuntimeError):
    """The local broker could not be started, found or stopped."""


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    port: int
    controller_port: int
    bootstrap_servers: str
    log_path: str
    data_dir: str
    home: str


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child counts as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def broker_command(java_bin: str, classpath: str, log4j: Path | str, config_path: Path | str) -> list[str]:
    """The broker's JVM command line; DELTACOORD_BROKER_JAVA_OPTS comes after the defaults, so it overrides them."""
    return [java_bin, "-Xms256m", KAFKA_HEAP, "-XX:+UseG1GC", LOCAL_JIT, "-Djava.awt.headless=true",
            *shlex.split(os.environ.get("DELTACOORD_BROKER_JAVA_OPTS", "")),
            f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, "kafka.Kafka", str(config_path)]


def server_properties(port: int, controller_port: int, data_dir: Path) -> str:
    """Single-node KRaft settings; internal topics at RF 1 so transactions work."""
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
auto.create.topics.enable=false
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1
default.replication.factor=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
message.max.bytes=8388608
"""


class LocalBroker:
    """Manage one local broker rooted at `home`."""

    def __init__(self, home: Path | None = None) -> None:
        env = os.environ.get("DELTACOORD_BROKER_HOME")
        self.home = (home or (Path(env) if env else jars.cache_home() / "broker")).resolve()
        self.state_file = self.home / "broker.json"
        self.data_dir = self.home / "data"
        self.log_path = self.home / "broker.log"
        self.config_path = self.home / "server.properties"

    # -- state ------------------------------------------------------------
    def _read_state(self) -> BrokerInfo | None:
        try:
            return BrokerInfo(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _owns(self, pid: int) -> bool:
        """True if pid is alive and is our JVM (guards against recycled pids)."""
        if not _pid_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            return False
        return str(self.config_path).encode() in cmdline

    def status(self) -> BrokerInfo | None:
        """The running broker's info, or None if it is not running."""
        info = self._read_state()
        if info is None or not self._owns(info.pid):
            return None
        return info

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- start / stop -------------------------------------------------------
    def _choose_ports(self, port: int | None) -> tuple[int, int]:
        previous = self._read_state()
        if port is not None:
            if not _port_free(port):
                raise BrokerError(f"port {port} on 127.0.0.1 is already in use; choose another with --port or stop what holds it")
            want = port
        elif previous is not None and _port_free(previous.port):
            want = previous.port
        elif _port_free(DEFAULT_PORT):
            want = DEFAULT_PORT
        else:
            want = _free_port()
        cport = previous.controller_port if previous is not None else want + 1
        if cport == want or not _port_free(cport):
            cport = _free_port()
        return want, cport

    def start(self, port: int | None = None, timeout_s: float = 120.0, fresh: bool = False) -> BrokerInfo:
        """Start the broker unless it runs already (then return its info)."""
        with self._lock():
            running = self.status()
            if running is not None:
                return running
            if fresh:
                shutil.rmtree(self.data_dir, ignore_errors=True)
            port, cport = self._choose_ports(port)
            cp = jars.classpath("kafka")
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(server_properties(port, cport, self.data_dir))
            log4j = self.home / "log4j2.properties"
            log4j.write_text(_LOG4J2.format(log=self.home / "server.log"))
            java = os.environ.get("JAVA_HOME", "")
            java_bin = str(Path(java) / "bin" / "java") if java else "java"
            if not (self.data_dir / "meta.properties").exists():
                cluster_id = _cluster_id()
                fmt = subprocess.run(
                    [java_bin, "-Xmx256m", "-cp", cp, f"-Dlog4j2.configurationFile={log4j}",
                     "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_path), "--ignore-formatted"],
                    capture_output=True, text=True,
                )
                if fmt.returncode != 0:
                    raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
            with open(self.log_path, "ab") as out:
                proc = subprocess.Popen(
                    broker_command(java_bin, cp, log4j, self.config_path),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                )
            info = BrokerInfo(
                pid=proc.pid, port=port, controller_port=cport, bootstrap_servers=f"127.0.0.1:{port}",
                log_path=str(self.home / "server.log"), data_dir=str(self.data_dir), home=str(self.home),
            )
            self.state_file.write_text(json.dumps(asdict(info), indent=2) + "\n")
            try:
                self._wait_ready(info, proc, timeout_s)
            except BaseException:
                self._terminate(proc.pid, 10.0)
                self.state_file.unlink(missing_ok=True)
                raise
            return info

    def _wait_ready(self, info: BrokerInfo, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": info.bootstrap_servers}, logger=_silent_logger())
        # Another broker may answer on this port (it was free when chosen): only ours counts.
        ours = self._formatted_cluster_id()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(f"the Kafka broker exited with code {proc.returncode}; last log lines:\n{self._log_tail()}")
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers and (ours is None or md.cluster_id == ours):
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise BrokerError(f"the Kafka broker did not answer on {info.bootstrap_servers} within {timeout_s:.0f}s; log:\n{self._log_tail()}")

    def _formatted_cluster_id(self) -> str | None:
        try:
            text = (self.data_dir / "meta.properties").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        return None

    def _log_tail(self, n: int = 40) -> str:
        lines: list[str] = []
        for p in (self.log_path, self.home / "server.log"):
            with contextlib.suppress(OSError):
                lines += p.read_text(errors="replace").splitlines()[-n:]
        return "\n".join(lines[-n:])

    @staticmethod
    def _terminate(pid: int, timeout_s: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _pid_alive(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker and its JVM; False if it was not running."""
        with self._lock():
            info = self.status()
            if info is None:
                return False
            self._terminate(info.pid, timeout_s)
            return True

    def kill(self) -> None:
        """SIGKILL the broker (fault injection); `start` restarts it on the same ports."""
        info = self.status()
        if info is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.pid, 0)


def _cluster_id() -> str:
    """A KRaft cluster id: 22 URL-safe base64 chars of a random UUID, never starting with '-'
    (the storage tool's argument parser would read such an id as an option; Kafka's own
    generator avoids it for the same reason)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _silent_logger() -> logging.Logger:
    lg = logging.getLogger("deltacoord.kafka.admin")
    lg.addHandler(logging.NullHandler())
    lg.propagate = False
    return lg
