"""LiveFileSet behaves as a Python set of 64-bit ints through adds, discards and merges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules import live_files
from deltacoord.coordinator.rules.live_files import LiveFileLayer, LiveFileSet

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


@settings(max_examples=150, deadline=None)
@given(initial=st.lists(st.one_of(st.integers(-40, 40), _KEYS), max_size=60), pending=_OPS,
       batches=st.lists(st.tuples(st.sets(st.one_of(st.integers(-40, 40), _KEYS), max_size=40), st.booleans()),
                        max_size=6),
       merge_min=st.integers(0, 8), layers=st.integers(0, 2))
def test_bulk_changes_match_a_python_set(initial: list[int], pending: list[tuple[str, int]],
                                         batches: list[tuple[set[int], bool]], merge_min: int, layers: int) -> None:
    """`add_many`/`discard_many` (a commit's distinct hashes at once), on a set with pending changes or on layers over
    it, then folded down (`commit`), leave what one-by-one adds and discards leave."""
    mp = pytest.MonkeyPatch()
    mp.setattr(live_files, "MERGE_MIN", merge_min)  # bulk merges into the array, and the one-by-one fallback
    try:
        base = LiveFileSet(initial)
        ref = set(initial)
        for op, h in pending:
            getattr(base, op)(h)
            getattr(ref, op)(h)
        stack: list[LiveFileSet | LiveFileLayer] = [base]
        for _ in range(layers):
            stack.append(stack[-1].fork())
        top = stack[-1]
        for hashes, adding in batches:
            arr = np.array(sorted(hashes), dtype=np.int64)
            assert top.contains_many(arr).tolist() == [h in ref for h in sorted(hashes)]
            if adding:
                top.add_many(arr)
                ref |= hashes
            else:
                top.discard_many(arr)
                ref -= hashes
            assert len(top) == len(ref)
        probe = set(initial) | {h for _, h in pending} | {h for hs, _ in batches for h in hs}
        assert all((h in top) == (h in ref) for h in probe)
        for layer in reversed(stack[1:]):
            assert isinstance(layer, LiveFileLayer)
            layer.commit()
        assert len(base) == len(ref) and all((h in base) == (h in ref) for h in probe)
        base.merge()
        assert set(base.array().tolist()) == ref
    finally:
        mp.undo()


@pytest.mark.parametrize("forked", [False, True])
def test_a_large_commit_changes_the_live_files_as_one_by_one_changes_do(forked: bool) -> None:
    """`TableState.apply` changes the live files of a commit of hundreds of files at once; with a key twice in it (which
    validation refuses, and the state still takes in order) it goes one by one. Either way the same files are live."""
    from deltacoord.coordinator.rules import state as state_module
    from deltacoord.schemas.actions import AddFile, RemoveFile
    from tests.unit.builders import Harness

    def run(bulk_from: int, twice: bool) -> list[bool]:
        mp = pytest.MonkeyPatch()
        mp.setattr(state_module, "BULK_LIVE_CHANGES", bulk_from)
        try:
            h = Harness()
            h.commit_raw([AddFile(f"old-{i}.parquet", {}, 1, 1, True) for i in range(400)])
            st_ = h.state.fork() if forked else h.state
            actions: list[AddFile | RemoveFile] = [RemoveFile(f"old-{i}.parquet", 2, True) for i in range(0, 400, 2)]
            actions += [RemoveFile(f"never-{i}.parquet", 2, True) for i in range(50)]
            actions += [AddFile(f"new-{i}.parquet", {}, 1, 1, True) for i in range(300)]
            actions += [AddFile(f"old-{i}.parquet", {}, 1, 1, True) for i in range(1, 40, 2)]  # already live
            if twice:
                actions += [RemoveFile("new-7.parquet", 2, True), AddFile("new-7.parquet", {}, 1, 1, True),
                            RemoveFile("new-8.parquet", 2, True)]
            st_.apply(st_.version + 1, actions)
            if forked:
                h.state.absorb(st_)
            names = [f"{k}-{i}.parquet" for k in ("old", "new", "never") for i in range(400)]
            return [h.state.is_live(AddFile(n, {}, 1, 1, True)) for n in names] + [h.state.live_file_count == 0]
        finally:
            mp.undo()

    for twice in (False, True):
        assert run(256, twice) == run(10**9, twice)
    assert run(256, False) != run(256, True)
