"""`deltacoord acls`: print the kafka-acls.sh commands of a deployment (the plan is `deltacoord.coordinator.kafka.acls`),
or with --apply create the ACLs on the cluster through the admin API as the administrator."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from deltacoord.coordinator.kafka.acls import (
    DEFAULT_READER_GROUP_PREFIXES,
    DEFAULT_WRITER_GROUP_PREFIXES,
    AclEntry,
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
    @click.option("--relay-principal", "relays", multiple=True,
                  help="Relay principal (`deltacoord relay run`; repeatable, optional): the writers' grants.")
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
    @click.option("--apply", is_flag=True,
                  help="Create the ACLs on the cluster (admin API) instead of printing commands; the client settings "
                       "(--kafka, DELTACOORD_KAFKA_<KEY>, [kafka] of --config) must be a principal with ALTER on the cluster.")
    @click.option("--kafka", "kafka_pairs", multiple=True, metavar="KEY=VALUE",
                  help="Kafka client setting of --apply (repeatable), e.g. sasl.username=admin.")
    @click.option("--config", "config_file", type=click.Path(exists=True, path_type=Path), envvar="DELTACOORD_CONFIG",
                  help="TOML file whose [kafka] table holds the client settings of --apply.")
    def acls_cmd(writers: tuple[str, ...], coordinators: tuple[str, ...], readers: tuple[str, ...],
                 relays: tuple[str, ...], topic_prefix: str,
                 group_id: str | None, transactional_id_prefix: str | None, writer_group_prefixes: tuple[str, ...],
                 reader_group_prefixes: tuple[str, ...], idempotent_write_acl: bool, bootstrap_servers: str,
                 bootstrap_server: str | None, command_config: str | None, executable: str, fmt: str, apply: bool,
                 kafka_pairs: tuple[str, ...], config_file: Path | None) -> None:
        """Print the kafka-acls.sh commands granting writers, relays, coordinators and change-feed readers exactly
        what they need, or create those ACLs with --apply.

        \b
        Example:
          deltacoord acls --writer-principal User:ingest --coordinator-principal User:coordinator
          deltacoord acls --apply --writer-principal User:ingest --coordinator-principal User:coordinator --kafka security.protocol=SASL_SSL
        """
        req = AclRequest(
            writer_principals=writers, coordinator_principals=coordinators, topic_prefix=topic_prefix,
            group_id=group_id, transactional_id_prefix=transactional_id_prefix,
            writer_group_prefixes=writer_group_prefixes or DEFAULT_WRITER_GROUP_PREFIXES,
            reader_principals=readers, reader_group_prefixes=reader_group_prefixes or DEFAULT_READER_GROUP_PREFIXES,
            idempotent_write_acl=idempotent_write_acl, relay_principals=relays,
        )
        try:
            entries = plan_acls(req)
        except AclPlanError as e:
            raise click.UsageError(str(e)) from e
        if apply:
            _apply(entries, config_file, bootstrap_server or bootstrap_servers, topic_prefix, kafka_pairs)
            return
        if fmt == "json":
            click.echo(json.dumps([asdict(e) for e in entries], indent=2))
        else:
            click.echo(render_commands(entries, bootstrap_server or bootstrap_servers, command_config, executable), nl=False)



def _apply(entries: list[AclEntry], config_file: Path | None, bootstrap_servers: str, topic_prefix: str,
           kafka_pairs: tuple[str, ...]) -> None:
    from deltacoord.cli.options import load_settings
    from deltacoord.coordinator.kafka.acl_apply import AclApplyError, apply_acls

    run = load_settings(config_file, {"bootstrap_servers": bootstrap_servers, "topic_prefix": topic_prefix}, kafka_pairs)
    try:
        n = apply_acls(entries, run.coordinator.client())
    except AclApplyError as e:
        raise click.ClickException(str(e)) from e
    principals = sorted({e.principal for e in entries})
    click.echo(f"applied {n} ACLs for {', '.join(principals)} on {run.coordinator.bootstrap_servers}")
