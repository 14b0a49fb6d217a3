"""The coordinator's settings, read in one place: defaults, then the config file, then the environment, then flags.

`CoordinatorSettings` is what the Kafka loop needs (how to reach Kafka, how to
batch, where tables may live and how to reach their storage); `RunSettings`
adds what `deltacoord coordinator run` needs around it (partitions, metrics
port, fsync, checkpoints, watchdog, log level).
`load(config_file, flags)` merges the four sources, highest last:

* built-in defaults;
* the TOML file's `[coordinator]` table (keys: `FILE_KEYS`), `[kafka]` table and
  `[storage]` table (storage options as delta-rs names them: string keys apply to
  every store, a sub-table named by a root URI to the tables under that root);
* `DELTACOORD_<KEY>` variables (`ENV_VARS`; fsync and checkpoints have none)
  and `DELTACOORD_KAFKA_<KEY>` variables for Kafka client settings (storage
  credentials come from each cloud's own variables: `AWS_*`, `AZURE_*`, `GOOGLE_*`);
* flags (`--bootstrap-servers`, ..., `--kafka key=value`, `--storage-option key=value`);
  a flag left out is None.

Every command that talks to a deployment (`coordinator run`, `topics`,
`verify`) reads its settings through `load`, so a file or a variable means the
same thing to all of them.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltacoord.coordinator.locations import TableLocations
from deltacoord.schemas.kafka_logs import kafka_config
from deltacoord.schemas.routing import Topics
from deltacoord.storage.uri import StorageUriError, check_table_uri

DEFAULT_TOPIC_PREFIX = "deltacoord"
#: A dead letter's key is cut to this many bytes and its error header to this many characters.
DEAD_LETTER_KEY_BYTES = 1024
DEAD_LETTER_ERROR_CHARS = 4000
#: Room for the key, the headers (error, source, size, hash) and the record's framing.
_DEAD_LETTER_OVERHEAD = 16 * 1024


def dead_letter_record_bound(dead_letter_max_bytes: int) -> int:
    """The largest dead letter a coordinator keeping `dead_letter_max_bytes` of raw bytes produces."""
    return dead_letter_max_bytes + _DEAD_LETTER_OVERHEAD


class SettingsError(ValueError):
    """A setting with a value of the wrong form; the message names the setting and where it came from."""


@dataclass
class CoordinatorSettings:
    """How a coordinator reaches Kafka and how it batches."""

    bootstrap_servers: str
    topics: Topics = field(default_factory=Topics.with_prefix)
    #: Extra client settings passed to every Kafka client (TLS, SASL, ...).
    kafka: dict[str, Any] = field(default_factory=dict)
    group_id: str = "deltacoord-coordinator"
    transactional_id_prefix: str = "deltacoord-coordinator"
    max_batch: int = 500
    poll_timeout_s: float = 0.1
    max_proposal_bytes: int = 4 * 1024 * 1024
    #: The largest commit carried by reference (`deltacoord.schemas.staged`) this coordinator loads: about 3 million files of
    #: two columns' stats, a few GB of memory while it is decided. A larger one is refused unread (OVERSIZE). It is
    #: decided off the deciding thread (`hold_min_actions`; docs/operations.md, Large commits).
    max_staged_bytes: int = 1 << 30
    transaction_timeout_ms: int = 60_000
    #: A proposal is decided off the deciding thread, its table held while the partition's other tables go on
    #: (`deltacoord.coordinator.kafka.holds`), when it carries this many actions by reference or read predicates of
    #: this many characters that sqlglot would parse (0: predicates never hold; what the rules refuse unparsed, too
    #: long or nested too deep, is cheap and never holds). 4,096 characters take 25 ms to parse on a quiet machine,
    #: 100 ms or more under load: several times a hold's own cost (one Kafka transaction); a flood for one table
    #: shares holds (`holds.joins`).
    hold_min_actions: int = 10_000
    hold_predicate_chars: int = 4096
    #: While a hold is open, at most this many later proposals are decided past it (0: half of `decided_ids_limit`):
    #: the offset recorded stays at the held proposal, and a restart recognises them in the decided-ids window.
    hold_runahead: int = 0
    #: Bound on adding the consumed offsets to a transaction. librdkafka can block in
    #: send_offsets_to_transaction for ever, its own timeout unchecked, when the group
    #: coordinator's broker dies (confluentinc/librdkafka#5456, #5511); a group coordinator
    #: failover takes about broker.session.timeout.ms (9 s), so this leaves room for one.
    send_offsets_timeout_s: float = 20.0
    #: A busy partition commits its consumed offset to the group inside a transaction at most this often.
    #: Every transaction records that offset in its commits-topic records (`deltacoord.next_offset`), which
    #: recovery resumes from; the group's offset is for lag tools and costs a transaction two broker round
    #: trips. An idle partition commits it at once.
    group_offset_interval_s: float = 1.0
    #: A table is checkpointed every `delta.checkpointInterval` versions (Delta's rule), and at most once in
    #: this many seconds: at hundreds of commits a second, a checkpoint every 10 versions would rewrite the
    #: table's whole file list dozens of times a second. Requests met meanwhile are coalesced to the newest.
    checkpoint_min_interval_s: float = 1.0
    #: A version of at least this many actions is checkpointed as well, whatever its number (Delta allows a
    #: checkpoint at any version): the next reader of the table, a writer's overwrite of it included, reads
    #: its files from Parquet instead of parsing them from one JSON file (about 1 s per 100,000 in Python). 0: off.
    checkpoint_after_actions: int = 10_000
    #: Tables publishing `_delta_log` at once (`deltacoord.coordinator.delta_log.publisher`): each table's versions in
    #: order, one table's slow store holding back only its own.
    publish_lanes: int = 16
    #: At most this many bytes of an undecodable message are copied into its dead letter (its full
    #: size and SHA-256 travel in headers), so a dead letter always fits the dead-letter topic.
    dead_letter_max_bytes: int = 64 * 1024
    #: `/healthz` turns unhealthy when proposals wait and no batch was committed for this long.
    stall_timeout_s: float = 60.0
    #: `/healthz` turns not ready (503, naming the table and the error) when a table's publication to `_delta_log`
    #: has failed (or not answered) for this long; liveness (`/livez`) is not affected.
    publish_failing_s: float = 10.0
    #: `/healthz` turns not ready (503) when no Kafka broker has been reachable for this long.
    kafka_unreachable_s: float = 10.0
    #: A repeated proposal id is answered with its first decision while it is among the newest this many
    #: decisions of its partition's tables with writer keys (or, kept apart, of its other tables) and younger than
    #: `decided_ids_max_age_ms` (`deltacoord.coordinator.rules.decided`).
    decided_ids_limit: int = 50_000
    decided_ids_max_age_ms: int = 7 * 24 * 3600 * 1000
    #: Where partition state snapshots go (a local directory or an object-store prefix, with `storage_options`);
    #: None: no snapshots, a restart reads the whole commits partition (`deltacoord.coordinator.kafka.state_snapshots`).
    state_root: str | None = None
    #: A snapshot is written after this many commits-topic records since the last one.
    snapshot_every_records: int = 10_000

    #: URI prefixes under which tables may be created and published; None: local tables anywhere.
    table_roots: tuple[str, ...] | None = None
    #: Storage options (delta-rs's keys) for every table's store.
    storage_options: dict[str, str] = field(default_factory=dict)
    #: Root URI -> storage options for the tables under it (over `storage_options`).
    storage_options_by_root: dict[str, dict[str, str]] = field(default_factory=dict)

    def dead_letter_record_bound(self) -> int:
        """The largest dead-letter record this coordinator produces: the kept prefix, key and headers."""
        return dead_letter_record_bound(self.dead_letter_max_bytes)

    def locations(self, fsync: bool = True) -> TableLocations:
        """The table roots and storage options as `TableLocations` (StorageUriError for a bad root)."""
        return TableLocations.of(self.table_roots, self.storage_options, self.storage_options_by_root, fsync=fsync)

    def client(self, defaults: dict[str, Any] | None = None, **required: Any) -> dict[str, Any]:
        """Client config: our tuning defaults, then the user's settings, then what correctness requires."""
        return kafka_config({**(defaults or {}), "bootstrap.servers": self.bootstrap_servers, **self.kafka, **required})

    def transactional_id(self, partition: int) -> str:
        return f"{self.transactional_id_prefix}-{self.topics.proposals}-{partition}"


@dataclass(frozen=True)
class RunSettings:
    """Everything `deltacoord coordinator run` needs."""

    coordinator: CoordinatorSettings
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    #: Proposals partitions to own (static assignment); None joins the consumer group.
    partitions: list[int] | None = None
    #: Partitions when the coordinator has to create the topics.
    num_partitions: int = 1
    metrics_port: int | None = None
    fsync: bool = True
    checkpoints: bool = True
    #: Exit when the loop makes no progress this long; None disables the watchdog.
    watchdog_s: float | None = 120.0
    log_level: str = "INFO"


#: The `[coordinator]` keys of the config file.
FILE_KEYS = (
    "bootstrap_servers", "topic_prefix", "partitions", "num_partitions", "group_id", "transactional_id_prefix",
    "max_batch", "metrics_port", "fsync", "checkpoints", "watchdog_seconds", "log_level", "dead_letter_max_bytes",
    "stall_seconds", "table_roots", "state_root", "snapshot_every_records", "decided_ids_limit", "decided_ids_max_age_hours",
    "group_offset_seconds", "checkpoint_min_seconds", "checkpoint_after_actions", "publish_lanes",
    "publish_failing_seconds", "kafka_unreachable_seconds", "send_offsets_timeout_seconds", "max_staged_bytes",
    "hold_min_actions", "hold_predicate_chars", "hold_runahead",
)
#: Keys that a `DELTACOORD_<KEY>` variable sets (fsync and checkpoints only have their --no-... flags).
ENV_VARS = {k: f"DELTACOORD_{k.upper()}" for k in FILE_KEYS if k not in ("fsync", "checkpoints")}
KAFKA_ENV_PREFIX = "DELTACOORD_KAFKA_"


def env_var(key: str) -> str:
    """The environment variable of a setting (for the CLI's option declarations)."""
    return ENV_VARS[key]


def read_config_file(path: Path | None) -> dict[str, Any]:
    """The parsed TOML file (empty without one); a file that is not TOML is a SettingsError."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"config file {path} is not valid TOML: {e}") from e


def flatten_kafka(table: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`[kafka]` keys as librdkafka names; an unquoted dotted TOML key becomes nested tables, so rejoin it."""
    out: dict[str, str] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_kafka(v, key + "."))
        elif isinstance(v, bool):
            out[key] = "true" if v else "false"
        else:
            out[key] = str(v)
    return out


def parse_kafka_pairs(pairs: Sequence[str], hint: str = "--kafka") -> dict[str, str]:
    """Repeated `key=value` settings as a dict; one without `=` is a SettingsError naming `hint`."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SettingsError(f"{hint}: expected key=value, got {pair!r}")
        k, v = pair.split("=", 1)
        out[k.strip()] = v
    return out


def _as_int(value: object, key: str, source: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise SettingsError(f"{key} from {source} must be an integer, got {value!r}") from None


def _as_float(value: object, key: str, source: str) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise SettingsError(f"{key} from {source} must be a number, got {value!r}") from None


def _as_bool(value: object, key: str, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise SettingsError(f"{key} from {source} must be true or false, got {value!r}")


def _as_roots(value: object, key: str, source: str) -> tuple[str, ...]:
    """A TOML array of URIs, or one comma-separated string; each must be a strict, normal location."""
    items = [str(v) for v in value] if isinstance(value, list) else str(value).split(",")
    roots = tuple(r.strip() for r in items if r.strip())
    for r in roots:
        try:
            check_table_uri(r)
        except StorageUriError as e:
            raise SettingsError(f"{key} from {source}: {e}") from None
    return roots


def storage_tables(table: Mapping[str, Any], source: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """`[storage]`: string keys are options for every store; a sub-table named by a root URI holds
    the options of the tables under that root."""
    defaults: dict[str, str] = {}
    by_root: dict[str, dict[str, str]] = {}
    for k, v in table.items():
        if isinstance(v, Mapping):
            try:
                check_table_uri(k)
            except StorageUriError as e:
                raise SettingsError(f"[storage.\"{k}\"] in {source}: a sub-table must be named by a root URI: {e}") from None
            by_root[k] = {str(kk): _option_text(vv) for kk, vv in v.items()}
        else:
            defaults[k] = _option_text(v)
    return defaults, by_root


def _check_store_options(coordinator: CoordinatorSettings, config_file: Path | None) -> None:
    """Each object-store root's client is made now (no request is sent), so a misspelt `[storage]` key or
    `--storage-option` is a configuration error at start, not a halted table at its first commit."""
    from deltacoord.storage.options import UnknownStorageOptionError
    from deltacoord.storage.table import StorageConfigError, StorageUriError, TableStorage

    try:
        locations = coordinator.locations()
    except StorageUriError as e:
        raise SettingsError(f"table_roots: {e}") from None
    for root in locations.roots or ():
        if root.kind == "file":
            continue
        try:
            TableStorage(root, locations.options_for(root), fsync=False)
        except UnknownStorageOptionError as e:  # credentials may still come from the environment: not judged here
            where = f"[storage] in {config_file} or --storage-option" if config_file else "--storage-option / [storage]"
            raise SettingsError(f"{e} (from {where}; storage options are delta-rs's names, e.g. AWS_REGION, "
                                "AWS_ENDPOINT_URL, AZURE_STORAGE_ACCOUNT_NAME)") from None
        except StorageConfigError:
            continue  # e.g. credentials missing from the options: the environment may give them when used


def _option_text(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _as_partitions(value: object, key: str, source: str) -> list[int] | None:
    if isinstance(value, list):
        return [_as_int(p, key, source) for p in value]
    text = str(value).strip()
    if not text:
        return None
    return [_as_int(p, key, source) for p in text.split(",")]


def load(config_file: Path | None = None, flags: Mapping[str, object] | None = None, *,
         kafka_pairs: Sequence[str] = (), storage_pairs: Sequence[str] = (),
         environ: Mapping[str, str] | None = None) -> RunSettings:
    """Merge defaults, the file, the environment and the flags (see the module doc).

    `flags` maps `FILE_KEYS` to the values given on the command line (None:
    not given). Without bootstrap servers `coordinator.bootstrap_servers` is
    empty: commands that need Kafka say so themselves.
    """
    env = os.environ if environ is None else environ
    doc = read_config_file(config_file)
    from_file = doc.get("coordinator", {})
    if not isinstance(from_file, Mapping):
        raise SettingsError(f"[coordinator] in {config_file} must be a table")
    unknown = sorted(set(from_file) - set(FILE_KEYS))
    if unknown:
        raise SettingsError(f"unknown [coordinator] key(s) {unknown} in {config_file}; known: {list(FILE_KEYS)}")

    raw: dict[str, tuple[object, str]] = {k: (v, f"the config file {config_file}") for k, v in from_file.items()}
    for key, var in ENV_VARS.items():
        if env.get(var):
            raw[key] = (env[var], f"the environment ({var})")
    for key, value in (flags or {}).items():
        if key not in FILE_KEYS:
            raise SettingsError(f"unknown setting {key!r}")
        if value is not None:
            raw[key] = (value, "the command line")

    def get(key: str) -> tuple[object, str] | None:
        return raw.get(key)

    def text(key: str, default: str) -> str:
        got = get(key)
        return default if got is None else str(got[0])

    def integer(key: str, default: int) -> int:
        got = get(key)
        return default if got is None else _as_int(got[0], key, got[1])

    def number(key: str, default: float) -> float:
        got = get(key)
        return default if got is None else _as_float(got[0], key, got[1])

    def flag(key: str, default: bool) -> bool:
        got = get(key)
        return default if got is None else _as_bool(got[0], key, got[1])

    kafka: dict[str, str] = {}
    from_kafka = doc.get("kafka", {})
    if not isinstance(from_kafka, Mapping):
        raise SettingsError(f"[kafka] in {config_file} must be a table")
    kafka.update(flatten_kafka(from_kafka))
    for k, v in env.items():
        if k.startswith(KAFKA_ENV_PREFIX) and len(k) > len(KAFKA_ENV_PREFIX):
            kafka[k.removeprefix(KAFKA_ENV_PREFIX).lower().replace("_", ".")] = v
    kafka.update(parse_kafka_pairs(kafka_pairs))

    from_storage = doc.get("storage", {})
    if not isinstance(from_storage, Mapping):
        raise SettingsError(f"[storage] in {config_file} must be a table")
    storage_options, by_root = storage_tables(from_storage, f"the config file {config_file}")
    storage_options.update(parse_kafka_pairs(storage_pairs, "--storage-option"))
    roots = get("table_roots")

    prefix = text("topic_prefix", DEFAULT_TOPIC_PREFIX)
    coordinator = CoordinatorSettings(
        bootstrap_servers=text("bootstrap_servers", ""),
        topics=Topics.with_prefix(prefix),
        kafka=kafka,
        group_id=text("group_id", f"{prefix}-coordinator"),
        transactional_id_prefix=text("transactional_id_prefix", f"{prefix}-coordinator"),
        max_batch=integer("max_batch", 500),
        dead_letter_max_bytes=integer("dead_letter_max_bytes", 64 * 1024),
        max_staged_bytes=integer("max_staged_bytes", 1 << 30),
        hold_min_actions=integer("hold_min_actions", 10_000),
        hold_predicate_chars=integer("hold_predicate_chars", 4096),
        hold_runahead=integer("hold_runahead", 0),
        stall_timeout_s=number("stall_seconds", 60.0),
        publish_failing_s=number("publish_failing_seconds", 10.0),
        kafka_unreachable_s=number("kafka_unreachable_seconds", 10.0),
        send_offsets_timeout_s=number("send_offsets_timeout_seconds", 20.0),
        group_offset_interval_s=number("group_offset_seconds", 1.0),
        checkpoint_min_interval_s=number("checkpoint_min_seconds", 1.0),
        checkpoint_after_actions=integer("checkpoint_after_actions", 10_000),
        publish_lanes=integer("publish_lanes", 16),
        decided_ids_limit=integer("decided_ids_limit", 50_000),
        decided_ids_max_age_ms=int(number("decided_ids_max_age_hours", 168.0) * 3600 * 1000),
        state_root=text("state_root", "") or None,
        snapshot_every_records=integer("snapshot_every_records", 10_000),
        table_roots=None if roots is None else _as_roots(roots[0], "table_roots", roots[1]),
        storage_options=storage_options,
        storage_options_by_root=by_root,
    )
    if coordinator.dead_letter_max_bytes < 0:
        raise SettingsError(f"dead_letter_max_bytes must be 0 or more, got {coordinator.dead_letter_max_bytes}")
    if coordinator.max_staged_bytes < 1:
        raise SettingsError(f"max_staged_bytes must be 1 or more, got {coordinator.max_staged_bytes}")
    for key, count, least in (("hold_min_actions", coordinator.hold_min_actions, 1),
                              ("hold_predicate_chars", coordinator.hold_predicate_chars, 0),
                              ("hold_runahead", coordinator.hold_runahead, 0)):
        if count < least:
            raise SettingsError(f"{key} must be {least} or more, got {count}")
    if coordinator.stall_timeout_s <= 0:
        raise SettingsError(f"stall_seconds must be above 0, got {coordinator.stall_timeout_s}")
    for key, value in (("publish_failing_seconds", coordinator.publish_failing_s),
                       ("kafka_unreachable_seconds", coordinator.kafka_unreachable_s),
                       ("send_offsets_timeout_seconds", coordinator.send_offsets_timeout_s)):
        if value <= 0:
            raise SettingsError(f"{key} must be above 0, got {value}")
    if coordinator.group_offset_interval_s < 0:
        raise SettingsError(f"group_offset_seconds must be 0 or more, got {coordinator.group_offset_interval_s}")
    if coordinator.checkpoint_min_interval_s < 0:
        raise SettingsError(f"checkpoint_min_seconds must be 0 or more, got {coordinator.checkpoint_min_interval_s}")
    if coordinator.checkpoint_after_actions < 0:
        raise SettingsError(f"checkpoint_after_actions must be 0 (off) or more, got {coordinator.checkpoint_after_actions}")
    if coordinator.decided_ids_limit < 0 or coordinator.decided_ids_max_age_ms < 0:
        raise SettingsError("decided_ids_limit and decided_ids_max_age_hours must be 0 or more")
    if coordinator.publish_lanes < 1:
        raise SettingsError(f"publish_lanes must be 1 or more, got {coordinator.publish_lanes}")
    if coordinator.snapshot_every_records < 1:
        raise SettingsError(f"snapshot_every_records must be 1 or more, got {coordinator.snapshot_every_records}")
    _check_store_options(coordinator, config_file)
    parts = get("partitions")
    metrics = get("metrics_port")
    watchdog = get("watchdog_seconds")
    watchdog_s = 120.0 if watchdog is None else _as_float(watchdog[0], "watchdog_seconds", watchdog[1])
    return RunSettings(
        coordinator=coordinator,
        topic_prefix=prefix,
        partitions=None if parts is None else _as_partitions(parts[0], "partitions", parts[1]),
        num_partitions=integer("num_partitions", 1),
        metrics_port=None if metrics is None else _as_int(metrics[0], "metrics_port", metrics[1]),
        fsync=flag("fsync", True),
        checkpoints=flag("checkpoints", True),
        watchdog_s=watchdog_s or None,
        log_level=text("log_level", "INFO"),
    )


__all__ = [
    "ENV_VARS",
    "FILE_KEYS",
    "CoordinatorSettings",
    "RunSettings",
    "SettingsError",
    "dead_letter_record_bound",
    "env_var",
    "load",
    "parse_kafka_pairs",
]
