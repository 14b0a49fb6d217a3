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

from importlib import metadata as _metadata

from reader.log import TableNotFoundError, VersionNotFoundError
from reader.snapshot import Snapshot, UnsupportedTableFeatureError, load_snapshot
from reader.stream import CommitEvent, CommitStream
from schemas.actions import Protocol
from schemas.errors import (
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
from schemas.kafka_logs import UnreachableKafkaError
from schemas.reasons import ReasonCode
from schemas.routing import Topics, grouped_table_id
from writer.client import CoordinatorClient
from writer.constraints import ConstraintViolationError
from writer.multi_table import MultiTableTransaction, TransactionResult, TransactionSpansPartitionsError, transaction
from writer.snapshots import snapshots
from writer.staging import SchemaError
from writer.table import MergeError, PublicationLagError, Table, TableExistsError
from writer.transaction import CommitResult, Transaction, retry

try:
    __version__ = _metadata.version("deltacoord")
except _metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0+unknown"

__all__ = [
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
