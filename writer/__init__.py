"""Writers: the batch client that stages data and proposes commits.

    from deltacoord.writer import Table, retry

The names are loaded on first use, so `import deltacoord.writer.staging` stays light.
The Spark sink (`deltacoord.writer.spark_sink`) needs the `spark` extra and is never
imported from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltacoord.writer.client import CoordinatorClient
    from deltacoord.writer.merge import TableMerger
    from deltacoord.writer.table import MergeError, PublicationLagError, Table, TableExistsError
    from deltacoord.writer.transaction import CommitResult, Transaction, retry

_PUBLIC = {
    "Table": "deltacoord.writer.table",
    "TableExistsError": "deltacoord.writer.table",
    "TableMerger": "deltacoord.writer.merge",
    "MergeError": "deltacoord.writer.table",
    "PublicationLagError": "deltacoord.writer.table",
    "Transaction": "deltacoord.writer.transaction",
    "CommitResult": "deltacoord.writer.transaction",
    "retry": "deltacoord.writer.transaction",
    "CoordinatorClient": "deltacoord.writer.client",
}

__all__ = ["CommitResult", "CoordinatorClient", "MergeError", "PublicationLagError", "Table", "TableExistsError",
           "TableMerger", "Transaction", "retry"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'writer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
