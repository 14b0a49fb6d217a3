"""The pure batch decision: forks see what a copy would see, the live state never changes, nothing is copied."""

from __future__ import annotations

import copy
import tracemalloc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deltacoord.coordinator.rules.batch import Submitted, decide_batch
from deltacoord.coordinator.rules.conflicts import decide
from deltacoord.coordinator.rules.outcomes import Accepted
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Action, CommitInfo
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.reasons import ReasonCode
from tests.unit.builders import (
    NOW,
    TABLE_ID,
    TABLE_URI,
    Harness,
    add,
    domain,
    metadata,
    proposal,
    protocol,
    remove,
    txn,
)

# -- TableState.fork ---------------------------------------------------------------------------------------

_paths = st.sampled_from([f"f{i}.parquet" for i in range(12)])
_commit = st.tuples(
    st.lists(_paths, max_size=4, unique=True),  # adds
    st.lists(_paths, max_size=3, unique=True),  # removes
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),  # app ids (txn)
    st.lists(st.tuples(st.sampled_from(["d1", "d2"]), st.booleans()), max_size=2, unique_by=lambda d: d[0]),  # domains
)


def _actions(i: int, c: tuple[list[str], list[str], list[str], list[tuple[str, bool]]]) -> list[Action]:
    adds, removes, apps, domains = c
    out: list[Action] = [CommitInfo({"operation": "WRITE", "txnId": f"t{i}", "isBlindAppend": not removes})]
    out += [add(p) for p in adds]
    out += [remove(p) for p in removes if p not in adds]
    out += [txn(a, i) for a in apps]
    out += [domain(name, removed=gone) for name, gone in domains]
    return out


def _created(**bounds: int) -> TableState:
    s = TableState.empty(TABLE_ID, TABLE_URI, **bounds)
    s.apply(0, [CommitInfo({"operation": "CREATE TABLE", "txnId": "t0"}), protocol(), metadata()])
    return s


def _view(s: TableState) -> dict[str, Any]:
    """Everything the rules can observe of a state."""
    winners = {}
    for rv in range(-1, s.version + 1):
        try:
            winners[rv] = [(w.version, w.removed_paths, w.app_ids, w.domains, w.quiet) for w in s.winners_since(rv)]
        except LookupError as e:
            winners[rv] = type(e).__name__
    return {
        "version": s.version, "metadata": s.metadata, "last_ict": s.last_ict, "ts": s.last_commit_timestamp,
        "apps": dict(s.app_versions), "domains": dict(s.domains), "has_apps": bool(s.app_versions),
        "live": {p: s.is_live(add(p)) for p in (f"f{i}.parquet" for i in range(12))}, "count": s.live_file_count,
        "txns": {f"t{i}": s.committed_version_of(f"t{i}") for i in range(40)},
        "oldest": s.oldest_retained_version, "window": s.window_size, "winners": winners,
    }


@settings(max_examples=150, deadline=None)
@given(before=st.lists(_commit, max_size=10), after=st.lists(_commit, min_size=1, max_size=10),
       commits=st.integers(1, 6), files=st.integers(0, 12), txns=st.integers(0, 8))
def test_a_fork_sees_what_the_state_would_and_leaves_it_unchanged(
        before: list[Any], after: list[Any], commits: int, files: int, txns: int) -> None:
    bounds = {"max_window_commits": commits, "max_window_files": files, "txn_index_limit": txns}
    live, reference = _created(**bounds), _created(**bounds)
    for i, c in enumerate(before, start=1):
        live.apply(i, _actions(i, c))
        reference.apply(i, _actions(i, c))
    untouched = _view(live)
    fork = live.fork()
    twice = live.fork().fork()  # a fork of a fork layers the same way
    for i, c in enumerate(after, start=len(before) + 1):
        fork.apply(i, _actions(i, c))
        reference.apply(i, _actions(i, c))
        assert _view(fork) == _view(reference)
    assert _view(live) == untouched
    for i, c in enumerate(after, start=len(before) + 1):
        twice.apply(i, _actions(i, c))
    assert _view(twice) == _view(reference)
    live.absorb(fork)  # what a committed batch does: the fork's changes become the state's
    assert _view(live) == _view(reference)
    for i, c in enumerate(before[:3], start=len(before) + len(after) + 1):  # and the state goes on from there
        live.apply(i, _actions(i, c))
        reference.apply(i, _actions(i, c))
    assert _view(live) == _view(reference)


# -- decide_batch ------------------------------------------------------------------------------------------


def _sequential(state: TableState, proposals: list[Proposal], now: int) -> list[tuple[Any, ...]]:
    """The decisions one proposal at a time on a copy, applying each acceptance (the definition of a batch)."""
    s = copy.deepcopy(state)
    out = []
    for p in proposals:
        r = decide(s, p, now)
        if isinstance(r, Accepted):
            s.apply(r.version, r.actions)
            out.append(("COMMITTED", r.version))
        else:
            out.append(("REJECTED", getattr(r, "version", None)))
    return out


def _summary(ds: list[Decision]) -> list[tuple[Any, ...]]:
    return [(d.outcome.value, d.version if d.duplicate_of is None else None) for d in ds]


def _batch(h: Harness) -> list[Proposal]:
    rv = h.head
    a = add("part=1/new-a.parquet", part=1)
    return [
        proposal(rv, [a]),  # blind append
        proposal(rv, [add("part=2/new-b.parquet", part=2)]),
        proposal(rv, [remove("part=1/old.parquet", part=1)], predicates=["part = 1"],
                 read_files=[add("part=1/old.parquet", part=1)]),  # reads part=1, which the first one appended to
        proposal(rv + 1, [add("part=3/c.parquet", part=3), txn("q", 1)], app_ids=["q"]),
        proposal(rv, [add("part=3/d.parquet", part=3), txn("q", 1)], app_ids=["q"]),  # loses to the previous txn
    ]


def test_a_batch_decides_as_one_proposal_at_a_time_and_leaves_the_states_alone() -> None:
    h = Harness(("part",), isolation="Serializable", files=[add("part=1/old.parquet", part=1)])
    before = copy.deepcopy(h.state)
    proposals = _batch(h)
    decisions, overlay = decide_batch({TABLE_ID: h.state}, proposals, NOW)
    assert _summary(decisions) == [("COMMITTED", 2), ("COMMITTED", 3), ("REJECTED", None), ("COMMITTED", 4),
                                   ("REJECTED", None)]
    assert [d[0] for d in _sequential(h.state, proposals, NOW)] == [d.outcome.value for d in decisions]
    assert _view(h.state) == _view(before)  # nothing applied yet: an abort would only drop the overlay
    assert [c.version for c in overlay.commits] == [2, 3, 4] and not overlay.created

    live = {TABLE_ID: h.state}
    overlay.apply_to(live)
    reference = copy.deepcopy(before)
    for c in overlay.commits:
        reference.apply(c.version, c.actions)
    assert live[TABLE_ID] is h.state and _view(h.state) == _view(reference)


def test_a_table_created_in_a_batch_becomes_live_only_with_the_overlay() -> None:
    create = proposal(-1, [protocol(), metadata()], operation="CREATE TABLE", changes_data=False)
    append = proposal(0, [add("a.parquet")])
    live: dict[str, TableState] = {}
    decisions, overlay = decide_batch(live, [Submitted(create, NOW - 5), append], NOW)
    assert _summary(decisions) == [("COMMITTED", 0), ("COMMITTED", 1)]
    assert decisions[0].decided_at_ms == NOW - 5 and decisions[1].decided_at_ms == NOW
    assert live == {} and overlay.created == [TABLE_ID]
    overlay.apply_to(live)
    assert live[TABLE_ID].version == 1 and live[TABLE_ID].is_live(add("a.parquet"))


def test_admission_and_redelivery_inside_a_batch() -> None:
    h = Harness()
    p = proposal(h.head, [add("a.parquet")])
    halted = {"other-table": "halted for a test"}
    other = proposal(-1, [protocol(), metadata()], table_id="other-table", table_uri="s3://lake/other")
    moved = proposal(h.head, [add("b.parquet")], table_uri="s3://lake/elsewhere")
    unknown = proposal(0, [add("c.parquet")], table_id="nowhere", table_uri="s3://lake/nowhere")
    decisions, overlay = decide_batch({TABLE_ID: h.state}, [p, p, moved, unknown, other], NOW, halted=halted)
    assert (decisions[0].version, decisions[1].duplicate_of) == (1, 1)  # a redelivery inside the batch
    assert [d.reason_code for d in decisions[2:]] == [ReasonCode.TABLE_URI_MISMATCH, ReasonCode.UNKNOWN_TABLE,
                                                      ReasonCode.TABLE_HALTED]
    assert decisions[4].reason_code == ReasonCode.TABLE_HALTED  # a halted id is refused, even for a creation
    assert overlay.created == []


def test_a_batch_copies_nothing_of_a_large_table() -> None:
    """Deciding against 200,000 live files allocates per proposal, not per live file."""
    s = TableState.restore(TABLE_ID, TABLE_URI, version=0, protocol=protocol(), metadata=metadata(),
                           live_files=(add(f"f{i:07d}.parquet") for i in range(200_000)))
    proposals = [proposal(0, [add(f"n{i}.parquet")]) for i in range(20)]
    decide_batch({TABLE_ID: s}, proposals[:1], NOW)  # warm caches (compiled schemas, interned strings)
    tracemalloc.start()
    try:
        decisions, overlay = decide_batch({TABLE_ID: s}, proposals, NOW)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(d.committed for d in decisions) and len(overlay.commits) == 20
    assert peak < 400_000, f"{peak} bytes allocated deciding 20 appends: is the live-file set being copied?"
    assert s.live_file_count == 200_000  # and the live state is unchanged
