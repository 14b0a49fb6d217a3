"""A table's files as a whole (`deltacoord.coordinator.delta_log.table_files`): the drop's deletion order, and what recovery
takes for a table deleted around the coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltacoord.coordinator.delta_log.table_files import delete_table_files, deleted_problem, location_claimed
from deltacoord.reader.claim import CLAIM_KEY
from deltacoord.storage.table import TableStorage

_FILES = [CLAIM_KEY, "_delta_log/00000000000000000000.json", "_delta_log/00000000000000000001.json",
          "_delta_log/00000000000000000001.checkpoint.parquet", "_delta_log/_last_checkpoint", "part-0.parquet",
          "date=2024-01-01/part-1.parquet"]


def _table(root: Path) -> TableStorage:
    storage = TableStorage(str(root))
    for key in _FILES:
        storage.put(key, b"x")
    return storage


def test_deletion_goes_claim_then_log_newest_first_then_data_and_leaves_no_directory(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    storage = _table(tmp_path / "t")
    order: list[str] = []
    real = storage.delete
    monkeypatch.setattr(storage, "delete", lambda key: (order.append(key), real(key)))
    assert delete_table_files(storage) == len(_FILES)
    assert order[0] == CLAIM_KEY
    log = [k for k in order if k.startswith("_delta_log/")]
    assert log == sorted(log, reverse=True) and order[1:1 + len(log)] == log, "the log goes newest key first"
    assert set(order[1 + len(log):]) == {"part-0.parquet", "date=2024-01-01/part-1.parquet"}
    assert not (tmp_path / "t").exists()
    assert delete_table_files(storage) == 0  # again: nothing left, no error


def test_a_half_done_deletion_is_finished_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = _table(tmp_path / "t")
    real = storage.delete

    def failing(key: str) -> None:
        if key.endswith("00000000000000000000.json"):
            raise OSError("the store refused")
        real(key)

    monkeypatch.setattr(storage, "delete", failing)
    with pytest.raises(OSError):
        delete_table_files(storage)
    assert location_claimed(storage) is False and storage.exists("part-0.parquet"), "data files outlive the log"
    monkeypatch.setattr(storage, "delete", real)
    delete_table_files(storage)
    assert not (tmp_path / "t").exists()


def test_only_a_location_without_a_claim_is_taken_for_deleted() -> None:
    uri = "file:///data/t"
    why = deleted_problem(uri, uri, 3, claimed=False)
    assert why is not None and f"deltacoord table drop {uri}`" in why and "0..3" in why
    other = deleted_problem("sales", uri, 0, claimed=False)
    assert other is not None and f"deltacoord table drop {uri} --table-id sales" in other
    # A creation claims its location before version 0 is ratified: its first publication may still be owed.
    assert deleted_problem(uri, uri, 3, claimed=True) is None
    assert deleted_problem(uri, uri, 3, claimed=None) is None  # the store did not answer: the publisher finds out
    assert deleted_problem(uri, uri, -1, claimed=False) is None  # nothing ratified, nothing to republish
