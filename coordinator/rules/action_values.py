"""Values inside actions that Delta readers parse: partition values against their column types, and
deletion-vector descriptors. A value no reader can parse, once committed, makes the whole table unreadable
(delta-rs and Spark fail the scan), so a proposal carrying one is refused before it is ratified.

Pure functions, no I/O; the accepted forms are those Delta writers produce (PROTOCOL.md "Partition Value
Serialization", "Deletion Vector Descriptor Schema").
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import re

from deltacoord.schemas.actions import DeletionVector
from deltacoord.schemas.deletion_vectors import DeletionVectorError, z85_decode

#: The range of each integral Delta type.
_INT_BITS = {"byte": 8, "tinyint": 8, "short": 16, "smallint": 16, "integer": 32, "int": 32, "long": 64, "bigint": 64}
_INTEGER = re.compile(r"[+-]?\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DECIMAL_TYPE = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
#: A 'u' descriptor: an optional random prefix, then the Z85 text of a 16-byte UUID (20 characters).
_UUID_Z85_CHARS = 20


@functools.lru_cache(maxsize=4096)
def partition_value_problem(text: str | None, type_name: str) -> str | None:
    """Why `text` is not a serialised value of the Delta type `type_name`, or None (null and '' are null)."""
    if text is None or text == "":
        return None
    t = type_name.strip().lower()
    if t in _INT_BITS:
        if not _INTEGER.fullmatch(text):
            return "not an integer"
        bits = _INT_BITS[t]
        if not -(1 << (bits - 1)) <= int(text) < (1 << (bits - 1)):
            return f"out of the range of {t}"
        return None
    if t in ("float", "double", "real"):
        try:
            float(text)
        except ValueError:
            return "not a number"
        return None
    m = _DECIMAL_TYPE.fullmatch(t)
    if m is not None or t == "decimal":
        precision, scale = (int(m.group(1)), int(m.group(2))) if m else (10, 0)
        return _decimal_problem(text, precision, scale)
    if t == "date":
        if not _DATE.fullmatch(text):
            return "not a date (yyyy-mm-dd)"
        try:
            dt.date.fromisoformat(text)
        except ValueError:
            return "not a date"
        return None
    if t in ("timestamp", "timestamp_ntz"):
        try:
            dt.datetime.fromisoformat(text)
        except ValueError:
            return "not a timestamp (yyyy-mm-dd hh:mm:ss[.ffffff])"
        return None
    if t == "boolean":
        return None if text.lower() in ("true", "false") else "not true or false"
    return None  # string, binary: any text


def _decimal_problem(text: str, precision: int, scale: int) -> str | None:
    try:
        d = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return "not a decimal number"
    if not d.is_finite():
        return "not a finite number"
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > scale and d != d.quantize(decimal.Decimal(1).scaleb(-scale)):
        return f"more than {scale} digits after the point"
    if d != 0 and d.adjusted() + 1 > precision - scale:
        return f"more than {precision - scale} digits before the point"
    return None


def deletion_vector_problem(dv: DeletionVector) -> str | None:
    """Why a deletion-vector descriptor cannot be read by a Delta reader, or None."""
    if dv.storage_type not in ("u", "i", "p"):
        return f"storageType {dv.storage_type!r} is not 'u', 'i' or 'p'"
    if dv.size_in_bytes < 0 or dv.cardinality < 0:
        return f"sizeInBytes {dv.size_in_bytes} and cardinality {dv.cardinality} must not be negative"
    if dv.max_row_index is not None and dv.max_row_index < 0:
        return f"maxRowIndex {dv.max_row_index} is negative"
    if dv.storage_type == "i":
        if dv.offset is not None:
            return "an inline deletion vector has no offset"
        try:
            z85_decode(dv.path_or_inline_dv)
        except DeletionVectorError as e:
            return f"pathOrInlineDv is not Z85 text: {e}"
        return None
    if dv.offset is not None and dv.offset < 0:
        return f"offset {dv.offset} is negative"
    if dv.storage_type == "u":
        encoded = dv.path_or_inline_dv[-_UUID_Z85_CHARS:]
        if len(dv.path_or_inline_dv) < _UUID_Z85_CHARS:
            return f"pathOrInlineDv {dv.path_or_inline_dv!r} is shorter than a Z85 UUID ({_UUID_Z85_CHARS} characters)"
        try:
            z85_decode(encoded)
        except DeletionVectorError as e:
            return f"pathOrInlineDv {dv.path_or_inline_dv!r} does not end in a Z85 UUID: {e}"
        return None
    if not dv.path_or_inline_dv:
        return "pathOrInlineDv is empty"
    return None  # 'p': an absolute path, checked against the table root by the caller


__all__ = ["deletion_vector_problem", "partition_value_problem"]
