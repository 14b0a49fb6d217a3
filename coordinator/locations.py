"""Where this coordinator may keep tables, and how it reaches them.

`TableLocations` is built from the settings `table_roots` and the `[storage]`
options. It answers two questions:

* `problem(table_uri)`: may a proposal name this table at all? Asked at the
  door, before anything is decided (`deltacoord.coordinator.kafka.door`). The URI must
  be an absolute, normal location (`deltacoord.storage.uri.check_table_uri`: no
  `..`, no percent-encoded separators, no relative path, no NUL) and lie under
  one of the roots; anything else is refused with a reason code
  (`BAD_TABLE_URI`, `TABLE_OUTSIDE_ROOTS`). Without configured roots the
  coordinator serves local tables anywhere it can write (development), and no
  object store.
* `storage(table_uri)`: the `TableStorage` to publish and checkpoint through,
  built with the coordinator's own storage options for that location. It
  applies the same check, so nothing is ever written outside the roots, even
  for a table ratified before the roots changed.

Storage options: defaults for every store, then the options of the longest
configured root the table lies under, merged over them. Credentials not given
come from each cloud's environment chain, so the coordinator's may differ
from the writers'.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.storage.table import StorageUriError, TableStorage, TableUri, parse_table_uri
from deltacoord.storage.uri import check_table_uri

_KIND_NAMES = {"file": "a local filesystem", "s3": "S3", "az": "Azure", "gs": "GCS"}
#: Verdicts are cached per URI string; the cache is cleared when it grows past this.
_CACHE_LIMIT = 10_000


class TableLocationError(InvalidProposalError):
    """A table location this coordinator refuses (the reason code says why)."""


@dataclass
class TableLocations:
    """The coordinator's table roots and storage options (see the module doc)."""

    #: Normalised roots; None serves local tables anywhere (and no object store).
    roots: tuple[TableUri, ...] | None = None
    storage_options: Mapping[str, str] = field(default_factory=dict)
    #: Root URI -> options for the tables under it (merged over `storage_options`).
    options_by_root: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    fsync: bool = True
    _by_root: list[tuple[TableUri, dict[str, str]]] = field(default_factory=list, init=False, repr=False)
    _verdicts: dict[str, TableUri | TableLocationError] = field(default_factory=dict, init=False, repr=False)
    _stores: dict[str, TableStorage] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        for root, opts in self.options_by_root.items():
            self._by_root.append((parse_table_uri(root), dict(opts)))
        # The longest root first: its options win over a shorter root's.
        self._by_root.sort(key=lambda r: (len(str(r[0])), str(r[0])), reverse=True)

    @staticmethod
    def of(roots: Sequence[str] | None, storage_options: Mapping[str, str] | None = None,
           options_by_root: Mapping[str, Mapping[str, str]] | None = None, *, fsync: bool = True) -> TableLocations:
        """Parse the roots (each must be a strict, normal location; StorageUriError otherwise)."""
        parsed = None if roots is None else tuple(check_table_uri(r) for r in roots)
        return TableLocations(parsed, dict(storage_options or {}), dict(options_by_root or {}), fsync)

    def describe_roots(self) -> str:
        if self.roots is None:
            return "any local directory (table_roots is not set)"
        return ", ".join(str(r) for r in self.roots) or "(none)"

    def _verdict(self, table_uri: str) -> TableUri | TableLocationError:
        try:
            uri = check_table_uri(table_uri)
        except StorageUriError as e:
            return TableLocationError(ReasonCode.BAD_TABLE_URI, str(e))
        if self.roots is None:
            if uri.kind != "file":
                return TableLocationError(
                    ReasonCode.TABLE_OUTSIDE_ROOTS,
                    f"table {uri} is on {_KIND_NAMES[uri.kind]}, which this coordinator does not serve: it has no "
                    "table_roots, so it serves local tables only (set table_roots to serve an object store)",
                )
            return uri
        if not any(uri.is_under(r) for r in self.roots):
            served = {r.kind for r in self.roots}
            where = "" if uri.kind in served else f" (no root is on {_KIND_NAMES[uri.kind]})"
            return TableLocationError(
                ReasonCode.TABLE_OUTSIDE_ROOTS,
                f"table {uri} is not under this coordinator's table_roots{where}: {self.describe_roots()}",
            )
        return uri

    def check(self, table_uri: str) -> TableUri:
        """The table's normal location, or `TableLocationError` with the reason code."""
        with self._lock:
            verdict = self._verdicts.get(table_uri)
        if verdict is None:
            verdict = self._verdict(table_uri)
            with self._lock:
                if len(self._verdicts) >= _CACHE_LIMIT:
                    self._verdicts.clear()
                self._verdicts[table_uri] = verdict
        if isinstance(verdict, TableLocationError):
            raise verdict
        return verdict

    def problem(self, table_uri: str) -> TableLocationError | None:
        """Why a proposal may not name `table_uri`, or None."""
        try:
            self.check(table_uri)
        except TableLocationError as e:
            return e
        return None

    def options_for(self, uri: TableUri) -> dict[str, str]:
        """The storage options for a location: the defaults, then its longest root's options."""
        out = dict(self.storage_options)
        for root, opts in self._by_root:
            if uri.is_under(root):
                out.update(opts)
                break
        return out

    def storage(self, table_uri: str) -> TableStorage:
        """The table's `TableStorage` (checked as at the door; `TableLocationError` when refused)."""
        uri = self.check(table_uri)
        key = str(uri)
        with self._lock:
            store = self._stores.get(key)
        if store is None:
            store = TableStorage(uri, self.options_for(uri), fsync=self.fsync)
            with self._lock:
                if len(self._stores) >= _CACHE_LIMIT:
                    self._stores.clear()
                self._stores[key] = store
        return store


__all__ = ["TableLocationError", "TableLocations"]
