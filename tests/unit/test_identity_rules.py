"""The coordinator never lets a commit hand out an identity value twice (`deltacoord.coordinator.rules.identity`).

Our writer generates values from the mark it read and advances it; these proposals are what a buggy or
hostile writer could send instead, and one that raced (a MetadataChangedException, not invalid).
"""

from __future__ import annotations

import json

import pytest

from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.schemas.actions import AddFile, Metadata
from deltacoord.schemas.errors import InvalidProposalError, MetadataChangedException
from deltacoord.schemas.identity import with_high_water_marks
from deltacoord.schemas.reasons import ReasonCode
from tests.unit.builders import Harness, proposal, removal_of


def _schema(mark: int | None, *, explicit: bool = False, step: int = 1) -> str:
    md: dict[str, object] = {"delta.identity.start": 1, "delta.identity.step": step,
                             "delta.identity.allowExplicitInsert": explicit}
    if mark is not None:
        md["delta.identity.highWaterMark"] = mark
    return json.dumps({"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": md},
        {"name": "v", "type": "string", "nullable": True, "metadata": {}}]})


def _md(schema: str) -> Metadata:
    return Metadata(id="5f1c0c9e-0000-4000-8000-00000000000a", schema_string=schema, partition_columns=(),
                    configuration={}, created_time=0)


def _file(path: str, lo: int, hi: int) -> AddFile:
    return AddFile(path, {}, 10, 0, True, json.dumps({"numRecords": 2, "minValues": {"id": lo}, "maxValues": {"id": hi}}))


def _append(h: Harness, mark: int, lo: int, hi: int, read: int | None = None) -> Accepted | Rejected:
    md = _md(with_high_water_marks(h.state.metadata.schema_string if h.state.metadata else "", {"id": mark}))
    r = h.run(proposal(h.head if read is None else read, [md, _file(f"f{lo}.parquet", lo, hi)]))
    assert not isinstance(r, Accepted) or r.version == h.head
    return r  # type: ignore[return-value]


def _reason(r: object) -> ReasonCode | str:
    assert isinstance(r, Rejected) and isinstance(r.error, InvalidProposalError), r
    return r.error.reason


def test_values_after_the_mark_with_the_mark_advanced_commit() -> None:
    h = Harness(md=_md(_schema(10)))
    assert isinstance(_append(h, 12, 11, 12), Accepted)


@pytest.mark.parametrize(("mark", "lo", "hi", "why"), [
    (12, 10, 12, "at or behind"),   # value 10 was handed out already
    (11, 11, 12, "beyond the high-water mark"),   # 12 written but the mark says 11: a later commit would reuse it
    (9, 11, 12, "moves the high-water mark back"),
])
def test_a_proposal_that_would_reuse_values_is_refused(mark: int, lo: int, hi: int, why: str) -> None:
    h = Harness(md=_md(_schema(10)))
    r = _append(h, mark, lo, hi)
    assert _reason(r) == ReasonCode.IDENTITY_VALUE_REUSED
    assert isinstance(r, Rejected) and why in str(r.error)


def test_a_descending_sequence_is_checked_the_other_way() -> None:
    h = Harness(md=_md(_schema(-10, step=-1)))
    assert isinstance(_append(h, -12, -12, -11), Accepted)
    assert _reason(_append(h, -13, -13, -12)) == ReasonCode.IDENTITY_VALUE_REUSED


def test_by_default_columns_take_given_values_behind_the_mark() -> None:
    h = Harness(md=_md(_schema(10, explicit=True)))
    assert isinstance(_append(h, 10, 3, 4), Accepted)


def test_two_writers_from_one_mark_conflict_instead() -> None:
    h = Harness(md=_md(_schema(10)))
    assert isinstance(_append(h, 12, 11, 12), Accepted)
    r = _append(h, 12, 11, 12, read=h.head - 1)  # raced: read the mark 10 too
    assert isinstance(r, Rejected) and isinstance(r.error, MetadataChangedException)


def test_rewrites_keep_their_values() -> None:
    h = Harness(md=_md(_schema(10)))
    seed = _file("old.parquet", 1, 2)
    h.commit_raw([seed])  # written before the mark reached 10
    r = h.run(proposal(h.head, [removal_of(seed), _file("new.parquet", 1, 2)], operation="UPDATE",
                       read_files=(seed,), predicates=("v = 'x'",)))
    assert isinstance(r, Accepted)


def test_a_winner_that_only_advanced_the_mark_passes_a_transaction_without_metadata() -> None:
    """As Delta Spark's checkNoMetadataUpdates: identity-HWM-only winner vs a current without metaData is OK."""
    h = Harness(md=_md(_schema(10)))
    seed = _file("old.parquet", 1, 2)
    h.commit_raw([seed])
    read = h.head
    assert isinstance(_append(h, 12, 11, 12), Accepted)  # the winner: an identity append
    r = h.run(proposal(read, [removal_of(seed)], operation="DELETE", read_files=(seed,), predicates=("v = 'x'",)))
    assert isinstance(r, Accepted), r


def test_a_winner_that_changed_more_than_the_mark_still_conflicts() -> None:
    h = Harness(md=_md(_schema(10)))
    seed = _file("old.parquet", 1, 2)
    h.commit_raw([seed])
    read = h.head
    other = Metadata(id="5f1c0c9e-0000-4000-8000-00000000000a", schema_string=with_high_water_marks(_schema(10), {"id": 12}),
                     partition_columns=(), configuration={"owner": "x"}, created_time=0)
    h.must_commit(proposal(read, [other, _file("f.parquet", 11, 12)]))
    r = h.run(proposal(read, [removal_of(seed)], operation="DELETE", read_files=(seed,), predicates=("v = 'x'",)))
    assert isinstance(r, Rejected) and isinstance(r.error, MetadataChangedException)


def test_a_schemas_identity_columns_are_read_once_and_read_only() -> None:
    """Read once per schema string, not once per proposal: every metaData of that schema gets the same columns,
    which no caller can change; a schema string that is not JSON has none, as before."""
    from deltacoord.coordinator.rules import identity

    a, b = _md(_schema(5)), _md(json.loads(json.dumps(_schema(5))))  # equal strings, distinct objects
    cols = identity._columns(a)
    assert cols is identity._columns(b) and list(cols) == ["id"] and cols["id"].high_water_mark == 5
    with pytest.raises(TypeError):
        cols["v"] = cols["id"]  # type: ignore[index]
    assert dict(identity._columns(_md("{not json"))) == {} and dict(identity._columns(None)) == {}
