"""deltacoord: Delta Lake tables whose commits are decided by a coordinator on Apache Kafka.

The front door for users, as `deltalake` is for delta-rs:

    import deltacoord

    t = deltacoord.Table("/data/sales", bootstrap_servers="127.0.0.1:19092")  # or DELTACOORD_BOOTSTRAP_SERVERS
    t.append(batch)
    deltacoord.retry(lambda: t.delete("id = 1"))
    snap = deltacoord.Snapshot.load("/data/sales")
    for event in deltacoord.CommitStream("/data/sales", "127.0.0.1:19092"): ...

Conflicts are Delta's exceptions (`deltacoord.ConcurrentAppendException`, ...);
an invalid proposal is `deltacoord.InvalidProposalError` with a
`deltacoord.ReasonCode`. The Spark data source and sink need the `spark` extra
(`pip install deltacoord[spark]`): `deltacoord.spark.session()` starts a session with it and Delta Lake,
`deltacoord.spark.register(spark)` adds it to another.
"""

from __future__ import annotations

from importlib import import_module as _import_module
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltacoord.reader.log import TableNotFoundError, VersionNotFoundError
    from deltacoord.reader.snapshot import Snapshot, UnsupportedTableFeatureError, load_snapshot
    from deltacoord.reader.stream import CommitEvent, CommitStream
    from deltacoord.schemas.actions import Protocol
    from deltacoord.schemas.errors import (
        ClientClosedError,
        CommitOutcomeUnknownError,
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentJobException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        DeltaCoordError,
        InvalidProposalError,
        MetadataChangedException,
        NoCoordinatorError,
        ProposalNotSentError,
        ProtocolChangedException,
        TopicNotFoundError,
    )
    from deltacoord.schemas.kafka_logs import UnreachableKafkaError
    from deltacoord.schemas.reasons import ReasonCode
    from deltacoord.schemas.routing import Topics, grouped_table_id
    from deltacoord.writer.client import CoordinatorClient
    from deltacoord.writer.constraints import ConstraintViolationError
    from deltacoord.writer.merge import TableMerger
    from deltacoord.writer.multi_table import (
        MultiTableTransaction,
        TransactionResult,
        TransactionSpansPartitionsError,
        transaction,
    )
    from deltacoord.writer.snapshots import snapshots
    from deltacoord.writer.staging import SchemaError
    from deltacoord.writer.table import MergeError, PublicationLagError, Table, TableExistsError
    from deltacoord.writer.transaction import CommitResult, Transaction, retry

try:
    __version__ = _metadata.version("deltacoord")
except _metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0+unknown"

# The front door's names load when first used: every module of the project lives under this package, so its
# `__init__` runs before any of them, and the coordinator's processes must not pay for the writer and Arrow.
_LAZY: dict[str, str] = {
    "ClientClosedError": "deltacoord.schemas.errors",
    "CommitEvent": "deltacoord.reader.stream",
    "CommitOutcomeUnknownError": "deltacoord.schemas.errors",
    "CommitResult": "deltacoord.writer.transaction",
    "CommitStream": "deltacoord.reader.stream",
    "ConcurrentAppendException": "deltacoord.schemas.errors",
    "ConcurrentDeleteDeleteException": "deltacoord.schemas.errors",
    "ConcurrentDeleteReadException": "deltacoord.schemas.errors",
    "ConcurrentJobException": "deltacoord.schemas.errors",
    "ConcurrentTransactionException": "deltacoord.schemas.errors",
    "ConcurrentWriteException": "deltacoord.schemas.errors",
    "ConstraintViolationError": "deltacoord.writer.constraints",
    "CoordinatorClient": "deltacoord.writer.client",
    "DeltaConcurrentModificationException": "deltacoord.schemas.errors",
    "DeltaCoordError": "deltacoord.schemas.errors",
    "InvalidProposalError": "deltacoord.schemas.errors",
    "MergeError": "deltacoord.writer.table",
    "MetadataChangedException": "deltacoord.schemas.errors",
    "MultiTableTransaction": "deltacoord.writer.multi_table",
    "NoCoordinatorError": "deltacoord.schemas.errors",
    "ProposalNotSentError": "deltacoord.schemas.errors",
    "Protocol": "deltacoord.schemas.actions",
    "ProtocolChangedException": "deltacoord.schemas.errors",
    "PublicationLagError": "deltacoord.writer.table",
    "ReasonCode": "deltacoord.schemas.reasons",
    "SchemaError": "deltacoord.writer.staging",
    "Snapshot": "deltacoord.reader.snapshot",
    "Table": "deltacoord.writer.table",
    "TableExistsError": "deltacoord.writer.table",
    "TableMerger": "deltacoord.writer.merge",
    "TableNotFoundError": "deltacoord.reader.log",
    "TopicNotFoundError": "deltacoord.schemas.errors",
    "Topics": "deltacoord.schemas.routing",
    "Transaction": "deltacoord.writer.transaction",
    "TransactionResult": "deltacoord.writer.multi_table",
    "TransactionSpansPartitionsError": "deltacoord.writer.multi_table",
    "UnreachableKafkaError": "deltacoord.schemas.kafka_logs",
    "UnsupportedTableFeatureError": "deltacoord.reader.snapshot",
    "VersionNotFoundError": "deltacoord.reader.log",
    "grouped_table_id": "deltacoord.schemas.routing",
    "load_snapshot": "deltacoord.reader.snapshot",
    "retry": "deltacoord.writer.transaction",
    "snapshots": "deltacoord.writer.snapshots",
    "transaction": "deltacoord.writer.multi_table",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'deltacoord' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ClientClosedError",
    "CommitEvent",
    "CommitOutcomeUnknownError",
    "CommitResult",
    "CommitStream",
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentJobException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "ConstraintViolationError",
    "CoordinatorClient",
    "DeltaConcurrentModificationException",
    "DeltaCoordError",
    "InvalidProposalError",
    "MergeError",
    "MetadataChangedException",
    "MultiTableTransaction",
    "NoCoordinatorError",
    "ProposalNotSentError",
    "Protocol",
    "ProtocolChangedException",
    "PublicationLagError",
    "ReasonCode",
    "SchemaError",
    "Snapshot",
    "Table",
    "TableExistsError",
    "TableMerger",
    "TableNotFoundError",
    "TopicNotFoundError",
    "Topics",
    "Transaction",
    "TransactionResult",
    "TransactionSpansPartitionsError",
    "UnreachableKafkaError",
    "UnsupportedTableFeatureError",
    "VersionNotFoundError",
    "__version__",
    "grouped_table_id",
    "load_snapshot",
    "retry",
    "snapshots",
    "transaction",
]
