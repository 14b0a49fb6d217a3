"""The short cluster form CI runs: the history workload on a three-broker KRaft cluster.

The test starts its own `LocalCluster` (three broker+controller JVMs on free ports,
topics at replication factor 3 with min.insync.replicas=2) with two cuttable
network paths for the coordinators, and runs 4 writer processes x 30
transactions (with a pause between them, so the slow faults happen under load)
through: 3 coordinator SIGKILLs, a SIGKILL of the proposals partition's leader
and one of the commits partition's leader (each restarted), one coordinator cut
off from every broker while a replacement on the other path fences it, one real
zombie (paused, fenced by a replacement, resumed: it must exit 3 on its own),
a racing coordinator and a writer killed between proposal and decision.
`DELTACOORD_HISTORY_SEED` overrides the seed. The long form is
`python -m tests.history.chaos --brokers 3 ...` (see its docstring).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from deltacoord.coordinator.kafka.topics import ensure_topics
from deltacoord.schemas.routing import Topics
from deltacoord.tooling.broker import LocalCluster
from tests.history.chaos import ChaosConfig, run_chaos
from tests.history.netpath import NetPath, close_paths, start_cluster_with_paths

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, dict[str, NetPath]]]:
    """A fresh three-broker cluster on free ports with two cuttable paths (A, B) for coordinators."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the cluster tests start a local three-broker Kafka cluster and need Java 17+ "
                    "(and the Kafka jars: `deltacoord jars fetch kafka`)", pytrace=False)
    cl, paths = start_cluster_with_paths(tmp_path_factory.mktemp("cluster"), brokers=3)
    try:
        yield cl, paths
    finally:
        cl.stop()
        close_paths(paths)


def _bootstrap(cl: LocalCluster) -> str:
    layout = cl.layout()
    assert layout is not None
    return layout.bootstrap_servers


@pytest.mark.check
def test_topics_just_created_validate_through_any_broker(cluster: tuple[LocalCluster, dict[str, NetPath]]) -> None:
    """ensure_topics creates the topics through one broker and reads the commits topic's configuration
    through another, which may not know the topic yet (UNKNOWN_TOPIC_OR_PART): that is waited out."""
    cl, _paths = cluster
    admin = AdminClient({"bootstrap.servers": _bootstrap(cl)})
    for _ in range(12):
        topics = Topics.with_prefix(f"t{uuid.uuid4().hex[:8]}")
        assert ensure_topics(admin, topics) == 1
        for name in (topics.proposals, topics.commits):
            # Metadata from yet another broker may lag as well: wait for it, then check the replicas.
            deadline = time.monotonic() + 30
            while name not in (md := admin.list_topics(timeout=30)).topics and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(md.topics[name].partitions[0].replicas) == 3, name


@pytest.mark.slow
def test_history_on_a_three_broker_cluster_under_leader_kills_isolation_and_zombies(
    cluster: tuple[LocalCluster, dict[str, NetPath]], tmp_path: Path
) -> None:
    cl, paths = cluster
    cfg = ChaosConfig(writers=4, transactions=120, coordinator_kills=3, sigstops=0, zombies=1, broker_restarts=0,
                      leader_kills=2, isolations=1, racing_coordinators=1, writer_kills=1, writer_think_s=1.0,
                      seed=int(os.environ.get("DELTACOORD_HISTORY_SEED", "20240612")))
    report = run_chaos(_bootstrap(cl), cl, cfg, tmp_path, paths)
    text = json.dumps(report, indent=2, sort_keys=True)
    print(text)
    for kind in ("proposals", "commits"):
        assert report["cluster"][kind] == {"replication_factor": 3, "min_insync_replicas": 2}, text
    assert report["cluster"]["brokers"] == 3, text
    assert report["drained"], text
    assert report["lost"] == 0, text
    assert report["duplicated"] == 0, text
    assert report["anomalies"] == 0, text
    assert report["false_conflicts"] == 0, text
    assert report["verify_ok"], text
    assert report["delta_log_rewrites"] == [], text
    assert report["ok"], text
    faults = report["faults"]
    assert faults["coordinator_sigkills"] >= 3 and faults["leader_kills"] == 2, text
    assert [e.split("[")[0] for e in faults["leader_kill_log"]] == ["proposals", "commits"], text
    assert faults["isolations"] == 1 and faults["isolated_fenced"] >= 1, text
    # The zombie resumed and found out by itself (exit 3), nobody killed it.
    assert faults["zombies"] == 1 and faults["zombies_fenced"] == 1 and not faults["zombies_unresolved"], text
    assert faults["racing_coordinators"] == 1 and faults["writer_kills"] == 1, text
    assert not faults["writer_failures"], text
    assert not faults["unexpected_coordinator_exits"], text
    assert report["committed"] >= 60, text
