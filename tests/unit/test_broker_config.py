"""The local broker's generated settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltacoord.tooling.broker import (
    BrokerError,
    ClusterLayout,
    LocalCluster,
    NodeLayout,
    _cluster_id,
    broker_command,
    cluster_properties,
    server_properties,
)


def test_cluster_ids_never_start_with_a_dash() -> None:
    """An id starting with '-' is read as an option by the storage tool (1 in 64 random ids)."""
    ids = [_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_single_node_settings_allow_transactions(tmp_path: Path) -> None:
    props = dict(
        line.split("=", 1) for line in server_properties(19092, 19093, tmp_path).splitlines() if "=" in line
    )
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["log.dirs"] == str(tmp_path)


def test_the_local_broker_jvm_uses_c1_and_takes_extra_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELTACOORD_BROKER_JAVA_OPTS", raising=False)
    cmd = broker_command("java", "cp", "log4j2.yaml", "server.properties")
    assert "-XX:TieredStopAtLevel=1" in cmd and cmd[-2:] == ["kafka.Kafka", "server.properties"]
    monkeypatch.setenv("DELTACOORD_BROKER_JAVA_OPTS", "-XX:TieredStopAtLevel=4 -Xmx2g")
    cmd = broker_command("java", "cp", "log4j2.yaml", "server.properties")
    # Later JVM flags win: the user's options come after the defaults.
    assert cmd.index("-XX:TieredStopAtLevel=4") > cmd.index("-XX:TieredStopAtLevel=1")
    assert cmd.index("-Xmx2g") > cmd.index("-Xmx768m")


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_cluster_nodes_replicate_like_production_and_advertise_routes_at_their_proxies(tmp_path: Path) -> None:
    node = NodeLayout(2, 30002, 31002, {"A": (32002, 40002)})
    layout = ClusterLayout("cid", (NodeLayout(1, 30001, 31001), node, NodeLayout(3, 30003, 31003)))
    props = _props(cluster_properties(node, layout.voters, tmp_path))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:31001,2@127.0.0.1:31002,3@127.0.0.1:31003"
    for key in ("default.replication.factor", "offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    # The route's listener binds its own port and sends clients that came through it back to the proxy.
    assert props["listeners"].split(",")[-1] == "ROUTEA://127.0.0.1:32002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:30002,ROUTEA://127.0.0.1:40002"
    assert "ROUTEA:PLAINTEXT" in props["listener.security.protocol.map"]
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_a_cluster_layout_survives_its_json_file() -> None:
    layout = ClusterLayout("cid", (NodeLayout(1, 1, 2, {"A": (3, 4), "B": (5, 6)}), NodeLayout(2, 7, 8)))
    assert ClusterLayout.from_json(layout.to_json()) == layout
    assert layout.bootstrap_servers == "127.0.0.1:1,127.0.0.1:7"


def test_cluster_routes_are_checked_before_anything_starts(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, brokers=3, default_port=None)
    with pytest.raises(BrokerError, match="upper-case"):
        cluster.start(routes={"a-b": [1, 2, 3]})
    with pytest.raises(BrokerError, match="needs 3 advertised ports"):
        cluster.start(routes={"A": [1, 2]})
    assert not (tmp_path / "cluster.json").exists()


def test_broker_start_refuses_a_port_for_a_cluster(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from deltacoord.cli.main import main

    out = CliRunner().invoke(main, ["broker", "--home", str(tmp_path), "start", "--brokers", "3", "--port", "19099"])
    assert out.exit_code == 2 and "--port is for a single broker" in out.output


def test_a_secured_home_has_a_ca_a_broker_certificate_for_localhost_and_private_files(tmp_path: Path) -> None:
    import ipaddress
    import os
    import stat

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    from deltacoord.tooling import broker_security
    sec = broker_security.prepare(tmp_path)
    assert broker_security.prepare(tmp_path) == sec  # made once, then kept
    assert broker_security.load(tmp_path) == sec
    for name in ("ca.pem", "ca-key.pem", "broker.pem", "security.json"):
        assert stat.S_IMODE(os.stat(tmp_path / "security" / name).st_mode) == 0o600, name
    ca = x509.load_pem_x509_certificate(Path(sec.ca_path).read_bytes())
    pem = Path(sec.keystore_path).read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, as Kafka's PEM keystore reads it
    leaf = x509.load_pem_x509_certificates(pem[pem.index(b"-----BEGIN CERTIFICATE-----"):])[0]
    assert leaf.issuer == ca.subject and leaf.subject.rfc4514_string() == f"CN={broker_security.BROKER_CN}"
    pub = ca.public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    pub.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm))  # signed by the CA
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert sec.client_config("ingest", "pw") == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ingest",
        "sasl.password": "pw", "ssl.ca.location": sec.ca_path}
    assert sec.format_args() == ["--add-scram", f"SCRAM-SHA-512=[name=admin,password={sec.admin_password}]"]


def test_secured_settings_take_sasl_ssl_the_authorizer_and_mutual_tls_for_the_controllers(tmp_path: Path) -> None:
    from deltacoord.tooling import broker_security
    sec = broker_security.prepare(tmp_path / "home")
    single = _props(server_properties(19092, 19093, tmp_path, sec))
    assert single["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert single["listener.security.protocol.map"] == "CONTROLLER:SSL,SASL_SSL:SASL_SSL"
    assert single["inter.broker.listener.name"] == "SASL_SSL"
    assert single["listener.name.controller.ssl.client.auth"] == "required"
    assert single["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert single["allow.everyone.if.no.acl.found"] == "false"
    assert single["super.users"] == f"User:admin;User:CN={broker_security.BROKER_CN}"
    assert single["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config" in single
    node = NodeLayout(1, 30001, 31001, {"A": (32001, 40001)})
    cluster = _props(cluster_properties(node, "1@127.0.0.1:31001", tmp_path, sec))
    assert "ROUTEA:SASL_SSL" in cluster["listener.security.protocol.map"]
    assert cluster["advertised.listeners"] == "SASL_SSL://127.0.0.1:30001,ROUTEA://127.0.0.1:40001"
    assert "listener.name.routea.scram-sha-512.sasl.jaas.config" in cluster
    assert not any("PLAINTEXT" in v for v in (cluster["listeners"], cluster["listener.security.protocol.map"]))
