"""Row-level concurrency on deletion-vector tables: pure rules, no I/O.

The seed documents' "write conflicts with row-level concurrency": on a table
with deletion vectors enabled and no partition columns, DELETE, UPDATE and
MERGE that change different rows of the same file do not conflict.

What a transaction changed is in its proposal: a deletion-vector update of a
file is a `remove`/`add` pair with the same path, the remove carrying the
vector the writer read and the add the new one; the rows it newly deleted
(deleted or updated rows: an UPDATE rewrites its rows to new files) are the
new vector minus the old. Inline vectors (`i`) are decoded here; a vector in a
file would need I/O, so such an update falls back to the file-level rules.
The writer keeps vectors inline up to `deltacoord.schemas.deletion_vectors.DEFAULT_INLINE_MAX_BYTES`.

When a winner and the current transaction both replaced the vector of one
file and their changed rows are disjoint, the current transaction is rebased:
its remove names the winner's vector and its add carries the union, inline.
Rows the winner's UPDATE or MERGE wrote to new files are matched against the
current transaction's read predicates by the files' min/max statistics
(`deltacoord.schemas.expressions.stats`), so a concurrent change of other rows does not
conflict while one whose new rows the current transaction would have read does.
A file the current transaction only read selected none of its rows, so a
winner changing or removing it does not conflict either.

The seeds' limits: a transaction whose conditions are complex (a subquery, a
non-deterministic or any other function, a nested field, a column that is not
a top-level primitive) may select different rows once other rows change, so it
keeps the file-level rules (`simple_conditions`; which conditions are simple
is `deltacoord.schemas.expressions.syntax.is_simple_condition`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from deltacoord.schemas.actions import Action, AddFile, DeletionVector, Metadata, RemoveFile
from deltacoord.schemas.deletion_vectors import DeletionVectorError, inline_rows
from deltacoord.schemas.expressions.syntax import ExpressionError, is_simple_condition
from deltacoord.schemas.expressions.types import STATS_TYPES
from deltacoord.schemas.properties import TableProperties

if TYPE_CHECKING:
    import pyarrow as pa

Rows = npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True)
class DvUpdate:
    """One file's deletion vector replaced in a commit: `remove` (old vector) and `add` (new vector)."""

    remove: RemoveFile
    add: AddFile

    @property
    def path(self) -> str:
        return self.add.path

    @property
    def old(self) -> DeletionVector | None:
        return self.remove.deletion_vector

    @property
    def new(self) -> DeletionVector:
        assert self.add.deletion_vector is not None
        return self.add.deletion_vector


def deletion_vector_table(metadata: Metadata | None) -> bool:
    """Deletion vectors are enabled: compactions do not conflict with row changes (`deltacoord.coordinator.rules.compaction`)."""
    return metadata is not None and TableProperties.of(metadata).deletion_vectors


def row_level_table(metadata: Metadata | None) -> bool:
    """Row-level concurrency applies: deletion vectors enabled and no partition columns (the seeds' first case)."""
    return metadata is not None and not metadata.partition_columns and deletion_vector_table(metadata)


def dv_updates(actions: Iterable[Action]) -> dict[str, DvUpdate]:
    """The deletion-vector updates of a commit, by path: a remove and an add of one path, the add with a vector."""
    removes: dict[str, RemoveFile] = {}
    adds: dict[str, AddFile] = {}
    for a in actions:
        if isinstance(a, RemoveFile):
            removes[a.path] = a
        elif isinstance(a, AddFile) and a.deletion_vector is not None:
            adds[a.path] = a
    return {p: DvUpdate(removes[p], add) for p, add in adds.items() if p in removes}


def decoded(dv: DeletionVector | None) -> Rows | None:
    """The rows a vector marks (none for no vector); None when it is not inline or does not decode."""
    if dv is None:
        return np.zeros(0, dtype=np.uint64)
    if dv.storage_type != "i":
        return None
    try:
        return inline_rows(dv)
    except (DeletionVectorError, struct.error, TypeError, IndexError, OverflowError):
        return None  # bytes that are no bitmap (a writer's bad input): the file-level rules then apply


def changed_rows(update: DvUpdate) -> Rows | None:
    """Rows the update newly deleted (new vector minus old); None when a vector is not inline (or does not
    decode) or the new vector drops a row of the old, which sends the file back to the file-level rules."""
    old, new = decoded(update.old), decoded(update.new)
    if old is None or new is None or len(np.setdiff1d(old, new, assume_unique=True)):
        return None
    return np.setdiff1d(new, old, assume_unique=True)


def same_vector(a: DeletionVector | None, b: DeletionVector | None) -> bool:
    return (a.unique_id() if a else None) == (b.unique_id() if b else None)


def loose_stats(stats: str | None) -> str | None:
    """A file's stats once rows of it are deleted by a vector: min/max may no longer be reached (`tightBounds`)."""
    if stats is None:
        return None
    try:
        d = json.loads(stats)
    except ValueError:
        return stats
    if not isinstance(d, dict):
        return stats
    d["tightBounds"] = False
    return json.dumps(d, separators=(",", ":"))


@dataclass(slots=True)
class Change:
    """One file's rows changed by the transaction being checked, as rebased so far: `remove` names the file's
    live vector, `add` re-adds it with the new one (None: the whole file is removed)."""

    remove: RemoveFile
    add: AddFile | None
    _rows: Rows | None = None
    _decoded: bool = False

    @property
    def rows(self) -> Rows | None:
        """The rows newly deleted; None when not known without I/O (or the whole file is removed). Decoded
        on first use: only a proposal that meets a winner changing the same file pays for it."""
        if not self._decoded:
            self._rows = changed_rows(DvUpdate(self.remove, self.add)) if self.add is not None else None
            self._decoded = True
        return self._rows

    @rows.setter
    def rows(self, value: Rows | None) -> None:
        self._rows, self._decoded = value, True


def changes_of(actions: Sequence[Action]) -> dict[str, Change]:
    """The data-changing file actions of a proposal that row-level rules can rebase, by path: deletion-vector
    updates, and removes of a whole file (dataChange=true, the path not added again)."""
    updates = dv_updates(actions)
    added = {a.path for a in actions if isinstance(a, AddFile)}
    out: dict[str, Change] = {}
    for a in actions:
        if not isinstance(a, RemoveFile) or a.path in out:
            continue
        u = updates.get(a.path)
        if u is not None:
            out[a.path] = Change(u.remove, u.add)
        elif a.data_change and a.path not in added:
            out[a.path] = Change(a, None)
    return out


def stats_columns(metadata: Metadata) -> list[str]:
    """The top-level columns whose min/max statistics compare (`types.STATS_TYPES`): a condition on any other
    column cannot skip a file."""
    return [f["name"] for f in metadata.schema().get("fields", [])
            if isinstance(f.get("type"), str) and f["type"] in STATS_TYPES]


def simple_conditions(predicates: Sequence[str], metadata: Metadata) -> bool:
    """Every read predicate is a simple condition (`syntax.is_simple_condition`) on top-level primitive columns
    (the seeds' limits of row-level concurrency: complex types, non-deterministic expressions and subqueries
    keep the file-level rules)."""
    columns = stats_columns(metadata)
    return all(is_simple_condition(text, columns) for text in predicates)


def _stats_schema(metadata: Metadata) -> pa.Schema:
    """The Arrow schema of `stats_columns`.

    Arrow is imported here, not at module level: the deciding process loads it only for row-level tables.
    """
    import pyarrow as pa

    from deltacoord.schemas.arrow_types import delta_to_arrow

    types = {f["name"]: f["type"] for f in metadata.schema().get("fields", [])}
    return pa.schema([pa.field(n, delta_to_arrow(types[n])) for n in stats_columns(metadata)])


class NewRowMatcher:
    """Whether files a winner added may hold rows the current transaction's read predicates select (stats)."""

    def __init__(self, predicates: Sequence[str], metadata: Metadata) -> None:
        self.tests: list[Callable[[AddFile], bool]] = []
        self.everything = not predicates
        if self.everything:
            return
        from deltacoord.schemas.expressions.stats import file_filter, stats_keys  # Arrow, only for row-level tables

        try:
            schema = _stats_schema(metadata)
            keys = stats_keys(metadata)
            self.tests = [file_filter(p, schema, metadata.partition_columns, keys) for p in predicates]
        except (ExpressionError, ValueError, KeyError, TypeError):
            self.everything = True  # a condition the stats cannot judge: every new file may match

    def first_match(self, files: Iterable[AddFile]) -> AddFile | None:
        for f in files:
            if self.everything or any(t(f) for t in self.tests):
                return f
        return None


__all__ = ["Change", "DvUpdate", "NewRowMatcher", "changed_rows", "changes_of", "decoded", "deletion_vector_table", "dv_updates",
           "loose_stats", "row_level_table", "same_vector", "simple_conditions", "stats_columns"]
