"""`deltacoord relay run`: the per-host relay for writer processes (see `writer.relay`)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import click

from coordinator.tooling.cli_options import kafka_options, parse_pairs, reach_kafka
from schemas import client_settings


def register(main: click.Group) -> None:
    @main.group("relay")
    def relay_group() -> None:
        """One Kafka producer and reply partition for every writer process on this host."""

    @relay_group.command("run")
    @click.option("--socket", "socket_path", envvar=client_settings.RELAY_ENV, required=True, metavar="PATH",
                  help=f"The Unix socket to serve (or {client_settings.RELAY_ENV}); writers set {client_settings.RELAY_ENV} "
                       "to the same path.")
    @click.option("--socket-mode", default="600", show_default=True, metavar="OCTAL",
                  help="Permissions of the socket: 600 lets only this user's writers connect, 660 also its group's.")
    @click.option("--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR.")
    @kafka_options
    def relay_run(socket_path: str, socket_mode: str, log_level: str, bootstrap_servers: str, topic_prefix: str,
                  kafka_pairs: tuple[str, ...]) -> None:
        """Serve this host's writer processes until SIGTERM or Ctrl-C.

        \b
        Example:
          deltacoord relay run --socket /run/deltacoord/relay.sock --bootstrap-servers kafka:9092

        then start the writers of this host with DELTACOORD_RELAY=/run/deltacoord/relay.sock
        (or relay= in Python).
        """
        from coordinator.logs import setup_logging
        from writer.relay import Relay

        try:
            mode = int(socket_mode, 8)
        except ValueError:
            mode = -1
        if not 0 < mode <= 0o777 or mode & 0o600 != 0o600:
            raise click.BadParameter(f"{socket_mode!r}: give octal permissions the relay's own user can use, e.g. 600 or 660",
                                     param_hint="--socket-mode")
        setup_logging(log_level)
        kafka: dict[str, Any] = parse_pairs(kafka_pairs, "--kafka")
        reach_kafka(bootstrap_servers, kafka)
        try:
            relay = Relay(socket_path, bootstrap_servers, topic_prefix=topic_prefix, socket_mode=mode, **kafka)
        except (FileExistsError, RuntimeError, OSError) as e:
            raise click.ClickException(str(e)) from e
        relay.replies.wait_leased(10)  # so the line below names the relay's reply partition
        done = threading.Event()

        def stop(_signum: int, _frame: Any) -> None:
            done.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        click.echo(f"relay serving {socket_path} for topics {relay.topics.proposals} and {relay.topics.replies} "
                   f"(reply partition {min(relay.replies.leased(), default=-1)})", err=True)
        try:
            while not done.wait(0.5):
                pass
        finally:
            relay.close()
