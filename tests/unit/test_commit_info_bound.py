"""commitInfo's size is checked without encoding it when a bound shows it is small: the answer is the one
`json.dumps` gives (the same refusals, with the same reasons), whatever the values hold."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules import validate
from deltacoord.schemas.errors import InvalidProposalError


def _by_dumps(values: Mapping[str, Any]) -> str | None:
    """The check as it was: walk for depth, then measure `json.dumps`."""
    stack: list[tuple[Any, int]] = [(values, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > validate.MAX_COMMIT_INFO_DEPTH:
            return "COMMIT_INFO_TOO_DEEP"
        if isinstance(v, Mapping):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
    try:
        size = len(json.dumps(values, separators=(",", ":"), default=str))
    except (TypeError, ValueError):
        return "MALFORMED_PROPOSAL"
    return "COMMIT_INFO_TOO_LARGE" if size > validate.MAX_COMMIT_INFO_CHARS else None


def _checked(values: Mapping[str, Any]) -> str | None:
    try:
        validate._check_commit_info(values)
    except InvalidProposalError as e:
        return str(e.reason.value if hasattr(e.reason, "value") else e.reason)
    return None


_TEXT = st.text(alphabet=st.sampled_from(["a", "\"", "\\", "\n", "\x01", "é", "中", "\U0001f600"]), max_size=40)
_SCALAR = st.one_of(_TEXT, st.integers(-10**30, 10**30), st.booleans(), st.none(),
                    st.floats(allow_nan=True, allow_infinity=True), st.integers(14_000, 15_000).map(lambda n: 1 << n), st.just(("a", 1)),
                    st.just(object()), st.just(b"bytes"))
_KEY = st.one_of(_TEXT, st.integers(-10, 10**20), st.booleans(), st.none(), st.floats(), st.just(("k",)))
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(_KEY, inner, max_size=4)), max_leaves=30)


@settings(max_examples=250, deadline=None)
@given(values=st.dictionaries(_TEXT, _VALUE, max_size=6), limit=st.sampled_from([40, 200, 1_000, 64 * 1024]))
def test_the_bounded_check_answers_as_json_dumps_does(values: dict[str, Any], limit: int) -> None:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(validate, "MAX_COMMIT_INFO_CHARS", limit)
        assert _checked(values) == _by_dumps(values)


def test_a_commit_info_just_over_the_limit_is_refused_and_one_just_under_is_not() -> None:
    limit = validate.MAX_COMMIT_INFO_CHARS
    base = len(json.dumps({"k": ""}, separators=(",", ":")))
    assert _checked({"k": "x" * (limit - base)}) is None
    assert _checked({"k": "x" * (limit - base + 1)}) == "COMMIT_INFO_TOO_LARGE"
    # Each emoji is 12 characters of JSON: a value of 5,500 is over the limit although it is 5,500 characters.
    assert _checked({"k": "\U0001f600" * 5_500}) == "COMMIT_INFO_TOO_LARGE"
