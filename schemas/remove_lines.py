"""The `remove` lines of files a commit removes in bulk, written straight from their `add`s.

An overwrite of a 100,000-file table removes every live file. Built as one `RemoveFile` per file and then
encoded, that was about half the writer's own work on the commit. Here the lines are written from the
adds as the snapshot holds them: a checkpoint's `add` column (Arrow, before any `AddFile` is built) is
encoded column-wise, and `AddFile`s (a commit's) are written field by field. Every line is byte for byte
`add.to_remove(deletion_timestamp, data_change)`'s JSON line (`deltacoord.schemas.actions`); a row the
column-wise encoder cannot write exactly (a control character to escape, a field of an odd type) is
written through the action instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.schemas.action_arrow import adds_from_struct, string_array
from deltacoord.schemas.actions import AddFile, RemoveFile, json_string_text, json_text
from deltacoord.schemas.control_chars import path_control_character

#: Live files as a snapshot holds them: a checkpoint's `add` StructArray, or AddFiles.
FilePart: TypeAlias = "pa.Array | Sequence[AddFile]"
#: Lines written together (Python path) or rows encoded together (Arrow path).
_LINES_PER_PIECE = 4096
_ROWS_PER_PIECE = 16_384
#: What a JSON string escapes besides `"` and backslash (`json_string_text`: C0 controls); such rows go through the action.
_NEEDS_ESCAPE = r"[\x00-\x1f]"
#: JSON text that may hold raw control characters (the column-wise text of a map, before it is checked).
_LENIENT = json.JSONDecoder(strict=False).decode
#: Paths the writer's path check must look at one by one (`path_control_character`).
_PATH_SUSPECT = r"[\x00-\x1f\x7f-\x9f%]"
_SUSPECT = re.compile(_PATH_SUSPECT)
_BOOL = {True: "true", False: "false"}


def remove_line(a: AddFile, deletion_timestamp: int, data_change: bool) -> str:
    """`add.to_remove(...)`'s JSON line (no newline), without the RemoveFile when the add is a plain one."""
    pv, stats, size = a.partition_values, a.stats, a.size
    if not (type(a) is AddFile and type(a.path) is str and type(deletion_timestamp) is int
            and type(data_change) is bool and (size is None or type(size) is int)
            and (stats is None or type(stats) is str) and pv is not None and a.tags is None
            and a.deletion_vector is None and a.base_row_id is None and a.default_row_commit_version is None):
        return json_text(a.to_remove(deletion_timestamp, data_change=data_change).to_json())
    return "".join((
        f'{{"remove":{{"path":{json_string_text(a.path)},"deletionTimestamp":{int.__repr__(deletion_timestamp)},'
        f'"dataChange":{_BOOL[data_change]},"extendedFileMetadata":true,'
        f'"partitionValues":{json_text(dict(pv)) if pv else "{}"}',
        "" if size is None else f',"size":{int.__repr__(size)}',
        "" if stats is None else f',"stats":{json_string_text(stats)}',
        "}}",
    ))


def _adds_lines(adds: Sequence[AddFile], ts: int, dc: bool) -> Iterator[bytes]:
    for i in range(0, len(adds), _LINES_PER_PIECE):
        chunk = [remove_line(a, ts, dc) for a in adds[i:i + _LINES_PER_PIECE]]
        chunk.append("")
        yield "\n".join(chunk).encode("utf-8")


# --------------------------------------------------------------------------- column-wise, from Arrow


def _lit(text: str) -> pa.Scalar:
    """A string scalar for compute calls (`pa.scalar` imports pandas, a quarter of a second in a fresh process)."""
    return string_array([text])[0]


_NULL = pa.nulls(1, pa.string())[0]
_EMPTY, _FALSE = _lit(""), pc.is_null(string_array([""]))[0]


def _bytes_of(values: pa.Array) -> np.ndarray:
    """The UTF-8 bytes of a string array's values, all together (no copy)."""
    _, offsets, data = values.buffers()
    if data is None or not len(values):
        return np.zeros(0, np.uint8)
    width = np.int64 if pa.types.is_large_string(values.type) else np.int32
    ends = np.frombuffer(offsets, dtype=width, count=len(values) + 1, offset=values.offset * np.dtype(width).itemsize)
    return np.frombuffer(data, dtype=np.uint8)[int(ends[0]):int(ends[-1])]


def _escapes(values: pa.Array) -> pa.Array | None:
    """Which values hold a character `_json_strings` does not escape as `json_string_text` does (None: none does)."""
    if not (_bytes_of(values) < 0x20).any():
        return None
    return pc.fill_null(pc.match_substring_regex(values, _NEEDS_ESCAPE), _FALSE)


def _json_strings(values: pa.Array) -> pa.Array:
    """`json_string_text` of each value of a string array, for values without C0 controls (`_escapes`); null stays null."""
    if (_bytes_of(values) == 0x5C).any():
        values = pc.replace_substring(values, "\\", "\\\\")
    return pc.binary_join_element_wise(_QUOTE, pc.replace_substring(values, '"', '\\"'), _QUOTE, _EMPTY)


_QUOTE = _lit('"')


def _field(arr: pa.Array, name: str) -> pa.Array | None:
    """A child of a struct, None when the struct has no such field or every row's is null."""
    i = arr.type.get_field_index(name)
    if i < 0:
        return None
    child = arr.field(i)
    return None if child.null_count == len(child) else child


def _key(name: str, values: pa.Array | None) -> pa.Array | pa.Scalar:
    """`,"name":value` where the value is not null, null (written as nothing) where it is."""
    if values is None:
        return _EMPTY
    return pc.binary_join_element_wise(_lit(f',"{name}":'), values, _EMPTY)


def _numbers(values: pa.Array | None) -> pa.Array | None:
    return None if values is None else values.cast(pa.string())


def _join(*parts: pa.Array | pa.Scalar) -> pa.Array:
    """The parts joined row by row, a null part written as nothing."""
    return pc.binary_join_element_wise(*parts, _EMPTY, null_handling="replace", null_replacement="")


def _dv_json(dv: pa.Array) -> pa.Array:
    """`DeletionVector.to_json()`'s text per row (null without a DV); storageType must not be null where a DV is."""
    body = _join(_lit('{"storageType":'), _json_strings(dv.field("storageType")),
                 _key("pathOrInlineDv", _json_strings(dv.field("pathOrInlineDv"))),
                 _key("offset", _numbers(dv.field("offset"))), _key("sizeInBytes", _numbers(dv.field("sizeInBytes"))),
                 _key("cardinality", _numbers(dv.field("cardinality"))),
                 _key("maxRowIndex", _numbers(dv.field("maxRowIndex"))), _lit("}"))
    return pc.if_else(dv.is_valid(), body, _NULL)


def _map_json(arr: pa.Array, name: str, empty_for_null: bool) -> pa.Array | pa.Scalar | None:
    """`json_text(dict(map))` per row (null for a null map, or "{}" with `empty_for_null`): each row's pairs are
    joined column-wise, and each distinct text is checked once against the encoder's (a repeated key, which
    `dict` keeps once, or a control character makes them differ; a table has few distinct partition values)."""
    col = _field(arr, name)
    if col is None:
        return _lit("{}") if empty_for_null else None
    pairs = pc.binary_join_element_wise(_json_strings(col.keys), pc.fill_null(_json_strings(col.items), _lit("null")),
                                        _lit(":"))
    listed = pc.binary_join(pa.ListArray.from_arrays(col.offsets, pairs), _lit(","))
    naive = pc.binary_join_element_wise(_lit("{"), listed, _lit("}"), _EMPTY)
    encoded = pc.dictionary_encode(naive)
    texts = encoded.dictionary.to_pylist()
    exact = [json_text(_LENIENT(t)) for t in texts]
    out = naive if exact == texts else pc.take(string_array(exact), encoded.indices)
    if col.null_count:
        out = pc.if_else(col.is_valid(), out, _lit("{}") if empty_for_null else _NULL)
    return out


def _struct_lines(arr: pa.Array, ts: int, dc: bool) -> pa.Array:
    """Each row's remove line, newline-terminated, as a StringArray (rows the column-wise encoder cannot write
    exactly go through `adds_from_struct` and `remove_line`)."""
    path, stats, dv = arr.field("path"), _field(arr, "stats"), _field(arr, "deletionVector")
    # Written through the action: a null path, a C0 control to escape, a DV without a storage type.
    odd: list[pa.Array | None] = [path.is_null() if path.null_count else None, _escapes(path)]
    if stats is not None:
        odd.append(_escapes(stats))
    if dv is not None:
        odd += [pc.and_(dv.is_valid(), dv.field("storageType").is_null()), _escapes(dv.field("storageType")),
                _escapes(dv.field("pathOrInlineDv"))]
    lines = _join(
        _lit('{"remove":{"path":'), _json_strings(path),
        _lit(f',"deletionTimestamp":{int.__repr__(ts)},"dataChange":{_BOOL[dc]},"extendedFileMetadata":true,'
             '"partitionValues":'), _map_json(arr, "partitionValues", empty_for_null=True),
        _key("size", _numbers(_field(arr, "size"))),
        _key("stats", None if stats is None else _json_strings(stats)),
        _key("tags", _map_json(arr, "tags", empty_for_null=False)),  # the encoder's own text: nothing odd there
        _key("deletionVector", None if dv is None else _dv_json(dv)),
        _key("baseRowId", _numbers(_field(arr, "baseRowId"))),
        _key("defaultRowCommitVersion", _numbers(_field(arr, "defaultRowCommitVersion"))),
        _lit("}}\n"))
    masks = [m for m in odd if m is not None]
    if masks:
        mask = masks[0]
        for m in masks[1:]:
            mask = pc.or_(mask, pc.fill_null(m, _FALSE))
        mask = pc.fill_null(mask, _FALSE)
        if mask.true_count:
            adds = adds_from_struct(arr.filter(mask))
            lines = pc.replace_with_mask(lines, mask, string_array([remove_line(a, ts, dc) + "\n" for a in adds]))
    return lines


def _struct_pieces(arr: pa.Array, ts: int, dc: bool) -> Iterator[bytes]:
    for start in range(0, len(arr), _ROWS_PER_PIECE):
        lines = _struct_lines(arr.slice(start, _ROWS_PER_PIECE), ts, dc)
        yield _bytes_of(lines).tobytes()  # every row is a line, none is null: the lines are the values' bytes


# --------------------------------------------------------------------------- the removes of a commit


@dataclass(frozen=True)
class RemovedFiles:
    """Files removed in bulk by one commit, as the snapshot holds them, all with one deletion timestamp."""

    parts: tuple[FilePart, ...]
    deletion_timestamp: int
    data_change: bool = True

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def lines(self) -> Iterator[bytes]:
        """The commit file's remove lines, newline-terminated, a piece at a time."""
        for part in self.parts:
            if isinstance(part, pa.Array):
                yield from _struct_pieces(part, self.deletion_timestamp, self.data_change)
            else:
                yield from _adds_lines(part, self.deletion_timestamp, self.data_change)

    def actions(self) -> Iterator[RemoveFile]:
        """The same removes as actions (a small commit sent inline)."""
        for part in self.parts:
            adds: Iterable[AddFile] = adds_from_struct(part) if isinstance(part, pa.Array) else part
            for a in adds:
                yield a.to_remove(self.deletion_timestamp, data_change=self.data_change)

    def bad_path(self) -> tuple[str, str] | None:
        """The first path `path_control_character` refuses, and why (None: none)."""
        for part in self.parts:
            if isinstance(part, pa.Array):
                paths = part.field("path")
                suspect = pc.fill_null(pc.match_substring_regex(paths, _PATH_SUSPECT), _FALSE)
                candidates = paths.filter(suspect).to_pylist() if suspect.true_count else []
            else:
                paths = [a.path for a in part]
                # One scan of them all (a space is neither a control nor `%`), then one by one if it finds any.
                candidates = paths if _SUSPECT.search(" ".join(paths)) else []
            for p in candidates:
                why = path_control_character(p)
                if why is not None:
                    return p, why
        return None


__all__ = ["FilePart", "RemovedFiles", "remove_line"]
