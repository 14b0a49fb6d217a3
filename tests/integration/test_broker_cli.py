"""`deltacoord broker start|status|stop` manages exactly one local broker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deltacoord.tooling.ports import free_port

pytestmark = pytest.mark.kafka  # each test starts brokers of its own


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltacoord.cli.main", "broker", "--home", str(home), *args],
        capture_output=True, text=True, timeout=180, env=os.environ.copy(),
    )


def _java_pids_for(home: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(home / "server.properties").encode() in cmd and b"kafka.Kafka" in cmd:
            pids.append(int(proc.name))
    return pids


def test_start_status_stop_twice_and_start_is_idempotent(tmp_path: Path) -> None:
    home = tmp_path / "broker"
    for _round in range(2):
        started = _cli(home, "start")
        assert started.returncode == 0, started.stderr
        status = _cli(home, "status")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["running"] is True and info["bootstrap_servers"].startswith("127.0.0.1:")
        assert Path(info["log_path"]).parent == home

        again = _cli(home, "start")
        assert again.returncode == 0 and "already running" in again.stdout
        assert _java_pids_for(home) == [info["pid"]], "a second start must not launch a second broker"

        stopped = _cli(home, "stop")
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        assert _java_pids_for(home) == []
        after = _cli(home, "status")
        assert after.returncode == 1 and json.loads(after.stdout)["running"] is False


def test_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = _cli(tmp_path / "b", "start", "--port", str(port))
    assert res.returncode != 0
    assert f"port {port}" in res.stderr and "already in use" in res.stderr


def test_start_waits_for_its_own_broker_not_any_broker_on_the_port(kafka_bootstrap: str, tmp_path: Path) -> None:
    # The chosen port was free when chosen; if another broker takes it first, our JVM fails to
    # bind while the other one answers. Readiness must check the cluster id formatted here.
    import subprocess as sp

    import pytest
    from confluent_kafka.admin import AdminClient

    from deltacoord.tooling.broker import BrokerError, BrokerInfo, LocalBroker

    real_id = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).cluster_id
    broker = LocalBroker(tmp_path / "b")
    broker.data_dir.mkdir(parents=True)
    port = kafka_bootstrap.rsplit(":", 1)[1]
    info = BrokerInfo(pid=0, port=int(port), controller_port=0, bootstrap_servers=kafka_bootstrap,
                      log_path=str(tmp_path / "b" / "server.log"), data_dir=str(broker.data_dir), home=str(tmp_path / "b"))
    stand_in = sp.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # our 'JVM', alive meanwhile
    try:
        (broker.data_dir / "meta.properties").write_text("node.id=1\ncluster.id=SomeOtherClusterIdAAAA\n")
        with pytest.raises(BrokerError, match="did not answer"):
            broker._wait_ready(info, stand_in, timeout_s=4)
        (broker.data_dir / "meta.properties").write_text(f"node.id=1\ncluster.id={real_id}\n")
        broker._wait_ready(info, stand_in, timeout_s=30)
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.mark.parametrize("asked", [False, True], ids=["any-port", "asked-port"])
def test_a_port_taken_between_choosing_and_binding_is_retried_on_other_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: bool) -> None:
    # Two sessions starting together both see the same ports free; the JVM that binds second must not die.
    # A port asked for is kept: only the controller's port, which nobody asked for, moves (CI saw the
    # controller's port taken under a broker started on a chosen port).
    from deltacoord.tooling import broker as broker_mod
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        monkeypatch.setattr(broker_mod.LocalBroker, "_choose_ports",
                            lambda self, port: (port or free_port(), held))
        b = broker_mod.LocalBroker(tmp_path / "broker")
        want = free_port() if asked else None
        try:
            info = b.start(port=want, timeout_s=120)
            assert info.controller_port != held and b.status() is not None
            assert want is None or info.port == want
            assert f"failed to bind to 127.0.0.1:{held}" in (tmp_path / "broker" / "server.log").read_text()
        finally:
            b.stop()


def test_a_broker_that_cannot_have_the_default_port_says_where_it_listens(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The docs export 127.0.0.1:19092; when something else holds it, the start says in one line where to point.
    from click.testing import CliRunner

    from deltacoord.cli.main import main
    from deltacoord.tooling import broker as broker_mod

    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        default = held.getsockname()[1]
        monkeypatch.setattr(broker_mod, "DEFAULT_PORT", default)
        result = CliRunner().invoke(main, ["broker", "--home", str(tmp_path / "b"), "start"])
        try:
            assert result.exit_code == 0, result.output
            info = broker_mod.LocalBroker(tmp_path / "b").status()
            assert info is not None and info.port != default
            assert (f"note: 127.0.0.1:{default} is held by another process, so this broker listens on "
                    f"{info.bootstrap_servers}: export DELTACOORD_BOOTSTRAP_SERVERS={info.bootstrap_servers}") in result.output
        finally:
            broker_mod.LocalBroker(tmp_path / "b").stop()
