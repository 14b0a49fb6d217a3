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
from deltacoord.schemas.reasons import ReasonCode


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


_PLAIN_SCALAR = st.one_of(_TEXT, st.integers(-10**30, 10**30), st.booleans(), st.none(),
                          st.floats(allow_nan=True, allow_infinity=True))
_PLAIN = st.recursive(_PLAIN_SCALAR, lambda inner: st.dictionaries(_TEXT, inner, max_size=4), max_leaves=30)


def _nested(levels: int, leaf: object) -> dict[str, Any]:
    """A commitInfo of `levels` dicts one inside the other, the innermost holding `leaf`."""
    values: dict[str, Any] = {"k": leaf}
    for _ in range(levels - 1):
        values = {"k": values}
    return values


@settings(max_examples=250, deadline=None)
@given(values=st.one_of(st.dictionaries(_TEXT, _VALUE, max_size=6), st.integers(1, 20).map(lambda n: _nested(n, "x"))))
def test_the_one_pass_bound_answers_with_the_walks_bound_or_leaves_it_to_the_walk(values: dict[str, Any]) -> None:
    """The fast path (`_plain_bound`) gives the general walk's bound or none (-1); every value nested too deep is
    left to the walk, which refuses it."""
    fast = validate._plain_bound(values, 1)
    try:
        walked = validate._walked_bound(values)
    except InvalidProposalError as e:
        assert fast == -1 and e.reason == ReasonCode.COMMIT_INFO_TOO_DEEP
        return
    assert fast in (-1, walked)


@settings(max_examples=250, deadline=None)
@given(values=st.dictionaries(_TEXT, _PLAIN, max_size=6))
def test_a_plain_commit_info_takes_the_one_pass_bound(values: dict[str, Any]) -> None:
    """String keys; strings, numbers, booleans, nulls and such dicts: the common commitInfo is bounded in one pass."""
    try:
        walked = validate._walked_bound(values)
    except InvalidProposalError:
        assert validate._plain_bound(values, 1) == -1
        return
    assert walked is not None and validate._plain_bound(values, 1) == walked


@pytest.mark.parametrize("leaf", ["x", 7, None, {}])
def test_a_commit_info_nested_to_the_limit_passes_and_one_level_more_is_refused(leaf: object) -> None:
    depth = validate.MAX_COMMIT_INFO_DEPTH
    # The leaf sits one level below the innermost of the nested dicts.
    assert _checked(_nested(depth - 1, leaf)) is None
    assert _checked(_nested(depth, leaf)) == "COMMIT_INFO_TOO_DEEP"
