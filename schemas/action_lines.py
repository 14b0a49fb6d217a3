"""Plain `add` and `remove` lines of a large commit read by Arrow's JSON reader: the same actions as the Python
parse (`deltacoord.schemas.actions.parse_commit`), or None when this reader cannot vouch for that.

A commit of a million files is a million lines; decoding each with `json` and building a dict per line is most
of the cost of loading it. Arrow's reader parses the lines in C++ against an explicit schema (the plain fields,
`_PLAIN_ADD_KEYS` and `_PLAIN_REMOVE_KEYS`; any other field is an error), and the actions are built column-wise.
Arrow accepts some input the Python parse refuses or reads otherwise, so a block is taken only when:

* each line starts with `{"add":{` or `{"remove":{` and ends with `}}` (no blank lines, no `\\r`, no whitespace
  around the object): a line then holds whole objects only, and its first and last top-level values are
  objects, so a second top-level key is either a duplicate (Arrow refuses it) or the other action (refused
  below); Arrow's row count equal to the line count then means one object a line;
* each row has exactly one of `add` and `remove`, and no null in a field the Python parse requires (Arrow
  reads a missing field as null, which the Python parse refuses as missing);
* each string is UTF-8 (Arrow does not check; converting it to Python does);
* partitionValues is `{}` (or null) in every line, or, when the first line names one or two partition columns,
  holds exactly those keys, all strings, in every line (a remove's may be null): Arrow reads them as a struct
  of those columns. A null value (`{"p":null}` and a missing key read alike), three columns or more, and two
  keys not in the first line's order in a line's text (a dict's order is written back) are left to the Python
  parse.

Anything else is None, and the caller parses the same bytes with the Python parser: same actions, same errors.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from deltacoord.schemas.actions import (
    NO_PARTITION_VALUES,
    SHARED_PARTITION_VALUES,
    Action,
    AddFile,
    PartitionValues,
    RemoveFile,
    json_string_text,
    plain_add,
    plain_remove,
    without_cyclic_gc,
)

#: Bytes of whole lines handed to Arrow at a time: a large file is never held whole, nor its Arrow form. Larger
#: blocks were no quicker and held more memory.
BLOCK_BYTES = 4 << 20
#: Read on the calling thread (Arrow's threads gave no quicker parse on two cores, and the cost stays on the thread
#: that asked for it), into the system allocator: it gives a block's memory back, where Arrow's default pool kept
#: some 25 MB more after a load of 100,000 files.
_READ = pa_json.ReadOptions(block_size=BLOCK_BYTES, use_threads=False)
_POOL = pa.system_memory_pool()
_ADD_START, _REMOVE_START = b'{"add":{', b'{"remove":{'
_ADD_JOIN, _REMOVE_JOIN = b'}}\n' + _ADD_START, b'}}\n' + _REMOVE_START
#: Required fields (a null one: missing in the line, or a null the Python parse keeps; either way, not vouched for).
_ADD_REQUIRED = ("path", "size", "modificationTime", "dataChange")
_REMOVE_REQUIRED = ("path", "dataChange")


class _Refused(Exception):
    """Raised inside a parse to give the block back to the Python parser."""


def _schema(columns: Sequence[str]) -> pa.Schema:
    values = pa.struct([(c, pa.string()) for c in columns])
    s, i, b = pa.string(), pa.int64(), pa.bool_()
    add = pa.struct([("path", s), ("partitionValues", values), ("size", i), ("modificationTime", i),
                     ("dataChange", b), ("stats", s)])
    remove = pa.struct([("path", s), ("deletionTimestamp", i), ("dataChange", b), ("extendedFileMetadata", b),
                        ("partitionValues", values), ("size", i), ("stats", s)])
    return pa.schema([("add", add), ("remove", remove)])


def _partition_columns(line: bytes) -> tuple[str, ...] | None:
    """The partition columns the first line names, in its order (None: not a plain file line of string values)."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    body = obj.get("add", obj.get("remove")) if isinstance(obj, dict) and len(obj) == 1 else None
    values = body.get("partitionValues") if isinstance(body, dict) else None
    if values is None:
        return ()
    if not isinstance(values, dict) or not all(type(v) is str for v in values.values()):
        return None
    return tuple(values)


def _lines_vouched(data: bytes, start: int, stop: int) -> int | None:
    """The number of lines of `data[start:stop]` when each is `{"add":{...}}` or `{"remove":{...}}` (see the
    module's docstring), else None."""
    end = stop - 1 if stop > start and data[stop - 1] == 0x0A else stop
    if end <= start or data[end - 2:end] != b"}}":
        return None
    if data.startswith(_ADD_START, start):
        first, other = _ADD_JOIN, _REMOVE_JOIN
    elif data.startswith(_REMOVE_START, start):
        first, other = _REMOVE_JOIN, _ADD_JOIN
    else:
        return None
    inner = data.count(b"\n", start, end)
    # the kind of the first line first: a block of one kind (the common case) is counted twice, not three times
    joins = data.count(first, start, end)
    if joins != inner and joins + data.count(other, start, end) != inner:
        return None
    return inner + 1


def _valid(arr: pa.Array) -> np.ndarray:
    """Whether each row is not null, read from the validity bitmap (no `pyarrow.compute`: its import alone is some
    8 MB of the deciding process)."""
    bitmap = arr.buffers()[0]
    if bitmap is None:
        return np.ones(len(arr), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset:arr.offset + len(arr)].astype(bool)


def _ints(child: pa.Array) -> list[Any]:
    if child.null_count == 0:
        # numpy's tolist is several times faster than Arrow's per-value conversion
        return np.frombuffer(child.buffers()[1], dtype=np.int64, count=len(child),  # type: ignore[no-any-return]
                             offset=child.offset * 8).tolist()
    return child.to_pylist()  # type: ignore[no-any-return]


class LineParser:
    """Parses the blocks of one file in order: the partition columns come from its first line, and files of one
    partition share one partition-values dict across blocks, as `_parse_lines` shares them."""

    def __init__(self) -> None:
        self._columns: tuple[str, ...] | None = None
        self._options: pa_json.ParseOptions | None = None
        self._shared: dict[tuple[str, ...], PartitionValues] = {}
        self._first_key = b""

    def parse(self, data: bytes, start: int = 0, stop: int | None = None) -> list[Action] | None:
        """The actions of the whole lines `data[start:stop]`, or None: leave them to the Python parse."""
        stop = len(data) if stop is None else stop
        lines = _lines_vouched(data, start, stop)
        if lines is None:
            return None
        if self._columns is None:
            first = data.find(b"\n", start, stop)
            columns = _partition_columns(data[start:first if first >= 0 else stop])
            if columns is None or len(columns) > 2:
                return None
            self._columns = columns
            self._options = pa_json.ParseOptions(explicit_schema=_schema(columns), unexpected_field_behavior="error")
            self._first_key = b'"partitionValues":{' + json_string_text(columns[0]).encode() + b":" if columns else b""
        if len(self._columns) == 2 and data.count(self._first_key, start, stop) != lines:
            return None  # two keys, not in the first line's order in every line (a dict's order is written back)
        buf = pa.py_buffer(memoryview(data)[start:stop]) if start or stop < len(data) else pa.py_buffer(data)
        try:
            table = pa_json.read_json(buf, read_options=_READ, parse_options=self._options, memory_pool=_POOL)
        except pa.ArrowException:
            return None
        if table.num_rows != lines:
            return None
        out: list[Action] = []
        try:
            with without_cyclic_gc():
                for batch in table.to_batches():
                    out.extend(self._batch(batch))
        except (_Refused, UnicodeDecodeError):
            return None
        return out

    def _batch(self, batch: pa.RecordBatch) -> list[Action]:
        adds, removes = batch.column(0), batch.column(1)
        if adds.null_count == 0 and removes.null_count == len(batch):
            return self._adds(adds)  # type: ignore[return-value]
        if removes.null_count == 0 and adds.null_count == len(batch):
            return self._removes(removes)  # type: ignore[return-value]
        is_add = _valid(adds)
        if not np.array_equal(is_add, ~_valid(removes)):
            raise _Refused  # a line of neither or both
        # Runs of adds and of removes, in line order, each built from its slice of the columns.
        edges = [0, *(np.flatnonzero(is_add[1:] != is_add[:-1]) + 1).tolist(), len(batch)]
        out: list[Action] = []
        for lo, hi in itertools.pairwise(edges):
            out.extend(self._adds(adds.slice(lo, hi - lo)) if is_add[lo] else self._removes(removes.slice(lo, hi - lo)))
        return out

    def _values(self, arr: pa.StructArray, *, null: PartitionValues | None) -> Iterable[PartitionValues | None]:
        """Each row's partitionValues as `_parse_lines` gives them: `{}` the shared empty dict, a null one `null`
        (an add's: the empty dict; a remove's: None), equal dicts shared."""
        child = arr.field("partitionValues")
        nulls = child.null_count
        valid = _valid(child).tolist() if nulls else None
        if not self._columns:
            if valid is None or null is NO_PARTITION_VALUES:
                return itertools.repeat(NO_PARTITION_VALUES, len(arr))
            return [NO_PARTITION_VALUES if v else null for v in valid]
        columns = child.flatten()  # the nulls of partitionValues merged in
        if any(c.null_count != nulls for c in columns):
            raise _Refused  # a null value: {"p":null} and a missing key read alike
        shared, names = self._shared, self._columns
        out: list[PartitionValues | None] = []
        for i, row in enumerate(zip(*(c.to_pylist() for c in columns), strict=True)):
            if valid is not None and not valid[i]:
                out.append(null)
                continue
            one = shared.get(row)
            if one is None:
                one = dict(zip(names, row, strict=True))
                if len(shared) < SHARED_PARTITION_VALUES:
                    shared[row] = one
            out.append(one)
        return out

    def _adds(self, arr: pa.StructArray) -> list[AddFile]:
        if any(arr.field(f).null_count for f in _ADD_REQUIRED):
            raise _Refused
        return list(map(plain_add, arr.field("path").to_pylist(), self._values(arr, null=NO_PARTITION_VALUES),
                        _ints(arr.field("size")), _ints(arr.field("modificationTime")),
                        arr.field("dataChange").to_pylist(), arr.field("stats").to_pylist()))

    def _removes(self, arr: pa.StructArray) -> list[RemoveFile]:
        if any(arr.field(f).null_count for f in _REMOVE_REQUIRED):
            raise _Refused
        return list(map(plain_remove, arr.field("path").to_pylist(), _ints(arr.field("deletionTimestamp")),
                        arr.field("dataChange").to_pylist(), arr.field("extendedFileMetadata").to_pylist(),
                        self._values(arr, null=None), _ints(arr.field("size")),
                        arr.field("stats").to_pylist()))


@without_cyclic_gc()
def parse_file_lines(data: bytes, start: int = 0) -> list[Action] | None:
    """The actions of the lines `data[start:]` (plain adds and removes), read a block of lines at a time
    (`BLOCK_BYTES`), or None: leave them to the Python parse."""
    parser, out, n = LineParser(), [], len(data)
    while start < n:
        cut = data.find(b"\n", min(start + BLOCK_BYTES, n) - 1)
        stop = n if cut < 0 else cut + 1
        actions = parser.parse(data, start, stop)
        if actions is None:
            return None
        out.extend(actions)
        start = stop
    return out if n else None


def line_blocks(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The bytes of `pieces` (cut anywhere) regrouped as blocks of whole lines of at least `size` bytes (the last
    block: what is left, newline or not). Each piece is searched once: a line of any length costs no more."""
    held: list[bytes] = []
    count = 0
    for piece in pieces:
        cut = piece.rfind(b"\n") + 1
        if count + len(piece) < size or not cut:
            held.append(piece)
            count += len(piece)
            continue
        held.append(piece[:cut])
        yield b"".join(held)
        rest = piece[cut:]
        held, count = ([rest], len(rest)) if rest else ([], 0)
    if count:
        yield b"".join(held)


@without_cyclic_gc()  # over the whole file: the collector would walk the actions of the blocks before
def parse_line_blocks(pieces: Iterable[bytes]) -> list[Action] | None:
    """`parse_file_lines` of a file read a piece at a time, a block of lines at a time (`BLOCK_BYTES`): only one
    block and the actions are held. None at the first block this reader cannot vouch for (what is left of
    `pieces` is not read)."""
    parser = LineParser()
    out: list[Action] = []
    for block in line_blocks(pieces, BLOCK_BYTES):
        actions = parser.parse(block)
        if actions is None:
            return None
        out.extend(actions)
    return out
