"""`deltacoord verify TABLE`: check a table against the commits topic (see `deltacoord.coordinator.delta_log.verify`).

    deltacoord verify /data/events --bootstrap-servers kafka:9092 --topic-prefix prod

Prints one JSON report on stdout. Exit codes: 0 the table verifies, 1 it has
problems (listed in the report's `problems`), 2 bad arguments or no proposals
topic. TABLE is a local path or an object-store URI (with `--storage-option
KEY=VALUE`, or credentials from the environment). `--table-id` defaults to the
table's location as `deltacoord.writer.table.Table` names it (the absolute `file://` URI of
a local table, the normal form of an object-store URI) and `--num-partitions`
to the partition count of `<prefix>.proposals`.

`register(main)` adds the command to the main `deltacoord` group.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from deltacoord.cli.options import (
    kafka_options,
    load_settings,
    parse_pairs,
    reach_kafka,
    storage_options,
)
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import table_root
from deltacoord.storage.table import StorageUriError, parse_table_uri

EXIT_PROBLEMS = 1
EXIT_USAGE = 2


def proposals_partitions(settings: CoordinatorSettings, timeout_s: float = 30.0) -> int:
    """The partition count of the proposals topic (raises click.UsageError when it does not exist)."""
    from confluent_kafka.admin import AdminClient

    topic = settings.topics.proposals
    md = AdminClient(settings.client()).list_topics(topic, timeout=timeout_s)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        why = "" if t is None or t.error is None else f" ({t.error})"
        raise click.UsageError(f"proposals topic {topic} not found on {settings.bootstrap_servers}{why}; "
                               "check --topic-prefix or pass --num-partitions")
    return len(t.partitions)


def table_location(table: str) -> str:
    """The table's location as `deltacoord.writer.table.Table` names it: the absolute `file://` URI of a local
    directory, the normal form of an object-store URI."""
    try:
        uri = parse_table_uri(table)
    except StorageUriError as e:
        raise click.BadParameter(str(e), param_hint="TABLE") from e
    if uri.kind != "file":
        return str(uri)
    return Path(table_root(table)).resolve().as_uri()


@click.command("verify")
@click.argument("table")
@kafka_options
@click.option("--table-id", default=None, help="The table's id on the wire (default: its file:// URI).")
@click.option("--num-partitions", type=click.IntRange(min=1), default=None,
              help="Partitions of the proposals topic (default: read from the topic).")
@click.option("--allow-unpublished", is_flag=True,
              help="Do not report ratified versions missing at the end of _delta_log (a coordinator still publishing).")
@storage_options
def verify_cmd(table: str, bootstrap_servers: str, topic_prefix: str, table_id: str | None, num_partitions: int | None,
               allow_unpublished: bool, kafka_pairs: tuple[str, ...], storage_pairs: tuple[str, ...]) -> None:
    """Check TABLE's _delta_log, checkpoints and data files against the commits topic; print a JSON report.

    \b
    Example:
      deltacoord verify /data/sales --bootstrap-servers localhost:19092
    """
    from deltacoord.coordinator.delta_log.verify import verify_table

    uri = table_location(table)
    reach_kafka(bootstrap_servers, parse_pairs(kafka_pairs, "--kafka"))
    run = load_settings(None, {"bootstrap_servers": bootstrap_servers, "topic_prefix": topic_prefix}, kafka_pairs)
    settings = dataclasses.replace(run.coordinator, group_id=f"{topic_prefix}-verify")
    partitions = num_partitions if num_partitions is not None else proposals_partitions(settings)
    rep = verify_table(settings, uri, table_id or uri, partitions, require_published=not allow_unpublished,
                       storage_options=parse_pairs(storage_pairs, "--storage-option"))
    click.echo(json.dumps(rep.to_json(), indent=2, ensure_ascii=False))
    if not rep.ok:
        sys.exit(EXIT_PROBLEMS)


def register(main: click.Group) -> None:
    """Add `verify` to the `deltacoord` group."""
    main.add_command(verify_cmd)
