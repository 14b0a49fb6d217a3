"""The MERGE builder's refusals, made before it reads or proposes anything (no table is touched): a builder
without a clause, a clause without a predicate before another of its kind, assignments that are not a mapping
of column to SQL; and the keyword form's clause lists (`deltacoord.writer.merge.keyword_clauses`)."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pytest

from deltacoord.writer.merge import TableMerger, WhenMatched, WhenNotMatched, keyword_clauses
from deltacoord.writer.operations import OperationTable


class _Untouchable:
    """A table any use of which fails the test: the refusals come before the table is read."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the merger used the table ({name}) before refusing")


def _merger() -> TableMerger:
    return TableMerger(cast(OperationTable, _Untouchable()), pa.table({"id": [1]}), ["id"])


def test_a_builder_without_any_clause_refuses_naming_the_clauses() -> None:
    with pytest.raises(ValueError, match=r"a MERGE needs at least one clause: add when_matched_update\(\.\.\.\)"):
        _merger().execute()


def test_only_the_last_clause_of_a_kind_may_omit_its_predicate() -> None:
    with pytest.raises(ValueError, match="only the last WHEN MATCHED clause may omit its predicate"):
        _merger().when_matched_delete().when_matched_update_all().execute()
    with pytest.raises(ValueError, match="only the last WHEN NOT MATCHED clause may omit its predicate"):
        _merger().when_not_matched_insert_all().when_not_matched_insert({"id": "s.id"}, predicate="s.id > 0").execute()


def test_a_refused_builder_may_be_completed_and_is_not_spent() -> None:
    merger = _merger()
    with pytest.raises(ValueError, match="at least one clause"):
        merger.execute()
    assert not merger.executed  # the refusal came before anything ran: adding a clause and executing is allowed


@pytest.mark.parametrize("updates", [{}, "*", ["id"], {"id": 1}])
def test_assignments_must_be_a_mapping_of_column_to_sql(updates: Any) -> None:
    with pytest.raises(TypeError, match="when_matched_update"):
        _merger().when_matched_update(updates)


def test_the_keyword_form_is_a_delete_before_an_update_and_one_insert() -> None:
    assert keyword_clauses("*", {"id": "s.id"}, "s.op = 'D'", "s.op != 'D'") == (
        [WhenMatched("delete", "s.op = 'D'"), WhenMatched("update", None, "*")],
        [WhenNotMatched({"id": "s.id"}, "s.op != 'D'")])
    assert keyword_clauses(None, None, True, None) == ([WhenMatched("delete")], [])
    with pytest.raises(ValueError, match="give when_matched_update, when_matched_delete and/or when_not_matched_insert"):
        keyword_clauses(None, None, False, None)
