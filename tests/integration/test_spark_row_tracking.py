"""Row tracking, checked by Delta on Spark's `_metadata.row_id` and `_metadata.row_commit_version`.

Concurrent appends get disjoint row ids from the coordinator (no conflict); DELETE, UPDATE, MERGE and
OPTIMIZE keep every surviving row's id, with or without deletion vectors; a row UPDATE or MERGE changes
gets the commit version of that change, an untouched row keeps its own, an inserted row gets a fresh id.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.row_tracking import high_water_mark
from tests.conftest import TablePlace
from tests.integration.test_deletion_vectors import DV, delta_rs_agrees
from tests.integration.test_writer_operations import SCHEMA, Env, data, rows, running_env

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

Identity = dict[int, tuple[int, int]]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def identity(spark: SparkSession, path: Path, version: int) -> Identity:
    """id -> (row id, row commit version) as Delta on Spark reads them at `version`."""
    df = spark.read.format("delta").option("versionAsOf", version).load(str(path))
    got = df.select("id", "_metadata.row_id", "_metadata.row_commit_version").collect()
    out = {r[0]: (r[1], r[2]) for r in got}
    assert len(out) == len(got), "ids are unique in these tables"
    assert len({rid for rid, _ in out.values()}) == len(out), f"version {version}: two rows share a row id"
    return out


@pytest.mark.parametrize("vectors", [True, False], ids=["deletion-vectors", "rewrite"])
def test_row_ids_survive_every_operation(spark: SparkSession, env: Env, tmp_path: Path, vectors: bool) -> None:
    path = tmp_path / "t"
    t = env.table(path)
    # One version per append (coalescing off): the four appends must get versions 1..4 and their own commit versions.
    t.create(SCHEMA, properties={"delta.enableRowTracking": "true", "deltacoord.coalesce": "false", **(DV if vectors else {})})
    snap = t.snapshot()
    writers = [env.table(path) for _ in range(4)]
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            writers[i].append(data(list(range(i * 100, i * 100 + 100)), "2024-01-01", "v"), snapshot=snap)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    env.settle()
    v = Snapshot.load(str(path)).version
    assert v == 4
    after_appends = identity(spark, path, v)
    assert sorted(rid for rid, _ in after_appends.values()) == list(range(400)), "four appends: ids 0..399, none shared"
    assert {ver for _, ver in after_appends.values()} == {1, 2, 3, 4}

    gone, changed = (0, 10, 100, 250, 399), (1, 11, 101, 251, 398)
    deleted = t.delete(f"id IN {gone}").version
    env.settle()
    after_delete = identity(spark, path, deleted)
    assert after_delete == {i: after_appends[i] for i in after_appends if i not in gone}

    updated = t.update(f"id IN {changed}", {"value": "'u'"}).version
    env.settle()
    after_update = identity(spark, path, updated)
    assert after_update == {i: (after_delete[i][0], updated if i in changed else after_delete[i][1]) for i in after_delete}

    source = data([2, 3, 1000, 1001], "2024-01-01", "m")
    merged = t.merge(source, ["id"], when_matched_update="*", when_not_matched_insert="*").version
    env.settle()
    after_merge = identity(spark, path, merged)
    assert {i: after_merge[i] for i in after_update} == {
        i: (after_update[i][0], merged if i in (2, 3) else after_update[i][1]) for i in after_update}
    fresh = [after_merge[i][0] for i in (1000, 1001)]
    # New files take fresh id ranges (the copied rows in them keep theirs): inserted rows get ids above all earlier.
    assert min(fresh) >= 400 and after_merge[1000][1] == after_merge[1001][1] == merged

    optimized = t.optimize().version
    env.settle()
    assert optimized == merged + 1
    assert identity(spark, path, optimized) == after_merge, "OPTIMIZE keeps every row's id and commit version"
    assert high_water_mark(Snapshot.load(str(path)).domain_metadata) >= max(fresh)
    assert all(rows(Snapshot.load(str(path), version=x).to_pyarrow()) == sorted(
        tuple(r) for r in spark.read.format("delta").option("versionAsOf", x).load(str(path)).collect())
        for x in range(optimized + 1))
    delta_rs_agrees(env, t)
    # Every add in the log carries its ids: Delta readers need both fields on a row-tracking table.
    for f in sorted((path / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            add = json.loads(line).get("add")
            if add is not None:
                assert isinstance(add.get("baseRowId"), int) and isinstance(add.get("defaultRowCommitVersion"), int), (f, add)
