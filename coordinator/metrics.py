"""Prometheus metrics and the `/metrics` + `/healthz` HTTP endpoint."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class TableGauges:
    """What the publisher knows of one table at a scrape (`Publisher.table_gauges`)."""

    table: str
    ratified: int
    published: int
    halted: bool


class _TableCollector(Collector):
    """Per-table gauges read from the publisher when scraped: no work on the deciding path."""

    def __init__(self, tables: Callable[[], Iterable[TableGauges]]) -> None:
        self._tables = tables

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily("deltacoord_table_publish_lag_versions", "Ratified versions of the table not yet in "
                                "its _delta_log", labels=["table"])
        ratified = GaugeMetricFamily("deltacoord_table_ratified_version", "The table's newest version ratified in Kafka",
                                     labels=["table"])
        published = GaugeMetricFamily("deltacoord_table_published_version", "The table's newest version in _delta_log",
                                      labels=["table"])
        halted = GaugeMetricFamily("deltacoord_table_halted", "1 while the table's publication is halted (see "
                                   "`deltacoord table status`)", labels=["table"])
        for t in self._tables():
            lag.add_metric([t.table], 0 if t.halted else max(0, t.ratified - t.published))
            ratified.add_metric([t.table], t.ratified)
            published.add_metric([t.table], t.published)
            halted.add_metric([t.table], 1 if t.halted else 0)
        yield from (lag, ratified, published, halted)


class Metrics:
    """The coordinator's metrics, on a registry of its own (several coordinators per process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._table_collector: _TableCollector | None = None
        r = self.registry
        self.proposals = Counter("deltacoord_proposals_total", "Proposals consumed", ["partition"], registry=r)
        self.commits = Counter("deltacoord_commits_total", "Versions ratified", ["partition"], registry=r)
        self.conflicts = Counter("deltacoord_conflicts_total", "Proposals rejected for a conflict, by Delta exception", ["type"], registry=r)
        self.rejections = Counter("deltacoord_rejections_total", "Proposals rejected as invalid, by reason code", ["reason"], registry=r)
        self.dead_letters = Counter("deltacoord_dead_letters_total", "Undecodable messages sent to the dead-letter topic", registry=r)
        self.coalesced = Counter("deltacoord_coalesced_commits_total",
                                 "Commits that share the version of an earlier commit of their batch (coalescing)", registry=r)
        self.duplicates = Counter("deltacoord_duplicate_proposals_total", "Redelivered proposals answered with their original decision", registry=r)
        self.decision_latency = Histogram(
            "deltacoord_decision_latency_seconds", "From proposal produce time to decision commit in Kafka", registry=r,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
        )
        self.batch_size = Histogram("deltacoord_batch_size", "Proposals decided per Kafka transaction", registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.publish_lag = Gauge("deltacoord_publish_lag_versions", "Ratified versions not yet in _delta_log", registry=r)
        self.checkpoint_duration = Histogram("deltacoord_checkpoint_duration_seconds", "Time to write one checkpoint", registry=r,
                                             buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60))
        self.halted_tables = Gauge("deltacoord_halted_tables", "Tables whose publication is halted", registry=r)
        self.tables = Gauge("deltacoord_tables", "Tables whose state this coordinator holds", registry=r)
        self.holds = Counter("deltacoord_holds_total",
                             "Proposals decided off the deciding thread while their table was held, by why (actions, predicates)",
                             ["why"], registry=r)
        self.transaction_failures = Counter(
            "deltacoord_transaction_failures_total", "Kafka transactions of a batch that failed and were retried", registry=r)
        self.unrecordable = Counter(
            "deltacoord_unrecordable_total",
            "Messages whose answer Kafka refused to record, by what was recorded instead (headers_only: a rejection and a "
            "dead letter without bytes; rejection_only: the rejection alone, the message skipped)", ["step"], registry=r)
        self.table_commits = Counter("deltacoord_table_commits_total", "Versions ratified, per table (its URI)", ["table"],
                                     registry=r)
        self.table_conflicts = Counter("deltacoord_table_conflicts_total",
                                       "Proposals rejected for a conflict, per table and Delta exception", ["table", "type"],
                                       registry=r)
        self.recovery_records = Counter(
            "deltacoord_recovery_records_total", "Commits-topic records read to rebuild table states (at partition take-over)",
            registry=r)


    def watch_tables(self, tables: Callable[[], Iterable[TableGauges]]) -> None:
        """Expose per-table gauges (lag, ratified and published versions, halted) read from `tables` at each scrape
        (the last source given: a coordinator made again with these metrics replaces its predecessor's)."""
        if self._table_collector is not None:
            self.registry.unregister(self._table_collector)
        self._table_collector = _TableCollector(tables)
        self.registry.register(self._table_collector)


class MetricsPortError(OSError):
    """The metrics port cannot be listened on (taken, or not allowed): a configuration error."""


class MetricsServer:
    """Serves `/metrics` (Prometheus text), `/healthz` (readiness, JSON from `health()`) and `/livez` (liveness)."""

    def __init__(self, metrics: Metrics, health: Callable[[], tuple[bool, dict[str, object]]], port: int, host: str = "0.0.0.0") -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    body = generate_latest(registry)
                    self._send(200, CONTENT_TYPE_LATEST, body)
                elif self.path.startswith("/healthz"):
                    ok, detail = health()
                    self._send(200 if ok else 503, "application/json", json.dumps({"ok": ok, **detail}).encode())
                elif self.path.startswith("/livez"):
                    # Liveness: what /healthz said before readiness also covered publication and Kafka (a restart
                    # cures neither a full disk nor a broker outage): 503 only for what a restart may cure.
                    ok, detail = health()
                    live = bool(detail.get("live", ok))
                    self._send(200 if live else 503, "application/json", json.dumps({"ok": ok, **detail}).encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise MetricsPortError(e.errno, f"cannot serve metrics on {host}:{port}: {e.strerror or e}; pick a free "
                                            "port with --metrics-port (or metrics_port in the config file)") from e
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="deltacoord-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
