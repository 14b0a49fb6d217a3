"""An added file's statistics: what Delta readers parse, checked before a proposal can be ratified.

Delta's protocol (Per-file Statistics) makes `add.stats` a JSON object: `numRecords` a long,
`minValues`/`maxValues` objects of column values (nested for structs), `nullCount` an object of
longs (nested likewise), `tightBounds` a boolean. Readers parse the stats of every file of the
table, so one malformed string (`""`, `{{not json`, `{"numRecords":1e308}`) makes the whole table
unreadable to them (delta-rs: `Kernel error: Json error`). Keys this module does not know are left
alone, as Delta readers leave them.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Deeper than any struct nesting a table has; a bound keeps a hostile document from costing recursion.
MAX_DEPTH = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


#: One decoder for every file: `json.loads` with an option builds a new one per call (a tenth of the check).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _count_problem(value: object, where: str) -> str | None:
    """numRecords and nullCount: a non-negative 64-bit integer."""
    if type(value) is not int:
        return f"{where} is {json.dumps(value)[:40]}, not an integer"
    if value < 0:
        return f"{where} is negative"
    if value > INT64_MAX:
        return f"{where} is {value}, beyond a 64-bit integer"
    return None


def _bound_problem(value: object, where: str) -> str | None:
    """A min or max value: a scalar; numbers finite, integers 64-bit."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is not a finite number"
    if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        return f"{where} is {value}, beyond a 64-bit integer"
    if isinstance(value, list):
        return f"{where} is a list; statistics hold one value per column"
    return None


def _per_column_problem(values: object, where: str, leaf: Callable[[object, str], str | None],
                        depth: int = 0) -> str | None:
    """An object with one entry per column (nested objects for structs), each leaf checked by `leaf`."""
    if not isinstance(values, dict):
        return f"{where} is not a JSON object"
    if leaf is _bound_problem and all(type(v) is str for v in values.values()):
        return None  # strings are always fine bounds (the common case of a string column's min and max)
    if depth > MAX_DEPTH:
        return f"{where} nests deeper than {MAX_DEPTH} levels"
    lo = INT64_MIN if leaf is _bound_problem else 0
    for name, v in values.items():
        if type(v) is int and lo <= v <= INT64_MAX:
            continue  # a 64-bit integer, non-negative for a count: what `leaf` passes (the common case)
        at = f"{where}.{name}"
        problem = _per_column_problem(v, at, leaf, depth + 1) if isinstance(v, dict) else leaf(v, at)
        if problem:
            return problem
    return None


def stats_problem(stats: object) -> str | None:
    """Why `stats` (an `add`'s statistics string, or None) would break a Delta reader, or None."""
    if stats is None:
        return None
    if not isinstance(stats, str):
        return f"stats is {type(stats).__name__}, not a JSON string"
    if stats.strip() == "":
        return "stats is an empty string; leave stats out (null) or give a JSON object"
    try:
        doc = _DECODER.decode(stats)
    except (ValueError, RecursionError) as e:
        return f"stats is not JSON ({str(e)[:80]})"
    if not isinstance(doc, dict):
        return "stats is not a JSON object"
    problem = None
    if "numRecords" in doc:
        problem = _count_problem(doc["numRecords"], "stats.numRecords")
    for key, leaf in (("minValues", _bound_problem), ("maxValues", _bound_problem), ("nullCount", _count_problem)):
        if problem is None and key in doc:
            problem = _per_column_problem(doc[key], f"stats.{key}", leaf)
    if problem is None and "tightBounds" in doc and not isinstance(doc["tightBounds"], bool):
        problem = "stats.tightBounds is not a boolean"
    return problem


#: From this many files on the stats are read in one Arrow pass. Below it the per-file check costs under 0.2 s,
#: and the deciding process does not import Arrow (about 80 MB and 0.4 s, once) for it.
BULK_MIN_FILES = 20_000


def _valid(arr: pa.Array) -> np.ndarray:
    import numpy as np

    n, nulls = len(arr), arr.null_count
    if nulls == 0 or nulls == n:  # no bitmap needed (a null-typed array has none)
        return np.full(n, nulls == 0, dtype=bool)
    # Read from the validity bitmap: `to_numpy` imports pandas (see `_values`).
    bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little", count=arr.offset + n)[arr.offset:].astype(bool)


def _values(arr: pa.Array) -> np.ndarray | None:
    """The values buffer of an int64 or float64 array, nulls' slots included (whatever they hold), without a copy;
    None for another type. Not `fill_null`: its `pa.scalar` imports pandas (about 50 MB the deciding process never
    needs otherwise)."""
    import numpy as np
    import pyarrow as pa

    dtype = {pa.int64(): np.int64, pa.float64(): np.float64}.get(arr.type)
    buf = arr.buffers()[1] if dtype is not None else None
    if buf is None:
        return None
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * 8)


def _depth(t: pa.DataType) -> int:
    import pyarrow as pa

    return 1 + max((_depth(t.field(i).type) for i in range(t.num_fields)), default=0) if pa.types.is_struct(t) else 0


def _suspect(arr: pa.Array, leaf: Callable[[pa.Array], np.ndarray]) -> np.ndarray:
    """Rows of a per-column object (nested structs for struct columns) with a leaf that `leaf` flags."""
    import numpy as np
    import pyarrow as pa

    t = arr.type
    if not pa.types.is_struct(t):
        return leaf(arr)
    out = np.zeros(len(arr), dtype=bool)
    for i in range(t.num_fields):
        out |= _suspect(arr.field(i), leaf)
    return out


def _suspect_bound(arr: pa.Array) -> np.ndarray:
    """A min/max leaf the per-file check might refuse: a list, or a double that is not finite or lies beyond a
    64-bit integer (the Arrow reader reads too large an integer as a double)."""
    import numpy as np
    import pyarrow as pa

    t = arr.type
    if pa.types.is_floating(t):
        v = _values(arr)
        if v is None:
            return np.ones(len(arr), dtype=bool)
        return np.asarray((~np.isfinite(v) | (np.abs(v) >= 2.0**63)) & _valid(arr), dtype=bool)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return _valid(arr)
    return np.zeros(len(arr), dtype=bool)


def _suspect_count(arr: pa.Array) -> np.ndarray:
    """A count leaf the per-file check might refuse: anything but a non-negative int64 (a null may be an explicit
    null, which is refused, or a column the row's stats lack, which is fine: asked again)."""
    import numpy as np
    import pyarrow as pa

    v = _values(arr) if pa.types.is_int64(arr.type) else None
    if v is None:
        return np.ones(len(arr), dtype=bool)
    return np.asarray((v < 0) | ~_valid(arr), dtype=bool)


#: Documents read by one Arrow pass: a commit of a million files is read a slice at a time, so that its stats are
#: never held twice more (as one text and as Arrow columns) beside its actions. A slice's text, its lines and
#: Arrow's buffers are what the pass adds to the process for good (the allocators keep the pages): 16,384 documents
#: add half of what 65,536 did, in the same time.
BULK_SLICE = 16_384


def _suspects(stats: list[str]) -> np.ndarray | None:
    """Rows the per-file check must look at, read as Arrow a slice at a time (`_slice_suspects`); every row of a
    slice the pass cannot tell about is checked one by one."""
    import numpy as np

    out = np.ones(len(stats), dtype=bool)
    for lo in range(0, len(stats), BULK_SLICE):
        got = _slice_suspects(stats[lo:lo + BULK_SLICE])
        if got is not None:
            out[lo:lo + len(got)] = got
    return out


def _slice_suspects(stats: list[str]) -> np.ndarray | None:
    """Rows the per-file check must look at, read as Arrow in one pass; None when the pass cannot tell (then every
    row is checked one by one). Each document is wrapped with its index, so a string holding two documents, or
    none, breaks the pass rather than shifting the rows. Arrow is imported here, by the first commit this large:
    the deciding process does not hold it otherwise."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.json as pa_json

    if any("\n" in s or "\r" in s for s in stats):
        return None
    try:
        body = "\n".join(f'{{"i":{i},"s":{s}}}' for i, s in enumerate(stats)).encode("utf-8")
        t = pa_json.read_json(io.BytesIO(body), read_options=pa_json.ReadOptions(block_size=max(1 << 20, len(body) + 1)))
    except (pa.ArrowException, UnicodeError, ValueError):
        return None
    if t.num_rows != len(stats) or t.column_names != ["i", "s"]:
        return None  # e.g. a document that closes itself early and goes on: `{...},"z":1`
    idx = t.column("i").combine_chunks()
    at = _values(idx)  # None unless int64
    if at is None or idx.null_count or not np.array_equal(at, np.arange(len(stats))):
        return None
    s = t.column("s").combine_chunks()
    if not pa.types.is_struct(s.type) or s.null_count or _depth(s.type) > MAX_DEPTH:
        return None
    # Arrow's JSON reader takes `NaN` and `Infinity` (not JSON) anywhere, even in keys no check below reads; the
    # per-file check refuses them, so a document naming either is asked again (a string holding the word too).
    if b"NaN" in body or b"Infinity" in body:
        out = np.fromiter(("NaN" in d or "Infinity" in d for d in stats), dtype=bool, count=len(stats))
    else:  # one scan of the whole text says so of every document (the common case)
        out = np.zeros(len(stats), dtype=bool)
    names = [s.type.field(i).name for i in range(s.type.num_fields)]
    for key in ("numRecords", "minValues", "maxValues", "nullCount", "tightBounds"):
        if key not in names:
            continue
        col = s.field(key)
        if key == "numRecords":
            out |= _suspect(col, _suspect_count)
        elif key == "nullCount":
            out |= ~_valid(col) | (_suspect(col, _suspect_count) if pa.types.is_struct(col.type) else True)
        elif key == "tightBounds":
            out |= ~_valid(col) | (not pa.types.is_boolean(col.type))
        else:
            out |= ~_valid(col) | (_suspect(col, _suspect_bound) if pa.types.is_struct(col.type) else True)
    return out


def stats_problems(stats: list[object], bulk_from: int = BULK_MIN_FILES) -> dict[int, str]:
    """`stats_problem` of many files at once, by index (only the files with a problem): the same answers, the
    same messages, much faster for a commit of thousands of files. The Arrow JSON reader reads every document
    in one pass; only the rows it cannot vouch for are checked one by one."""
    import numpy as np

    texts = [s for s in stats if isinstance(s, str)]
    suspects: np.ndarray | None = None
    if len(texts) >= bulk_from:
        suspects = _suspects(texts)
    del texts
    check: Iterable[int]
    if suspects is None:
        check = range(len(stats))
    else:
        if len(suspects) == len(stats):  # every file has stats: the rows are the indexes
            check = np.flatnonzero(suspects).tolist()
        else:
            # The index in `stats` of each text (no tuple per file: a million of them would outweigh the texts).
            at = np.fromiter((i for i, s in enumerate(stats) if isinstance(s, str)), dtype=np.int64,
                             count=len(suspects))
            flagged = {int(i) for i in at[np.flatnonzero(suspects)]}
            check = sorted(flagged | {i for i, s in enumerate(stats) if not isinstance(s, str)})
    out: dict[int, str] = {}
    for i in check:
        problem = stats_problem(stats[i])
        if problem is not None:
            out[i] = problem
    return out
