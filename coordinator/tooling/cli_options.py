"""Command-line pieces shared by the `deltacoord` subcommands: settings, `key=value` pairs and Kafka options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from coordinator import settings

F = TypeVar("F", bound=Callable[..., Any])


def load_settings(config_file: Path | None, flags: Mapping[str, object] | None = None,
                  kafka_pairs: tuple[str, ...] = ()) -> settings.RunSettings:
    """`coordinator.settings.load` (file, environment, flags), its errors as usage errors."""
    try:
        return settings.load(config_file, flags, kafka_pairs=kafka_pairs)
    except settings.SettingsError as e:
        raise click.UsageError(str(e)) from e


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
