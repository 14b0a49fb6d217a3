"""Per-table metrics: commits, conflicts, publication and halts carry the table's URI as a label, as the
Grafana dashboard in deploy/grafana reads them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deltacoord import ConcurrentDeleteReadException
from tests.conftest import TablePlace
from tests.integration.test_writer_operations import Env, running_env

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


def _samples(env: Env) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the coordinator's /metrics text, by name and labels."""
    text = generate_latest(env.coordinator.metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_commits_conflicts_and_versions_are_counted_per_table(env: Env, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("day", pa.string())])
    a, b = env.table(tmp_path / "a"), env.table(tmp_path / "b")
    a.create(schema, partition_by=["day"])
    b.create(schema, partition_by=["day"])
    for i in range(3):
        a.append(pa.table({"id": [i], "day": ["2024-01-01"]}))
    snap = a.snapshot()
    a.delete("day = '2024-01-01'", snapshot=snap)
    with pytest.raises(ConcurrentDeleteReadException):  # an overwrite that read what the delete removed
        a.overwrite(pa.table({"id": [9], "day": ["2024-01-01"]}), replace_where="day = '2024-01-01'", snapshot=snap)
    env.settle()
    got = _samples(env)
    ta, tb = a.uri, b.uri

    def value(name: str, table: str, **labels: str) -> float:
        return got[(name, tuple(sorted({"table": table, **labels}.items())))]

    assert value("deltacoord_table_commits_total", ta) == 5 and value("deltacoord_table_commits_total", tb) == 1
    assert value("deltacoord_table_conflicts_total", ta, type="ConcurrentDeleteReadException") == 1
    assert not [k for k in got if k[0] == "deltacoord_table_conflicts_total" and ("table", tb) in k[1]]
    assert value("deltacoord_table_ratified_version", ta) == value("deltacoord_table_published_version", ta) == 4
    assert value("deltacoord_table_published_version", tb) == 0
    assert value("deltacoord_table_publish_lag_versions", ta) == 0 and value("deltacoord_table_halted", ta) == 0
