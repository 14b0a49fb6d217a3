"""The one SQL expression engine: a parser, typing rules, and an evaluator per use.

* `syntax` -- the sqlglot parser (Spark dialect, bounded input), literals, conjuncts,
  which conjuncts may prune by partition, MERGE conditions;
* `types` -- value categories, text to typed values, literal coercion (Spark's implicit casts);
* `partitions` -- partition rows: the coordinator's append matching and the writer's pruning;
* `arrow` -- Arrow compute expressions: a writer's WHERE/SET/MERGE and a reader's filters;
* `stats` -- min/max data skipping.

`files_read` is what a DELETE or UPDATE with a condition scans: the files the
coordinator's matcher cannot rule out by partition, less those whose stats
prove no row matches. So the files a writer declares as read always include
every file that can hold a matching row, and lie in partitions the
coordinator's append check guards.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from schemas.actions import AddFile, Metadata
from schemas.expressions.partitions import prune
from schemas.expressions.stats import skip_files
from schemas.expressions.syntax import ExpressionError


def files_read(files: Sequence[AddFile], where: str | None, metadata: Metadata, schema: pa.Schema) -> list[AddFile]:
    """The files a scan with condition `where` (None: everything) must read, in order."""
    pruned = prune(files, where, metadata, lambda a: a.partition_values)
    return skip_files(pruned, where, schema, metadata.partition_columns)


__all__ = ["ExpressionError", "files_read"]
