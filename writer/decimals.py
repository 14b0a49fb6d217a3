"""Numbers and numeric text written into Delta decimal columns exactly, or refused naming the value.

Arrow's own casts either refuse integers outright (an int64 needs precision 19 plus the scale) or round
floats silently (1.234 into decimal(10,2) becomes 1.23). A decimal column holds money more often than not,
so a value is written only when the column represents it exactly; otherwise the write fails naming the
column, the value and what to change.
"""

from __future__ import annotations

import decimal

import pyarrow as pa
import pyarrow.compute as pc

from deltacoord.writer.staging import SchemaError

#: Arrow's widest 128-bit decimal; integers and floats pass through it on their way to the column's type.
_WIDE_PRECISION = 38


def is_decimal_source(t: pa.DataType) -> bool:
    """Whether values of `t` can become decimals: integers, floats, decimals and numeric text."""
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t))


def to_decimal(column: str, values: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """`values` as the decimal type `target`, every value exactly; SchemaError naming the first that is not."""
    assert pa.types.is_decimal(target)
    t = values.type
    try:
        if pa.types.is_floating(t):
            return _from_float(column, values, target)
        if pa.types.is_integer(t):
            return values.cast(pa.decimal128(_WIDE_PRECISION, 0)).cast(target)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return pc.utf8_trim_whitespace(values).cast(target)
        return values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _refusal(column, values, target) from None


def _from_float(column: str, values: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """Floats through Arrow's rounding cast, then checked: a value whose decimal reads back as another
    float had more decimal places than the column keeps."""
    if pc.any(pc.invert(pc.is_finite(values))).as_py():
        raise _refusal(column, values, target)
    out = values.cast(pa.decimal128(_WIDE_PRECISION, target.scale)).cast(target)
    if not pc.all(pc.equal(out.cast(pa.float64()), values.cast(pa.float64()))).as_py():
        raise _refusal(column, values, target)
    return out


def _refusal(column: str, values: pa.ChunkedArray, target: pa.DataType) -> SchemaError:
    """The error naming the first value the column cannot hold exactly, and why."""
    p, s = target.precision, target.scale
    for v in values.to_pylist():
        if v is None:
            continue
        why = _why_not(v, p, s)
        if why is not None:
            return SchemaError(f"column {column!r} is decimal({p},{s}) but the value {v!r} {why}; deltacoord does not "
                               f"round decimals: round the data first or widen the column")
    return SchemaError(f"column {column!r}: its values cannot be written as decimal({p},{s})")


def _why_not(v: object, p: int, s: int) -> str | None:
    """Why one value does not fit decimal(p, s) exactly, or None when it does."""
    # A float's repr is the shortest text that reads back as it: what a JSON number said.
    text = repr(v) if isinstance(v, float) else str(v).strip()
    try:
        d = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return "is not a number"
    if not d.is_finite():
        return "is not a finite number"
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > s and d != d.quantize(decimal.Decimal(1).scaleb(-s)):
        return f"has more than {s} digits after the point"
    if d.adjusted() + 1 > p - s:
        return f"needs more than {p - s} digits before the point"
    return None


__all__ = ["is_decimal_source", "to_decimal"]
