"""The `deltacoord` command line."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from coordinator import jars
from coordinator.broker import BrokerError, LocalBroker


@click.group()
def main() -> None:
    """deltacoord: a commit coordinator for Delta Lake tables built on Apache Kafka."""


# -- jars -------------------------------------------------------------------
@main.group("jars")
def jars_group() -> None:
    """JVM jars resolved from Maven Central (Kafka broker, Delta Lake for Spark)."""


@jars_group.command("fetch")
@click.argument("which", type=click.Choice(["kafka", "delta", "all"]), default="all")
def jars_fetch(which: str) -> None:
    """Resolve jars with Maven into ~/.cache/deltacoord/jars (no-op when cached)."""
    names = ["kafka", "delta"] if which == "all" else [which]
    try:
        for name in names:
            js = jars.fetch(name)
            click.echo(f"{name}: {len(js.jars())} jars in {js.directory}")
    except jars.JarResolutionError as e:
        raise click.ClickException(str(e)) from e


@jars_group.command("path")
@click.argument("which", type=click.Choice(["kafka", "delta"]))
def jars_path(which: str) -> None:
    """Print the classpath of a jar set (fetching it if needed)."""
    click.echo(jars.classpath(which))


# -- broker -----------------------------------------------------------------
@main.group("broker")
@click.option("--home", type=click.Path(path_type=Path), default=None, help="Broker home (default ~/.cache/deltacoord/broker).")
@click.pass_context
def broker_group(ctx: click.Context, home: Path | None) -> None:
    """A local single-node Kafka broker (KRaft) for development and tests."""
    ctx.obj = LocalBroker(home)


@broker_group.command("start")
@click.option("--port", type=int, default=None, help="Client port (default 19092, or a free one if taken).")
@click.option("--fresh", is_flag=True, help="Wipe the broker's data directory first.")
@click.option("--timeout", type=float, default=120.0, show_default=True)
@click.pass_obj
def broker_start(broker: LocalBroker, port: int | None, fresh: bool, timeout: float) -> None:
    """Start the broker; a running broker is left alone and its address printed."""
    running = broker.status()
    if running is not None:
        click.echo(f"broker already running at {running.bootstrap_servers} (pid {running.pid})")
        return
    click.echo("starting local Kafka broker ...", err=True)
    try:
        info = broker.start(port=port, timeout_s=timeout, fresh=fresh)
    except (BrokerError, jars.JarResolutionError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"broker running at {info.bootstrap_servers} (pid {info.pid}, log {info.log_path})")


@broker_group.command("stop")
@click.pass_obj
def broker_stop(broker: LocalBroker) -> None:
    """Stop the broker and its JVM."""
    click.echo("broker stopped" if broker.stop() else "broker was not running")


@broker_group.command("status")
@click.pass_obj
def broker_status(broker: LocalBroker) -> None:
    """Print the broker's pid, address and log path as JSON; exit 1 if stopped."""
    info = broker.status()
    if info is None:
        click.echo(json.dumps({"running": False, "home": str(broker.home)}))
        sys.exit(1)
    click.echo(json.dumps({"running": True, **asdict(info)}))


if __name__ == "__main__":
    main()
