"""Identity columns at the coordinator: a commit may never hand out an identity value twice.

Concurrent writers of an identity table conflict through the metaData action that advances the
high-water mark (any winner metaData is MetadataChangedException). These checks refuse what a
single bad proposal could still do: lower a mark, or append values of a GENERATED ALWAYS column at or
behind the mark, or beyond the mark it declares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType

from deltacoord.schemas.actions import Action, AddFile, Metadata, RemoveFile
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.identity import HIGH_WATER_MARK, IdentityColumn, identity_columns
from deltacoord.schemas.reasons import ReasonCode


def _columns(md: Metadata | None) -> Mapping[str, IdentityColumn]:
    if md is None:
        return {}
    if type(md.schema_string) is str:
        return _columns_of(md.schema_string)  # the common case: once per schema, not once per proposal
    return _parsed_columns(md.schema_string)


def _parsed_columns(schema_string: object) -> Mapping[str, IdentityColumn]:
    try:
        return MappingProxyType({c.name: c for c in identity_columns(json.loads(schema_string))})  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return MappingProxyType({})


#: The identity columns of the few schemas in use (a schema string is immutable; what it holds is read only).
_columns_of = lru_cache(maxsize=64)(_parsed_columns)


def _bounds(add: AddFile, column: str) -> tuple[int, int] | None:
    try:
        stats = json.loads(add.stats or "{}")
        lo, hi = stats["minValues"][column], stats["maxValues"][column]
    except (ValueError, KeyError, TypeError):
        return None
    return (lo, hi) if isinstance(lo, int) and isinstance(hi, int) else None


def _behind(c: IdentityColumn, value: int, mark: int) -> bool:
    return value > mark if c.step > 0 else value < mark


def _without_marks(schema_string: str) -> object:
    schema = json.loads(schema_string)
    for f in schema.get("fields", []):
        md = f.get("metadata")
        if isinstance(md, dict):
            md.pop(HIGH_WATER_MARK, None)
    return schema


def only_marks_changed(before: Metadata | None, after: Metadata) -> bool:
    """Whether `after` differs from `before` in identity high-water marks and nothing else (Delta Spark lets
    such a winner pass a transaction that changes no metadata itself)."""
    if before is None or before.schema_string == after.schema_string:
        return False
    same = (before.id, before.name, before.description, before.format_provider, dict(before.format_options or {}),
            tuple(before.partition_columns), dict(before.configuration), before.created_time) == \
           (after.id, after.name, after.description, after.format_provider, dict(after.format_options or {}),
            tuple(after.partition_columns), dict(after.configuration), after.created_time)
    try:
        return same and _without_marks(before.schema_string) == _without_marks(after.schema_string)
    except (ValueError, AttributeError, TypeError):
        return False


def identity_error(before: Metadata | None, after: Metadata | None, actions: Sequence[Action]) -> InvalidProposalError | None:
    """Why this commit would reuse identity values (None: it does not)."""
    old = _columns(before)
    if not old:
        return None
    new = _columns(after) if after is not None else old
    for name, c in old.items():
        n = new.get(name)
        if n is None or c.high_water_mark is None:
            continue
        if n.high_water_mark is None or (c.used(n.high_water_mark) and n.high_water_mark != c.high_water_mark):
            return InvalidProposalError(ReasonCode.IDENTITY_VALUE_REUSED, (
                f"identity column {name!r}: the commit moves the high-water mark back from {c.high_water_mark} to "
                f"{n.high_water_mark}; identity values would be handed out twice"))
    if any(isinstance(a, RemoveFile) for a in actions):
        return None  # rewritten rows keep their values; only appends hand out new ones
    for a in actions:
        if not isinstance(a, AddFile):
            continue
        for name, c in old.items():
            n = new.get(name, c)
            b = _bounds(a, name)
            if b is None:
                continue
            first, last = (b[0], b[1]) if c.step > 0 else (b[1], b[0])
            if not c.allow_explicit_insert and c.used(first):
                return InvalidProposalError(ReasonCode.IDENTITY_VALUE_REUSED, (
                    f"identity column {name!r} is GENERATED ALWAYS and the file {a.path!r} holds value {first}, at or "
                    f"behind the high-water mark {c.high_water_mark}: generate values from the table's latest version"))
            if not c.allow_explicit_insert and (n.high_water_mark is None or _behind(c, last, n.high_water_mark)):
                return InvalidProposalError(ReasonCode.IDENTITY_VALUE_REUSED, (
                    f"identity column {name!r}: the file {a.path!r} holds value {last} beyond the high-water mark "
                    f"{n.high_water_mark} the commit declares; a later commit would hand it out again"))
    return None


__all__ = ["identity_error", "only_marks_changed"]
