"""Row ids on a row-tracking table: assigned by the coordinator at decision time, in version order.

Concurrent appends never conflict over row ids and never share one; a file re-added with a deletion
vector keeps its ids and commit version; a fresh file without numRecords is refused; a writer's own
`delta.rowTracking` domain is replaced by the coordinator's.
"""

from __future__ import annotations

import json

import pytest

from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.schemas.actions import AddFile, DomainMetadata, Protocol
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.row_tracking import DOMAIN, high_water_mark
from tests.unit.builders import Harness, add, metadata, proposal, removal_of

ROW_TRACKING = Protocol(1, 7, None, ("appendOnly", "invariants", "domainMetadata", "rowTracking"))


def _stats(n: int) -> str:
    return json.dumps({"numRecords": n})


def _adds(r: Accepted) -> dict[str, AddFile]:
    return {a.path: a for a in r.actions if isinstance(a, AddFile)}


def _mark(r: Accepted) -> int | None:
    marks = [json.loads(a.configuration)["rowIdHighWaterMark"] for a in r.actions
             if isinstance(a, DomainMetadata) and a.domain == DOMAIN]
    assert len(marks) <= 1
    return marks[0] if marks else None


def _table() -> Harness:
    return Harness(md=metadata(config={"delta.enableRowTracking": "true"}), proto=ROW_TRACKING)


def test_concurrent_appends_get_disjoint_ids_in_version_order() -> None:
    h = _table()
    first = proposal(0, [add("a.parquet", stats=_stats(3))])
    second = proposal(0, [add("b.parquet", stats=_stats(5)), add("c.parquet", stats=_stats(2))])
    r1 = h.must_commit(first)
    r2 = h.must_commit(second)  # read the same version: no conflict over row ids
    a, b, c = _adds(r1)["a.parquet"], _adds(r2)["b.parquet"], _adds(r2)["c.parquet"]
    assert (a.base_row_id, a.default_row_commit_version) == (0, r1.version)
    assert (b.base_row_id, c.base_row_id) == (3, 8)
    assert b.default_row_commit_version == c.default_row_commit_version == r2.version
    assert (_mark(r1), _mark(r2)) == (2, 9)
    assert high_water_mark(h.state.domains) == 9


def test_a_writers_own_domain_is_replaced_not_a_conflict() -> None:
    h = _table()
    h.must_commit(proposal(0, [add("a.parquet", stats=_stats(4)), DomainMetadata(DOMAIN, '{"rowIdHighWaterMark":3}')]))
    r = h.must_commit(proposal(0, [add("b.parquet", stats=_stats(1)), DomainMetadata(DOMAIN, '{"rowIdHighWaterMark":0}')]))
    assert _adds(r)["b.parquet"].base_row_id == 4
    assert _mark(r) == 4
    assert sum(isinstance(a, DomainMetadata) for a in r.actions) == 1


def test_a_deletion_vector_re_add_keeps_the_ids_and_commit_version() -> None:
    h = _table()
    v1 = h.must_commit(proposal(0, [add("a.parquet", stats=_stats(10))]))
    old = _adds(v1)["a.parquet"]
    readd = AddFile(old.path, old.partition_values, old.size, old.modification_time, True, old.stats,
                    deletion_vector=add("x", dv="abcdefghijklmnopqrst").deletion_vector)
    r = h.must_commit(proposal(1, [removal_of(old), readd], operation="DELETE", read_files=(old,), predicates=("x = 1",)))
    kept = _adds(r)["a.parquet"]
    assert (kept.base_row_id, kept.default_row_commit_version) == (0, v1.version)
    assert _mark(r) is None  # no fresh ids handed out
    assert high_water_mark(h.state.domains) == 9


def test_a_fresh_file_without_num_records_is_refused() -> None:
    h = _table()
    r = h.decide(proposal(0, [add("a.parquet", stats=json.dumps({"minValues": {}}))]))
    assert isinstance(r, Rejected)
    assert isinstance(r.error, InvalidProposalError)
    assert r.error.reason is ReasonCode.MISSING_ROW_COUNT
    assert "a.parquet" in str(r.error)


@pytest.mark.parametrize("given", [None, 7])
def test_a_fresh_file_gets_the_coordinators_ids_whatever_the_writer_gave(given: int | None) -> None:
    h = _table()
    h.must_commit(proposal(0, [add("a.parquet", stats=_stats(2))]))
    f = AddFile("b.parquet", {}, 1, 1, True, _stats(2), base_row_id=given, default_row_commit_version=given)
    r = h.must_commit(proposal(0, [f]))
    assert (_adds(r)["b.parquet"].base_row_id, _adds(r)["b.parquet"].default_row_commit_version) == (2, r.version)


def test_a_table_without_row_tracking_gets_no_ids() -> None:
    h = Harness()
    r = h.must_commit(proposal(0, [add("a.parquet")]))
    assert _adds(r)["a.parquet"].base_row_id is None
    assert _mark(r) is None
