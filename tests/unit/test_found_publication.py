"""A writer that finds its version in `_delta_log` without the coordinator's notice (its reply late, or a retry of a
decided proposal) takes the file for its commit only when the commitInfo names its proposal
(`Transaction._published_is_ours`): a file written there around the coordinator never passes for it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deltacoord.reader.log import commit_path
from deltacoord.schemas.actions import COALESCED_KEY, CommitInfo, commit_to_json_lines
from deltacoord.schemas.errors import CommitNotPublishedError
from deltacoord.storage.table import TableStorage
from deltacoord.writer.replies import Pending
from deltacoord.writer.transaction import Transaction


def _writer(root: Path, proposal_id: str) -> Any:
    """What `_await_publication` reads of a transaction: its table (storage, id, publish timeout) and proposal id."""
    table = SimpleNamespace(storage=TableStorage(root.as_uri(), fsync=False), table_id="t", publish_timeout_s=2.0)
    tx = SimpleNamespace(table=table, proposal_id=proposal_id)
    tx._published_is_ours = lambda version: Transaction._published_is_ours(tx, version)  # type: ignore[arg-type]
    return tx


def _write_version(root: Path, version: int, info: dict[str, Any]) -> None:
    path = commit_path(root, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(commit_to_json_lines([CommitInfo(info)]))


def _await(tx: Any, version: int) -> None:
    Transaction._await_publication(tx, Pending("p", 0), version, notice=False)


@pytest.mark.parametrize("info", [{"operation": "WRITE", "txnId": "mine"},
                                  {"operation": "WRITE", "txnId": "other", COALESCED_KEY: [{"txnId": "mine"}]}],
                         ids=["its-own", "coalesced"])
def test_a_version_naming_the_proposal_is_its_commit(tmp_path: Path, info: dict[str, Any]) -> None:
    _write_version(tmp_path, 1, info)
    _await(_writer(tmp_path, "mine"), 1)  # returns


@pytest.mark.parametrize("info", [{"operation": "WRITE", "txnId": "someone-else"}, {"operation": "ROGUE"}],
                         ids=["another-proposal", "no-txn-id"])
def test_a_version_written_around_the_coordinator_is_never_taken_for_the_commit(tmp_path: Path,
                                                                               info: dict[str, Any]) -> None:
    _write_version(tmp_path, 1, info)
    with pytest.raises(CommitNotPublishedError) as e:
        _await(_writer(tmp_path, "mine"), 1)
    assert e.value.version == 1 and "around the coordinator" in str(e.value) and "mine" in str(e.value)


def test_no_version_at_all_waits_until_the_publish_timeout(tmp_path: Path) -> None:
    tx = _writer(tmp_path, "mine")
    tx.table.publish_timeout_s = 0.2
    with pytest.raises(CommitNotPublishedError) as e:
        _await(tx, 1)
    assert "did not appear within" in str(e.value)
