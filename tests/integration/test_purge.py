"""Purging deletion vectors: REORG ... APPLY (PURGE), and OPTIMIZE of files with many deleted rows.

The rewrite changes no data (snapshot isolation) and records a row map, so a DELETE that raced it on the
same file commits too (its rows are moved into the rewritten file's vector); delta-rs reads every version
with our reader's rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltacoord.reader.snapshot import Snapshot
from tests.conftest import TablePlace
from tests.integration.test_deletion_vectors import delta_rs_agrees, one_file
from tests.integration.test_writer_operations import Env, rows, running_env

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def _commit(path: Path, version: int) -> list[dict[str, object]]:
    return [json.loads(line) for line in (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]


def test_purge_rewrites_vectors_away_and_a_racing_delete_still_commits(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "t", n=1000)
    t.delete("id < 100")
    env.settle()
    before = Snapshot.load(t.uri)
    (old,) = before.files()
    assert old.deletion_vector is not None
    purged = t.purge(snapshot=before)
    raced = env.table(tmp_path / "t").delete("id >= 900", snapshot=before)  # read the same version as the purge
    env.settle()
    assert raced.version == purged.version + 1
    commit = _commit(t.root, purged.version)
    info = next(a["commitInfo"] for a in commit if "commitInfo" in a)
    assert info["operation"] == "REORG" and info["operationParameters"]["applyPurge"] == "true"
    assert info["isolationLevel"] == "SnapshotIsolation"
    assert all(a["add"]["dataChange"] is False and "deletionVector" not in a["add"] for a in commit if "add" in a)
    after = Snapshot.load(t.uri)
    assert old.path not in {a.path for a in after.files()}
    assert [r[0] for r in rows(after.to_pyarrow())] == list(range(100, 900))
    # the racing DELETE's rows were moved into the purged file's new vector
    assert sum(a.deletion_vector.cardinality for a in after.files() if a.deletion_vector is not None) == 100
    delta_rs_agrees(env, t)


def test_optimize_rewrites_a_lone_file_with_many_deleted_rows(env: Env, tmp_path: Path) -> None:
    t = one_file(env, tmp_path / "t", n=100)
    t.delete("id < 3")
    assert t.optimize().noop, "3% deleted: below the 5% default, a lone file stays"
    t.delete("id < 10")
    result = t.optimize()
    env.settle()
    assert not result.noop
    (new,) = Snapshot.load(t.uri).files()
    assert new.deletion_vector is None
    assert [r[0] for r in rows(Snapshot.load(t.uri).to_pyarrow())] == list(range(10, 100))
    delta_rs_agrees(env, t)
