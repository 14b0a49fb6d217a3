"""`deltacoord acls`: print the kafka-acls.sh commands of a deployment (the plan is `coordinator.kafka.acls`)."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from coordinator.kafka.acls import (
    DEFAULT_READER_GROUP_PREFIXES,
    DEFAULT_WRITER_GROUP_PREFIXES,
    AclPlanError,
    AclRequest,
    plan_acls,
    render_commands,
)


def register(main: click.Group) -> None:
    """Add `deltacoord acls` to the CLI group."""

    @main.command("acls")
    @click.option("--writer-principal", "writers", multiple=True, help="Writer principal, e.g. User:writer (repeatable).")
    @click.option("--coordinator-principal", "coordinators", multiple=True, help="Coordinator principal (repeatable).")
    @click.option("--reader-principal", "readers", multiple=True, help="Change-feed reader principal (repeatable, optional).")
    @click.option("--topic-prefix", default="deltacoord", show_default=True, envvar="DELTACOORD_TOPIC_PREFIX",
                  help="Topics are <prefix>.proposals/.commits/.deadletters (or DELTACOORD_TOPIC_PREFIX).")
    @click.option("--group-id", default=None, envvar="DELTACOORD_GROUP_ID", help="Coordinator group (default <prefix>-coordinator).")
    @click.option("--transactional-id-prefix", default=None, envvar="DELTACOORD_TRANSACTIONAL_ID_PREFIX",
                  help="Coordinator transactional-id prefix (default <prefix>-coordinator).")
    @click.option("--writer-group-prefix", "writer_group_prefixes", multiple=True,
                  help=f"Consumer-group prefix writers use (repeatable; default {', '.join(DEFAULT_WRITER_GROUP_PREFIXES)}).")
    @click.option("--reader-group-prefix", "reader_group_prefixes", multiple=True,
                  help=f"Consumer-group prefix readers use (repeatable; default {', '.join(DEFAULT_READER_GROUP_PREFIXES)}).")
    @click.option("--idempotent-write-acl", is_flag=True,
                  help="Also grant IDEMPOTENT_WRITE on the cluster (only brokers older than Kafka 3.0 need it).")
    @click.option("--bootstrap-servers", "bootstrap_servers", default="localhost:9092", show_default=True,
                  envvar="DELTACOORD_BOOTSTRAP_SERVERS",
                  help="Written into the commands (or DELTACOORD_BOOTSTRAP_SERVERS); the admin running them needs ALTER "
                       "on the cluster.")
    @click.option("--bootstrap-server", "bootstrap_server", default=None, hidden=True,
                  help="Old spelling of --bootstrap-servers.")
    @click.option("--command-config", default=None, help="Admin client properties file passed to kafka-acls.sh.")
    @click.option("--kafka-acls", "executable", default="kafka-acls.sh", show_default=True, help="Path of kafka-acls.sh.")
    @click.option("--format", "fmt", type=click.Choice(["commands", "json"]), default="commands", show_default=True,
                  help="Shell commands for kafka-acls.sh, or the ACL entries as JSON.")
    def acls_cmd(writers: tuple[str, ...], coordinators: tuple[str, ...], readers: tuple[str, ...], topic_prefix: str,
                 group_id: str | None, transactional_id_prefix: str | None, writer_group_prefixes: tuple[str, ...],
                 reader_group_prefixes: tuple[str, ...], idempotent_write_acl: bool, bootstrap_servers: str,
                 bootstrap_server: str | None, command_config: str | None, executable: str, fmt: str) -> None:
        """Print the kafka-acls.sh commands granting writers and coordinators exactly what they need.

        \b
        Example:
          deltacoord acls --writer-principal User:ingest --coordinator-principal User:coordinator
        """
        req = AclRequest(
            writer_principals=writers, coordinator_principals=coordinators, topic_prefix=topic_prefix,
            group_id=group_id, transactional_id_prefix=transactional_id_prefix,
            writer_group_prefixes=writer_group_prefixes or DEFAULT_WRITER_GROUP_PREFIXES,
            reader_principals=readers, reader_group_prefixes=reader_group_prefixes or DEFAULT_READER_GROUP_PREFIXES,
            idempotent_write_acl=idempotent_write_acl,
        )
        try:
            entries = plan_acls(req)
        except AclPlanError as e:
            raise click.UsageError(str(e)) from e
        if fmt == "json":
            click.echo(json.dumps([asdict(e) for e in entries], indent=2))
        else:
            click.echo(render_commands(entries, bootstrap_server or bootstrap_servers, command_config, executable), nl=False)

