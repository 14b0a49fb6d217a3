"""Check multi-table transactions across the tables they touched: none lost, none partial, none twice.

Pure: the inputs are what the writers were told and each table's versions with the transaction stamp of their
commitInfo (`deltacoord.transaction`: the id and the tables of the transaction; None for a version that no
multi-table transaction made). `check_multi_table` returns a `MultiTableReport`; `ok` is the verdict.

* **lost**: a transaction a writer was told committed is missing from one of its tables at the version it was told.
* **partial**: a transaction is in some of the tables its stamp names and not in the others, or its parts name
  different tables.
* **duplicated**: a transaction is at two versions of one table.
* **phantom**: a version carries a transaction no writer sent, or one its writer was told was refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class MultiTableReport:
    """The verdict on the multi-table transactions over a set of tables."""

    transactions: int = 0
    lost: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.partial or self.duplicated or self.phantom)


def check_multi_table(stamps: Mapping[str, Mapping[int, Mapping[str, Any] | None]],
                      told: Mapping[str, Mapping[str, int]], *, sent: Collection[str] = (),
                      refused: Collection[str] = ()) -> MultiTableReport:
    """`stamps`: table id -> version -> its transaction stamp (or None); `told`: transaction id -> table id ->
    the version its writer was told; `sent`: every transaction id a writer sent, whatever it was told (those of
    `told` are added); `refused`: the ids whose writer was told the transaction was rejected."""
    report = MultiTableReport()
    where: dict[str, dict[str, list[int]]] = {}  # transaction id -> table id -> versions carrying it
    names: dict[str, set[tuple[str, ...]]] = {}  # transaction id -> the table lists its parts name
    for table, versions in stamps.items():
        for version, stamp in sorted(versions.items()):
            if stamp is None:
                continue
            txid = str(stamp.get("id"))
            where.setdefault(txid, {}).setdefault(table, []).append(version)
            names.setdefault(txid, set()).add(tuple(stamp.get("tables") or ()))
    report.transactions = len(where)
    known = set(sent) | set(told)
    for txid, tables in sorted(where.items()):
        for table, versions in sorted(tables.items()):
            if len(versions) > 1:
                report.duplicated.append(f"transaction {txid} is at versions {versions} of {table}")
        if txid not in known or txid in refused:
            why = "no writer sent it" if txid not in known else "its writer was told it was rejected"
            report.phantom.append(f"transaction {txid} is in {sorted(tables)} but {why}")
        if len(names[txid]) > 1:
            report.partial.append(f"the parts of transaction {txid} name different tables: {sorted(names[txid])}")
            continue
        (named,) = names[txid]
        missing = [t for t in named if t in stamps and t not in tables]
        unnamed = [t for t in tables if t not in named]
        if missing or unnamed:
            report.partial.append(f"transaction {txid} names {list(named)}; it is in {sorted(tables)}"
                                  + (f", missing from {missing}" if missing else "")
                                  + (f", in {unnamed} that it does not name" if unnamed else ""))
    for txid, versions in sorted(told.items()):
        for table, version in sorted(versions.items()):
            if version not in where.get(txid, {}).get(table, []):
                at = where.get(txid, {}).get(table)
                report.lost.append(f"transaction {txid} was told committed at version {version} of {table}, "
                                   + (f"found at {at}" if at else "not found in it"))
    return report


__all__ = ["MultiTableReport", "check_multi_table"]
