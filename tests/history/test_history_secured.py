"""The short cluster form of the history run on a secured cluster: three brokers with SASL_SSL
(SCRAM-SHA-512, the project's local CA) and KRaft's StandardAuthorizer refusing what no ACL allows.
The coordinators run as User:coord and the writers as User:ingest with only the ACLs of the plan
(`deltacoord acls`, applied through the admin API); the harness checks as the administrator. The
same faults as `test_history_cluster` (coordinator SIGKILLs, leader kills, an isolated coordinator,
a zombie, a racing coordinator, a writer killed between proposal and decision): nothing lost,
nothing doubled, and every fencing goes through the coordinators' own transactional ids.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltacoord.coordinator.kafka.acl_apply import apply_acls
from deltacoord.coordinator.kafka.acls import AclRequest, plan_acls
from deltacoord.schemas.routing import Topics
from deltacoord.tooling import broker_security
from deltacoord.tooling.broker import LocalCluster
from tests.history.chaos import ChaosClients, ChaosConfig, run_chaos
from tests.history.netpath import NetPath, close_paths, start_cluster_with_paths
from tests.integration.coord_harness import coordinator_group

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

PASSWORDS = {"coord": "coord-chaos-pw", "ingest": "ingest-chaos-pw"}


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, dict[str, NetPath]]]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the cluster tests start a local three-broker Kafka cluster and need Java 17+ "
                    "(and the Kafka jars: `deltacoord jars fetch kafka`)", pytrace=False)
    cl, paths = start_cluster_with_paths(tmp_path_factory.mktemp("secured-cluster"), brokers=3, secure=True)
    try:
        layout = cl.layout()
        assert layout is not None and cl.security is not None
        broker_security.add_users(layout.bootstrap_servers, cl.security, PASSWORDS)
        yield cl, paths
    finally:
        cl.stop()
        close_paths(paths)


@pytest.mark.slow
def test_history_on_a_secured_three_broker_cluster_with_only_the_planned_acls(
    secured_cluster: tuple[LocalCluster, dict[str, NetPath]], tmp_path: Path
) -> None:
    cl, paths = secured_cluster
    layout = cl.layout()
    assert layout is not None
    bootstrap = layout.bootstrap_servers
    clients = ChaosClients(admin=cl.client_config(), coordinator=cl.client_config("coord", PASSWORDS["coord"]),
                           writer=cl.client_config("ingest", PASSWORDS["ingest"]))
    applied: list[int] = []

    def grant(topics: Topics) -> None:
        prefix = topics.proposals.removesuffix(".proposals")
        entries = plan_acls(AclRequest(("User:ingest",), ("User:coord",), topic_prefix=prefix,
                                       group_id=coordinator_group(topics),
                                       transactional_id_prefix=f"{topics.proposals}-tx"))
        applied.append(apply_acls(entries, {"bootstrap.servers": bootstrap, **clients.admin}))

    cfg = ChaosConfig(writers=4, transactions=120, coordinator_kills=3, sigstops=0, zombies=1, broker_restarts=0,
                      leader_kills=2, isolations=1, racing_coordinators=1, writer_kills=1, writer_think_s=1.0,
                      seed=int(os.environ.get("DELTACOORD_HISTORY_SEED", "20240613")))
    report = run_chaos(bootstrap, cl, cfg, tmp_path, paths, clients=clients, on_topics=grant)
    text = json.dumps(report, indent=2, sort_keys=True)
    print(text)
    assert applied and applied[0] > 0
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
    assert faults["isolations"] == 1 and faults["isolated_fenced"] >= 1, text
    assert faults["zombies"] == 1 and faults["zombies_fenced"] == 1 and not faults["zombies_unresolved"], text
    assert faults["racing_coordinators"] == 1 and faults["writer_kills"] == 1, text
    assert not faults["writer_failures"], text
    assert not faults["unexpected_coordinator_exits"], text
    assert report["committed"] >= 60, text
