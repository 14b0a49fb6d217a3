"""The bookkeeping of holds (`deltacoord.coordinator.kafka.holds`): which proposals are expensive, what waits behind a
hold, the offset a transaction may record, and the bound on decisions past it. The loop itself is tested against a
real broker (tests/integration/test_holds.py)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any

from deltacoord.coordinator.kafka.door import Decoded
from deltacoord.coordinator.kafka.holds import ACTIONS, PREDICATES, Behind, Hold, Holds, expensive, joins
from deltacoord.coordinator.rules.batch import Submitted
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.messages import StagedActions
from tests.unit.builders import proposal

SETTINGS = CoordinatorSettings("127.0.0.1:1", hold_min_actions=100, hold_predicate_chars=50)
DEFAULTS = CoordinatorSettings("127.0.0.1:1")


def _decoded(offset: int, table: str, **kw: Any) -> Decoded:
    return Decoded(offset, submitted=Submitted(proposal(0, table_id=table, table_uri=f"file:///t/{table}")), **kw)


def _held(h: Holds, offset: int, table: str) -> None:
    h.hold = Hold([(None, _decoded(offset, table, expensive=ACTIONS))], ACTIONS, Future(), 0.0)  # type: ignore[list-item]


def test_large_commits_by_reference_and_long_predicates_are_expensive() -> None:
    p = proposal(0)
    assert expensive(p, SETTINGS) is None
    assert expensive(dataclasses.replace(p, staged=StagedActions("0" * 64, 100, 1)), SETTINGS) == ACTIONS
    assert expensive(dataclasses.replace(p, staged=StagedActions("0" * 64, 99, 1)), SETTINGS) is None
    assert expensive(proposal(0, predicates=["a = 1" * 5, "b = 2" * 5]), SETTINGS) == PREDICATES
    assert expensive(proposal(0, predicates=["a = 1"]), SETTINGS) is None


def test_only_predicates_sqlglot_would_parse_hold() -> None:
    """What the rules refuse before parsing (too long, nested too deep, too many) is cheap to decide: a barrage of
    such junk never takes a hold, and a long predicate that parses does (by default from 4,096 characters)."""
    parsed = " OR ".join(f"(date = '2026-01-{i % 28 + 1:02d}' AND id <> {i})" for i in range(120))
    assert 4096 <= len(parsed) <= 16_384
    assert expensive(proposal(0, predicates=[parsed]), DEFAULTS) == PREDICATES
    assert expensive(proposal(0, predicates=[parsed[:3000]]), DEFAULTS) is None, "below the default"
    refused_unparsed = [
        ["x" * 70_000],  # over the total length
        ["a = 1"] * 65 + [parsed],  # over the count
        ["x" * 16_385],  # one over the length of a predicate
        ["(" * 3_000 + "date = '2024-01-01'" + ")" * 3_000],  # nested too deep
        ["NOT " * 2_000 + "date = '2024-01-01'"],
        ["", parsed],  # the first is refused: the rules stop there
    ]
    for predicates in refused_unparsed:
        assert expensive(proposal(0, predicates=predicates), DEFAULTS) is None, [p[:20] for p in predicates]
    assert expensive(proposal(0, predicates=[parsed, "x" * 16_385]), DEFAULTS) == PREDICATES, "parsed before the refusal"
    assert expensive(proposal(0, predicates=[parsed]), CoordinatorSettings("127.0.0.1:1", hold_predicate_chars=0)) is None


def test_a_hold_takes_the_messages_of_its_table_right_after_it_but_no_request_or_other_large_commit() -> None:
    assert joins(_decoded(2, "a"), {"a"}) and joins(Decoded(3), {"a"}), "its table's, or a dead letter's (no table)"
    assert joins(_decoded(4, "a", expensive=PREDICATES), {"a"})
    assert not joins(_decoded(5, "b"), {"a"}), "another table's"
    assert not joins(_decoded(6, "a", request="release"), {"a"}) and not joins(Decoded(7, resume="a"), {"a"})
    assert not joins(_decoded(8, "a", expensive=ACTIONS), {"a"}), "one large commit loaded at a time"


def test_only_what_names_a_held_or_waiting_table_waits_and_a_resume_waits_with_all_after_it() -> None:
    h = Holds(runahead_limit=10)
    assert not h.blocks(_decoded(5, "a")), "nothing held: nothing waits"
    _held(h, 5, "a")
    assert h.blocks(_decoded(6, "a")) and not h.blocks(_decoded(6, "b"))
    aside = Behind()
    aside.add(_decoded(6, "c"))
    assert h.blocks(_decoded(7, "c"), aside), "behind a message of its table set aside in the batch"
    h.wait([(None, _decoded(8, "d"))])  # type: ignore[list-item]
    assert h.blocks(_decoded(9, "d"))
    assert h.blocks(Decoded(10, resume="b")), "a resumption rebuilds the partition: it waits for the hold"
    h.wait([(None, Decoded(10, resume="b"))])  # type: ignore[list-item]
    assert h.blocks(_decoded(11, "e")), "and everything after it waits too"
    assert [x.offset for _m, x in h.take_waiting()] == [8, 10]
    h.hold = None
    assert not h.blocks(_decoded(12, "d")) and not h.blocks(Decoded(13, resume="b")), "taken: nothing waits"


def test_no_offset_is_recorded_past_the_first_undecided_one() -> None:
    h = Holds(runahead_limit=10)
    assert h.floor() is None
    _held(h, 7, "a")
    assert h.floor() == 7 and h.floor([_decoded(3, "x")]) == 3
    h.hold = None
    h.wait([(None, _decoded(9, "a"))])  # type: ignore[list-item]
    h.wait([(None, _decoded(8, "a"))], first=True)  # type: ignore[list-item]
    assert h.floor() == 8, "what waited behind the hold still holds the offset"


def test_decisions_past_a_hold_are_bounded_and_counted_from_the_first_undecided_offset() -> None:
    h = Holds(runahead_limit=3)
    h.recorded(5)
    assert h.runahead == 0 and not h.at_limit(), "nothing held: nothing counted"
    _held(h, 1, "a")
    h.recorded(2)
    assert not h.at_limit() and h.at_limit(1), "counting the decisions of the run about to be recorded"
    h.recorded(1)
    assert h.at_limit(), "at the bound the loop waits for the hold"
    h.hold = None
    h.recorded(1)
    assert h.runahead == 0, "once everything consumed is decided, the count starts over"
    g = h.generation
    _held(h, 2, "a")
    h.reset()
    assert h.hold is None and h.generation == g + 1 and h.describe() is None
