"""The project's own writer feature `deltacoord-coordinated`: added to and removed from protocols as PROTOCOL.md allows."""

from __future__ import annotations

import pytest

from coordinator.delta_log.adoption import adoption_problems
from schemas.actions import Metadata, Protocol
from schemas.writer_features import COORDINATED, coordinated, with_coordinated, without_coordinated, writer_problems

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
