"""Several coordinated tables written per Spark micro-batch, exactly once, with `foreachBatch`.

    writer = deltacoord.spark.MultiTableBatchWriter(
        {"/lake/orders": lambda df: df.where("kind = 'order'"), "/lake/totals": totals_of},
        app_id="orders-pipeline", bootstrap_servers="127.0.0.1:19092")
    stream.writeStream.foreachBatch(writer).option("checkpointLocation", ...).start()

Each micro-batch is one multi-table transaction (`deltacoord.writer.multi_table`): every table's rows, each part with
Delta's `txn(appId, batchId)`, so all tables take the batch or none. A batch Spark replays after a restart (it
committed, but the query died before Spark's commit log recorded it) finds its app version recorded in the
tables and writes nothing; the transaction id derives from the app id and batch id, so a replay of a batch
whose outcome was unknown is answered with its first decisions. Each table's rows are collected to the driver
as Arrow (`DataFrame.toArrow`): meant for micro-batches that fit the driver's memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deltacoord.schemas.routing import Topics
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.multi_table import MultiTableTransaction, TransactionResult
from deltacoord.writer.table import Table

#: Namespace of the transaction ids derived from (app id, batch id).
_BATCH_IDS = uuid.UUID("0e6c3d52-8d7b-4a57-bb1e-5a1f0c9d2e73")


class MultiTableBatchWriter:
    """A `foreachBatch` function writing each micro-batch to several tables in one transaction, exactly once.

    `targets` maps each table (a location, or a `Table`) to the function selecting its rows from the batch
    (None: the batch as it is); `app_id` names the query for Delta's `txn` (keep it across restarts)."""

    def __init__(self, targets: Mapping[str | Path | Table, Callable[[Any], Any] | None], app_id: str,
                 bootstrap_servers: str | None = None, *, topics: Topics | None = None, topic_prefix: str | None = None,
                 table_ids: Mapping[str, str] | None = None, storage_options: Mapping[str, str] | None = None,
                 decision_timeout_s: float | None = None, **kafka_config: Any) -> None:
        if not targets:
            raise ValueError("give at least one target table")
        if not app_id or not app_id.strip():
            raise ValueError("app_id must name the query (the same across its restarts), e.g. 'orders-pipeline'")
        self.app_id = app_id
        self.client = CoordinatorClient(bootstrap_servers, topics=topics, topic_prefix=topic_prefix, relay="",
                                        **kafka_config)
        ids = dict(table_ids or {})
        self.targets: list[tuple[Table, Callable[[Any], Any] | None]] = []
        for where, select in targets.items():
            t = where if isinstance(where, Table) else Table(where, table_id=ids.get(str(where)), client=self.client,
                                                              storage_options=storage_options,
                                                              decision_timeout_s=decision_timeout_s)
            self.targets.append((t, select))
        self.decision_timeout_s = decision_timeout_s
        #: What the last batch committed (empty when it had been written before).
        self.last: TransactionResult | None = None

    def transaction_id(self, batch_id: int) -> str:
        return str(uuid.uuid5(_BATCH_IDS, f"{self.app_id}\n{batch_id}"))

    def __call__(self, batch: Any, batch_id: int) -> None:
        tx = MultiTableTransaction(client=self.client, transaction_id=self.transaction_id(batch_id),
                                   decision_timeout_s=self.decision_timeout_s)
        with tx:
            for table, select in self.targets:
                rows = (select(batch) if select is not None else batch).toArrow()
                tx.table(table).append(rows, app_id=self.app_id, app_version=batch_id)
        self.last = tx.commit_result

    def close(self) -> None:
        self.client.close()


__all__ = ["MultiTableBatchWriter"]
