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
from pathlib import Path

import pytest

from tests.history.chaos import ChaosConfig, run_chaos
from tests.history.netpath import close_paths, start_cluster_with_paths

pytestmark = pytest.mark.kafka


def test_history_on_a_three_broker_cluster_under_leader_kills_isolation_and_zombies(tmp_path: Path) -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the cluster history run starts a local three-broker Kafka cluster and needs Java 17+ "
                    "(and the Kafka jars: `deltacoord jars fetch kafka`)", pytrace=False)
    cluster, paths = start_cluster_with_paths(tmp_path / "cluster", brokers=3)
    try:
        layout = cluster.layout()
        assert layout is not None
        cfg = ChaosConfig(writers=4, transactions=120, coordinator_kills=3, sigstops=0, zombies=1, broker_restarts=0,
                          leader_kills=2, isolations=1, racing_coordinators=1, writer_kills=1, writer_think_s=1.0,
                          seed=int(os.environ.get("DELTACOORD_HISTORY_SEED", "20240612")))
        report = run_chaos(layout.bootstrap_servers, cluster, cfg, tmp_path, paths)
    finally:
        cluster.stop()
        close_paths(paths)
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
