"""`deltacoord table status` folds a table's commits-topic records as recovery does (`deltacoord.cli.table_status`)."""

from __future__ import annotations

import dataclasses

from deltacoord.cli.table_status import COORDINATED, DROPPED, HALTED, RELEASED, UNKNOWN, table_status
from deltacoord.coordinator.kafka.control import drop_record, halt_record, release_record, resume_record
from deltacoord.schemas.messages import Decision, Outcome

T, URI = "file:///data/t", "file:///data/t"


def _committed(version: int, table_id: str = T) -> Decision:
    return Decision(table_id, URI, f"p{version}-{table_id}", Outcome.COMMITTED, version=version)


def test_halts_resumes_releases_and_drops_as_recovery_folds_them() -> None:
    records = [_committed(0), _committed(1), _committed(0, "other")]
    assert table_status(T, []).state == UNKNOWN
    assert (table_status(T, records).state, table_status(T, records).version) == (COORDINATED, 1)
    halted = table_status(T, [*records, halt_record(T, URI, "the table's files are gone: drop it", 1, 0)])
    assert (halted.state, halted.halted) == (HALTED, "the table's files are gone: drop it")
    assert table_status(T, [*records, halt_record(T, URI, "x", 1, 0), resume_record(T, URI, 1, 0)]).state == COORDINATED
    released = table_status(T, [*records, release_record(T, URI, "deltacoord-control:release:1", 1, 0)])
    assert (released.state, released.version) == (RELEASED, 1)


def test_a_drop_ends_the_table_and_a_creation_after_it_starts_a_new_one() -> None:
    drop = drop_record(T, URI, "deltacoord-control:drop:1", 1, "dropped at version 1", 0)
    records = [_committed(0), _committed(1), halt_record(T, URI, "gone", 1, 0), drop]
    dropped = table_status(T, records)
    assert (dropped.state, dropped.version, dropped.halted, dropped.drops) == (DROPPED, 1, None, 1)
    again = dataclasses.replace(drop, decided_at_ms=5, duplicate_of=1)  # answered again: nothing changes
    assert table_status(T, [*records, again]).drops == 1
    recreated = table_status(T, [*records, _committed(0)])
    assert (recreated.state, recreated.version, recreated.drops) == (COORDINATED, 0, 1)
