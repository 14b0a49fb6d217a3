"""The `--schema` text of `deltacoord table create`: Spark DDL or the short `name:type` form.

Delta users write schemas as Spark DDL (`id BIGINT NOT NULL, ts TIMESTAMP COMMENT 'when'`); the short form
(`id:long not null,ts:timestamp`) stays for scripts that already use it. Both take Delta's type names and
Spark's (BIGINT, INT, ...), nested `ARRAY<...>`, `MAP<...>` and `STRUCT<...>`, `NOT NULL`, a generated column
(`GENERATED ALWAYS AS (expr)`) and a `COMMENT`.
"""

from __future__ import annotations

import re

import click
import pyarrow as pa

from deltacoord.reader.snapshot import delta_type_to_arrow
from deltacoord.schemas.errors import DeltaCoordError

#: Type names accepted besides Delta's own (long, integer, ..., decimal(p,s)): Spark SQL's and a few common ones.
_TYPE_ALIASES = {
    "int": "integer",
    "bigint": "long",
    "smallint": "short",
    "tinyint": "byte",
    "bool": "boolean",
    "str": "string",
    "real": "float",
    "float64": "double",
    "int64": "long",
    "int32": "integer",
    "decimal": "decimal(10,0)",
    "dec": "decimal(10,0)",
    "numeric": "decimal(10,0)",
}
#: Spark's other spellings of decimal(p,s).
_DECIMAL_PREFIXES = ("dec(", "numeric(")

#: Delta's column metadata key of a generated column (`deltacoord.writer.constraints.GENERATION_KEY`).
GENERATION_KEY = "delta.generationExpression"
#: `<type> [not null] generated always as (<SQL>)`: a generated column (Spark's DDL words).
_GENERATED = re.compile(r"^(?P<type>.*?)\s+generated\s+always\s+as\s*\((?P<expr>.*)\)\s*$", re.IGNORECASE | re.DOTALL)
#: A trailing `COMMENT 'text'` (Spark DDL; '' inside the text is a quote).
_COMMENT = re.compile(r"^(?P<rest>.*?)\s+comment\s+'(?P<text>(?:[^']|'')*)'\s*$", re.IGNORECASE | re.DOTALL)
#: `name:type ...` (the short form; the name may hold spaces, not brackets or quotes) and `name TYPE ...` (DDL; a
#: name in backquotes may hold anything but them).
_SHORT_ITEM = re.compile(r"^(?P<name>[^:`'\"<(]+?)\s*:(?P<rest>.*)$", re.DOTALL)
_DDL_ITEM = re.compile(r"^(?P<name>`[^`]+`|[^\s:`]+)\s+(?P<rest>\S.*)$", re.DOTALL)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside parentheses, angle brackets and quotes (so decimal(10,2) and a generation
    expression stay whole; `<` and `>` inside parentheses are comparisons, not brackets)."""
    parts: list[str] = []
    parens = angles = 0
    quote: str | None = None
    cur: list[str] = []
    for ch in text:
        if quote is not None:
            quote = None if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            parens += 1
        elif ch == ")":
            parens -= 1
        elif ch == "<" and parens == 0:
            angles += 1
        elif ch == ">" and parens == 0:
            angles -= 1
        if ch == sep and parens == 0 and angles == 0 and quote is None:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_schema(spec: str) -> pa.Schema:
    """`"id BIGINT NOT NULL, ts TIMESTAMP, d DATE GENERATED ALWAYS AS (CAST(ts AS DATE))"` (or the short form
    `"id:long not null,ts:timestamp"`) -> an Arrow schema: nullable unless NOT NULL; a generated column
    carries its expression as `delta.generationExpression`, a comment as `comment`."""
    fields = [_column(item) for item in split_top_level(spec)]
    if not fields:
        raise click.BadParameter("the schema has no columns", param_hint="--schema")
    names = [f.name for f in fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise click.BadParameter(f"duplicate columns {dupes}", param_hint="--schema")
    return pa.schema(fields)


def _column(item: str) -> pa.Field:
    """One column of the schema text."""
    m = _SHORT_ITEM.match(item) or _DDL_ITEM.match(item)
    if m is None:
        raise click.BadParameter(f"expected 'name TYPE' (or name:type), got {item!r}", param_hint="--schema")
    name, rest = m.group("name").strip("`"), m.group("rest").strip()
    if not name:
        raise click.BadParameter(f"a column without a name in {item!r}", param_hint="--schema")
    metadata: dict[str, str] = {}
    comment = _COMMENT.match(rest)
    if comment is not None:
        metadata["comment"] = comment.group("text").replace("''", "'")
        rest = comment.group("rest").strip()
    generated = _GENERATED.match(rest)
    if generated is not None:
        if not generated.group("expr").strip():
            raise click.BadParameter(f"column {name!r}: an empty generation expression", param_hint="--schema")
        metadata[GENERATION_KEY] = generated.group("expr").strip()
        rest = generated.group("type").strip()
    nullable = True
    if re.search(r"\snot\s+null$", rest, re.IGNORECASE):
        nullable = False
        rest = re.sub(r"\s+not\s+null$", "", rest, flags=re.IGNORECASE)
    try:
        arrow_type = arrow_type_of(rest)
    except ValueError as e:
        raise click.BadParameter(f"column {name!r}: {e}", param_hint="--schema") from e
    return pa.field(name, arrow_type, nullable=nullable, metadata=metadata or None)


def arrow_type_of(text: str) -> pa.DataType:
    """The Arrow type of a Delta or Spark type name, nested types included; ValueError naming what is wrong."""
    low = text.strip().lower()
    compact = re.sub(r"\s+", "", low)
    for kind in ("array<", "map<", "struct<"):
        if compact.startswith(kind):
            if not low.endswith(">"):
                raise ValueError(f"unknown type {text.strip()!r} (a {kind[:-1].upper()} type ends with '>')")
            whole = text.strip()
            return _nested(kind[:-1], whole[whole.index("<") + 1:-1].strip())
    if compact.startswith(("varchar(", "char(")) or compact in ("varchar", "char"):
        raise ValueError(f"{text.strip()!r}: deltacoord does not enforce CHAR/VARCHAR lengths; use STRING")
    if compact.startswith(_DECIMAL_PREFIXES):
        compact = "decimal" + compact[compact.index("("):]
    delta_name = _TYPE_ALIASES.get(compact, compact)
    try:
        return delta_type_to_arrow(delta_name)
    except (DeltaCoordError, ValueError) as e:
        raise ValueError(f"unknown type {text.strip()!r} ({e})") from e


def _nested(kind: str, inner: str) -> pa.DataType:
    if kind == "array":
        return pa.list_(pa.field("element", arrow_type_of(inner)))
    if kind == "map":
        parts = split_top_level(inner)
        if len(parts) != 2:
            raise ValueError(f"MAP<{inner}> needs a key type and a value type")
        return pa.map_(arrow_type_of(parts[0]), pa.field("value", arrow_type_of(parts[1])))
    fields = []
    for part in split_top_level(inner):
        m = _SHORT_ITEM.match(part) or _DDL_ITEM.match(part)
        if m is None:
            raise ValueError(f"a STRUCT field is 'name: TYPE', got {part!r}")
        rest = m.group("rest").strip()
        nullable = not re.search(r"\snot\s+null$", rest, re.IGNORECASE)
        rest = re.sub(r"\s+not\s+null$", "", rest, flags=re.IGNORECASE)
        fields.append(pa.field(m.group("name").strip("`"), arrow_type_of(rest), nullable=nullable))
    if not fields:
        raise ValueError("a STRUCT needs at least one field")
    return pa.struct(fields)


__all__ = ["GENERATION_KEY", "arrow_type_of", "parse_schema", "split_top_level"]
