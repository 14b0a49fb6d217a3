"""What a scan with a condition reads: partition pruning by the coordinator's matcher, then min/max skipping."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from deltacoord.schemas.actions import AddFile, Metadata
from deltacoord.schemas.expressions.partitions import prune
from deltacoord.schemas.expressions.stats import skip_files, stats_keys


def files_read(files: Sequence[AddFile], where: str | None, metadata: Metadata, schema: pa.Schema) -> list[AddFile]:
    """The files a scan with condition `where` (None: everything) must read, in order.

    A DELETE, UPDATE or MERGE declares exactly these as read: every file that
    can hold a matching row is among them, and each lies in a partition the
    coordinator's append check matches.
    """
    pruned = prune(files, where, metadata, lambda a: a.partition_values)
    return skip_files(pruned, where, schema, metadata.partition_columns, stats_keys(metadata))


__all__ = ["files_read"]
