"""One table location is one table: the location's claim (`deltacoord.reader.claim`), the coordinator's check of a creation
or an adoption against it (`deltacoord.coordinator.kafka.batch_checks.claim_problem`, on real local storage), and the batch
refusing the creations the storage edge refused (`decide_batch(refused_creates=...)`)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltacoord.coordinator.kafka.batch_checks import claim_problem
from deltacoord.coordinator.locations import TableLocations
from deltacoord.coordinator.rules.batch import decide_batch
from deltacoord.reader.claim import CLAIM_KEY, Claim, ClaimError, claim, drop_claim, read_claim
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.storage.table import TableStorage
from tests.unit.builders import NOW, TABLE_ID, Harness, add, metadata, proposal, protocol


def _storage(path: Path) -> TableStorage:
    path.mkdir(parents=True, exist_ok=True)
    return TableStorage(path, fsync=False)


def test_the_first_claim_holds_the_location_and_only_its_holder_drops_it(tmp_path: Path) -> None:
    s = _storage(tmp_path / "t")
    assert read_claim(s) is None
    first = claim(s, Claim("a", 1, "req-a"))
    assert first == Claim("a", 1, "req-a") and read_claim(s) == first
    assert claim(s, Claim("b", 2, "req-b")) == first  # the holder, not the new id
    assert claim(s, Claim("a", 3, "req-a2")) == first  # the same id again: still the first claim
    assert not drop_claim(s, "b") and read_claim(s) == first  # not b's to drop
    assert drop_claim(s, "a") and read_claim(s) is None
    assert claim(s, Claim("b", 4, "req-b")).table_id == "b"  # free again: any id may claim it


def test_claims_racing_on_one_location_have_one_winner(tmp_path: Path) -> None:
    s = _storage(tmp_path / "t")
    barrier = threading.Barrier(8)
    won: list[str] = []

    def race(i: int) -> None:
        barrier.wait()
        won.append(claim(TableStorage(s.location, fsync=False), Claim(f"id-{i}", i, f"r{i}")).table_id)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holder = read_claim(s)
    assert holder is not None and won == [holder.table_id] * 8


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"tableId": ""}', b'{"claimedAtMs": 3}'])
def test_an_unreadable_claim_is_an_error_not_a_free_location(tmp_path: Path, raw: bytes) -> None:
    s = _storage(tmp_path / "t")
    s.put(CLAIM_KEY, raw)
    with pytest.raises(ClaimError, match=r"_deltacoord/table\.json"):
        read_claim(s)


def _uri(path: Path) -> str:
    return path.as_uri()


def test_a_creation_claims_an_empty_location_and_refuses_another_id(tmp_path: Path) -> None:
    locations = TableLocations.of(None)
    path = tmp_path / "t"
    assert claim_problem(locations, "first", _uri(path), "create-1", NOW, creating=True) is None
    assert read_claim(TableStorage(path)) == Claim("first", NOW, "create-1")
    assert claim_problem(locations, "first", _uri(path), "create-2", NOW, creating=True) is None  # the same id again
    for creating in (True, False):
        err = claim_problem(locations, "alias", _uri(path), "req", NOW, creating=creating)
        assert err is not None and err.reason == ReasonCode.TABLE_LOCATION_TAKEN
        assert "'first'" in str(err) and "table_id='first'" in str(err)
        assert ("may not create" if creating else "may not adopt") in str(err)
    assert read_claim(TableStorage(path)) == Claim("first", NOW, "create-1")


def test_a_creation_over_an_uncoordinated_delta_table_is_refused_and_claims_nothing(tmp_path: Path) -> None:
    path = tmp_path / "foreign"
    write_deltalake(str(path), pa.table({"id": [1, 2]}))
    write_deltalake(str(path), pa.table({"id": [3]}), mode="append")
    err = claim_problem(TableLocations.of(None), _uri(path), _uri(path), "create-1", NOW, creating=True)
    assert err is not None and err.reason == ReasonCode.TABLE_EXISTS_UNCOORDINATED
    assert "version 1" in str(err) and f"deltacoord table adopt {_uri(path)}" in str(err)
    assert read_claim(TableStorage(path)) is None
    # Adopting it is what claims it.
    assert claim_problem(TableLocations.of(None), _uri(path), _uri(path), "adopt-1", NOW, creating=False) is None
    assert read_claim(TableStorage(path)) == Claim(_uri(path), NOW, "adopt-1")


def test_an_unreadable_claim_refuses_creation_and_adoption_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _storage(path).put(CLAIM_KEY, b"garbage")
    for creating in (True, False):
        err = claim_problem(TableLocations.of(None), "a", _uri(path), "r", NOW, creating=creating)
        assert err is not None and err.reason == ReasonCode.TABLE_LOCATION_TAKEN
        assert f"remove {_uri(path)}/{CLAIM_KEY}" in str(err)


def test_a_location_outside_the_roots_is_refused_by_its_own_reason(tmp_path: Path) -> None:
    locations = TableLocations.of([str(tmp_path / "roots")])
    err = claim_problem(locations, "a", _uri(tmp_path / "elsewhere"), "r", NOW, creating=True)
    assert err is not None and err.reason == ReasonCode.TABLE_OUTSIDE_ROOTS
    assert not (tmp_path / "elsewhere" / CLAIM_KEY).exists()


def test_the_batch_refuses_the_creations_the_storage_edge_refused() -> None:
    h = Harness()
    taken = InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, "taken by 'first'")
    create = proposal(-1, [protocol(), metadata()], table_id="alias", operation="CREATE TABLE", changes_data=False)
    other = proposal(-1, [protocol(), metadata()], table_id="other", table_uri="s3://lake/other",
                     operation="CREATE TABLE", changes_data=False)
    append = proposal(h.head, [add("a.parquet")])
    decisions, overlay = decide_batch({TABLE_ID: h.state}, [create, other, append], NOW,
                                      refused_creates={"alias": taken, TABLE_ID: taken})
    assert [(d.outcome.value, d.reason_code) for d in decisions] == [
        ("REJECTED", ReasonCode.TABLE_LOCATION_TAKEN), ("COMMITTED", None), ("COMMITTED", None)]
    assert "taken by 'first'" in (decisions[0].error_message or "")
    assert overlay.created == ["other"]  # a known table's proposals are not creations: the refusal does not touch them
