"""`deltacoord relay run`: the per-host relay for writer processes (see `deltacoord.writer.relay`)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import click

from deltacoord.cli.options import kafka_options, parse_pairs, reach_kafka
from deltacoord.schemas import client_settings
from deltacoord.writer.relay_limits import RelayLimits

#: The relay's default limits (shown in --help).
_LIMITS = RelayLimits()


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
    @click.option("--max-frame-bytes", type=click.IntRange(min=1), default=_LIMITS.max_frame_bytes, show_default=True,
                  envvar="DELTACOORD_RELAY_MAX_FRAME_BYTES",
                  help="Largest frame (a proposal with its headers) read from a writer; a larger one is refused unread "
                       "and its connection closed (commits beyond the coordinator's proposal limit travel by reference).")
    @click.option("--max-buffered-bytes", type=click.IntRange(min=1), default=_LIMITS.max_buffered_bytes,
                  show_default=True, envvar="DELTACOORD_RELAY_MAX_BUFFERED_BYTES",
                  help="Bytes of frames held at once over every connection (being read or waiting to be produced); "
                       "a frame waits for room up to --frame-timeout-seconds, then its connection is closed.")
    @click.option("--max-connections", type=click.IntRange(min=1), default=_LIMITS.max_connections, show_default=True,
                  envvar="DELTACOORD_RELAY_MAX_CONNECTIONS",
                  help="Writer connections served at once; more are refused with an error the writer raises.")
    @click.option("--frame-timeout-seconds", type=click.FloatRange(min=0, min_open=True), default=_LIMITS.frame_timeout_s,
                  show_default=True, envvar="DELTACOORD_RELAY_FRAME_TIMEOUT_SECONDS",
                  help="A connection that sends no greeting, or part of a frame and then nothing, this long is closed.")
    @click.option("--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR.")
    @kafka_options
    def relay_run(socket_path: str, socket_mode: str, max_frame_bytes: int, max_buffered_bytes: int,
                  max_connections: int, frame_timeout_seconds: float, log_level: str, bootstrap_servers: str,
                  topic_prefix: str, kafka_pairs: tuple[str, ...]) -> None:
        """Serve this host's writer processes until SIGTERM or Ctrl-C.

        \b
        Example:
          deltacoord relay run --socket /run/deltacoord/relay.sock --bootstrap-servers kafka:9092

        then start the writers of this host with DELTACOORD_RELAY=/run/deltacoord/relay.sock
        (or relay= in Python).
        """
        from deltacoord.coordinator.json_logs import setup_logging
        from deltacoord.writer.relay import Relay

        try:
            limits = RelayLimits(max_frame_bytes=max_frame_bytes, max_buffered_bytes=max_buffered_bytes,
                                 max_connections=max_connections, frame_timeout_s=frame_timeout_seconds)
        except ValueError as e:
            raise click.UsageError(str(e)) from e

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
            relay = Relay(socket_path, bootstrap_servers, topic_prefix=topic_prefix, socket_mode=mode, limits=limits,
                          **kafka)
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
