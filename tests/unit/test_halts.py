"""The one record of halts (`deltacoord.coordinator.halts`): what is shown, what is still to be recorded on the
commits topic, and that the publisher halts through it."""

from __future__ import annotations

from deltacoord.coordinator.delta_log.publisher import Publisher
from deltacoord.coordinator.halts import Halts


def test_the_first_cause_is_recorded_and_the_latest_shown() -> None:
    h = Halts()
    assert h.halt("t", "file:///t", "first", head=3)
    assert not h.halt("t", "file:///t", "second")
    assert h.why("t") == "second" and h.tables() == {"t": "second"} and h.count() == 1
    [pending] = h.unrecorded()
    assert (pending.why, pending.head) == ("first", 3)
    assert h.all()[0].since_ms == pending.since_ms


def test_a_recorded_halt_is_not_recorded_again_until_the_table_halts_anew() -> None:
    h = Halts()
    h.halt("t", "file:///t", "why")
    h.recorded(h.unrecorded())
    assert h.unrecorded() == [] and h.why("t") == "why"
    h.halt("r", "file:///r", "read back", recorded=True)
    assert h.unrecorded() == [] and h.why("r") == "read back"
    h.halt("t", "file:///t", "again")
    assert [x.why for x in h.unrecorded()] == ["again"]


def test_the_recording_partition_fixes_the_head_once() -> None:
    h = Halts()
    h.halt("t", "file:///t", "why")
    fixed = h.fix_head("t", 7)
    assert fixed is not None and fixed.head == 7
    again = h.fix_head("t", 9)
    assert again is not None and again.head == 7
    h.recorded([fixed])
    assert h.unrecorded() == [] and h.fix_head("t", 1) is None


def test_a_halt_replaced_while_its_record_was_in_flight_stays_to_record() -> None:
    h = Halts()
    h.halt("t", "file:///t", "why")
    [taken] = h.unrecorded()
    h.reset("t")
    h.halt("t", "file:///t", "later")
    h.recorded([taken])
    assert [x.why for x in h.unrecorded()] == ["later"]


def test_lift_forget_reset() -> None:
    h = Halts()
    for t in ("a", "b", "c"):
        h.halt(t, f"file:///{t}", t)
    h.lift("a")
    h.forget(["b"])
    h.reset("c")
    assert h.tables() == {}
    assert [x.table_id for x in h.unrecorded()] == ["b"], "a rebuilt partition still records a halt it had not recorded"
    h.drop_unrecorded("b")
    assert h.unrecorded() == []


def test_the_publisher_halts_and_resumes_through_its_halts() -> None:
    halts = Halts()
    seen: list[tuple[str, str, str]] = []
    p = Publisher(halts=halts, on_halted=lambda *a: seen.append(a))
    p.halt("t", "file:///t", "why")
    assert halts.why("t") == "why" and p.halted("t") == "why" and p.halted_count() == 1
    assert seen == [("t", "file:///t", "why")] and [x.table_id for x in halts.unrecorded()] == ["t"]
    assert [g.halted for g in p.table_gauges()] == [True]
    p.resume("t")
    assert halts.tables() == {} and halts.unrecorded() == [] and p.halted("t") is None
    p.forget(["gone"])
    p.halt("gone", "file:///gone", "after it moved")  # its partition moved: the new owner finds the cause
    assert halts.why("gone") is None and len(seen) == 1
