"""Z-order clustering for OPTIMIZE ... ZORDER BY: rows sorted by the Morton key of their columns' ranks.

Each column's values are replaced by their dense rank (nulls last), scaled to
an equal share of a 63-bit key; the key interleaves the ranks' bits, most
significant first, so rows close in every column land close in the file and
min/max statistics skip well for any of the columns. This is the interleaving
Delta's ZORDER BY uses, computed on ranks rather than on range-partition ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

_KEY_BITS = 63


def _ranks(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.uint64]:
    """Dense ranks from 0, nulls after every value."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    ranks: npt.NDArray[np.uint64] = pc.rank(arr, sort_keys="ascending", tiebreaker="dense").to_numpy(
        zero_copy_only=False).astype(np.uint64)
    return ranks - np.uint64(1)


def zorder_key(table: pa.Table, columns: Sequence[str]) -> npt.NDArray[np.uint64]:
    """The Z-order (Morton) key of each row over `columns`."""
    if not columns:
        raise ValueError("ZORDER BY needs at least one column")
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"ZORDER BY column(s) {missing} are not columns of the table ({table.column_names})")
    k = len(columns)
    bits = max(1, _KEY_BITS // k)
    keys = np.zeros(table.num_rows, dtype=np.uint64)
    for i, name in enumerate(columns):
        ranks = _ranks(table.column(name))
        top = int(ranks.max()) if len(ranks) else 0
        if top >= 1 << bits:  # more distinct values than the column's share of the key: scale down
            ranks = (ranks.astype(np.float64) * (((1 << bits) - 1) / top)).astype(np.uint64)
        for b in range(bits):
            keys |= ((ranks >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * k + (k - 1 - i))
    return keys


def zorder(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """`table`'s rows in Z-order of `columns` (the first column's bits are the most significant at each level)."""
    order = np.argsort(zorder_key(table, columns), kind="stable")
    return table.take(pa.array(order))


__all__ = ["zorder", "zorder_key"]
