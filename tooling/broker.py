"""A local single-node Apache Kafka broker (KRaft) run from Maven Central jars, no Docker.

One combined broker+controller on 127.0.0.1 with the single-node settings that
transactions need. Its home (default `~/.cache/deltacoord/broker`) keeps the
data directory across restarts, the log and `broker.json` (pid, ports, log path).
The same class backs `deltacoord broker start|stop|status` and the test fixture.
`LocalCluster` runs N such nodes from the same launcher as one KRaft cluster
replicated like production (`deltacoord broker start --brokers 3`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.tooling import broker_security, jars, processes
from deltacoord.tooling.broker_security import BrokerSecurity
from deltacoord.tooling.ports import free_port, port_free

log = logging.getLogger(__name__)

DEFAULT_PORT = 19092
KAFKA_HEAP = "-Xmx768m"
KAFKA_HEAP_MIN = "-Xms256m"
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


#: How the JVM names a port it could not bind ("Socket server failed to bind to 127.0.0.1:42966: ...").
_BIND_FAILED = re.compile(r"failed to bind to [^\s:]+:(\d+)")


class BrokerError(DeltaCoordError, RuntimeError):
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


def broker_command(java_bin: str, classpath: str, log4j: Path | str, config_path: Path | str,
                   heap: tuple[str, str] = (KAFKA_HEAP_MIN, KAFKA_HEAP)) -> list[str]:
    """The broker's JVM command line; DELTACOORD_BROKER_JAVA_OPTS comes after the defaults, so it overrides them."""
    return [java_bin, *heap, "-XX:+UseG1GC", LOCAL_JIT, "-Djava.awt.headless=true",
            *shlex.split(os.environ.get("DELTACOORD_BROKER_JAVA_OPTS", "")),
            f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, "kafka.Kafka", str(config_path)]


def server_properties(port: int, controller_port: int, data_dir: Path, security: BrokerSecurity | None = None) -> str:
    """Single-node KRaft settings; internal topics at RF 1 so transactions work. With `security`, clients
    connect with SASL_SSL and the authorizer is on (`broker_security`)."""
    client = "SASL_SSL" if security is not None else "PLAINTEXT"
    controller = "SSL" if security is not None else "PLAINTEXT"
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners={client}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners={client}://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name={client}
listener.security.protocol.map=CONTROLLER:{controller},{client}:{client}
{security.properties([client]) if security is not None else ""}log.dirs={data_dir}
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
# Writers lease reply partitions through a consumer group (KIP-848): a lower heartbeat interval
# hands a partition to a new writer sooner.
group.consumer.heartbeat.interval.ms=500
group.consumer.min.heartbeat.interval.ms=500
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
        #: Set when the home is secured (`start(secure=True)` once; restarts keep it): SASL_SSL and ACLs.
        self.security: BrokerSecurity | None = broker_security.load(self.home)

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """Kafka settings (besides bootstrap.servers) of a client of this broker: none when it is not secured,
        else SASL_SSL as `user` (default: the administrator)."""
        if self.security is None:
            return {}
        if user is None:
            return self.security.admin_config()
        if password is None:
            raise BrokerError(f"the secured broker needs the password of user {user}")
        return self.security.client_config(user, password)

    # -- state ------------------------------------------------------------
    def status(self) -> BrokerInfo | None:
        """The running broker's info, or None if it is not running (its JVM's command line names this home's
        config)."""
        return processes.running(self.state_file, BrokerInfo, self.config_path)

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return processes.file_lock(self.home / ".lock")

    # -- start / stop -------------------------------------------------------
    def _choose_ports(self, port: int | None) -> tuple[int, int]:
        previous = processes.recorded(self.state_file, BrokerInfo)
        if port is not None:
            if not port_free(port):
                raise BrokerError(f"port {port} on 127.0.0.1 is already in use; choose another with --port or stop what holds it")
            want = port
        elif previous is not None and port_free(previous.port):
            want = previous.port
        elif port_free(DEFAULT_PORT):
            want = DEFAULT_PORT
        else:
            want = free_port()
        cport = previous.controller_port if previous is not None else want + 1
        if cport == want or not port_free(cport):
            cport = free_port()
        return want, cport

    def start(self, port: int | None = None, timeout_s: float = 120.0, fresh: bool = False,
              secure: bool = False) -> BrokerInfo:
        """Start the broker unless it runs already (then return its info). `secure` makes the home secured
        (SASL_SSL, a local CA, the authorizer: `broker_security`); a secured home stays so until `fresh`."""
        with self._lock():
            running = self.status()
            if running is not None:
                if secure and self.security is None:
                    raise BrokerError(f"the broker in {self.home} runs unsecured; stop it and start it with --fresh --secure")
                return running
            if fresh:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                shutil.rmtree(broker_security.security_dir(self.home), ignore_errors=True)
                self.security = None
            if secure:
                if self.security is None and (self.data_dir / "meta.properties").exists():
                    raise BrokerError(f"the broker in {self.home} was formatted unsecured; start it with --fresh --secure")
                self.security = broker_security.prepare(self.home)
            requested = port
            server_log = self.home / "server.log"
            port_, cport = self._choose_ports(requested)
            for attempt in range(3):
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self.config_path.write_text(server_properties(port_, cport, self.data_dir, self.security))
                log_start = server_log.stat().st_size if server_log.exists() else 0
                proc, info = self._launch(port_, cport)
                try:
                    self._await_ready(info, proc, timeout_s)
                    return info
                except BrokerError:
                    # Ports are chosen free, then bound seconds later by the JVM: another process may take one in
                    # between (two test sessions starting together). The port asked for is kept (its taker is
                    # named in the error); any other is replaced.
                    with open(server_log, "rb") as f:
                        f.seek(log_start)
                        taken = {int(p) for p in _BIND_FAILED.findall(f.read().decode(errors="replace"))}
                    if not taken or attempt == 2 or (requested is not None and requested in taken):
                        raise
                    log.info("port(s) %s of the broker were taken before it bound them; retrying on others",
                             sorted(taken))
                    port_ = port_ if requested is not None else free_port()
                    cport = free_port()
            raise AssertionError("unreachable")

    def _launch(self, port: int, cport: int, cluster_id: str | None = None,
                heap: tuple[str, str] = (KAFKA_HEAP_MIN, KAFKA_HEAP)) -> tuple[subprocess.Popen[bytes], BrokerInfo]:
        """Format the storage if new (with `cluster_id`, else a fresh id) and start the JVM on `config_path`."""
        cp = jars.classpath("kafka")
        if self.security is not None:
            os.chmod(self.config_path, 0o600)  # it holds the administrator's inter-broker login
        log4j = self.home / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.home / "server.log"))
        java = os.environ.get("JAVA_HOME", "")
        java_bin = str(Path(java) / "bin" / "java") if java else "java"
        if not (self.data_dir / "meta.properties").exists():
            fmt = subprocess.run(
                [java_bin, "-Xmx256m", "-cp", cp, f"-Dlog4j2.configurationFile={log4j}",
                 "kafka.tools.StorageTool", "format", "-t", cluster_id or _cluster_id(), "-c", str(self.config_path),
                 "--ignore-formatted", *(self.security.format_args() if self.security is not None else ())],
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        with open(self.log_path, "ab") as out:
            proc = subprocess.Popen(
                broker_command(java_bin, cp, log4j, self.config_path, heap=heap),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        info = BrokerInfo(
            pid=proc.pid, port=port, controller_port=cport, bootstrap_servers=f"127.0.0.1:{port}",
            log_path=str(self.home / "server.log"), data_dir=str(self.data_dir), home=str(self.home),
        )
        processes.record(self.state_file, info)
        return proc, info

    def _await_ready(self, info: BrokerInfo, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Wait until the broker answers; on failure stop its JVM and forget it."""
        try:
            self._wait_ready(info, proc, timeout_s)
        except BaseException:
            processes.terminate(proc.pid, 10.0)
            self.state_file.unlink(missing_ok=True)
            raise

    def _wait_ready(self, info: BrokerInfo, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": info.bootstrap_servers, **self.client_config()}, logger=_silent_logger())
        # Another broker may answer on this port (it was free when chosen): only ours counts.
        ours = self._formatted_cluster_id()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(f"the Kafka broker exited with code {proc.returncode}; last log lines:\n{self._log_tail()}")
            try:
                md = admin.list_topics(timeout=2)
                if self._answers(md) and (ours is None or md.cluster_id == ours):
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise BrokerError(f"the Kafka broker did not answer on {info.bootstrap_servers} within {timeout_s:.0f}s; log:\n{self._log_tail()}")

    def _answers(self, md: Any) -> bool:
        """Whether the metadata `md` this broker returned says it serves clients."""
        return bool(md.brokers)

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

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker and its JVM; False if it was not running."""
        with self._lock():
            info = self.status()
            if info is None:
                return False
            processes.terminate(info.pid, timeout_s)
            return True

    def kill(self) -> None:
        """SIGKILL the broker (fault injection); `start` restarts it on the same ports."""
        info = self.status()
        if info is not None:
            processes.kill(info.pid)


# -- a local cluster ---------------------------------------------------------------------------------
#: A cluster node's heap: three JVMs share the machine, and a test cluster holds little data.
CLUSTER_HEAP = ("-Xms128m", "-Xmx512m")
_ROUTE_NAME = re.compile(r"^[A-Z][A-Z0-9]{0,15}$")


def cluster_properties(node: NodeLayout, voters: str, data_dir: Path, security: BrokerSecurity | None = None) -> str:
    """A combined broker+controller of an N-node KRaft cluster, replicated like production:
    RF 3 (or N when smaller), min ISR RF - 1, unclean election off. Each route is one more
    listener (PLAINTEXT, or SASL_SSL with `security`) whose advertised port is a proxy in front of it
    (see `LocalCluster`)."""
    rf = min(3, voters.count("@"))
    isr = max(1, rf - 1)
    client = "SASL_SSL" if security is not None else "PLAINTEXT"
    listeners = [f"{client}://127.0.0.1:{node.port}", f"CONTROLLER://127.0.0.1:{node.controller_port}"]
    advertised = [f"{client}://127.0.0.1:{node.port}"]
    protocols = [f"CONTROLLER:{'SSL' if security is not None else 'PLAINTEXT'}", f"{client}:{client}"]
    for name, (listen, adv) in sorted(node.routes.items()):
        listeners.append(f"ROUTE{name}://127.0.0.1:{listen}")
        advertised.append(f"ROUTE{name}://127.0.0.1:{adv}")
        protocols.append(f"ROUTE{name}:{client}")
    secured = security.properties([client, *(f"ROUTE{n}" for n in sorted(node.routes))]) if security is not None else ""
    return f"""\
process.roles=broker,controller
node.id={node.node_id}
controller.quorum.voters={voters}
listeners={",".join(listeners)}
advertised.listeners={",".join(advertised)}
controller.listener.names=CONTROLLER
inter.broker.listener.name={client}
listener.security.protocol.map={",".join(protocols)}
{secured}log.dirs={data_dir}
num.partitions=1
auto.create.topics.enable=false
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
min.insync.replicas={isr}
default.replication.factor={rf}
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
# Writers lease reply partitions through a consumer group (KIP-848): a lower heartbeat interval
# hands a partition to a new writer sooner.
group.consumer.heartbeat.interval.ms=500
group.consumer.min.heartbeat.interval.ms=500
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
message.max.bytes=8388608
replica.fetch.max.bytes=8388608
"""


@dataclass(frozen=True)
class NodeLayout:
    """Where one node of a local cluster listens."""

    node_id: int
    port: int
    controller_port: int
    #: Route name -> (port the broker binds, port it advertises to clients that connect on that route).
    routes: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterLayout:
    """A local cluster's identity and ports, kept in `cluster.json` so nodes restart where they were."""

    cluster_id: str
    nodes: tuple[NodeLayout, ...]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)

    def route_bootstrap(self, name: str) -> str:
        """The bootstrap servers of a route: every node's advertised (proxy) port on it."""
        return ",".join(f"127.0.0.1:{n.routes[name][1]}" for n in self.nodes)

    def to_json(self) -> str:
        return json.dumps({"cluster_id": self.cluster_id, "nodes": [asdict(n) for n in self.nodes]}, indent=2) + "\n"

    @staticmethod
    def from_json(text: str) -> ClusterLayout:
        doc = json.loads(text)
        nodes = tuple(
            NodeLayout(int(n["node_id"]), int(n["port"]), int(n["controller_port"]),
                       {k: (int(v[0]), int(v[1])) for k, v in n.get("routes", {}).items()})
            for n in doc["nodes"]
        )
        return ClusterLayout(str(doc["cluster_id"]), nodes)


@dataclass(frozen=True)
class NodeStatus:
    node_id: int
    running: bool
    pid: int | None
    port: int
    log_path: str


@dataclass(frozen=True)
class ClusterInfo:
    cluster_id: str
    bootstrap_servers: str
    home: str
    nodes: tuple[NodeStatus, ...]

    @property
    def running(self) -> int:
        return sum(1 for n in self.nodes if n.running)


class _ClusterNode(LocalBroker):
    """One node of a `LocalCluster`: the launcher of `LocalBroker` with the cluster's config and id."""

    def __init__(self, home: Path, node_id: int, security: BrokerSecurity | None) -> None:
        super().__init__(home)
        self.node_id = node_id
        self.security = security

    def _answers(self, md: Any) -> bool:
        # Registered and unfenced: the node serves clients as part of the cluster.
        return self.node_id in md.brokers

    def launch(self, layout: ClusterLayout) -> tuple[subprocess.Popen[bytes], BrokerInfo]:
        node = next(n for n in layout.nodes if n.node_id == self.node_id)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        formatted = self._formatted_cluster_id()
        if formatted is not None and formatted != layout.cluster_id:
            raise BrokerError(f"{self.data_dir} belongs to cluster {formatted}, not {layout.cluster_id}; "
                              "start with --fresh to rebuild the cluster")
        self.config_path.write_text(cluster_properties(node, layout.voters, self.data_dir, self.security))
        return self._launch(node.port, node.controller_port, cluster_id=layout.cluster_id, heap=CLUSTER_HEAP)


class LocalCluster:
    """A local N-node KRaft cluster (every node broker and controller) from the same jars as `LocalBroker`.

    It lives in `home` (default: the broker home) as `cluster.json` plus one `node-<id>/` directory per
    node, each with its own data, log and `broker.json`, so a single broker and a cluster can share a
    home without sharing files. Nodes can be killed and restarted one by one (fault injection); a
    restarted node keeps its ports and data.

    A *route* is an extra listener on every node whose advertised address is a port the caller owns
    (a TCP proxy in front of the real listener): clients that bootstrap through a route's proxies only
    ever reach the brokers through them, so cutting the proxies cuts those clients off while everyone
    else keeps the brokers. Names are upper-case letters and digits.
    """

    def __init__(self, home: Path | None = None, brokers: int = 3, default_port: int | None = DEFAULT_PORT) -> None:
        """`default_port` is node 1's client port when free (tests pass None: free ports only)."""
        if brokers < 1:
            raise BrokerError(f"a cluster needs at least one broker, not {brokers}")
        env = os.environ.get("DELTACOORD_BROKER_HOME")
        self.home = (home or (Path(env) if env else jars.cache_home() / "broker")).resolve()
        self.brokers = brokers
        self.layout_file = self.home / "cluster.json"
        self.default_port = default_port
        #: Set when the cluster is secured (`start(secure=True)` once; restarts keep it), as `LocalBroker.security`.
        self.security: BrokerSecurity | None = broker_security.load(self.home)

    def node(self, node_id: int) -> _ClusterNode:
        return _ClusterNode(self.home / f"node-{node_id}", node_id, self.security)

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """As `LocalBroker.client_config`."""
        if self.security is None:
            return {}
        if user is None:
            return self.security.admin_config()
        if password is None:
            raise BrokerError(f"the secured cluster needs the password of user {user}")
        return self.security.client_config(user, password)

    def layout(self) -> ClusterLayout | None:
        try:
            return ClusterLayout.from_json(self.layout_file.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return processes.file_lock(self.home / ".cluster.lock")

    # -- state ----------------------------------------------------------------------------------------
    def status(self) -> ClusterInfo | None:
        """Every node's state, or None when no node of this cluster runs."""
        layout = self.layout()
        if layout is None:
            return None
        nodes = []
        for n in layout.nodes:
            node = self.node(n.node_id)
            info = node.status()
            nodes.append(NodeStatus(n.node_id, info is not None, info.pid if info else None, n.port,
                                    str(node.home / "server.log")))
        if not any(n.running for n in nodes):
            return None
        return ClusterInfo(layout.cluster_id, layout.bootstrap_servers, str(self.home), tuple(nodes))

    # -- start / stop -----------------------------------------------------------------------------------
    def _new_layout(self, previous: ClusterLayout | None, routes: Mapping[str, Sequence[int]]) -> ClusterLayout:
        """Ports for every node: the previous ones where still free, else free ones (node 1 prefers `default_port`)."""
        taken: set[int] = set(p for ports in routes.values() for p in ports)

        def pick(want: int | None) -> int:
            if want is not None and want not in taken and port_free(want):
                taken.add(want)
                return want
            while True:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    return port

        old = {n.node_id: n for n in previous.nodes} if previous is not None else {}
        nodes = []
        for node_id in range(1, self.brokers + 1):
            o = old.get(node_id)
            port = pick(o.port if o else (self.default_port if node_id == 1 else None))
            cport = pick(o.controller_port if o else None)
            node_routes = {name: (pick(o.routes[name][0] if o and name in o.routes else None), ports[node_id - 1])
                           for name, ports in routes.items()}
            nodes.append(NodeLayout(node_id, port, cport, node_routes))
        return ClusterLayout(previous.cluster_id if previous is not None else _cluster_id(), tuple(nodes))

    def start(self, timeout_s: float = 180.0, fresh: bool = False,
              routes: Mapping[str, Sequence[int]] | None = None, secure: bool = False) -> ClusterInfo:
        """Start every node that is not running (all of them the first time) and wait until each serves.

        `routes` maps a route name to the advertised port on each node, in node order; without it a
        restarted cluster keeps the routes it had.
        """
        for name, ports in (routes or {}).items():
            if not _ROUTE_NAME.match(name):
                raise BrokerError(f"route name {name!r} must be 1 to 16 upper-case letters or digits, starting with a letter")
            if len(ports) != self.brokers:
                raise BrokerError(f"route {name} needs {self.brokers} advertised ports (one per node), got {len(ports)}")
        with self._lock():
            single = LocalBroker(self.home).status()
            if single is not None:
                raise BrokerError(f"a single broker runs in {self.home} (pid {single.pid}); stop it first "
                                  "(deltacoord broker stop) or give the cluster another --home")
            if fresh:
                self._stop_nodes(30.0)
                for d in self.home.glob("node-*"):
                    shutil.rmtree(d, ignore_errors=True)
                self.layout_file.unlink(missing_ok=True)
                shutil.rmtree(broker_security.security_dir(self.home), ignore_errors=True)
                self.security = None
            if secure and self.security is None:
                if any((d / "data" / "meta.properties").exists() for d in self.home.glob("node-*")):
                    raise BrokerError(f"the cluster in {self.home} was formatted unsecured; start it with --fresh --secure")
                self.security = broker_security.prepare(self.home)
            layout = self.layout()
            if layout is not None and len(layout.nodes) != self.brokers:
                raise BrokerError(f"the cluster in {self.home} has {len(layout.nodes)} nodes, not {self.brokers}; "
                                  "start it with --fresh to rebuild it with a new size")
            running = {n.node_id for n in (layout.nodes if layout else ()) if self.node(n.node_id).status() is not None}
            if layout is None or (not running and (routes is not None or not self._ports_free(layout))):
                kept: dict[str, list[int]] = {} if layout is None else {
                    name: [n.routes[name][1] for n in layout.nodes] for name in layout.nodes[0].routes}
                layout = self._new_layout(layout, routes if routes is not None else kept)
            elif routes is not None and any(
                    {k: v[1] for k, v in n.routes.items()} != {k: ports[n.node_id - 1] for k, ports in routes.items()}
                    for n in layout.nodes):
                raise BrokerError("the cluster runs with other routes; stop it before starting it with new ones")
            self.layout_file.write_text(layout.to_json())
            started = []
            try:
                for n in layout.nodes:
                    if n.node_id not in running:
                        started.append((self.node(n.node_id), *self.node(n.node_id).launch(layout)))
                # A node serves only once a quorum of controllers runs: launch all, then wait for each.
                deadline = time.monotonic() + timeout_s
                for node, proc, binfo in started:
                    node._await_ready(binfo, proc, max(1.0, deadline - time.monotonic()))
            except BaseException:
                for node, proc, _info in started:
                    processes.terminate(proc.pid, 10.0)
                    node.state_file.unlink(missing_ok=True)
                raise
        info = self.status()
        if info is None:
            raise BrokerError(f"the cluster in {self.home} stopped right after it started; see its node logs")
        return info

    def _ports_free(self, layout: ClusterLayout) -> bool:
        return all(port_free(p) for n in layout.nodes
                   for p in (n.port, n.controller_port, *(r[0] for r in n.routes.values())))

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> BrokerInfo:
        """Restart one node (after `kill_node`) on its ports with its data; waits until it serves."""
        with self._lock():
            layout = self.layout()
            if layout is None:
                raise BrokerError(f"no cluster in {self.home}; start it first")
            node = self.node(node_id)
            running = node.status()
            if running is not None:
                return running
            proc, info = node.launch(layout)
            node._await_ready(info, proc, timeout_s)
            return info

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (fault injection); `start_node` brings it back."""
        self.node(node_id).kill()

    def kill(self) -> None:
        """SIGKILL every node; `start` restarts them on the same ports with the same data."""
        layout = self.layout()
        for n in layout.nodes if layout else ():
            self.node(n.node_id).kill()

    def stop(self, timeout_s: float = 60.0) -> bool:
        """Stop every node; False if none was running."""
        with self._lock():
            return self._stop_nodes(timeout_s)

    def _stop_nodes(self, timeout_s: float) -> bool:
        layout = self.layout()
        pids = [info.pid for n in (layout.nodes if layout else ()) if (info := self.node(n.node_id).status()) is not None]
        # SIGTERM all at once: stopping them one by one makes each later node wait for a controller
        # quorum that is going away.
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for pid in pids:
            processes.terminate(pid, max(0.1, deadline - time.monotonic()))
        return bool(pids)

    # -- what clients see -----------------------------------------------------------------------------
    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        layout = self.layout()
        if layout is None:
            raise BrokerError(f"no cluster in {self.home}")
        return AdminClient({"bootstrap.servers": layout.bootstrap_servers, **self.client_config()}, logger=_silent_logger())

    def leader(self, topic: str, partition: int = 0, timeout_s: float = 30.0) -> int:
        """The node id leading `topic`'s `partition` (waits while it has none)."""
        admin = self._admin()
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(Exception):
                md = admin.list_topics(topic, timeout=5)
                leader = int(md.topics[topic].partitions[partition].leader)
                if leader >= 0:
                    return leader
            if time.monotonic() > deadline:
                raise BrokerError(f"{topic}[{partition}] has no leader after {timeout_s:.0f}s")
            time.sleep(0.2)

    def under_replicated(self, timeout_s: float = 10.0) -> list[str]:
        """Partitions (every topic, internal ones too) whose in-sync replicas are fewer than their replicas."""
        md = self._admin().list_topics(timeout=timeout_s)
        return sorted(f"{name}[{pid}] isr={list(p.isrs)} replicas={list(p.replicas)}"
                      for name, t in md.topics.items() for pid, p in t.partitions.items()
                      if p.error is not None or len(p.isrs) < len(p.replicas))

    def wait_in_sync(self, timeout_s: float = 120.0) -> list[str]:
        """Wait until every replica is in sync; returns what is still under-replicated at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                lagging = self.under_replicated()
            except Exception as e:
                lagging = [f"metadata unavailable: {e}"]
            if not lagging or time.monotonic() > deadline:
                return lagging
            time.sleep(0.5)

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
