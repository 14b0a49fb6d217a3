"""Writers: the batch client that stages data and proposes commits.

    from writer import Table, retry

The names are loaded on first use, so `import writer.staging` stays light.
The Spark sink (`writer.spark_sink`) needs the `spark` extra and is never
imported from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from writer.client import CoordinatorClient
    from writer.table import MergeError, PublicationLagError, Table, TableExistsError
    from writer.transaction import CommitResult, Transaction, retry

_PUBLIC = {
    "Table": "writer.table",
    "TableExistsError": "writer.table",
    "MergeError": "writer.table",
    "PublicationLagError": "writer.table",
    "Transaction": "writer.transaction",
    "CommitResult": "writer.transaction",
    "retry": "writer.transaction",
    "CoordinatorClient": "writer.client",
}

__all__ = ["CommitResult", "CoordinatorClient", "MergeError", "PublicationLagError", "Table", "TableExistsError",
           "Transaction", "retry"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'writer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
