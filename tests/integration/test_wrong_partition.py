"""A proposal on a partition other than its table's is rejected (WRONG_PARTITION) and nothing is decided for it.

The probe: a CREATE plus three appends, committed on the table's partition, are
re-sent byte for byte to the other partition of a two-partition deployment.
Decided there, they became a second history of the same table whose version 3
was published into the real `_delta_log` (and the real version 3, already
acknowledged, was skipped).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.codec import encode_proposal
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.routing import H_PROPOSAL_ID, H_TABLE_ID, partition_for
from deltacoord.writer import staging
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])


def _append(t: Table, read_version: int, row: int) -> Proposal:
    tx = Transaction(t, read_version)
    tx.stage(staging.write_data_files(t.root, pa.table({"id": [row]}, schema=SCHEMA), ()))
    return tx.proposal("WRITE", True, {"mode": "Append"})


def test_a_history_resent_to_the_other_partition_is_rejected(kafka_bootstrap: str, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deltacoord.coordinator.kafka.door")
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics, partitions=[0, 1], num_partitions=2) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics, coordinator_check=False)  # a static coordinator joins no group: the writers' check for one cannot see it
        t = Table(path, kafka_bootstrap, topics=topics, client=client)
        home = partition_for(t.table_id, 2)
        other = 1 - home
        assert client.partition_of(t.table_id) == home
        history = [t.begin_create(SCHEMA).proposal("CREATE TABLE", False)]
        assert client.commit(history[0]).version == 0
        for v in range(3):
            history.append(_append(t, v, v))
            assert client.commit(history[-1]).version == v + 1

        # Re-send the same four proposals to the other partition.
        futures = [client.expect(p.proposal_id) for p in history]
        raw = Producer({"bootstrap.servers": kafka_bootstrap})
        for p, fut in zip(history, futures, strict=True):
            raw.produce(topics.proposals, value=encode_proposal(p), key=p.table_id.encode(), partition=other,
                        headers=[(H_PROPOSAL_ID, p.proposal_id.encode()), (H_TABLE_ID, p.table_id.encode()), fut.header])
        assert raw.flush(30) == 0
        for p, fut in zip(history, futures, strict=True):
            d = fut.result(60)
            assert not d.committed and d.reason_code == "WRONG_PARTITION", (p.operation, d)
            assert f"partition {home} of 2" in (d.error_message or "")
        assert coord._workers[other].states == {}, "nothing was decided on the wrong partition"
        assert any("WRONG_PARTITION" in r.getMessage() and t.table_id in r.getMessage() for r in caplog.records)

        # The real history goes on at version 4.
        assert client.commit(_append(t, 3, 3)).version == 4
        assert coord.wait_published(60)
        client.close()

    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    assert [d.committed for d in read_decisions(settings, other)] == [False] * 4
    rep = verify_table(settings, t.uri, t.table_id, num_partitions=2)
    assert_verified(rep)
    assert rep.topic_versions == 5 and rep.published_versions == 5
    from deltalake import DeltaTable

    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2, 3]
