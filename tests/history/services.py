"""The services a chaos run kills and brings back besides Kafka: the writers' relay and the S3 server.

* `RelayProcess`: `deltacoord relay run` on one Unix socket; `kill` SIGKILLs it
  (the socket file stays, as after a crash) and `start` serves the same socket
  again, so writers configured with it reconnect without being told.
* `StoreOutage`: the local S3 server (versitygw) holding the run's tables;
  `stop` ends it and `restart` starts it on the same port with the same data
  directory, so every client's endpoint is valid again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from deltacoord.schemas.routing import Topics
from deltacoord.tooling.storage_servers import S3Server, ServerInfo
from deltacoord.writer.relay import relay_counts


def relay_socket_path() -> str:
    """A fresh socket path short enough for a Unix socket (about 100 bytes at most)."""
    return f"/tmp/dc-chaos-relay-{uuid.uuid4().hex[:10]}.sock"


class RelayProcess:
    """A relay child process on a fixed socket path, killed and restarted on it."""

    def __init__(self, bootstrap: str, topics: Topics, socket_path: str, log: Path,
                 kafka: dict[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.socket_path = socket_path
        self.log = log
        self.kafka = dict(kafka or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout_s: float = 180.0) -> None:
        """Start the relay and return once it answers on its socket (a dead relay's socket file may remain)."""
        pairs = [a for k, v in self.kafka.items() for a in ("--kafka", f"{k}={v}")]
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "deltacoord.cli.main", "relay", "run", "--socket", self.socket_path,
                 "--bootstrap-servers", self.bootstrap, "--topic-prefix", self.topics.proposals.removesuffix(".proposals"),
                 *pairs], stdout=fh, stderr=subprocess.STDOUT)
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the relay exited {self.proc.returncode}; its log is {self.log}")
            try:
                relay_counts(self.socket_path, self.topics, timeout_s=5)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the relay did not answer on {self.socket_path} within {timeout_s:.0f}s; "
                                       f"its log is {self.log}") from None
                time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: proposals it has not confirmed have an unknown delivery, answers due come from the topic."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class StoreOutage:
    """The local S3 server of a run: stopped for an outage and restarted on the same port and data."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.info: ServerInfo = server.info()

    @property
    def data_dir(self) -> Path:
        """Where versitygw keeps each bucket as a directory of plain files (the run watches `_delta_log` there)."""
        return self.server.data_dir

    def stop(self) -> None:
        if not self.server.stop():
            raise RuntimeError(f"the local S3 server in {self.server.home} was not running when an outage began")

    def restart(self, timeout_s: float = 120.0) -> None:
        """Start again on the same port (clients keep their endpoint); waits out a port still being released."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                info = self.server.start(port=self.info.port, timeout_s=timeout_s, die_with_parent=True)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        if info.endpoint != self.info.endpoint:
            raise RuntimeError(f"the S3 server came back on {info.endpoint}, not {self.info.endpoint}")
        self.info = info
