"""Files a staging call wrote are deleted when it is interrupted, whatever it was doing.

A Ctrl-C in the CLI's streaming append once left a staged file behind: it arrived after the
file was stored and before the writer knew of it (its stats were being computed), so the
transaction's clean-up, which deletes the files it was given, never saw it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.storage.table import TableStorage
from deltacoord.writer import staging


def _parquet(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet"))


def test_an_interrupt_while_computing_stats_deletes_the_stored_files(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_a: object, **_k: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(staging, "file_stats", interrupted)
    with pytest.raises(KeyboardInterrupt):
        staging.write_data_files(tmp_path, pa.table({"id": [1, 2, 3]}), max_rows_per_file=1)
    assert _parquet(tmp_path) == []


def test_an_interrupt_between_two_files_deletes_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = TableStorage.write_parquet
    calls: list[str] = []

    def second_interrupted(self: TableStorage, key: str, table: pa.Table, **kw: object) -> int:
        calls.append(key)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, key, table, **kw)

    monkeypatch.setattr(TableStorage, "write_parquet", second_interrupted)
    with pytest.raises(KeyboardInterrupt):
        staging.write_data_files(tmp_path, pa.table({"p": ["a", "b"], "id": [1, 2]}), partition_by=["p"])
    assert len(calls) == 2 and _parquet(tmp_path) == []


def test_without_an_interrupt_every_file_stays(tmp_path: Path) -> None:
    adds = staging.write_data_files(tmp_path, pa.table({"id": [1, 2, 3]}), max_rows_per_file=1)
    assert len(adds) == 3 and len(_parquet(tmp_path)) == 3
