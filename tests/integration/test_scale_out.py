"""Two coordinators split a 4-partition proposals topic; one is SIGKILLed and the other takes over."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa

from deltacoord.coordinator.delta_log.verify import assert_verified, verify_table
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.routing import partition_for
from deltacoord.tooling.ports import free_port
from deltacoord.writer.table import Table
from tests.integration.coord_harness import fresh_topics, start_coordinator_process

TABLES = 8
PER_TABLE = 12
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])


def _health(port: int) -> dict[str, object]:
    """The /healthz body, 200 or 503 (a coordinator recovering taken-over partitions answers 503)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            out: dict[str, object] = json.loads(r.read())
    except urllib.error.HTTPError as e:
        out = json.loads(e.read())
    return out


def test_survivor_takes_over_the_partitions_of_a_killed_coordinator(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=4)
    ports = [free_port(), free_port()]
    coords = [start_coordinator_process(kafka_bootstrap, topics, tmp_path, "--metrics-port", str(p)) for p in ports]

    # Both members of the group own part of the topic before the run starts.
    deadline = time.monotonic() + 180
    owned: list[list[int]] = [[], []]
    while time.monotonic() < deadline:
        try:
            owned = [list(_health(p)["partitions"]) for p in ports]  # type: ignore[call-overload]
        except OSError:
            owned = [[], []]
        if all(owned) and sorted(owned[0] + owned[1]) == [0, 1, 2, 3]:
            break
        time.sleep(0.5)
    assert sorted(owned[0] + owned[1]) == [0, 1, 2, 3] and all(owned), f"partitions not split: {owned}"

    # Two tables on every partition, so both coordinators' partitions carry traffic.
    per_partition: dict[int, list[Path]] = {0: [], 1: [], 2: [], 3: []}
    i = 0
    while any(len(v) < TABLES // 4 for v in per_partition.values()):
        p = (tmp_path / f"table{i}").resolve()
        bucket = per_partition[partition_for(p.as_uri(), 4)]
        if len(bucket) < TABLES // 4:
            bucket.append(p)
        i += 1
    paths = [p for v in per_partition.values() for p in v]
    versions: dict[int, list[int]] = {i: [] for i in range(TABLES)}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            with Table(paths[i], kafka_bootstrap, topics=topics, decision_timeout_s=180) as t:
                t.create(SCHEMA)
                for j in range(PER_TABLE):
                    versions[i].append(t.append(pa.table({"id": [j], "k": [f"t{i}"]})).version)
                    time.sleep(0.05)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(TABLES)]
    for th in threads:
        th.start()
    # Mid-run: once every table has its first append decided (both coordinators have carried traffic).
    deadline = time.monotonic() + 180
    while not all(versions.values()) and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(versions.values()) and not errors, f"not every table had version 1 within 180 s: {versions} {errors}"
    coords[0].kill()  # SIGKILL mid-run
    for th in threads:
        th.join(300)
    assert not errors, errors

    deadline = time.monotonic() + 180
    while sorted(_health(ports[1])["partitions"]) != [0, 1, 2, 3] and time.monotonic() < deadline:  # type: ignore[call-overload]
        time.sleep(0.5)
    assert sorted(_health(ports[1])["partitions"]) == [0, 1, 2, 3]  # type: ignore[call-overload]
    for i in range(TABLES):
        assert versions[i] == list(range(1, PER_TABLE + 1)), f"table {i}: {versions[i]}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not all((p / "_delta_log" / f"{PER_TABLE:020d}.json").exists() for p in paths):
        time.sleep(0.2)
    coords[1].kill(15)
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    for p in paths:
        rep = verify_table(settings, p.resolve().as_uri(), p.resolve().as_uri(), num_partitions=4)
        assert_verified(rep)
        assert rep.topic_versions == PER_TABLE + 1
