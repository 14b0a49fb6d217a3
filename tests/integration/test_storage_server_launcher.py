"""The local storage-server launcher: start/status/stop, restarts keep the data, clear install errors."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from deltacoord.storage.table import BucketNotFoundError, TableStorage
from deltacoord.tooling import storage_servers
from deltacoord.tooling.storage_servers import GcsServer, S3Server, StorageServerError

pytestmark = pytest.mark.storage


def test_start_status_stop_and_restart_keeps_the_data(tmp_path: Path) -> None:
    server = S3Server(home=tmp_path / "s3")
    assert server.status() is None
    info = server.start(die_with_parent=True)
    try:
        assert server.start() == info, "starting a running server returns it"
        assert server.status() == info
        state = json.loads((tmp_path / "s3" / "server.json").read_text())
        assert state["endpoint"] == info.endpoint == f"http://127.0.0.1:{info.port}"
        server.create_bucket("kept")
        TableStorage("s3://kept/t", info.storage_options).put("k", b"survives a restart")
        assert server.stop() is True
        assert server.status() is None
        assert server.stop() is False
        again = server.start(die_with_parent=True)
        assert again.pid != info.pid
        assert TableStorage("s3://kept/t", again.storage_options).get("k") == b"survives a restart"
    finally:
        server.stop()


def test_cli_reports_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "gcs"
    assert storage_servers.main(["status", "gcs", "--home", str(home)]) == 0
    assert "gcs: not running" in capsys.readouterr().out
    server = GcsServer(home=home)
    server.start(die_with_parent=True)
    try:
        assert storage_servers.main(["status", "gcs", "--home", str(home)]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["kind"] == "gcs" and shown["storage_options"]["google_allow_http"] == "true"
        assert storage_servers.main(["create-bucket", "gcs", "--home", str(home), "--bucket", "b1"]) == 0
        TableStorage("gs://b1/t", shown["storage_options"]).put("k", b"x")
    finally:
        assert storage_servers.main(["stop", "gcs", "--home", str(home)]) == 0
    assert "stopped" in capsys.readouterr().out


def test_missing_toolchain_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELTACOORD_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    with pytest.raises(StorageServerError, match=r"`go` is not on PATH; install Go"):
        S3Server(home=tmp_path / "s3").start()
    with pytest.raises(StorageServerError, match=r"`npm` is not on PATH"):
        storage_servers.install("azure")
    assert storage_servers.main(["start", "gcs", "--home", str(tmp_path / "gcs")]) == 1


@pytest.mark.parametrize("kind", ["s3", "azure", "gcs"])
def test_a_port_taken_before_the_server_binds_it_is_replaced(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = storage_servers.server(kind, tmp_path / kind)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        taken = holder.getsockname()[1]
        monkeypatch.setattr(server, "_choose_port", lambda port: taken)
        info = server.start(die_with_parent=True)
        try:
            assert info.port != taken
            assert server.status() == info
            assert "address already in use" in server.log_path.read_text().lower().replace("eaddrinuse", "address already in use")
        finally:
            server.stop()


def test_deltacoord_storage_start_status_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`deltacoord storage ...`: the servers behind the CLI, with the storage options to reach them."""
    from click.testing import CliRunner

    from deltacoord.cli.main import main

    monkeypatch.setenv("DELTACOORD_S3_SERVER_HOME", str(tmp_path / "s3"))
    runner = CliRunner()
    stopped = runner.invoke(main, ["storage", "status", "s3"])
    assert stopped.exit_code == 1 and json.loads(stopped.output)["running"] is False
    started = runner.invoke(main, ["storage", "start", "s3"])
    try:
        assert started.exit_code == 0, started.output
        info = json.loads(started.output.strip().splitlines()[-1])
        assert info["running"] is True and info["kind"] == "s3" and info["storage_options"]["aws_conditional_put"] == "etag"
        status = runner.invoke(main, ["storage", "status", "s3"])
        assert status.exit_code == 0 and json.loads(status.output)["pid"] == info["pid"]
        missing = TableStorage("s3://cli/t", info["storage_options"])
        with pytest.raises(BucketNotFoundError) as ei:  # a write to a bucket that does not exist says so
            missing.put("k", b"v")
        assert str(ei.value) == ("the bucket 'cli' of s3://cli/t does not exist: create it first (on the local servers: "
                                 "deltacoord storage create-bucket s3 cli)")
        with pytest.raises(BucketNotFoundError):
            missing.list()
        made = runner.invoke(main, ["storage", "create-bucket", "s3", "cli"])
        assert made.exit_code == 0 and json.loads(made.output) == {"kind": "s3", "bucket": "cli", "created": True}
        again = runner.invoke(main, ["storage", "create-bucket", "s3", "cli"])  # idempotent
        assert again.exit_code == 0 and json.loads(again.output)["created"] is False, again.output
        TableStorage("s3://cli/t", info["storage_options"]).put("k", b"v")
        assert [o.key for o in TableStorage("s3://cli/t", info["storage_options"]).list()] == ["k"]
    finally:
        stop = runner.invoke(main, ["storage", "stop", "s3"])
    assert stop.exit_code == 0 and "s3: stopped" in stop.output
    assert runner.invoke(main, ["storage", "status", "s3"]).exit_code == 1
    assert runner.invoke(main, ["storage", "start", "all", "--port", "1"]).exit_code == 2
    not_running = runner.invoke(main, ["storage", "create-bucket", "s3", "cli"])
    assert not_running.exit_code == 1 and "deltacoord storage start s3" in not_running.output
