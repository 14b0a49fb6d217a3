"""Identity columns (PROTOCOL.md "Identity Columns"): the column metadata both the writer and the coordinator read.

A column is an identity column when its field metadata has `delta.identity.start` and `.step`; the
high-water mark (`delta.identity.highWaterMark`) is the last value handed out. `GENERATED ALWAYS`
columns (`allowExplicitInsert` false) take only generated values; `BY DEFAULT` ones also take given values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

START = "delta.identity.start"
STEP = "delta.identity.step"
HIGH_WATER_MARK = "delta.identity.highWaterMark"
ALLOW_EXPLICIT_INSERT = "delta.identity.allowExplicitInsert"


@dataclass(frozen=True)
class IdentityColumn:
    name: str
    start: int
    step: int
    high_water_mark: int | None
    allow_explicit_insert: bool

    def next_values(self, n: int) -> list[int]:
        """The next `n` values after the high-water mark (from `start` when none was handed out)."""
        first = self.start if self.high_water_mark is None else self.high_water_mark + self.step
        return [first + i * self.step for i in range(n)]

    def used(self, value: int) -> bool:
        """Whether `value` is at or behind the high-water mark (in the step's direction)."""
        if self.high_water_mark is None:
            return False
        return value <= self.high_water_mark if self.step > 0 else value >= self.high_water_mark


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def identity_columns(schema: Mapping[str, Any]) -> list[IdentityColumn]:
    """The top-level identity columns of a Delta schema (JSON); malformed metadata is skipped."""
    out = []
    for f in schema.get("fields", []):
        md = f.get("metadata") or {}
        start, step = _int(md.get(START)), _int(md.get(STEP))
        if start is None or step is None or step == 0:
            continue
        out.append(IdentityColumn(f["name"], start, step, _int(md.get(HIGH_WATER_MARK)),
                                  bool(md.get(ALLOW_EXPLICIT_INSERT, False))))
    return out


def with_high_water_marks(schema_string: str, marks: Mapping[str, int]) -> str:
    """The schema with the identity columns' high-water marks set to `marks` (column name -> value)."""
    schema = json.loads(schema_string)
    for f in schema.get("fields", []):
        if f["name"] in marks:
            f["metadata"] = {**(f.get("metadata") or {}), HIGH_WATER_MARK: marks[f["name"]]}
    return json.dumps(schema, separators=(",", ":"))


__all__ = ["ALLOW_EXPLICIT_INSERT", "HIGH_WATER_MARK", "START", "STEP", "IdentityColumn", "identity_columns",
           "with_high_water_marks"]
