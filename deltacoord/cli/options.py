"""Command-line pieces shared by the `deltacoord` subcommands: settings, `key=value` pairs, Kafka and storage options."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from deltacoord.coordinator import settings
from deltacoord.schemas import client_settings
from deltacoord.storage.table import StorageUriError, parse_table_uri

F = TypeVar("F", bound=Callable[..., Any])


def load_settings(config_file: Path | None, flags: Mapping[str, object] | None = None,
                  kafka_pairs: tuple[str, ...] = (), storage_pairs: tuple[str, ...] = ()) -> settings.RunSettings:
    """`deltacoord.coordinator.settings.load` (file, environment, flags), its errors as usage errors."""
    try:
        return settings.load(config_file, flags, kafka_pairs=kafka_pairs, storage_pairs=storage_pairs)
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
    f = click.option("--topic-prefix", envvar=client_settings.TOPIC_PREFIX_ENV,
                     default=client_settings.DEFAULT_TOPIC_PREFIX, show_default=True,
                     help=f"Topics are <prefix>.proposals/.commits/.deadletters (or {client_settings.TOPIC_PREFIX_ENV}).")(f)
    f = click.option("--bootstrap-servers", envvar=client_settings.BOOTSTRAP_SERVERS_ENV, required=True,
                     help=f"Kafka bootstrap servers (or {client_settings.BOOTSTRAP_SERVERS_ENV}).")(f)
    return f


def storage_options(f: F) -> F:
    """--storage-option KEY=VALUE (repeatable): the table's storage options, as delta-rs names them."""
    return click.option("--storage-option", "storage_pairs", multiple=True, metavar="KEY=VALUE",
                        help="Storage option for the table's store, as delta-rs names them (repeatable), e.g. "
                             "AWS_ENDPOINT_URL=http://127.0.0.1:9000; credentials also come from AWS_*, AZURE_*, "
                             "GOOGLE_* variables.")(f)


class TableLocationParam(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A table: a local directory or an object-store URI (s3://, s3a://, az://, abfss://, gs://).

    A local table that must exist is checked here (a usage error, exit 2); object stores are
    checked when the command reads them.
    """

    name = "table"

    def __init__(self, exists: bool = False) -> None:
        self.exists = exists

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        try:
            uri = parse_table_uri(text)
        except StorageUriError as e:
            self.fail(str(e), param, ctx)
        if uri.kind == "file":
            if os.path.exists(uri.path) and not os.path.isdir(uri.path):
                self.fail(f"{text!r} is a file, not a table directory", param, ctx)
            if self.exists and not os.path.isdir(uri.path):
                self.fail(f"Directory {text!r} does not exist.", param, ctx)
        return text


class KafkaUnreachable(click.ClickException):
    """No broker answered: a configuration problem (exit 2), said in one line."""

    exit_code = 2


def reach_kafka(bootstrap_servers: str, kafka: dict[str, Any]) -> None:
    """Fail fast (exit 2, one line) when no broker of `bootstrap_servers` answers."""
    from deltacoord.schemas.kafka_logs import UnreachableKafkaError, probe

    try:
        probe({**kafka, "bootstrap.servers": bootstrap_servers})
    except UnreachableKafkaError as e:
        raise KafkaUnreachable(str(e)) from None
