"""The deployment files agree with the code: commands, flags, env names, ports, probes, ACLs, topic rules.

No Docker, Kubernetes or Kafka needed: the files are parsed and checked against
the click commands (introspected), the metrics registry and the pure functions
behind `deltacoord acls` and `deltacoord topics create`.
"""

from __future__ import annotations

import configparser
import inspect
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from deltacoord.cli import acls as cli_acls
from deltacoord.cli import topics as cli_topics
from deltacoord.cli.main import coordinator_run
from deltacoord.cli.main import main as cli_main
from deltacoord.cli.topics import (
    UnsafeTopicSettingsError,
    check_replication,
    create_specs,
    default_min_insync_replicas,
    spec_differences,
    topic_problems,
)
from deltacoord.coordinator import settings
from deltacoord.coordinator.kafka import acls
from deltacoord.coordinator.kafka.acls import (
    CLUSTER,
    GROUP,
    LITERAL,
    PREFIXED,
    TOPIC,
    TRANSACTIONAL_ID,
    AclEntry,
    AclPlanError,
    AclRequest,
    command_args,
    plan_acls,
    render_commands,
)
from deltacoord.coordinator.kafka.topics import DEFAULT_REPLY_PARTITIONS, TopicSpec
from deltacoord.coordinator.metrics import Metrics, MetricsServer, TableGauges
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.routing import Topics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


# -- helpers -------------------------------------------------------------------------
def cli() -> click.Group:
    """The `deltacoord` group with the `acls` and `topics` commands registered."""
    group = click.Group("deltacoord", commands=dict(cli_main.commands))
    cli_acls.register(group)
    cli_topics.register(group)
    return group


def command(*path: str) -> click.Command:
    cmd: click.Command = cli()
    for name in path:
        assert isinstance(cmd, click.Group), f"{cmd.name} is not a group"
        sub = cmd.commands.get(name)
        assert sub is not None, f"`deltacoord {' '.join(path)}`: no command {name!r}"
        cmd = sub
    return cmd


def options_of(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def envvars_of(cmd: click.Command) -> set[str]:
    out: set[str] = set()
    for p in cmd.params:
        ev = getattr(p, "envvar", None)
        if isinstance(ev, str):
            out.add(ev)
        elif ev:
            out.update(ev)
    return out


RUN_OPTIONS = options_of(coordinator_run)
RUN_ENVVARS = envvars_of(coordinator_run)
RUN_PARAM_NAMES = {p.name for p in coordinator_run.params}


def file_keys_understood() -> set[str]:
    """The [coordinator] keys `coordinator run` reads from its config file (the settings module's list)."""
    keys = set(settings.FILE_KEYS)
    assert keys, "found no config-file keys in coordinator.settings: the introspection needs updating"
    return keys


def env_name_ok(name: str) -> bool:
    """A DELTACOORD_* variable the coordinator reads (its flags' variables or a Kafka client setting)."""
    return name in RUN_ENVVARS or (name.startswith("DELTACOORD_KAFKA_") and len(name) > len("DELTACOORD_KAFKA_"))


def flags_in(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def k8s_objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for p in sorted(K8S.glob("*.yaml")):
        for d in yaml_docs(p):
            yield p, d


def k8s_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _p, d in k8s_objects() if d.get("kind") == kind]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    lines: list[str] = []
    buf = ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    out = []
    for line in lines:
        instr, _, args = line.partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def dockerfile_final_stage() -> list[tuple[str, str]]:
    ins = dockerfile_instructions()
    last_from = max(i for i, (k, _v) in enumerate(ins) if k == "FROM")
    return ins[last_from:]


def dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for k, v in stage:
        if k == "ENV":
            for tok in shlex.split(v):
                name, _, value = tok.partition("=")
                env[name] = value
    return env


def image_metrics_port() -> int:
    return int(dockerfile_env(dockerfile_final_stage())["DELTACOORD_METRICS_PORT"])


def compose() -> dict[str, Any]:
    with open(DEPLOY / "compose.yaml") as fh:
        doc: dict[str, Any] = yaml.safe_load(fh)
    return doc


def kafka_version_of_pom() -> str:
    tree = ET.parse(DEPLOY / "maven" / "kafka" / "pom.xml")
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    el = tree.getroot().find("m:properties/m:kafka.version", ns)
    assert el is not None and el.text
    return el.text


# -- the CLI surface the deploy files rely on ---------------------------------------------
def test_metrics_port_flag_and_variable() -> None:
    (opt,) = [p for p in coordinator_run.params if p.name == "metrics_port"]
    assert "--metrics-port" in opt.opts and opt.envvar == "DELTACOORD_METRICS_PORT"
    assert "--config" in RUN_OPTIONS and "DELTACOORD_CONFIG" in RUN_ENVVARS


def test_config_file_keys_are_coordinator_run_parameters() -> None:
    for key in file_keys_understood():
        assert key in RUN_PARAM_NAMES or f"no_{key}" in RUN_PARAM_NAMES, key


def test_acls_and_topics_commands_register_on_a_click_group() -> None:
    group = click.Group("x")
    cli_acls.register(group)
    cli_topics.register(group)
    assert set(group.commands) == {"acls", "topics"}
    topics_group = group.commands["topics"]
    assert isinstance(topics_group, click.Group)
    assert set(topics_group.commands) == {"create", "describe"}
    assert {"--partitions", "--replication-factor", "--min-insync-replicas", "--allow-unsafe",
            "--bootstrap-servers", "--topic-prefix"} <= options_of(topics_group.commands["create"])
    assert {"--writer-principal", "--coordinator-principal", "--topic-prefix", "--transactional-id-prefix"} <= options_of(
        group.commands["acls"])


# -- Dockerfile ----------------------------------------------------------------------------
def test_dockerfile_entrypoint_is_coordinator_run() -> None:
    stage = dockerfile_final_stage()
    entry = [json.loads(v) for k, v in stage if k == "ENTRYPOINT"]
    assert entry == [["deltacoord", "coordinator", "run"]]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["deltacoord"] == "deltacoord.cli.main:run"  # `main` in a process of its own
    assert command("coordinator", "run") is coordinator_run


def test_dockerfile_base_user_healthcheck_and_no_java() -> None:
    ins = dockerfile_instructions()
    text = (DEPLOY / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert all(v.split()[0] == "${PYTHON_IMAGE}" for k, v in ins if k == "FROM")
    stage = dockerfile_final_stage()
    users = [v for k, v in stage if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    checks = [v for k, v in stage if k == "HEALTHCHECK"]
    assert len(checks) == 1 and "/healthz" in checks[0] and "DELTACOORD_METRICS_PORT" in checks[0]
    assert [v for k, v in stage if k == "STOPSIGNAL"] == ["SIGTERM"]
    for k, v in ins:
        if k == "RUN":
            assert not re.search(r"\b(openjdk|default-jre|temurin|jre-headless)\b", v), v
    env = dockerfile_env(stage)
    for name in env:
        if name.startswith("DELTACOORD_"):
            assert env_name_ok(name), name
    assert [int(v) for k, v in stage if k == "EXPOSE"] == [image_metrics_port()]


def test_dockerfile_installs_every_package_and_the_context_allows_them() -> None:
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = [p.removesuffix("*") for p in find["include"]]
    copies = [v.split()[0] for k, v in dockerfile_instructions() if k == "COPY" and not v.startswith("--from")]
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for pkg in packages:
        assert pkg in copies, pkg
        assert f"!{pkg}/" in ignore, pkg
    for needed in ("pyproject.toml", "README.md"):
        assert f"!{needed}" in ignore


@pytest.mark.parametrize("healthy", [True, False])
def test_dockerfile_healthcheck_follows_healthz(healthy: bool) -> None:
    (check,) = [v for k, v in dockerfile_final_stage() if k == "HEALTHCHECK"]
    argv = json.loads(check.split(" CMD ", 1)[1])
    assert argv[0] == "python"
    server = MetricsServer(Metrics(), lambda: (healthy, {}), port=0, host="127.0.0.1")
    server.start()
    try:
        env = {**os.environ, "DELTACOORD_METRICS_PORT": str(server.port)}
        res = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30)
    finally:
        server.stop()
    assert (res.returncode == 0) is healthy, res.stderr


# -- compose -----------------------------------------------------------------------------
def test_compose_kafka_cluster_is_three_kraft_nodes_with_durable_defaults() -> None:
    services = compose()["services"]
    brokers = {n: s for n, s in services.items() if s.get("image", "").startswith("apache/kafka")}
    assert sorted(brokers) == ["kafka-1", "kafka-2", "kafka-3"]
    ids, cluster_ids, voters = set(), set(), set()
    for name, s in brokers.items():
        assert s["image"] == f"apache/kafka:{kafka_version_of_pom()}"
        env = {k: str(v) for k, v in s["environment"].items()}
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        ids.add(env["KAFKA_NODE_ID"])
        cluster_ids.add(env["CLUSTER_ID"])
        voters.add(env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        assert f"INTERNAL://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
        assert "healthcheck" in s and s["volumes"]
    assert ids == {"1", "2", "3"}
    assert len(cluster_ids) == 1 and len(next(iter(cluster_ids))) == 22
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}


def coordinator_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose()["services"].items() if n.startswith("coordinator-")}


def test_compose_two_coordinators_from_the_dockerfile_share_one_group() -> None:
    coords = coordinator_services()
    assert sorted(coords) == ["coordinator-1", "coordinator-2"]
    groups = set()
    for name, s in coords.items():
        assert s["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / s["build"]["context"] / s["build"]["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
        assert "entrypoint" not in s and "command" not in s, name
        env = {k: str(v) for k, v in s["environment"].items()}
        for var in env:
            if var.startswith("DELTACOORD_"):
                assert env_name_ok(var), f"{name}: {var} is not read by `coordinator run`"
        groups.add(env["DELTACOORD_GROUP_ID"])
        # No static partition list: the consumer group splits the partitions between them.
        assert "DELTACOORD_PARTITIONS" not in env
        assert s["stop_signal"] == "SIGTERM"
        assert any(str(v).endswith(":/data/tables") for v in s["volumes"])
        assert s["depends_on"]["topics-init"]["condition"] == "service_completed_successfully"
    assert len(groups) == 1


def test_compose_metrics_ports_and_prometheus_targets_match_metrics_port() -> None:
    coords = coordinator_services()
    ports = set()
    for s in coords.values():
        port = int(s["environment"]["DELTACOORD_METRICS_PORT"])
        ports.add(port)
        assert all(int(str(p).rsplit(":", 1)[1]) == port for p in s["ports"])
    assert ports == {image_metrics_port()}
    prom = compose()["services"]["prometheus"]
    assert any(str(v).startswith("./prometheus.yml:") for v in prom["volumes"])
    with open(DEPLOY / "prometheus.yml") as fh:
        cfg = yaml.safe_load(fh)
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "deltacoord"]
    assert len(jobs) == 1 and jobs[0].get("metrics_path", "/metrics") == "/metrics"
    targets = {t for sc in jobs[0]["static_configs"] for t in sc["targets"]}
    expected = {f"{s.get('hostname', n)}:{image_metrics_port()}" for n, s in coords.items()}
    assert targets == expected


def test_compose_topics_init_uses_safe_topics_create_flags() -> None:
    s = compose()["services"]["topics-init"]
    assert s["entrypoint"] == ["deltacoord", "topics", "create"]
    argv = [str(a) for a in s["command"]]
    assert set(flags_in(argv)) <= options_of(command("topics", "create"))
    assert "--allow-unsafe" not in argv
    rf = int(argv[argv.index("--replication-factor") + 1])
    isr = int(argv[argv.index("--min-insync-replicas") + 1])
    parts = int(argv[argv.index("--partitions") + 1])
    assert check_replication(parts, rf, isr) == []
    for var in s["environment"]:
        assert var in envvars_of(command("topics", "create")), var
    coord_env = next(iter(coordinator_services().values()))["environment"]
    assert int(coord_env["DELTACOORD_NUM_PARTITIONS"]) == parts


def exported_metric_names() -> set[str]:
    """Every series name the coordinator exports, per-table gauges included."""
    metrics = Metrics()
    metrics.watch_tables(lambda: [TableGauges("file:///t", 1, 1, False)])
    known: set[str] = set()
    for fam in metrics.registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}[fam.type]
        known |= {fam.name + s for s in suffixes}
    return known


def test_alert_rules_use_existing_metrics() -> None:
    with open(DEPLOY / "alerts.yml") as fh:
        rules = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"]]
    assert rules
    known = exported_metric_names()
    for r in rules:
        for name in re.findall(r"\bdeltacoord_[a-z_]+", r["expr"]):
            assert name in known, f"alert {r['alert']}: no metric {name}"
    with open(DEPLOY / "prometheus.yml") as fh:
        assert yaml.safe_load(fh)["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_the_grafana_dashboard_loads_and_reads_only_existing_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "deltacoord.json").read_text())
    assert dash["uid"] == "deltacoord" and [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and all(p["title"] for p in panels)
    known = exported_metric_names()
    used: set[str] = set()
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = set(re.findall(r"\bdeltacoord_[a-z_]+", t["expr"]))
            assert names and names <= known, f"panel {p['title']!r}: no metric {names - known}"
            used |= names
    per_table = {"deltacoord_table_commits_total", "deltacoord_table_conflicts_total",
                 "deltacoord_table_publish_lag_versions", "deltacoord_table_halted"}
    assert per_table <= used  # commits, conflicts, publish lag and halts per table are shown


# -- Kubernetes --------------------------------------------------------------------------
def deployment_container() -> tuple[dict[str, Any], dict[str, Any]]:
    deps = k8s_kind("Deployment")
    assert len(deps) == 1
    dep = deps[0]
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dep, containers[0]


def test_k8s_deployment_has_two_replicas_and_runs_coordinator_run() -> None:
    dep, c = deployment_container()
    assert dep["spec"]["replicas"] == 2
    assert "command" not in c, "the image's entrypoint (`deltacoord coordinator run`) must stay"
    assert set(flags_in(c.get("args", []))) <= RUN_OPTIONS
    for e in c["env"]:
        if e["name"].startswith("DELTACOORD_"):
            assert env_name_ok(e["name"]), e["name"]
        assert "PARTITIONS" not in e["name"], "replicas of one Deployment must not pin partitions"
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    sc = pod["spec"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60


def test_k8s_probes_are_on_healthz_at_the_metrics_port() -> None:
    _dep, c = deployment_container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    metrics_port = int(env["DELTACOORD_METRICS_PORT"])
    assert metrics_port == image_metrics_port()
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/healthz"), ("startupProbe", "/livez")):
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        port = get["port"]
        assert (ports[port] if isinstance(port, str) else port) == metrics_port, probe


def test_k8s_configmap_holds_a_valid_config_file() -> None:
    dep, c = deployment_container()
    cms = k8s_kind("ConfigMap")
    assert len(cms) == 1
    doc = tomllib.loads(cms[0]["data"]["coordinator.toml"])
    # librdkafka settings are flat, quoted keys (an unquoted dotted key is a nested table).
    assert all(isinstance(v, str) and "." in k for k, v in doc["kafka"].items()), doc["kafka"]
    assert set(doc["coordinator"]) <= file_keys_understood()
    assert "partitions" not in doc["coordinator"]
    assert int(doc["coordinator"]["metrics_port"]) == image_metrics_port()
    # The Deployment mounts the ConfigMap where --config points.
    args = c["args"]
    config_path = Path(args[args.index("--config") + 1])
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == config_path.parent]
    assert len(mounts) == 1 and vols[mounts[0]["name"]]["configMap"]["name"] == cms[0]["metadata"]["name"]
    for key in doc.get("kafka", {}):
        assert "password" not in key and "secret" not in key, f"secret {key} in a ConfigMap"


def test_k8s_sasl_credentials_come_from_a_secret_reference_only() -> None:
    _dep, c = deployment_container()
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert {"DELTACOORD_KAFKA_SASL_USERNAME", "DELTACOORD_KAFKA_SASL_PASSWORD"} <= set(refs)
    assert len({r["name"] for r in refs.values()}) == 1
    assert not k8s_kind("Secret"), "no Secret objects (and so no secret values) in deploy/k8s"
    for e in c["env"]:
        if re.search("PASSWORD|SECRET", e["name"]):
            assert "value" not in e, e["name"]


def test_k8s_metrics_service_targets_the_metrics_port() -> None:
    dep, c = deployment_container()
    svcs = k8s_kind("Service")
    assert len(svcs) == 1
    svc = svcs[0]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "metrics"]
    target = port["targetPort"]
    assert (ports[target] if isinstance(target, str) else target) == image_metrics_port()


def test_k8s_kustomization_lists_every_manifest() -> None:
    with open(K8S / "kustomization.yaml") as fh:
        kust = yaml.safe_load(fh)
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    for _p, d in k8s_objects():
        assert "apiVersion" in d and "kind" in d


# -- systemd -------------------------------------------------------------------------------
def test_systemd_unit_has_the_required_keys() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "deltacoord-coordinator.service")
    svc = unit["Service"]
    assert svc["Restart"] == "on-failure"
    assert svc["EnvironmentFile"].lstrip("-").startswith("/")
    assert svc["KillSignal"] == "SIGTERM"
    assert int(svc["TimeoutStopSec"]) >= 60
    assert svc["User"] and svc["User"] != "root"
    argv = shlex.split(svc["ExecStart"])
    assert Path(argv[0]).name == "deltacoord" and argv[1:3] == ["coordinator", "run"]
    assert set(flags_in(argv)) <= RUN_OPTIONS
    name, _, _value = svc["Environment"].partition("=")
    assert env_name_ok(name)
    assert "2" in svc["RestartPreventExitStatus"].split() and "3" not in svc["RestartPreventExitStatus"].split()
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert "network-online.target" in unit["Unit"]["After"]


def test_relay_unit_runs_the_relay_on_the_socket_writers_are_told() -> None:
    from deltacoord.cli.main import main

    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "deltacoord-relay.service")
    svc = unit["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert Path(argv[0]).name == "deltacoord" and argv[1:3] == ["relay", "run"]
    relay_run = main.commands["relay"].commands["run"]  # type: ignore[attr-defined]
    options = {o for p in relay_run.params for o in p.opts}
    assert set(flags_in(argv)) <= options
    # The socket comes from the variable writers read, in the runtime directory systemd creates.
    name, _, value = svc["Environment"].partition("=")
    socket_option = next(p for p in relay_run.params if "--socket" in p.opts)
    assert name == socket_option.envvar == "DELTACOORD_RELAY"
    assert Path(value).parent == Path("/run") / svc["RuntimeDirectory"]
    assert svc["User"] and svc["User"] != "root" and svc["EnvironmentFile"].startswith("/")
    assert unit["Install"]["WantedBy"] == "multi-user.target"


# -- example config ----------------------------------------------------------------------
def test_example_toml_documents_every_key_coordinator_run_reads() -> None:
    text = (DEPLOY / "coordinator.example.toml").read_text()
    doc = tomllib.loads(text)
    understood = file_keys_understood()
    active = set(doc["coordinator"])
    assert active <= understood, active - understood
    # Every key is there, set or commented out with its explanation.
    for key in understood:
        assert key in active or re.search(rf"^# {key} = ", text, re.M), f"{key} is not documented"
    assert doc.get("kafka", {}) == {}, "[kafka] examples stay commented out"
    for needle in ("security.protocol", "ssl.ca.location", "SCRAM-SHA-512", "OAUTHBEARER",
                   "sasl.oauthbearer.token.endpoint.url", "DELTACOORD_KAFKA_SASL_PASSWORD"):
        assert needle in text, needle
    assert not re.search(r"^\s*\"?sasl\.password\"?\s*=", text, re.M)
    # Each commented [kafka] example, uncommented, is one flat librdkafka setting.
    kafka_part = text[text.index("\n[kafka]"):]
    examples = re.findall(r"^# (\"[a-z.]+\" = .*)$", kafka_part, re.M)
    assert len(examples) >= 10
    for line in examples:
        table = tomllib.loads(f"[kafka]\n{line}")["kafka"]
        assert len(table) == 1 and all("." in k and isinstance(v, str) for k, v in table.items()), line


@pytest.fixture
def fake_coordinator(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace the daemon so `coordinator run` only records what it would run."""
    from deltacoord.coordinator import json_logs
    from deltacoord.coordinator.kafka import daemon

    calls: list[dict[str, Any]] = []

    class FakeCoordinator:
        def __init__(self, settings: CoordinatorSettings, **kwargs: Any) -> None:
            calls.append({"settings": settings, **kwargs})

        def install_signal_handlers(self) -> None:
            pass

        def run(self) -> int:
            return 0

    monkeypatch.setattr(daemon, "Coordinator", FakeCoordinator)
    monkeypatch.setattr(json_logs, "setup_logging", lambda level="INFO": None)
    for k in list(os.environ):
        if k.startswith("DELTACOORD_"):
            monkeypatch.delenv(k)
    return calls


def test_example_toml_drives_coordinator_run(fake_coordinator: list[dict[str, Any]], tmp_path: Path) -> None:
    text = (DEPLOY / "coordinator.example.toml").read_text().replace('# partitions = "0,1,2"', 'partitions = "0,1,2"')
    cfg = tmp_path / "coordinator.toml"
    cfg.write_text(text)
    res = CliRunner().invoke(cli(), ["coordinator", "run", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    (call,) = fake_coordinator
    s: CoordinatorSettings = call["settings"]
    doc = tomllib.loads(text)["coordinator"]
    assert s.bootstrap_servers == doc["bootstrap_servers"]
    assert s.topics == Topics.with_prefix(doc["topic_prefix"])
    assert s.group_id == doc["group_id"] and s.transactional_id_prefix == doc["transactional_id_prefix"]
    assert s.max_batch == doc["max_batch"]
    assert call["partitions"] == [0, 1, 2] and call["num_partitions"] == doc["num_partitions"]
    assert call["metrics_port"] == doc["metrics_port"]
    assert call["publish_fsync"] is True and call["checkpoint_fn"] is not None


def test_k8s_config_with_secret_env_drives_coordinator_run(fake_coordinator: list[dict[str, Any]], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _dep, c = deployment_container()
    cfg = tmp_path / "coordinator.toml"
    cfg.write_text(k8s_kind("ConfigMap")[0]["data"]["coordinator.toml"])
    for e in c["env"]:
        monkeypatch.setenv(e["name"], e.get("value") or f"from-secret-{e['valueFrom']['secretKeyRef']['key']}")
    args = [str(cfg) if a.endswith(".toml") else a for a in c["args"]]
    res = CliRunner().invoke(cli(), ["coordinator", "run", *args])
    assert res.exit_code == 0, res.output
    (call,) = fake_coordinator
    s: CoordinatorSettings = call["settings"]
    assert s.kafka["sasl.username"] == "from-secret-username" and s.kafka["sasl.password"] == "from-secret-password"
    assert s.kafka["security.protocol"] == "SASL_SSL"
    assert call["partitions"] is None  # group mode
    assert call["metrics_port"] == image_metrics_port()


# -- ACLs ------------------------------------------------------------------------------------
W, C, R = "User:writer", "User:coord", "User:reader"


def grants(entries: list[AclEntry], principal: str) -> set[tuple[str, str, str, str]]:
    return {(e.resource_type, e.name, e.pattern_type, e.operation) for e in entries if e.principal == principal}


def test_acls_grant_exactly_the_needed_operations() -> None:
    entries = plan_acls(AclRequest((W,), (C,), topic_prefix="dc", transactional_id_prefix="dc-tx"))
    assert all(e.permission == "ALLOW" and e.host == "*" for e in entries)
    assert len(entries) == len(set(entries))
    assert grants(entries, W) == {
        (TOPIC, "dc.proposals", LITERAL, "WRITE"), (TOPIC, "dc.proposals", LITERAL, "DESCRIBE"),
        (TOPIC, "dc.commits", LITERAL, "READ"), (TOPIC, "dc.commits", LITERAL, "DESCRIBE"),
        (TOPIC, "dc.replies", LITERAL, "READ"), (TOPIC, "dc.replies", LITERAL, "DESCRIBE"),
        (GROUP, "deltacoord-writer-", PREFIXED, "READ"), (GROUP, "deltacoord-lookup", PREFIXED, "READ"),
        (GROUP, "dc-coordinator", LITERAL, "DESCRIBE"),
    }
    assert grants(entries, C) == {
        (TOPIC, "dc.proposals", LITERAL, "READ"), (TOPIC, "dc.proposals", LITERAL, "DESCRIBE"),
        (TOPIC, "dc.commits", LITERAL, "WRITE"), (TOPIC, "dc.commits", LITERAL, "READ"),
        (TOPIC, "dc.commits", LITERAL, "DESCRIBE"), (TOPIC, "dc.commits", LITERAL, "DESCRIBE_CONFIGS"),
        (TOPIC, "dc.deadletters", LITERAL, "WRITE"), (TOPIC, "dc.deadletters", LITERAL, "DESCRIBE"),
        (TOPIC, "dc.deadletters", LITERAL, "DESCRIBE_CONFIGS"),
        (TOPIC, "dc.replies", LITERAL, "WRITE"), (TOPIC, "dc.replies", LITERAL, "DESCRIBE"),
        (GROUP, "dc-coordinator", LITERAL, "READ"), (GROUP, "dc-coordinator", LITERAL, "DESCRIBE"),
        (GROUP, "dc-coordinator-recovery", LITERAL, "READ"), (GROUP, "dc-coordinator-recovery", LITERAL, "DESCRIBE"),
        (TRANSACTIONAL_ID, "dc-tx-dc.proposals-", PREFIXED, "WRITE"),
        (TRANSACTIONAL_ID, "dc-tx-dc.proposals-", PREFIXED, "DESCRIBE"),
    }
    assert {e.principal for e in entries} == {W, C}


def test_writers_cannot_decide_or_use_transactions() -> None:
    entries = plan_acls(AclRequest((W, "User:w2"), (C,), idempotent_write_acl=True))
    for w in (W, "User:w2"):
        g = grants(entries, w)
        assert not any(rt == TRANSACTIONAL_ID for rt, *_ in g)
        assert (TOPIC, "deltacoord.commits", LITERAL, "WRITE") not in g
        assert not any(n == "deltacoord.deadletters" for _rt, n, *_ in g)
        # They may describe the coordinators' group (the serving check), never join it or commit its offsets.
        assert not any(rt == GROUP and n.startswith("deltacoord-coordinator") and op != "DESCRIBE" for rt, n, _pt, op in g)
        assert not any(op in ("CREATE", "ALTER", "ALTER_CONFIGS", "DELETE", "ALL") for *_x, op in g)
        assert not any(rt == TOPIC and pt == PREFIXED for rt, _n, pt, _op in g)


def test_idempotent_write_is_opt_in_and_only_on_the_cluster() -> None:
    base = plan_acls(AclRequest((W,), (C,)))
    extra = set(plan_acls(AclRequest((W,), (C,), idempotent_write_acl=True))) - set(base)
    assert {(e.principal, e.resource_type, e.operation) for e in extra} == {
        (W, CLUSTER, "IDEMPOTENT_WRITE"), (C, CLUSTER, "IDEMPOTENT_WRITE")}
    assert not any(e.resource_type == CLUSTER for e in base)


def test_transactional_id_prefix_covers_every_partition_and_nothing_of_other_deployments() -> None:
    entries = plan_acls(AclRequest((), (C,), topic_prefix="dc", transactional_id_prefix="coord"))
    (prefix,) = {e.name for e in entries if e.resource_type == TRANSACTIONAL_ID}
    settings = CoordinatorSettings("x:1", topics=Topics.with_prefix("dc"), transactional_id_prefix="coord")
    for p in (0, 1, 9, 10, 127):
        assert settings.transactional_id(p).startswith(prefix)
    other = CoordinatorSettings("x:1", topics=Topics.with_prefix("dc2"), transactional_id_prefix="coord")
    assert not other.transactional_id(0).startswith(prefix)


def test_acl_groups_match_the_group_ids_the_code_uses() -> None:
    from deltacoord.coordinator.kafka import recovery
    from deltacoord.reader import stream
    from deltacoord.writer import client

    assert '{settings.group_id}-recovery' in inspect.getsource(recovery.read_decisions_at)
    assert acls.coordinator_groups("g") == ("g", "g-recovery")
    writer_groups = re.findall(r'"group\.id":\s*f?"([^"{]+)', inspect.getsource(client))
    assert writer_groups
    for g in writer_groups:
        assert any(g.startswith(p) for p in acls.DEFAULT_WRITER_GROUP_PREFIXES), g
    reader_groups = re.findall(r'"group\.id":\s*f?"([^"{]+)', inspect.getsource(stream))
    for g in reader_groups:
        assert any(g.startswith(p) for p in acls.DEFAULT_READER_GROUP_PREFIXES), g


def test_relays_get_the_writers_grants() -> None:
    entries = plan_acls(AclRequest((W,), (C,), relay_principals=("User:relay", W)))
    assert grants(entries, "User:relay") == grants(entries, W)
    assert len(entries) == len(set(entries))


def test_readers_only_read_commits() -> None:
    entries = plan_acls(AclRequest((), (), reader_principals=(R,)))
    assert grants(entries, R) == {
        (TOPIC, "deltacoord.commits", LITERAL, "READ"), (TOPIC, "deltacoord.commits", LITERAL, "DESCRIBE"),
        (GROUP, "deltacoord-stream-", PREFIXED, "READ"),
    }


@pytest.mark.parametrize("req, message", [
    (AclRequest((W,), (C,), writer_group_prefixes=("deltacoord-",)), "covers the coordinator's consumer group"),
    (AclRequest((W,), (C,), writer_group_prefixes=("",)), "every consumer group"),
    (AclRequest((W,), (W,)), "both coordinator principals and writer"),
    (AclRequest((), (C,), relay_principals=(C,)), "both coordinator principals and writer, relay"),
    (AclRequest(("writer",), (C,)), "Type:name"),
    (AclRequest((), ()), "no principals"),
])
def test_unsafe_acl_requests_are_refused(req: AclRequest, message: str) -> None:
    with pytest.raises(AclPlanError, match=message):
        plan_acls(req)


def test_rendered_commands_are_kafka_acls_lines_one_per_resource() -> None:
    entries = plan_acls(AclRequest(("User:CN=writer,O=Acme",), (C,), idempotent_write_acl=True))
    text = render_commands(entries, "kafka:9093", "/etc/kafka/admin.properties")
    lines = text.splitlines()
    argvs = command_args(entries, "kafka:9093", "/etc/kafka/admin.properties")
    assert [shlex.split(line) for line in lines] == argvs
    resources = {(e.principal, e.resource_type, e.name, e.pattern_type) for e in entries}
    assert len(lines) == len(resources)
    rebuilt = set()
    for argv in argvs:
        assert argv[:5] == ["kafka-acls.sh", "--bootstrap-server", "kafka:9093", "--command-config", "/etc/kafka/admin.properties"]
        assert "--add" in argv and argv[argv.index("--allow-host") + 1] == "*"
        principal = argv[argv.index("--allow-principal") + 1]
        ops = [argv[i + 1] for i, a in enumerate(argv) if a == "--operation"]
        if "--cluster" in argv:
            rtype, name, pattern = CLUSTER, acls.CLUSTER_NAME, LITERAL
        else:
            flag = next(a for a in argv if a in ("--topic", "--group", "--transactional-id"))
            rtype = {"--topic": TOPIC, "--group": GROUP, "--transactional-id": TRANSACTIONAL_ID}[flag]
            name = argv[argv.index(flag) + 1]
            pattern = argv[argv.index("--resource-pattern-type") + 1].upper()
        names = {"Read": "READ", "Write": "WRITE", "Describe": "DESCRIBE", "DescribeConfigs": "DESCRIBE_CONFIGS",
                 "IdempotentWrite": "IDEMPOTENT_WRITE"}
        rebuilt |= {AclEntry(principal, rtype, name, pattern, names[o]) for o in ops}
    assert rebuilt == set(entries)


def test_acls_command_prints_the_rendered_plan_and_json() -> None:
    args = ["acls", "--writer-principal", W, "--coordinator-principal", C, "--topic-prefix", "dc",
            "--transactional-id-prefix", "dc-tx", "--bootstrap-servers", "k:9092"]
    res = CliRunner().invoke(cli(), args, env={"DELTACOORD_GROUP_ID": None})
    assert res.exit_code == 0, res.output
    req = AclRequest((W,), (C,), topic_prefix="dc", transactional_id_prefix="dc-tx")
    assert res.output == render_commands(plan_acls(req), "k:9092")
    # The singular spelling of older releases still works, but the help names only the plural, as every command does.
    old = CliRunner().invoke(cli(), [*args[:-2], "--bootstrap-server", "k:9092"], env={"DELTACOORD_GROUP_ID": None})
    assert old.exit_code == 0 and old.output == res.output
    usage = CliRunner().invoke(cli(), ["acls", "--help"]).output
    assert "--bootstrap-servers" in usage and "--bootstrap-server " not in usage
    res = CliRunner().invoke(cli(), [*args, "--format", "json"], env={"DELTACOORD_GROUP_ID": None})
    assert {AclEntry(**d) for d in json.loads(res.output)} == set(plan_acls(req))
    bad = CliRunner().invoke(cli(), ["acls", "--writer-principal", W, "--writer-group-prefix", "deltacoord-",
                                     "--coordinator-principal", C])
    assert bad.exit_code == 2 and "coordinator's consumer group" in bad.output


def test_acls_sh_calls_deltacoord_acls() -> None:
    path = DEPLOY / "acls.sh"
    assert path.stat().st_mode & stat.S_IXUSR
    assert 'exec deltacoord acls "$@"' in path.read_text()
    subprocess.run(["sh", "-n", str(path)], check=True)


# -- topics create: the safety rules -----------------------------------------------------
@pytest.mark.parametrize("rf, isr, named", [
    (1, 1, "replication factor 1 < 3"),
    (2, 2, "replication factor 2 < 3"),
    (3, 1, "min.insync.replicas 1 < 2"),
    (3, 3, "min.insync.replicas 3 >= replication factor 3"),
    (5, 1, "min.insync.replicas 1 < 2"),
])
def test_unsafe_replication_is_refused_without_allow_unsafe(rf: int, isr: int, named: str) -> None:
    with pytest.raises(UnsafeTopicSettingsError, match=re.escape(named)) as exc:
        check_replication(3, rf, isr)
    assert "--allow-unsafe" in str(exc.value)
    warnings = check_replication(3, rf, isr, allow_unsafe=True)
    assert any(named in w for w in warnings)


@pytest.mark.parametrize("parts, rf, isr", [(3, 3, 2), (1, 3, 2), (12, 5, 3), (6, 4, 3), (6, 5, 4)])
def test_safe_replication_passes(parts: int, rf: int, isr: int) -> None:
    assert check_replication(parts, rf, isr) == []


@pytest.mark.parametrize("parts, rf, isr", [(0, 3, 2), (3, 0, 1), (3, 3, 0), (3, 3, 4), (3, 1, 2)])
def test_invalid_settings_are_refused_even_with_allow_unsafe(parts: int, rf: int, isr: int) -> None:
    with pytest.raises(UnsafeTopicSettingsError):
        check_replication(parts, rf, isr, allow_unsafe=True)


def test_default_min_insync_replicas_is_a_safe_majority() -> None:
    assert [default_min_insync_replicas(rf) for rf in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    for rf in (3, 4, 5, 6, 7):
        assert check_replication(1, rf, default_min_insync_replicas(rf)) == []


def test_create_specs_keep_the_commits_topic_forever_and_uncompacted() -> None:
    topics = Topics.with_prefix("dc")
    specs = {s.name: s for s in create_specs(topics, 12, 3, 2)}
    assert set(specs) == {topics.proposals, topics.commits, topics.dead_letters, topics.replies}
    assert specs[topics.replies].partitions == DEFAULT_REPLY_PARTITIONS
    assert specs[topics.replies].config["retention.ms"] == str(24 * 3600 * 1000)
    commits = specs[topics.commits]
    assert commits.config["cleanup.policy"] == "delete"
    assert commits.config["retention.ms"] == "-1" and commits.config["retention.bytes"] == "-1"
    assert specs[topics.proposals].partitions == commits.partitions == 12
    dl = specs[topics.dead_letters]
    assert dl.partitions == 1
    # Explicit limits, not the broker's defaults; room for the largest dead letter the coordinator sends.
    assert dl.config["max.message.bytes"] == "1048576" and dl.config["retention.bytes"] == "1073741824"
    assert int(dl.config["max.message.bytes"]) >= CoordinatorSettings("x").dead_letter_record_bound()
    assert specs[topics.proposals].config["max.message.bytes"] == str(8 * 1024 * 1024)
    for s in specs.values():
        assert s.replication_factor == 3
        assert s.config["min.insync.replicas"] == "2"
        assert s.config["unclean.leader.election.enable"] == "false"
        assert "compact" not in s.config["cleanup.policy"]


def test_topic_problems_flag_what_breaks_the_coordinator() -> None:
    topics = Topics.with_prefix("dc")
    good = {s.name: cli_topics.TopicState(s.name, True, s.partitions, s.replication_factor, s.config)
            for s in create_specs(topics, 6, 3, 2)}
    assert topic_problems(topics, good) == ([], [])
    bound = CoordinatorSettings("x").dead_letter_record_bound()
    assert topic_problems(topics, good, bound) == ([], [])
    dl = good[topics.dead_letters]
    small = {**good, dl.name: cli_topics.TopicState(dl.name, True, 1, 3, {**dl.configs, "max.message.bytes": "1000"})}
    (problem,), _ = topic_problems(topics, small, bound)
    assert "dc.deadletters has max.message.bytes=1000" in problem and str(bound) in problem
    bad = dict(good)
    c = good[topics.commits]
    bad[topics.commits] = cli_topics.TopicState(c.name, True, 7, 3, {**c.configs, "cleanup.policy": "compact,delete",
                                                                      "retention.ms": "604800000"})
    del bad[topics.dead_letters]
    problems, warnings = topic_problems(topics, bad)
    assert any("compact" in p for p in problems)
    assert any("6 partitions" in p and "7" in p for p in problems)
    assert any("does not exist" in p for p in problems)
    assert any("retention.ms=604800000" in w for w in warnings)
    spec = TopicSpec(topics.commits, 6, 3, {"cleanup.policy": "delete"})
    assert spec_differences(spec, bad[topics.commits]) == [
        "dc.commits has 7 partitions, not 6", "dc.commits has cleanup.policy=compact,delete, not delete"]


def test_topics_create_refuses_unsafe_settings_before_connecting() -> None:
    res = CliRunner().invoke(cli(), ["topics", "create", "--bootstrap-servers", "unreachable.invalid:9092",
                                     "--partitions", "3", "--replication-factor", "2"])
    assert res.exit_code == 2
    assert "replication factor 2 < 3" in res.output and "--allow-unsafe" in res.output


def test_dead_letter_and_stall_settings_come_from_file_environment_and_flags(tmp_path: Path) -> None:
    from deltacoord.coordinator import settings as settings_module

    cfg = tmp_path / "c.toml"
    cfg.write_text("[coordinator]\ndead_letter_max_bytes = 1000\nstall_seconds = 5\n")
    run = settings_module.load(cfg, environ={})
    assert run.coordinator.dead_letter_max_bytes == 1000 and run.coordinator.stall_timeout_s == 5.0
    run = settings_module.load(cfg, environ={"DELTACOORD_STALL_SECONDS": "7"}, flags={"dead_letter_max_bytes": 0})
    assert run.coordinator.dead_letter_max_bytes == 0 and run.coordinator.stall_timeout_s == 7.0
    assert run.coordinator.dead_letter_record_bound() == 16 * 1024
    defaults = settings_module.load(None, environ={}).coordinator
    assert (defaults.dead_letter_max_bytes, defaults.stall_timeout_s) == (64 * 1024, 60.0)
    for bad in ({"stall_seconds": 0}, {"dead_letter_max_bytes": -1}):
        with pytest.raises(settings_module.SettingsError):
            settings_module.load(None, flags=bad, environ={})


def test_a_stop_signal_while_coordinator_run_loads_is_a_clean_stop(fake_coordinator: list[dict[str, Any]],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor's SIGTERM that arrives while `coordinator run` still loads its settings (before the coordinator
    has handlers of its own) stops it with exit 0 before it touches Kafka, instead of killing it by the signal;
    run in-process, the command leaves the signal handlers as it found them."""
    import signal

    from deltacoord.cli import main as cli_main

    loaded = cli_main.load_settings

    def load_then_signal(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return loaded(*args, **kwargs)

    monkeypatch.setattr(cli_main, "load_settings", load_then_signal)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    res = CliRunner().invoke(cli(), ["coordinator", "run", "--bootstrap-servers", "127.0.0.1:9", "--partitions", "0"])
    assert res.exit_code == 0, res.output
    assert "stopped by a signal before it started" in res.output
    assert len(fake_coordinator) == 1, "the coordinator is built (its own handlers installed) but never run"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
