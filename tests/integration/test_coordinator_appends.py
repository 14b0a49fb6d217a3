"""16 concurrent writer processes x 50 blind appends through one coordinator, on a local directory and on S3."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.actions import parse_commit
from deltacoord.schemas.messages import Outcome
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.coord_harness import append_worker, coordinator_thread, fresh_topics

WRITERS = 16
PER_WRITER = 50
SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("value", pa.string())])


@pytest.mark.slow
def test_sixteen_writers_fifty_blind_appends_each(kafka_bootstrap: str, tmp_path: Path, table_place: TablePlace) -> None:
    topics = fresh_topics(kafka_bootstrap)
    prefix = topics.proposals.removesuffix(".proposals")
    table_path = table_place.uri("events")
    options = table_place.storage_options
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint, **table_place.coordinator_settings) as coord:
        with Table(table_path, kafka_bootstrap, topics=topics, storage_options=options) as t:
            t.create(SCHEMA, partition_by=["date"], properties={"delta.checkpointInterval": "10",
                                                             # one version per commit: each version v holds v rows
                                                             "deltacoord.coalesce": "false"})
        ctx = mp.get_context("spawn")
        outs = [tmp_path / f"w{i}.json" for i in range(WRITERS)]
        procs = [ctx.Process(target=append_worker,
                             args=(kafka_bootstrap, prefix, table_path, i, PER_WRITER, str(outs[i]), options))
                 for i in range(WRITERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
            assert p.exitcode == 0, "a writer process failed"
        assert coord.wait_published(60)
        head = max(st.version for w in coord._workers.values() for st in w.states.values())

    results = [r for o in outs for r in json.loads(o.read_text())]
    versions = sorted(r["version"] for r in results)
    # Every append committed, at distinct contiguous versions after the creation.
    assert versions == list(range(1, WRITERS * PER_WRITER + 1))
    assert head == WRITERS * PER_WRITER

    # Exactly one decision per proposal on the commits topic, all committed.
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    decisions = list(read_decisions(settings, 0))
    by_proposal: dict[str, int] = {}
    for d in decisions:
        by_proposal[d.proposal_id] = by_proposal.get(d.proposal_id, 0) + 1
        assert d.outcome is Outcome.COMMITTED
    assert len(decisions) == WRITERS * PER_WRITER + 1
    assert all(n == 1 for n in by_proposal.values())

    # _delta_log equals the commits topic, byte for byte.
    from deltacoord.schemas.actions import commit_to_json_lines

    log = table_place.storage(table_path)
    for d in decisions:
        assert d.version is not None
        assert log.get(f"_delta_log/{d.version:020d}.json") == commit_to_json_lines(d.actions)
        assert parse_commit(log.get(f"_delta_log/{d.version:020d}.json"))[0] == d.actions[0]

    # Checkpoints every 10 versions, and delta-rs reads every version with the expected row counts.
    assert log.exists("_delta_log/_last_checkpoint")
    assert log.exists(f"_delta_log/{800:020d}.checkpoint.parquet")
    for v, dt in table_place.delta_tables(table_path, range(0, WRITERS * PER_WRITER + 1)):
        adds = dt.get_add_actions(flatten=True)
        assert sum(adds.column("num_records").to_pylist()) == v, f"version {v}"
    for v in [1, 10, 11, 399, 655]:
        assert table_place.delta_table(table_path, version=v).to_pyarrow_table().num_rows == v
    # All rows, each once.
    final = table_place.delta_table(table_path).to_pyarrow_table()
    assert sorted(final.column("id").to_pylist()) == sorted(w * 1_000_000 + i for w in range(WRITERS) for i in range(PER_WRITER))
