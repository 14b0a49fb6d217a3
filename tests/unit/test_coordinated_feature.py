"""The project's own writer feature `deltacoord-coordinated`: added to and removed from protocols as PROTOCOL.md allows."""

from __future__ import annotations

import pytest

from deltacoord.coordinator.delta_log.adoption import adoption_problems
from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.coordinator.rules.validate import proposal_error
from deltacoord.schemas.actions import Metadata, Protocol
from deltacoord.schemas.errors import ProtocolChangedException
from deltacoord.schemas.table_features import (
    COORDINATED,
    coordinated,
    with_coordinated,
    without_coordinated,
    writer_problems,
)
from tests.unit.builders import Harness, proposal

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
AI = ("appendOnly", "invariants")

#: protocol before -> the same protocol with the feature (and, released, the protocol before again).
ROUND_TRIPS: list[tuple[Protocol, Protocol]] = [
    (Protocol(1, 1), Protocol(1, 7, writer_features=(COORDINATED,))),
    (Protocol(1, 2), Protocol(1, 7, writer_features=(*AI, COORDINATED))),
    (Protocol(1, 3), Protocol(1, 7, writer_features=(*AI, "checkConstraints", COORDINATED))),
    (Protocol(1, 4), Protocol(1, 7, writer_features=(*AI, "checkConstraints", "changeDataFeed", "generatedColumns",
                                                     COORDINATED))),
    # Reader 2 (column mapping) stays: the feature is the writers' alone; (2, 7) lists columnMapping.
    (Protocol(2, 5), Protocol(2, 7, writer_features=(*AI, "checkConstraints", "changeDataFeed", "generatedColumns",
                                                     "columnMapping", COORDINATED))),
    (Protocol(2, 6), Protocol(2, 7, writer_features=(*AI, "checkConstraints", "changeDataFeed", "generatedColumns",
                                                     "columnMapping", "identityColumns", COORDINATED))),
    # Table features already: the feature is listed last, the reader side untouched.
    (Protocol(1, 7, writer_features=("appendOnly",)), Protocol(1, 7, writer_features=("appendOnly", COORDINATED))),
    (Protocol(3, 7, ("deletionVectors",), (*AI, "deletionVectors")),
     Protocol(3, 7, ("deletionVectors",), (*AI, "deletionVectors", COORDINATED))),
]


@pytest.mark.parametrize(("before", "coordinated_protocol"), ROUND_TRIPS, ids=[str(p) for p, _ in ROUND_TRIPS])
def test_adding_and_removing_the_feature_round_trips(before: Protocol, coordinated_protocol: Protocol) -> None:
    assert not coordinated(before)
    assert with_coordinated(before) == coordinated_protocol and coordinated(coordinated_protocol)
    assert with_coordinated(coordinated_protocol) == coordinated_protocol  # once only
    assert without_coordinated(coordinated_protocol) == before
    assert without_coordinated(before) == before


def test_features_added_while_coordinated_stay_listed_when_released() -> None:
    # Created (1, 2) + the feature, then column mapping turned on: {appendOnly, invariants, columnMapping} is no
    # legacy writer version's set, so the released table keeps writer version 7, listing them.
    p = Protocol(2, 7, writer_features=(*AI, COORDINATED, "columnMapping"))
    assert without_coordinated(p) == Protocol(2, 7, writer_features=(*AI, "columnMapping"))
    # Reader version 3 is never brought back to a legacy protocol.
    p = Protocol(3, 7, (), (*AI, COORDINATED))
    assert without_coordinated(p) == Protocol(3, 7, (), AI)


def test_the_feature_is_honoured_by_this_writer_and_does_not_block_adoption() -> None:
    md = Metadata(id="m", schema_string=SCHEMA)
    for _before, p in ROUND_TRIPS:
        for operation in ("WRITE", "DELETE", "MERGE", "CREATE TABLE", "UPGRADE PROTOCOL", "DROP FEATURE"):
            assert writer_problems(p, md, operation) == [], (p, operation)
        assert adoption_problems(p, md) == []
    # It is the project's own: an unknown feature beside it is still refused by name.
    problems = writer_problems(Protocol(1, 7, writer_features=(COORDINATED, "someFutureFeature")), md, "WRITE")
    assert [f for f, _ in problems] == ["someFutureFeature"]


COORDINATED_1_2 = Protocol(1, 7, writer_features=(*AI, COORDINATED))


def test_the_coordinator_lets_only_the_release_commit_drop_the_feature() -> None:
    h = Harness(proto=COORDINATED_1_2)
    # A protocol change that keeps it (column mapping, say) is decided as before.
    kept = proposal(0, [Protocol(2, 7, writer_features=(*AI, COORDINATED, "columnMapping"))], operation="SET TBLPROPERTIES",
                    changes_data=False)
    assert proposal_error(h.state, kept) is None
    # One that drops it is refused, naming the feature and release; unless it is release's DROP FEATURE.
    for operation in ("SET TBLPROPERTIES", "UPGRADE PROTOCOL", "WRITE"):
        err = proposal_error(h.state, proposal(0, [Protocol(1, 2)], operation=operation, changes_data=False))
        assert err is not None and err.reason == "MISSING_TABLE_FEATURE", operation
        assert COORDINATED in str(err) and "deltacoord table release" in str(err)
    assert isinstance(h.run(proposal(0, [Protocol(1, 2)], operation="DROP FEATURE", changes_data=False)), Accepted)
    # A table without it (adopted by a deltacoord of before the feature) changes its protocol freely; adding it is fine.
    assert proposal_error(h.state, proposal(1, [Protocol(1, 3)], operation="SET TBLPROPERTIES", changes_data=False)) is None
    assert proposal_error(h.state, proposal(1, [COORDINATED_1_2], operation="UPGRADE PROTOCOL", changes_data=False)) is None


def test_a_stale_protocol_change_without_the_feature_is_a_protocol_conflict_not_invalid() -> None:
    """A change computed before the adoption's upgrade commit added the feature: ProtocolChangedException, so
    its writer retries on the new protocol (which keeps the feature), as after any concurrent protocol change."""
    h = Harness()
    h.must_commit(proposal(0, [COORDINATED_1_2], operation="UPGRADE PROTOCOL", changes_data=False))
    stale = proposal(0, [Protocol(1, 3)], operation="SET TBLPROPERTIES", changes_data=False)
    assert proposal_error(h.state, stale) is None
    r = h.decide(stale)
    assert isinstance(r, Rejected) and isinstance(r.error, ProtocolChangedException), r
