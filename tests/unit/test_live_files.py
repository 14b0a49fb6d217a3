"""LiveFileSet behaves as a Python set of 64-bit ints through adds, discards and merges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules import live_files
from deltacoord.coordinator.rules.live_files import LiveFileSet

_KEYS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# a small key space makes re-adds, removes of absent keys and add-after-remove common
_OPS = st.lists(st.tuples(st.sampled_from(["add", "discard"]), st.one_of(st.integers(-40, 40), _KEYS)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(initial=st.lists(st.one_of(st.integers(-40, 40), _KEYS), max_size=60), ops=_OPS, merge_min=st.integers(0, 8))
def test_matches_a_python_set(initial: list[int], ops: list[tuple[str, int]], merge_min: int) -> None:
    mp = pytest.MonkeyPatch()
    mp.setattr(live_files, "MERGE_MIN", merge_min)  # merge often, so merged and pending states both get probed
    try:
        ours = LiveFileSet(initial)
        ref = set(initial)
        for op, h in ops:
            getattr(ours, op)(h)
            getattr(ref, op)(h)
            assert len(ours) == len(ref)
            assert (h in ours) == (h in ref)
        for h in set(initial) | {h for _, h in ops}:
            assert (h in ours) == (h in ref), h
        ours.merge()
        assert len(ours) == len(ref) and all(h in ours for h in ref)
    finally:
        mp.undo()


def test_merges_keep_pending_changes_bounded() -> None:
    s = LiveFileSet(range(0, 200_000, 2))
    for h in range(1, 40_001, 2):
        s.add(h)
    for h in range(0, 40_000, 4):
        s.discard(h)
    assert len(s) == 100_000 + 20_000 - 10_000
    assert len(s._added) + len(s._removed) <= max(live_files.MERGE_MIN, s._base.size >> 4) + 1
    assert 3 in s and 4 not in s and 6 in s and 40_001 not in s
    assert "a" not in s  # type: ignore[operator]


def test_a_million_members_take_about_eight_bytes_each() -> None:
    s = LiveFileSet(hash((f"d=1/part-{i}.parquet", None)) for i in range(1_000_000))
    assert len(s) == 1_000_000
    assert s.nbytes == 8_000_000
