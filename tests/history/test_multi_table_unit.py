"""The multi-table history check on hand-made histories: a clean one passes, each injected anomaly is caught."""

from __future__ import annotations

from typing import Any

from tests.history.multi_table import check_multi_table

AB = ["g::a", "g::b"]


def _stamp(txid: str, tables: list[str] = AB) -> dict[str, Any]:
    return {"id": txid, "tables": tables}


def _clean() -> tuple[dict[str, dict[int, dict[str, Any] | None]], dict[str, dict[str, int]]]:
    stamps: dict[str, dict[int, dict[str, Any] | None]] = {
        "g::a": {0: None, 1: _stamp("t1"), 2: None, 3: _stamp("t2")},
        "g::b": {0: None, 1: _stamp("t1"), 2: _stamp("t2")},
    }
    told = {"t1": {"g::a": 1, "g::b": 1}, "t2": {"g::a": 3, "g::b": 2}}
    return stamps, told


def test_a_clean_history_passes() -> None:
    stamps, told = _clean()
    report = check_multi_table(stamps, told, sent=["t1", "t2", "t3"], refused=["t3"])
    assert report.ok and report.transactions == 2, report


def test_a_part_missing_from_one_table_is_partial_and_lost() -> None:
    stamps, told = _clean()
    stamps["g::b"][2] = None
    report = check_multi_table(stamps, told)
    assert len(report.partial) == 1 and "missing from ['g::b']" in report.partial[0], report
    assert len(report.lost) == 1 and "version 2 of g::b" in report.lost[0], report


def test_a_transaction_in_no_table_is_lost() -> None:
    stamps, told = _clean()
    stamps["g::a"][3] = stamps["g::b"][2] = None
    report = check_multi_table(stamps, told)
    assert len(report.lost) == 2 and not report.partial, report


def test_a_transaction_twice_in_one_table_is_duplicated() -> None:
    stamps, told = _clean()
    stamps["g::a"][4] = _stamp("t2")
    report = check_multi_table(stamps, told)
    assert report.duplicated == ["transaction t2 is at versions [3, 4] of g::a"], report


def test_parts_naming_different_tables_are_partial() -> None:
    stamps, told = _clean()
    stamps["g::b"][1] = _stamp("t1", ["g::a", "g::b", "g::c"])
    report = check_multi_table(stamps, told)
    assert len(report.partial) == 1 and "name different tables" in report.partial[0], report


def test_a_refused_or_unsent_transaction_that_committed_is_a_phantom() -> None:
    stamps, told = _clean()
    stamps["g::a"][4] = stamps["g::b"][3] = _stamp("t9")
    assert len(check_multi_table(stamps, told, sent=["t1", "t2"]).phantom) == 1
    report = check_multi_table(stamps, told, sent=["t9"], refused=["t9"])
    assert report.phantom == ["transaction t9 is in ['g::a', 'g::b'] but its writer was told it was rejected"], report


def test_a_version_other_than_the_one_told_is_lost() -> None:
    stamps, told = _clean()
    told["t2"]["g::a"] = 2
    report = check_multi_table(stamps, told)
    assert report.lost == ["transaction t2 was told committed at version 2 of g::a, found at [3]"], report
