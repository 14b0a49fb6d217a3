"""The `deltacoord` Spark sink's options: parsed, named and checked on the driver before anything is staged.

A write fails at once, on the driver, when an option is unknown (with the closest known name as a hint),
when a required one is missing or malformed, or when Kafka or the coordinator's topics cannot be found:
not after the executors staged the data. `bootstrap.servers` and `topic.prefix` default to the driver's
`DELTACOORD_BOOTSTRAP_SERVERS` and `DELTACOORD_TOPIC_PREFIX`, as for the CLI.

Options starting with ``__`` are internal, set by `deltacoord.writer.spark_save_modes` from what PySpark's writers hold
and do not hand to a Python data source: ``__partition_columns`` (`.partitionBy(...)`, a JSON list, the name
Spark's file sources use), ``__save_mode`` (`errorifexists` or `ignore`, which Spark refuses to pass on) and
the calling process's DELTACOORD_* defaults.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import json
import os
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from deltacoord.reader.spark_source import storage_options_of
from deltacoord.schemas import client_settings
from deltacoord.schemas.errors import DeltaCoordError, KafkaAccessDeniedError
from deltacoord.schemas.kafka_logs import KafkaCredentialsError, UnreachableKafkaError, kafka_config, probe
from deltacoord.schemas.routing import Topics
from deltacoord.schemas.signing import resolve_writer_key
from deltacoord.storage.table import TableStorage
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table

BOOTSTRAP_ENV = client_settings.BOOTSTRAP_SERVERS_ENV
TOPIC_PREFIX_ENV = client_settings.TOPIC_PREFIX_ENV
TIMEOUT_ENV = client_settings.TIMEOUT_ENV
DEFAULT_TOPIC_PREFIX = client_settings.DEFAULT_TOPIC_PREFIX
PARTITION_COLUMNS_KEY = "__partition_columns"
SAVE_MODE_KEY = "__save_mode"
#: The DELTACOORD_* defaults of the process that called `save()`/`start()`, carried as internal options.
ENV_DEFAULT_KEYS = {BOOTSTRAP_ENV: "__env_bootstrap_servers", TOPIC_PREFIX_ENV: "__env_topic_prefix",
                    TIMEOUT_ENV: "__env_timeout"}
_INTERNAL_KEYS = frozenset({PARTITION_COLUMNS_KEY, SAVE_MODE_KEY, *ENV_DEFAULT_KEYS.values()})
#: Save modes a batch write may carry in `__save_mode` (append and overwrite are Spark's own flag).
CREATE_MODES = ("errorifexists", "ignore")
#: Namespace of the streaming sink's deterministic proposal ids.
PROPOSAL_NS = uuid.UUID("5b0c3f4e-8a57-4c1e-9d59-2f6c8e0a7d11")

#: Every write option, as documented (matched without regard to case, as Spark does).
WRITE_OPTIONS = (
    "path", "bootstrap.servers", "topic.prefix", "checkpointLocation", "appId", "partitionBy", "replaceWhere",
    "txnAppId", "txnVersion", "decisionTimeoutS", "writerName", "writerKey", "metricsPath",
)
#: Option families: `kafka.<key>` goes to the Kafka client, `storage.<key>` to the table's store (delta-rs's keys).
WRITE_OPTION_PREFIXES = ("kafka.", "storage.")
#: Delta Lake write options the sink does not take, and why (named rather than reported as unknown).
UNSUPPORTED_DELTA_OPTIONS = {
    "mergeschema": "schema evolution on write is not supported: add the columns first (Table.add_columns)",
    "overwriteschema": "changing a table's schema or partitioning on overwrite is not supported: write a new table",
    "partitionoverwritemode": "dynamic partition overwrite is not supported: use replaceWhere with mode('overwrite')",
    "usermetadata": "commitInfo.userMetadata is not supported",
    "maxrecordsperfile": "files hold up to a million rows per task; the option is not supported",
    "datachange": "dataChange=false writes are not supported (Table.optimize rewrites files)",
    "optimizewrite": "optimized writes are not supported (Table.optimize compacts files)",
}
_HOST_PORT = re.compile(r"^(?:[A-Za-z_]+://)?(?:\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d{1,5})$")


class SinkConfigError(DeltaCoordError, ValueError):
    """An option the sink needs is missing or wrong, or names something that does not exist."""


_CLIENTS: dict[tuple[str, Topics, tuple[tuple[str, str], ...]], CoordinatorClient] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(servers: str, topics: Topics, kafka: Mapping[str, Any]) -> CoordinatorClient:
    """One coordinator client per Kafka settings in this process, kept across commits: Spark runs every
    micro-batch's driver-side commit in the same Python worker, and a new client spends its first commit on
    start-up (its Kafka clients, reply partition lease and coordinator check, 150 to 300 ms) where a kept one
    has a reply partition and a trusted check already. Closed when the process exits."""
    key = (servers, topics, tuple(sorted((k, str(v)) for k, v in kafka.items())))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            if not _CLIENTS:
                atexit.register(_close_clients)
            client = _CLIENTS[key] = CoordinatorClient(servers, topics=topics, **kafka)
        return client


def _close_clients() -> None:
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()


def _path_of(location: str) -> Path:
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    return Path(location)


def check_option_names(options: Mapping[str, str], extra: frozenset[str] = frozenset()) -> None:
    """Refuse an option the sink does not know, naming the closest known one (`extra`: lower-case names a subclass adds)."""
    known = {n.lower(): n for n in WRITE_OPTIONS}
    for key in options:
        k = key.lower()
        if k in known or k in extra or k in _INTERNAL_KEYS:
            continue
        if any(k.startswith(p) and len(k) > len(p) for p in WRITE_OPTION_PREFIXES):
            continue
        if k in UNSUPPORTED_DELTA_OPTIONS:
            raise SinkConfigError(f"option {key!r} is a Delta Lake option the deltacoord sink does not take: "
                                  f"{UNSUPPORTED_DELTA_OPTIONS[k]}")
        close = difflib.get_close_matches(k, [*known, *(p + "<key>" for p in WRITE_OPTION_PREFIXES)], n=1, cutoff=0.6)
        hint = f"did you mean {known.get(close[0], close[0])!r}? " if close else ""
        raise SinkConfigError(f"unknown option {key!r} for the deltacoord sink; {hint}known options: "
                              f"{', '.join(WRITE_OPTIONS)}, kafka.<key>, storage.<key>")


def check_bootstrap_servers(value: str) -> None:
    """`host:port[,host:port...]`, else a SinkConfigError saying what is wrong."""
    entries = [e.strip() for e in value.split(",")]
    for e in entries:
        m = _HOST_PORT.match(e)
        if not e or m is None or not 0 < int(m.group(1)) < 65536:
            raise SinkConfigError(f"option 'bootstrap.servers' is {value!r}: {e!r} is not host:port "
                                  "(e.g. 127.0.0.1:19092; several are comma-separated)")


def _partition_by(o: Mapping[str, str]) -> tuple[str, ...]:
    """`.option("partitionBy", "a,b")` and `.partitionBy("a", "b")` (as `__partition_columns`); they must agree."""
    from_option = tuple(c.strip() for c in (o.get("partitionby") or "").split(",") if c.strip())
    raw = o.get(PARTITION_COLUMNS_KEY)
    if raw is None:
        return from_option
    try:
        cols = json.loads(raw)
    except json.JSONDecodeError:
        cols = None
    if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols):
        raise SinkConfigError(f"option {PARTITION_COLUMNS_KEY!r} is {raw!r}, not a JSON list of column names")
    if from_option and tuple(cols) != from_option:
        raise SinkConfigError(f".partitionBy({', '.join(map(repr, cols))}) and option partitionBy={o['partitionby']!r} "
                              "disagree: give one of them")
    return tuple(cols)


def _default(o: Mapping[str, str], env: Mapping[str, str], var: str) -> str | None:
    """A DELTACOORD_* default: the calling process's (carried as an option), else this process's."""
    return o.get(ENV_DEFAULT_KEYS[var]) or env.get(var)


@dataclass(frozen=True)
class SinkOptions:
    """Parsed write options (picklable; travels to executors and commit workers)."""

    uri: str
    bootstrap_servers: str | None
    topic_prefix: str
    checkpoint: str | None
    app_id_option: str | None
    partition_by: tuple[str, ...]
    replace_where: str | None
    txn_app_id: str | None
    txn_version: int | None
    decision_timeout_s: float
    writer_name: str | None
    writer_key: str | None
    metrics_path: str | None
    kafka: tuple[tuple[str, str], ...]
    #: The table's storage options (`storage.<key>` options, delta-rs's keys).
    storage_options: tuple[tuple[str, str], ...] = ()
    #: `errorifexists` or `ignore` when PySpark's writer asked for them; None for append and overwrite.
    save_mode: str | None = None

    @staticmethod
    def parse(options: Mapping[str, str], env: Mapping[str, str] | None = None) -> SinkOptions:
        """The options as given, with `bootstrap.servers` and `topic.prefix` from `env` (default: this process's) when absent."""
        env = os.environ if env is None else env
        o = {k.lower(): v for k, v in options.items()}
        path = o.get("path")
        if not path:
            raise SinkConfigError("the deltacoord sink needs a table path: .save(path), .start(path) or .option('path', ...)")
        tv = o.get("txnversion")
        if (o.get("txnappid") is None) != (tv is None):
            raise SinkConfigError("options txnAppId and txnVersion go together (an idempotent write names both)")
        try:
            txn_version = int(tv) if tv is not None else None
            timeout = float(o.get("decisiontimeouts") or _default(o, env, TIMEOUT_ENV) or client_settings.DEFAULT_TIMEOUT_S)
        except ValueError as e:
            raise SinkConfigError(f"option txnVersion must be an integer and decisionTimeoutS (or {TIMEOUT_ENV}) a number "
                                  f"of seconds: {e}") from None
        if timeout <= 0:
            raise SinkConfigError(f"option decisionTimeoutS must be positive, not {timeout}")
        mode = o.get(SAVE_MODE_KEY)
        if mode is not None and mode not in CREATE_MODES:
            raise SinkConfigError(f"option {SAVE_MODE_KEY} is {mode!r}; it is one of {', '.join(CREATE_MODES)}")
        storage_options = storage_options_of(options)
        storage = TableStorage(path, storage_options, fsync=False)
        return SinkOptions(
            uri=storage.local_path() if storage.is_local else storage.location,
            bootstrap_servers=(o.get("bootstrap.servers") or o.get("kafka.bootstrap.servers") or _default(o, env, BOOTSTRAP_ENV)
                               or None),
            topic_prefix=o.get("topic.prefix") or _default(o, env, TOPIC_PREFIX_ENV) or DEFAULT_TOPIC_PREFIX,
            checkpoint=o.get("checkpointlocation"),
            app_id_option=o.get("appid"),
            partition_by=_partition_by(o),
            replace_where=o.get("replacewhere"),
            txn_app_id=o.get("txnappid"),
            txn_version=txn_version,
            decision_timeout_s=timeout,
            writer_name=o.get("writername"),
            writer_key=o.get("writerkey"),
            metrics_path=o.get("metricspath"),
            kafka=tuple(sorted((k[len("kafka."):], v) for k, v in o.items()
                               if k.startswith("kafka.") and k != "kafka.bootstrap.servers")),
            storage_options=tuple(sorted(storage_options.items())),
            save_mode=mode,
        )

    @property
    def root(self) -> TableStorage:
        """The table's storage (built in the process that asks: obstore does not travel)."""
        return TableStorage(self.uri, dict(self.storage_options), fsync=False)

    @property
    def topics(self) -> Topics:
        return Topics.with_prefix(self.topic_prefix)

    def servers(self) -> str:
        """`bootstrap.servers`, checked for form; SinkConfigError when it is missing or malformed."""
        if not self.bootstrap_servers:
            raise SinkConfigError(f"the deltacoord sink needs option 'bootstrap.servers' (the Kafka cluster of the "
                                  f"coordinator), e.g. .option('bootstrap.servers', '127.0.0.1:19092'), or {BOOTSTRAP_ENV} "
                                  "set for the driver")
        check_bootstrap_servers(self.bootstrap_servers)
        return self.bootstrap_servers

    def check_kafka(self, timeout_s: float = 8.0) -> None:
        """Kafka answers at `bootstrap.servers` and holds the coordinator's proposals topic (seconds at most)."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient

        servers = self.servers()
        conf: dict[str, Any] = {**dict(self.kafka), "bootstrap.servers": servers}
        try:
            probe(conf, timeout_s)
            admin = AdminClient(kafka_config(conf))
            topics = admin.list_topics(timeout=timeout_s).topics
        except KafkaCredentialsError as e:
            raise SinkConfigError(f"{e} (the options kafka.sasl.username / kafka.sasl.password)") from None
        except (UnreachableKafkaError, KafkaException) as e:
            why = str(e).split(". Check --bootstrap-servers")[0]
            raise SinkConfigError(f"option 'bootstrap.servers': {why}. Check the option (or {BOOTSTRAP_ENV}) and that "
                                  "the brokers run; `deltacoord broker start` runs a local one") from None
        proposals = self.topics.proposals
        if proposals not in topics:
            # With an authorizer, a topic no ACL lets this principal describe is left out of the listing.
            with contextlib.suppress(KafkaException):
                t = admin.list_topics(proposals, timeout=timeout_s).topics.get(proposals)
                if t is not None and t.error is not None and t.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise SinkConfigError(str(KafkaAccessDeniedError(conf, "DESCRIBE", f"topic {proposals}")))
            raise SinkConfigError(f"Kafka at {servers} has no topic {proposals}: check option 'topic.prefix' (now "
                                  f"{self.topic_prefix!r}; or {TOPIC_PREFIX_ENV}) and that a coordinator runs "
                                  "(`deltacoord coordinator run` creates its topics)")

    def table(self) -> Table:
        """The table, with this Python worker's client of these Kafka settings (`shared_client`)."""
        key = resolve_writer_key(self.writer_key)
        return Table(self.uri, client=shared_client(self.servers(), self.topics, dict(self.kafka)),
                     writer_name=self.writer_name or (None if key is not None else "spark"), writer_key=key,
                     decision_timeout_s=self.decision_timeout_s, storage_options=dict(self.storage_options))

    def app_id(self) -> str:
        """The streaming query's app id: option, else Spark's query id from the checkpoint, else a hash of its path."""
        if self.app_id_option:
            return self.app_id_option
        if not self.checkpoint:
            raise SinkConfigError("a streaming write to deltacoord needs option 'checkpointLocation' (or 'appId')")
        ckpt = _path_of(self.checkpoint)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, IndexError):
            first = (ckpt / "metadata").read_text().splitlines()[0]
            qid = json.loads(first)["id"]
            if isinstance(qid, str) and qid:
                return qid
        return str(uuid.uuid5(PROPOSAL_NS, str(ckpt.resolve())))

    def proposal_id(self, table_id: str, app_id: str, batch_id: int, read_version: int) -> str:
        """Deterministic per (table, app id, batch, checkpoint, read version): a batch re-run on the same snapshot
        is the same proposal (answered with its first decision). The coordinator decides each proposal id once,
        so a re-run after a rejection must read a newer snapshot to be decided again; the batch's SetTransaction
        keeps a re-run from committing twice whatever its id."""
        ckpt = str(_path_of(self.checkpoint).resolve()) if self.checkpoint else ""
        return str(uuid.uuid5(PROPOSAL_NS, f"{table_id}\x00{app_id}\x00{batch_id}\x00{ckpt}\x00{read_version}"))


__all__ = [
    "BOOTSTRAP_ENV",
    "CREATE_MODES",
    "ENV_DEFAULT_KEYS",
    "PARTITION_COLUMNS_KEY",
    "SAVE_MODE_KEY",
    "TOPIC_PREFIX_ENV",
    "UNSUPPORTED_DELTA_OPTIONS",
    "WRITE_OPTIONS",
    "SinkConfigError",
    "SinkOptions",
    "check_bootstrap_servers",
    "check_option_names",
]
