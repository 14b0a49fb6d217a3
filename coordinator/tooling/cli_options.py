"""Command-line pieces shared by the `deltacoord` subcommands: `key=value` pairs and Kafka options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def parse_pairs(values: tuple[str, ...], hint: str) -> dict[str, str]:
    """Repeated `key=value` options as a dict; a value without `=` is a usage error naming `hint`."""
    out: dict[str, str] = {}
    for pair in values:
        if "=" not in pair:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint=hint)
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return out


def kafka_options(f: F) -> F:
    """--bootstrap-servers, --topic-prefix and --kafka k=v for commands that talk to Kafka."""
    f = click.option("--kafka", "kafka_pairs", multiple=True, metavar="KEY=VALUE",
                     help="Extra Kafka client setting (repeatable), e.g. security.protocol=SSL.")(f)
    f = click.option("--topic-prefix", envvar="DELTACOORD_TOPIC_PREFIX", default="deltacoord", show_default=True,
                     help="Topics are <prefix>.proposals/.commits/.deadletters.")(f)
    f = click.option("--bootstrap-servers", envvar="DELTACOORD_BOOTSTRAP_SERVERS", required=True,
                     help="Kafka bootstrap servers (or DELTACOORD_BOOTSTRAP_SERVERS).")(f)
    return f
