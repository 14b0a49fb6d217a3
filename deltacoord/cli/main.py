"""The `deltacoord` command line."""

from __future__ import annotations

import importlib.abc
import json
import signal
import sys
import threading
from collections.abc import Callable, MutableMapping
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import click

from deltacoord.cli.options import KafkaUnreachable, load_settings
from deltacoord.coordinator.settings import env_var
from deltacoord.tooling import broker as broker_module
from deltacoord.tooling import jars
from deltacoord.tooling.broker import BrokerError, LocalBroker, LocalCluster
from deltacoord.tooling.ports import port_free


class LazyGroup(click.Group):
    """A command group whose command families (`deltacoord.cli.tables`, `.topics`, ...) are imported when one of
    their commands runs, is listed (help, a did-you-mean) or `commands` is read: `table append` then imports the
    table commands' modules, not the topics', keys', relay's and ACLs' (a short-lived CLI write pays every import)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loaded: dict[str, click.Command] = {}
        self._families: dict[str, Callable[[click.Group], None]] = {}  # command name -> its family's register
        super().__init__(*args, **kwargs)

    @property
    def commands(self) -> MutableMapping[str, click.Command]:
        """Every command, each family loaded."""
        for register in list(dict.fromkeys(self._families.values())):
            self._load(register)
        return self._loaded

    @commands.setter
    def commands(self, value: MutableMapping[str, click.Command]) -> None:
        self._loaded = dict(value)

    def lazy(self, names: tuple[str, ...], register: Callable[[click.Group], None]) -> None:
        """Commands `names` are added by `register(self)`, called when one of them is first needed."""
        for name in names:
            self._families[name] = register

    def _load(self, register: Callable[[click.Group], None]) -> None:
        names = [n for n, r in self._families.items() if r is register]
        if not names:
            return
        for n in names:
            del self._families[n]
        register(self)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name is None:
            raise TypeError("Command has no name.")
        self._loaded[name] = cmd

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        register = self._families.get(cmd_name)
        if register is not None:
            self._load(register)
        return self._loaded.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self._loaded, *self._families})


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="deltacoord", prog_name="deltacoord")
def main() -> None:
    """deltacoord: a commit coordinator for Delta Lake tables built on Apache Kafka.

    Writers propose commits through Kafka, one coordinator per partition decides them
    with Delta's conflict rules and publishes _delta_log. Every command prints its
    help with -h; settings also come from DELTACOORD_* variables.

    \b
    Example (a local broker, a coordinator, one table):
      deltacoord broker start
      deltacoord coordinator run --bootstrap-servers localhost:19092 &
      deltacoord table create /tmp/t --schema "id:long" --bootstrap-servers localhost:19092
    """


# -- jars -------------------------------------------------------------------
@main.group("jars")
def jars_group() -> None:
    """JVM jars resolved from Maven Central (Kafka broker, Delta Lake for Spark, S3A for Spark on S3)."""


@jars_group.command("fetch")
@click.argument("which", type=click.Choice(["kafka", "delta", "s3a", "all"]), default="all")
def jars_fetch(which: str) -> None:
    """Resolve jars with Maven into ~/.cache/deltacoord/jars (no-op when cached).

    \b
    Example:
      deltacoord jars fetch delta
    """
    names = ["kafka", "delta", "s3a"] if which == "all" else [which]
    try:
        for name in names:
            js = jars.fetch(name)
            click.echo(f"{name}: {len(js.jars())} jars in {js.directory}")
    except jars.JarResolutionError as e:
        raise click.ClickException(str(e)) from e


@jars_group.command("path")
@click.argument("which", type=click.Choice(["kafka", "delta", "s3a"]))
def jars_path(which: str) -> None:
    """Print the classpath of a jar set (fetching it if needed).

    \b
    Example:
      deltacoord jars path kafka
    """
    click.echo(jars.classpath(which))


# -- broker -----------------------------------------------------------------
@main.group("broker")
@click.option("--home", type=click.Path(path_type=Path), default=None, help="Broker home (default ~/.cache/deltacoord/broker).")
@click.pass_context
def broker_group(ctx: click.Context, home: Path | None) -> None:
    """A local Kafka broker (KRaft), or a local cluster with --brokers 3, for development and tests."""
    ctx.obj = LocalBroker(home)


@broker_group.command("start")
@click.option("--port", type=int, default=None, help="Client port (default 19092, or a free one if taken).")
@click.option("--brokers", type=click.IntRange(1, 9), default=1, show_default=True,
              help="Nodes; more than 1 starts a KRaft cluster (replication factor 3, min ISR 2).")
@click.option("--fresh", is_flag=True, help="Wipe the broker's data directory first.")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for the broker to answer.")
@click.option("--secure", is_flag=True,
              help="SASL_SSL (SCRAM-SHA-512) with a generated local CA, the StandardAuthorizer and no access without "
                   "an ACL; the home stays secured across restarts until --fresh. See `broker user` and `broker credentials`.")
@click.pass_obj
def broker_start(broker: LocalBroker, port: int | None, brokers: int, fresh: bool, timeout: float, secure: bool) -> None:
    """Start the broker; a running broker is left alone and its address printed.

    \b
    Example:
      deltacoord broker start
      deltacoord broker start --brokers 3 --fresh
      deltacoord broker start --secure --fresh
    """
    if brokers > 1:
        if port is not None:
            raise click.UsageError("--port is for a single broker; a cluster's nodes take 19092 and free ports")
        try:
            cinfo = LocalCluster(broker.home, brokers).start(timeout_s=max(timeout, 180.0), fresh=fresh, secure=secure)
        except (BrokerError, jars.JarResolutionError) as e:
            raise click.ClickException(str(e)) from e
        click.echo(f"cluster of {brokers} running at {cinfo.bootstrap_servers} (logs in {cinfo.home}/node-*/server.log)"
                   + (" with SASL_SSL and ACLs" if LocalCluster(broker.home).security is not None else ""))
        return
    if LocalCluster(broker.home).status() is not None:
        raise click.ClickException(f"a cluster runs in {broker.home}; stop it first (deltacoord broker stop)")
    running = broker.status()
    if running is not None:
        if secure and broker.security is None:
            raise click.ClickException("the broker runs unsecured; stop it and start it with --secure --fresh")
        click.echo(f"broker already running at {running.bootstrap_servers} (pid {running.pid})")
        return
    click.echo("starting local Kafka broker ...", err=True)
    try:
        info = broker.start(port=port, timeout_s=timeout, fresh=fresh, secure=secure)
    except (BrokerError, jars.JarResolutionError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"broker running at {info.bootstrap_servers} (pid {info.pid}, log {info.log_path})"
               + (" with SASL_SSL and ACLs" if broker.security is not None else ""))
    if port is None and info.port != broker_module.DEFAULT_PORT and not port_free(broker_module.DEFAULT_PORT):
        # Clients that assume the default (the docs export 127.0.0.1:19092) would reach whatever holds it.
        click.echo(f"note: 127.0.0.1:{broker_module.DEFAULT_PORT} is held by another process, so this broker listens on "
                   f"{info.bootstrap_servers}: export DELTACOORD_BOOTSTRAP_SERVERS={info.bootstrap_servers}", err=True)


@broker_group.command("stop")
@click.pass_obj
def broker_stop(broker: LocalBroker) -> None:
    """Stop the broker and its JVM (every node of a cluster).

    \b
    Example:
      deltacoord broker stop
    """
    if LocalCluster(broker.home).stop():
        click.echo("cluster stopped")
        return
    click.echo("broker stopped" if broker.stop() else "broker was not running")


@broker_group.command("status")
@click.pass_obj
def broker_status(broker: LocalBroker) -> None:
    """Print the broker's pid, address and log path as JSON (a cluster's per node); exit 1 if stopped.

    \b
    Example:
      deltacoord broker status
    """
    cluster = LocalCluster(broker.home)
    cinfo = cluster.status()
    if cinfo is not None:
        click.echo(json.dumps({"running": True, "brokers": len(cinfo.nodes), "secured": cluster.security is not None,
                               **asdict(cinfo)}))
        return
    info = broker.status()
    if info is None:
        click.echo(json.dumps({"running": False, "home": str(broker.home)}))
        sys.exit(1)
    click.echo(json.dumps({"running": True, "secured": broker.security is not None, **asdict(info)}))


def _secured(broker: LocalBroker) -> tuple[str, Any]:
    """The bootstrap servers and security of the running secured broker or cluster of `broker`'s home."""
    cluster = LocalCluster(broker.home)
    cinfo = cluster.status()
    if cinfo is not None:
        bootstrap, security = cinfo.bootstrap_servers, cluster.security
    else:
        info = broker.status()
        if info is None:
            raise click.ClickException(f"no broker runs in {broker.home}; start it with `deltacoord broker start --secure`")
        bootstrap, security = info.bootstrap_servers, broker.security
    if security is None:
        raise click.ClickException(f"the broker in {broker.home} is not secured; restart it with "
                                   "`deltacoord broker start --secure --fresh`")
    return bootstrap, security


def _print_settings(bootstrap: str, settings: dict[str, str], fmt: str) -> None:
    if fmt == "flags":
        from shlex import quote

        click.echo(" ".join(f"--kafka {quote(f'{k}={v}')}" for k, v in settings.items()))
    elif fmt == "env":
        from shlex import quote

        from deltacoord.coordinator.settings import KAFKA_ENV_PREFIX

        click.echo(f"export DELTACOORD_BOOTSTRAP_SERVERS={quote(bootstrap)}")
        for k, v in settings.items():
            click.echo(f"export {KAFKA_ENV_PREFIX}{k.upper().replace('.', '_')}={quote(v)}")
    else:
        click.echo(f"bootstrap.servers={bootstrap}")
        for k, v in settings.items():
            click.echo(f"{k}={v}")


_SETTINGS_FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["properties", "env", "flags"]), default="properties", show_default=True,
    help="librdkafka key=value lines, `export DELTACOORD_...` lines (the coordinator and `topics` read "
         "DELTACOORD_KAFKA_<KEY>), or --kafka flags for the table commands.")


@broker_group.command("user")
@click.argument("name")
@click.option("--password", default=None, help="The user's password (default: a new random one, printed).")
@_SETTINGS_FORMAT
@click.pass_obj
def broker_user(broker: LocalBroker, name: str, password: str | None, fmt: str) -> None:
    """Create (or reset) SCRAM user NAME on the secured broker and print its client settings.

    The user may do nothing until ACLs grant it something (`deltacoord acls --apply`).

    \b
    Example:
      deltacoord broker user ingest --format flags
    """
    from deltacoord.tooling import broker_security
    bootstrap, security = _secured(broker)
    password = password or broker_security.new_password()
    try:
        broker_security.add_users(bootstrap, security, {name: password})
    except broker_security.SecurityError as e:
        raise click.ClickException(str(e)) from e
    _print_settings(bootstrap, security.client_config(name, password), fmt)


@broker_group.command("credentials")
@_SETTINGS_FORMAT
@click.pass_obj
def broker_credentials(broker: LocalBroker, fmt: str) -> None:
    """Print the administrator's client settings of the secured broker (a super user: topics, ACLs, users);
    `eval "$(deltacoord broker credentials --format env)"` puts them in the shell's environment.

    \b
    Example:
      deltacoord broker credentials --format env
    """
    bootstrap, security = _secured(broker)
    _print_settings(bootstrap, security.admin_config(), fmt)


# -- coordinator ----------------------------------------------------------------
@main.group("coordinator")
def coordinator_group() -> None:
    """Run the commit coordinator."""


def _stop_requested_from_now() -> threading.Event:
    """SIGTERM and SIGINT are noted from the command's first line until the coordinator installs its own handlers
    (`Coordinator.install_signal_handlers`): a supervisor stopping a coordinator that is still loading its modules
    and settings gets exit 0, not a death by signal."""
    requested = threading.Event()

    def note(signum: int, frame: FrameType | None) -> None:
        requested.set()

    before = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:  # the command run in-process (tests, embedding) leaves the handlers as it found them
        for sig, handler in before.items():
            if signal.getsignal(sig) is note:
                signal.signal(sig, handler)

    click.get_current_context().call_on_close(restore)
    return requested


@coordinator_group.command("run")
@click.option("--config", "config_file", type=click.Path(exists=True, path_type=Path), envvar="DELTACOORD_CONFIG",
              help="TOML file with [coordinator] and [kafka] tables.")
@click.option("--bootstrap-servers", envvar=env_var("bootstrap_servers"), default=None,
              help="Kafka brokers, host:port[,host:port...] (or DELTACOORD_BOOTSTRAP_SERVERS).")
@click.option("--topic-prefix", envvar=env_var("topic_prefix"), default=None, help="Topics are <prefix>.proposals/.commits/.deadletters.")
@click.option("--partitions", envvar=env_var("partitions"), default=None, help="Comma-separated proposals partitions to own (default: all).")
@click.option("--num-partitions", type=int, envvar=env_var("num_partitions"), default=None, help="Partitions when creating topics.")
@click.option("--group-id", envvar=env_var("group_id"), default=None,
              help="Consumer group coordinators share to split partitions (default <prefix>-coordinator).")
@click.option("--transactional-id-prefix", envvar=env_var("transactional_id_prefix"), default=None,
              help="Prefix of the per-partition transactional ids that fence zombies (default <prefix>-coordinator).")
@click.option("--max-batch", type=int, envvar=env_var("max_batch"), default=None,
              help="Most proposals decided in one Kafka transaction (default 500).")
@click.option("--metrics-port", type=int, envvar=env_var("metrics_port"), default=None, help="Serve /metrics and /healthz.")
@click.option("--no-fsync", is_flag=True, help="Do not fsync published files (Kafka stays the durable copy).")
@click.option("--no-checkpoints", is_flag=True, help="Do not write checkpoints.")
@click.option("--kafka", "kafka_pairs", multiple=True, help="Extra Kafka client setting key=value (repeatable).")
@click.option("--watchdog-seconds", type=float, envvar=env_var("watchdog_seconds"), default=None,
              help="Exit (code 4) when no progress is made this long, for the supervisor to restart (default 120; 0 disables).")
@click.option("--log-level", default=None, envvar=env_var("log_level"), help="Default INFO.")
@click.option("--dead-letter-max-bytes", type=int, envvar=env_var("dead_letter_max_bytes"), default=None,
              help="Raw bytes of an undecodable message kept in its dead letter (default 65536; size and hash go in headers).")
@click.option("--stall-seconds", type=float, envvar=env_var("stall_seconds"), default=None,
              help="/healthz answers 503 when proposals wait and no batch was committed this long (default 60).")
@click.option("--publish-failing-seconds", type=float, envvar=env_var("publish_failing_seconds"), default=None,
              help="/healthz answers 503 (not ready, naming the table) when a table's publication to _delta_log has "
                   "failed this long (default 10); /livez stays 200.")
@click.option("--kafka-unreachable-seconds", type=float, envvar=env_var("kafka_unreachable_seconds"), default=None,
              help="/healthz answers 503 (not ready) when no Kafka broker was reachable this long (default 10); "
                   "/livez stays 200.")
@click.option("--send-offsets-timeout-seconds", type=float, envvar=env_var("send_offsets_timeout_seconds"), default=None,
              help="A Kafka producer blocked this long (plus 5 s) adding offsets to a transaction is replaced, as after "
                   "a restart (default 20).")
@click.option("--table-roots", envvar=env_var("table_roots"), default=None,
              help="Comma-separated URI prefixes under which tables may be created and published (s3://bucket/tables,"
                   "/data/tables); proposals for other locations are refused. Unset: local tables anywhere, no object store.")
@click.option("--storage-option", "storage_pairs", multiple=True, metavar="KEY=VALUE",
              help="Storage option for every table's store, as delta-rs names them (repeatable); credentials also come "
                   "from AWS_*, AZURE_*, GOOGLE_* variables.")
@click.option("--state-root", envvar=env_var("state_root"), default=None,
              help="Directory or object-store prefix for state snapshots, so a restart reads the newest snapshot plus the "
                   "records after it instead of the whole commits topic. Unset: no snapshots.")
@click.option("--snapshot-every-records", type=int, envvar=env_var("snapshot_every_records"), default=None,
              help="Write a state snapshot after this many commits-topic records (default 10000).")
@click.option("--decided-ids-limit", type=int, envvar=env_var("decided_ids_limit"), default=None,
              help="A repeated proposal id is answered with its first decision while among this many newest decisions of "
                   "its partition's tables with writer keys, or as many of its other tables' (default 50000), and younger "
                   "than --decided-ids-max-age-hours (default 168).")
@click.option("--group-offset-seconds", type=float, envvar=env_var("group_offset_seconds"), default=None,
              help="A busy partition commits its consumed offset to the consumer group at most this often (default 1; "
                   "0: in every transaction). Recovery resumes from the offset each transaction records with its decisions.")
@click.option("--checkpoint-min-seconds", type=float, envvar=env_var("checkpoint_min_seconds"), default=None,
              help="Checkpoint a table at most once in this many seconds (default 1; 0: every delta.checkpointInterval "
                   "versions however fast they come). Requests met meanwhile are coalesced to the newest version.")
@click.option("--checkpoint-after-actions", type=int, envvar=env_var("checkpoint_after_actions"), default=None,
              help="Checkpoint a version of at least this many actions whatever its number (default 10000; 0: off), so "
                   "the next reader reads its files from Parquet, not from one large JSON file.")
@click.option("--publish-lanes", type=int, envvar=env_var("publish_lanes"), default=None,
              help="Tables publishing _delta_log at once (default 16): each table's versions in order, a slow store "
                   "holding back only its own table.")
@click.option("--max-staged-bytes", type=int, envvar=env_var("max_staged_bytes"), default=None,
              help="The largest commit carried by reference that is decided (default 1073741824, about 3 million files); "
                   "a larger one is refused unread (OVERSIZE). It bounds the memory a large commit takes while decided.")
@click.option("--hold-min-actions", type=int, envvar=env_var("hold_min_actions"), default=None,
              help="A proposal carrying this many actions by reference is decided off the deciding thread, its table "
                   "held while the partition's other tables go on (default 10000).")
@click.option("--hold-predicate-chars", type=int, envvar=env_var("hold_predicate_chars"), default=None,
              help="A proposal whose read predicates have this many characters in all is held the same way (default 0: never).")
@click.option("--hold-runahead", type=int, envvar=env_var("hold_runahead"), default=None,
              help="Decisions past a held proposal before the loop waits for it (default 0: half of --decided-ids-limit).")
@click.option("--decided-ids-max-age-hours", type=float, envvar=env_var("decided_ids_max_age_hours"), default=None,
              help="Hours a decision stays the answer to its repeated proposal id (default 168; see --decided-ids-limit).")
def coordinator_run(config_file: Path | None, bootstrap_servers: str | None, topic_prefix: str | None, partitions: str | None,
                    num_partitions: int | None, group_id: str | None, transactional_id_prefix: str | None, max_batch: int | None,
                    metrics_port: int | None, no_fsync: bool, no_checkpoints: bool, kafka_pairs: tuple[str, ...],
                    watchdog_seconds: float | None, log_level: str | None, dead_letter_max_bytes: int | None,
                    stall_seconds: float | None, table_roots: str | None, storage_pairs: tuple[str, ...],
                    state_root: str | None, snapshot_every_records: int | None, decided_ids_limit: int | None,
                    decided_ids_max_age_hours: float | None, group_offset_seconds: float | None,
                    checkpoint_min_seconds: float | None, checkpoint_after_actions: int | None, publish_lanes: int | None,
                    publish_failing_seconds: float | None, kafka_unreachable_seconds: float | None,
                    send_offsets_timeout_seconds: float | None, max_staged_bytes: int | None,
                    hold_min_actions: int | None, hold_predicate_chars: int | None, hold_runahead: int | None) -> None:
    """Consume proposals, decide them, record decisions in Kafka, publish _delta_log.

    \b
    Example:
      deltacoord coordinator run --bootstrap-servers localhost:19092 --metrics-port 9464
      deltacoord coordinator run --config coordinator.toml --table-roots s3://lake/tables
    """
    stop_requested = _stop_requested_from_now()
    from deltacoord.coordinator import json_logs
    from deltacoord.coordinator.kafka import daemon

    flags: dict[str, object] = {
        "bootstrap_servers": bootstrap_servers, "topic_prefix": topic_prefix, "partitions": partitions,
        "num_partitions": num_partitions, "group_id": group_id, "transactional_id_prefix": transactional_id_prefix,
        "max_batch": max_batch, "metrics_port": metrics_port, "fsync": False if no_fsync else None,
        "checkpoints": False if no_checkpoints else None, "watchdog_seconds": watchdog_seconds, "log_level": log_level,
        "dead_letter_max_bytes": dead_letter_max_bytes, "stall_seconds": stall_seconds, "table_roots": table_roots,
        "state_root": state_root, "snapshot_every_records": snapshot_every_records, "decided_ids_limit": decided_ids_limit,
        "decided_ids_max_age_hours": decided_ids_max_age_hours, "group_offset_seconds": group_offset_seconds,
        "checkpoint_min_seconds": checkpoint_min_seconds, "checkpoint_after_actions": checkpoint_after_actions,
        "publish_lanes": publish_lanes,
        "publish_failing_seconds": publish_failing_seconds, "kafka_unreachable_seconds": kafka_unreachable_seconds,
        "send_offsets_timeout_seconds": send_offsets_timeout_seconds, "max_staged_bytes": max_staged_bytes,
        "hold_min_actions": hold_min_actions, "hold_predicate_chars": hold_predicate_chars, "hold_runahead": hold_runahead,
    }
    run = load_settings(config_file, flags, kafka_pairs, storage_pairs)
    json_logs.setup_logging(run.log_level)
    if not run.coordinator.bootstrap_servers:
        raise click.UsageError("no Kafka bootstrap servers: pass --bootstrap-servers, DELTACOORD_BOOTSTRAP_SERVERS or the config file")
    from deltacoord.schemas.kafka_logs import KafkaCredentialsError, UnreachableKafkaError, probe

    try:  # refused credentials fail at once, in one line; brokers not up yet are the coordinator's own to wait for
        probe(run.coordinator.client())
    except KafkaCredentialsError as e:
        raise KafkaUnreachable(str(e)) from None
    except UnreachableKafkaError:
        pass
    checkpoint_fn = None
    if run.checkpoints:
        from deltacoord.coordinator.delta_log.checkpoint_worker import CheckpointWorker

        checkpoint_fn = CheckpointWorker()
    coord = daemon.Coordinator(
        run.coordinator, partitions=run.partitions, num_partitions=run.num_partitions, metrics_port=run.metrics_port,
        publish_fsync=run.fsync, checkpoint_fn=checkpoint_fn, watchdog_s=run.watchdog_s,
    )
    coord.install_signal_handlers()
    if stop_requested.is_set():  # before it touched Kafka: it owns nothing, fences nobody, and stops cleanly
        click.echo("coordinator: stopped by a signal before it started", err=True)
        sys.exit(0)
    from deltacoord.coordinator.kafka.topics import TopicConfigError
    from deltacoord.coordinator.metrics import MetricsPortError

    try:
        code = coord.run()
    except MetricsPortError as e:
        raise click.UsageError(e.strerror or str(e)) from None  # exit 2: a configuration error, as systemd expects
    except TopicConfigError as e:
        raise click.ClickException(str(e)) from None
    sys.exit(code)


@main.command("bench")
@click.option("--writers", default="16", show_default=True,
              help="Writer processes, or a comma-separated list of counts run one after the other (e.g. 1,16,64).")
@click.option("--commits-per-writer", default="50", show_default=True,
              help="Timed commits per writer: one count for every run, or one per writer count (e.g. 100,50,10).")
@click.option("--memory-files", type=int, default=1_000_000, show_default=True,
              help="Live files for the memory measurements (0 skips them; always skipped with --storage s3).")
@click.option("--bootstrap-servers", default=None, help="Use this broker instead of the local one.")
@click.option("--warmup-commits-per-writer", type=int, default=150, show_default=True,
              help="Untimed deltacoord appends per writer first, to warm the broker's JVM (0 skips).")
@click.option("--storage", type=click.Choice(["local", "s3"]), default="local", show_default=True,
              help="Where both systems' tables live: a local directory, or the local S3 server (versitygw), where the "
                   "latency is from the write call to the version's visibility in _delta_log.")
@click.option("--chart", "chart", default="deltacoord-bench.svg", show_default=True, type=click.Path(dir_okay=False),
              help="Also draw both systems' commits/s and latency distributions here (.svg or .png).")
@click.option("--no-chart", is_flag=True, help="Draw no chart.")
@click.option("--relay", is_flag=True,
              help="deltacoord's writer processes go through one relay process (`deltacoord relay run`), as the "
                   "writers of one host would.")
@click.option("--tables", type=click.IntRange(min=1), default=1, show_default=True,
              help="Deal each run's writers over this many tables (one coordinator; delta-rs the same).")
@click.option("--s3-latency-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="With --storage s3: both systems reach the S3 server through a proxy adding this round trip to "
                   "every request (real S3: 20-60 ms).")
def bench_cmd(writers: str, commits_per_writer: str, memory_files: int, bootstrap_servers: str | None,
              warmup_commits_per_writer: int, storage: str, chart: str, no_chart: bool, relay: bool, tables: int,
              s3_latency_ms: float) -> None:
    """Commits/s and latency vs delta-rs, in one run; last line is JSON (a chart is drawn beside it).

    \b
    Example:
      deltacoord bench --writers 1,16,64 --commits-per-writer 100,50,10 --chart bench.svg
      deltacoord bench --storage s3 --s3-latency-ms 60 --writers 2,16 --tables 8
    """
    from deltacoord.tooling.bench import run

    _require_bench_extra(chart=not no_chart)
    if s3_latency_ms and storage != "s3":
        raise click.BadParameter("only with --storage s3", param_hint="--s3-latency-ms")

    def counts(text: str, option: str) -> list[int]:
        try:
            out = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            out = []
        if not out or min(out) < 1:
            raise click.BadParameter(f"{text!r}: give positive whole numbers separated by commas", param_hint=option)
        return out

    ws, ks = counts(writers, "--writers"), counts(commits_per_writer, "--commits-per-writer")
    if len(ks) not in (1, len(ws)):
        raise click.BadParameter(f"{len(ks)} counts for {len(ws)} writer counts: give one, or one per writer count",
                                 param_hint="--commits-per-writer")
    click.echo(json.dumps(run(ws if len(ws) > 1 else ws[0], ks if len(ks) > 1 else ks[0], memory_files,
                              bootstrap_servers, warmup_commits_per_writer, storage=storage,
                              chart=None if no_chart else chart, relay=relay, tables=tables,
                              s3_latency_ms=s3_latency_ms)))


def _require_bench_extra(*, chart: bool) -> None:
    """The bench's peer (delta-rs) and its chart (matplotlib) are the `bench` extra, not the daemon's needs:
    say so before a run of minutes rather than fail at its end."""
    import importlib.util

    missing = [m for m in ("deltalake", *(("matplotlib",) if chart else ())) if importlib.util.find_spec(m) is None]
    if missing:
        hint = " (or --no-chart for no chart)" if missing == ["matplotlib"] else ""
        raise click.ClickException(f"deltacoord bench needs {' and '.join(missing)}: pip install 'deltacoord[bench]'{hint}")


@main.command("demo")
@click.option("--storage", type=click.Choice(["local", "s3"]), default="local", show_default=True,
              help="Where the table lives: a temporary directory, or a bucket on the local S3 server (versitygw).")
def demo_cmd(storage: str) -> None:
    """Broker + coordinator + concurrent writers + conflicts + delta-rs verification; last line is JSON.

    \b
    Example:
      deltacoord demo
    """
    from deltacoord.tooling.demo import main as demo_main

    demo_main(storage=storage)


# -- storage servers -------------------------------------------------------------
@main.group("storage")
def storage_group() -> None:
    """Local object-storage servers for development and tests: S3 (versitygw), Azure (Azurite), GCS (fake-gcs-server)."""


_STORAGE_KINDS = click.Choice(["s3", "azure", "gcs", "all"])


def _servers(kind: str) -> list[Any]:
    from deltacoord.tooling import storage_servers
    return [storage_servers.server(k) for k in (storage_servers.KINDS if kind == "all" else [kind])]


@storage_group.command("start")
@click.argument("kind", type=_STORAGE_KINDS, default="s3")
@click.option("--port", type=int, default=None, help="Port (default: the previous one, else a free one); one server only.")
def storage_start(kind: str, port: int | None) -> None:
    """Start (building on first use) a local server; prints its endpoint and storage options as JSON lines.

    \b
    Example:
      deltacoord storage start s3
    """
    from deltacoord.tooling.storage_servers import StorageServerError

    if port is not None and kind == "all":
        raise click.UsageError("--port names one server's port; choose s3, azure or gcs")
    for srv in _servers(kind):
        try:
            srv.artifact().ensure(quiet=False)
            info = srv.start(port)
        except StorageServerError as e:
            raise click.ClickException(str(e)) from e
        click.echo(json.dumps({"running": True, **asdict(info)}))


@storage_group.command("stop")
@click.argument("kind", type=_STORAGE_KINDS, default="all")
def storage_stop(kind: str) -> None:
    """Stop local servers.

    \b
    Example:
      deltacoord storage stop
    """
    for srv in _servers(kind):
        click.echo(f"{srv.kind}: {'stopped' if srv.stop() else 'was not running'}")


@storage_group.command("status")
@click.argument("kind", type=_STORAGE_KINDS, default="all")
def storage_status(kind: str) -> None:
    """Each server's pid, endpoint and storage options as JSON lines; exit 1 if one is stopped.

    \b
    Example:
      deltacoord storage status s3
    """
    stopped = False
    for srv in _servers(kind):
        info = srv.status()
        if info is None:
            stopped = True
            click.echo(json.dumps({"kind": srv.kind, "running": False, "home": str(srv.home)}))
        else:
            click.echo(json.dumps({"running": True, **asdict(info)}))
    if stopped:
        sys.exit(1)


@storage_group.command("create-bucket")
@click.argument("kind", type=click.Choice(["s3", "azure", "gcs"]))
@click.argument("name")
def storage_create_bucket(kind: str, name: str) -> None:
    """Create a bucket (Azure: a container) on the running local server, for tables at s3://NAME/...

    \b
    Example:
      deltacoord storage create-bucket s3 lake
    """
    from deltacoord.tooling.storage_servers import StorageServerError

    (srv,) = _servers(kind)
    if srv.status() is None:
        raise click.ClickException(f"the local {kind} server is not running: start it with `deltacoord storage start {kind}`")
    try:
        srv.create_bucket(name)
    except StorageServerError as e:
        if not any(m in str(e) for m in ("AlreadyOwnedByYou", "AlreadyExists", "HTTP 409")):
            raise click.ClickException(str(e)) from e
        click.echo(json.dumps({"kind": kind, "bucket": name, "created": False}))  # it was there: fine
        return
    click.echo(json.dumps({"kind": kind, "bucket": name, "created": True}))


def _tables(group: click.Group) -> None:
    from deltacoord.cli import tables as cli_tables
    from deltacoord.cli import transaction as cli_transaction

    cli_tables.register(group)
    cli_tables.table_group.add_command(cli_transaction.transact_cmd)  # `table transact` (uses cli_tables' helpers)


def _relay(group: click.Group) -> None:
    from deltacoord.cli import relay as cli_relay

    cli_relay.register(group)


def _keys(group: click.Group) -> None:
    from deltacoord.cli import keys as cli_keys

    cli_keys.register(group)


def _topics(group: click.Group) -> None:
    from deltacoord.cli import topics as cli_topics

    cli_topics.register(group)


def _acls(group: click.Group) -> None:
    from deltacoord.cli import acls as cli_acls

    cli_acls.register(group)


def _verify(group: click.Group) -> None:
    from deltacoord.cli import verify as cli_verify

    cli_verify.register(group)


def _register_extensions() -> None:
    assert isinstance(main, LazyGroup)
    for names, register in ((("table", "tail"), _tables), (("relay",), _relay), (("writer-key",), _keys),
                            (("topics",), _topics), (("acls",), _acls), (("verify",), _verify)):
        main.lazy(names, register)


_register_extensions()


class NoPandas(importlib.abc.MetaPathFinder):
    """Refuses `import pandas`: pyarrow imports it (about 200 ms and 50 MB of a fresh process), when installed,
    only to ask whether a list it converts is a pandas object."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError("this deltacoord command does not use pandas")
        return None


#: Commands that never hold a pandas object: their process refuses pandas (`NoPandas`). `table append` reads its
#: rows from JSON or Parquet into Arrow, and a CLI write's process pays every import it makes.
WITHOUT_PANDAS = (("table", "append"),)


def run() -> None:
    """The `deltacoord` program: `main` in a process of its own (`NoPandas` for WITHOUT_PANDAS)."""
    if tuple(sys.argv[1:3]) in WITHOUT_PANDAS and "pandas" not in sys.modules:
        sys.meta_path.insert(0, NoPandas())
    main()


if __name__ == "__main__":
    run()
