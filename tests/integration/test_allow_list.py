"""A table's writer allow-list: listed writers commit, others get WRITER_NOT_ALLOWED."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.properties import Property
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])


def test_writer_outside_the_allow_list_is_rejected(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics, writer_name="etl") as etl:
        etl.create(SCHEMA, properties={Property.ALLOWED_WRITERS: "etl, backfill"})
        deadline = time.monotonic() + 30
        while not (path / "_delta_log" / f"{0:020d}.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert etl.append(pa.table({"id": [1]})).version == 1
        intruder = Table(path, kafka_bootstrap, topics=topics, writer_name="intruder", client=etl.client)
        with pytest.raises(InvalidProposalError) as ei:
            intruder.append(pa.table({"id": [2]}))
        assert ei.value.reason == "WRITER_NOT_ALLOWED"
        assert "intruder" in str(ei.value)
        anonymous = Table(path, kafka_bootstrap, topics=topics, client=etl.client)
        with pytest.raises(InvalidProposalError):
            anonymous.append(pa.table({"id": [3]}))
        backfill = Table(path, kafka_bootstrap, topics=topics, writer_name="backfill", client=etl.client)
        assert backfill.append(pa.table({"id": [4]})).version == 2
    from deltalake import DeltaTable

    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == [1, 4]
