"""The window's index of marked winners (`WinnersWindow.marked_since`, `Winners.marked`) holds exactly the
retained marked commits, through bounds, forks, forks of forks and commits of forks; and a blind append far
behind the head is decided without a list of every intervening commit being built."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules import conflicts, layers
from deltacoord.coordinator.rules.layers import ForkedWindow, WinnersWindow
from deltacoord.coordinator.rules.outcomes import Rejected
from deltacoord.coordinator.rules.state import Winners
from tests.unit.builders import Harness, add, insert_op, metadata


@dataclass(frozen=True)
class _C:
    version: int
    num_file_actions: int
    marked: bool


def _expected(w: WinnersWindow[_C] | ForkedWindow[_C], after: int) -> list[_C]:
    return [c for c in w.tail(len(w)) if c.marked and c.version > after]


def _agrees(w: WinnersWindow[_C] | ForkedWindow[_C]) -> None:
    head = w.oldest_version + len(w) - 1
    for after in range(w.oldest_version - 3, head + 2):
        assert w.marked_since(after) == _expected(w, after), after


# One step: ("append", marked, files) on the innermost fork (or the base), "fork", "commit" (the innermost
# fork into the base, when it is a fork of the base) or "drop" (the innermost fork).
_STEP = st.one_of(
    st.tuples(st.just("append"), st.booleans(), st.integers(0, 3)),
    st.tuples(st.sampled_from(["fork", "commit", "drop"]), st.just(False), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEP, max_size=60), max_commits=st.integers(1, 8), max_files=st.integers(0, 12))
def test_marked_since_is_the_retained_marked_commits(steps: list[tuple[str, bool, int]], max_commits: int,
                                                     max_files: int) -> None:
    base: WinnersWindow[_C] = WinnersWindow()
    chain: list[ForkedWindow[_C]] = []
    for kind, marked, files in steps:
        top: WinnersWindow[_C] | ForkedWindow[_C] = chain[-1] if chain else base
        if kind == "append":
            nxt = top.oldest_version + len(top)
            top.append(_C(nxt, files, marked), max_commits, max_files)
        elif kind == "fork":
            chain.append(top.fork())
        elif kind == "commit" and len(chain) == 1:
            chain.pop().commit()
        elif kind == "drop" and chain:
            chain.pop()
        for w in [base, *chain]:
            _agrees(w)


def test_winners_marked_are_the_marked_winners_after_the_read_version() -> None:
    h = Harness(["part"], max_window_commits=40)
    for i in range(60):
        loud = i % 7 == 3
        if loud:
            h.commit_raw([metadata(["part"], config={"k": str(i)})], operation="SET TBLPROPERTIES")
        else:
            h.commit_raw([add(f"f{i}.parquet", part=i % 2)], blind=True)
    fork = h.state.fork()
    fork.apply(fork.version + 1, (metadata(["part"], config={"k": "fork"}),))
    for st_ in (h.state, fork):
        for rv in range(st_.oldest_retained_version - 1, st_.version + 1):
            ws = st_.winners_since(rv)
            if rv == st_.version:
                assert list(ws) == []
                continue
            assert isinstance(ws, Winners)
            assert ws.marked() == [w for w in list(ws) if w.marked]
            assert len(ws) == st_.version - rv and [w.version for w in ws] == list(range(rv + 1, st_.version + 1))
            if len(ws):
                assert ws[0].version == rv + 1 and ws[-1].version == st_.version


def test_a_far_behind_blind_append_builds_no_list_of_the_intervening_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(["part"])
    read_version = h.head
    for i in range(2_000):
        h.commit_raw([add(f"w-{i}.parquet", part=i % 2)], blind=True)
    h.commit_raw([metadata(["part"], config={"k": "v"})], operation="SET TBLPROPERTIES")
    for i in range(2_000):
        h.commit_raw([add(f"x-{i}.parquet", part=i % 2)], blind=True)

    def no_tail(*_a: object) -> object:
        raise AssertionError("the window's commits were listed")

    monkeypatch.setattr(layers.WinnersWindow, "tail", no_tail)
    seen: list[int] = []
    real = conflicts._check_winner

    def spy(cur: object, w: conflicts.WinningCommit, table: str) -> None:
        seen.append(w.version)
        real(cur, w, table)  # type: ignore[arg-type]

    monkeypatch.setattr(conflicts, "_check_winner", spy)
    r = h.decide(insert_op(read_version, [add("late.parquet", part=0)]))
    assert isinstance(r, Rejected) and type(r.error).__name__ == "MetadataChangedException"
    assert seen == [read_version + 2_001]
