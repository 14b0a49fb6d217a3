"""docs/settings.md against the code: every name it gives exists where it says, so the table cannot drift.

Each row's Python keyword is a parameter of `Table` (or of every write operation, for
`proposal_id`), its CLI flag an option of the write commands whose environment
variable is the row's, its variable one the clients read, its Spark option one the
sink parses. No command spells a listed flag differently. Also the settings
resolution itself: argument, else variable, else default, and a clear error
naming both the keyword and the variable when the bootstrap servers are missing.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click
import pytest

from deltacoord.cli.main import main as cli_main
from deltacoord.schemas import client_settings
from deltacoord.schemas.routing import Topics
from deltacoord.schemas.signing import WRITER_KEY_ENV
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
NONE = "—"
COLUMNS = ["setting", "Python keyword", "CLI flag", "environment variable", "Spark option", "default"]
WRITE_OPERATIONS = ("create", "append", "overwrite", "delete", "update", "merge", "optimize", "compact", "truncate",
                    "set_properties", "add_columns")
#: Every variable the clients read (the coordinator reads DELTACOORD_GROUP_ID too).
CLIENT_VARIABLES = {client_settings.BOOTSTRAP_SERVERS_ENV, client_settings.TOPIC_PREFIX_ENV, client_settings.GROUP_ID_ENV,
                    client_settings.COORDINATOR_CHECK_ENV, client_settings.TIMEOUT_ENV, WRITER_KEY_ENV,
                    client_settings.RELAY_ENV}


def _rows() -> list[dict[str, str]]:
    lines = DOC.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| setting |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    assert header == COLUMNS
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows.append({k: v.strip("`") if v.startswith("`") and v.count("`") == 2 else v for k, v in zip(COLUMNS, cells, strict=True)})
    return rows


ROWS = _rows()
BY_SETTING = {r["setting"]: r for r in ROWS}


def _commands(group: click.Group, path: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name, cmd in group.commands.items():
        full = f"{path} {name}".strip()
        if isinstance(cmd, click.Group):
            out.extend(_commands(cmd, full))
        else:
            out.append((full, cmd))
    return out


def _options(cmd: click.Command) -> dict[str, click.Option]:
    return {name: p for p in cmd.params if isinstance(p, click.Option) and not p.hidden for name in p.opts}


WRITE_COMMANDS = [(n, c) for n, c in _commands(cli_main) if n in ("table create", "table append", "table delete",
                                                                    "table truncate", "table compact")]


def test_the_table_lists_the_settings_every_front_door_shares() -> None:
    assert {"Kafka bootstrap servers", "topic prefix", "storage options", "Kafka client settings",
            "decision timeout (seconds)"} <= set(BY_SETTING)
    assert len(WRITE_COMMANDS) == 5


@pytest.mark.parametrize("row", ROWS, ids=[r["setting"] for r in ROWS])
def test_each_python_keyword_is_a_parameter(row: dict[str, str]) -> None:
    kw = row["Python keyword"]
    assert kw != NONE
    table_params = inspect.signature(Table.__init__).parameters
    if kw.startswith("**"):
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in table_params.values())
    elif kw == "proposal_id":
        for op in WRITE_OPERATIONS:
            assert "proposal_id" in inspect.signature(getattr(Table, op)).parameters, op
    else:
        assert kw in table_params, kw


@pytest.mark.parametrize("row", [r for r in ROWS if r["CLI flag"] != NONE], ids=lambda r: r["setting"])
def test_each_cli_flag_is_an_option_of_every_write_command_with_the_rows_variable(row: dict[str, str]) -> None:
    flag, var = row["CLI flag"], row["environment variable"]
    for name, cmd in WRITE_COMMANDS:
        opts = _options(cmd)
        assert flag in opts, f"{name} has no {flag}"
        if var != NONE:
            assert opts[flag].envvar == var, f"{name} {flag} reads {opts[flag].envvar}, the table says {var}"


def test_no_command_spells_a_listed_flag_differently() -> None:
    def norm(flag: str) -> str:
        return flag.lstrip("-").replace("-", "").replace("_", "").rstrip("s")

    listed = {r["CLI flag"] for r in ROWS if r["CLI flag"] != NONE}
    for name, cmd in _commands(cli_main):
        for opt in _options(cmd):
            for flag in listed:
                assert opt == flag or norm(opt) != norm(flag), f"`deltacoord {name}` spells {flag} as {opt}"


@pytest.mark.parametrize("row", [r for r in ROWS if r["environment variable"] != NONE], ids=lambda r: r["setting"])
def test_each_variable_is_one_the_clients_read(row: dict[str, str]) -> None:
    assert row["environment variable"] in CLIENT_VARIABLES


@pytest.mark.parametrize("row", [r for r in ROWS if r["Spark option"] != NONE], ids=lambda r: r["setting"])
def test_each_spark_option_is_one_the_sink_parses(row: dict[str, str], tmp_path: Path) -> None:
    from deltacoord.writer.spark_sink import SinkOptions

    option = row["Spark option"].replace("<KEY>", "AWS_REGION").replace("<key>", "client.id")
    value = "7.5" if row["setting"].startswith("decision timeout") else "a-value"
    base = {"path": str(tmp_path / "t")}
    assert SinkOptions.parse({**base, option: value}) != SinkOptions.parse(base), f"the sink ignores {option}"


def test_defaults_are_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in CLIENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    assert BY_SETTING["topic prefix"]["default"] == client_settings.topic_prefix(None) == "deltacoord"
    assert BY_SETTING["decision timeout (seconds)"]["default"] == f"{client_settings.decision_timeout(None):g}"
    topics = Topics.with_prefix("p")
    assert client_settings.coordinator_group(None, topics) == BY_SETTING["coordinators' consumer group"]["default"].replace(
        "<prefix>", "p")
    assert client_settings.coordinator_check(None) is True and BY_SETTING[
        "check that a coordinator serves the table"]["default"] == "on"
    assert "required" in BY_SETTING["Kafka bootstrap servers"]["default"]
    assert client_settings.relay(None) is None and BY_SETTING["the host's relay (Unix socket)"]["default"].startswith("none")
    assert inspect.signature(Table.__init__).parameters["bootstrap_servers"].default is None


def test_variables_apply_when_no_argument_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(client_settings.BOOTSTRAP_SERVERS_ENV, "k1:9092,k2:9092")
    monkeypatch.setenv(client_settings.TOPIC_PREFIX_ENV, "sales")
    monkeypatch.setenv(client_settings.TIMEOUT_ENV, "12.5")
    monkeypatch.setenv(client_settings.GROUP_ID_ENV, "coords")
    monkeypatch.setenv(client_settings.COORDINATOR_CHECK_ENV, "off")
    assert client_settings.bootstrap_servers(None) == "k1:9092,k2:9092"
    assert client_settings.bootstrap_servers("given:1") == "given:1"
    topics = client_settings.topics_of(None, None)
    assert topics == Topics.with_prefix("sales") and client_settings.topics_of("x", None) == Topics.with_prefix("x")
    assert client_settings.decision_timeout(None) == 12.5 and client_settings.decision_timeout(3) == 3
    assert client_settings.coordinator_group(None, topics) == "coords"
    assert client_settings.coordinator_check(None) is False and client_settings.coordinator_check(True) is True


def test_a_missing_bootstrap_server_names_the_keyword_and_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.delenv(client_settings.BOOTSTRAP_SERVERS_ENV, raising=False)
    expected = re.compile(r"bootstrap_servers=.*DELTACOORD_BOOTSTRAP_SERVERS")
    with pytest.raises(client_settings.ClientSettingError, match=expected):
        Table(tmp_path / "t")
    with pytest.raises(client_settings.ClientSettingError, match=expected):
        CoordinatorClient()
    from deltacoord.reader.stream import CommitStream

    with pytest.raises(client_settings.ClientSettingError, match=expected):
        CommitStream(str(tmp_path / "t"))


@pytest.mark.parametrize("var, value, named", [
    (client_settings.TIMEOUT_ENV, "soon", "DELTACOORD_TIMEOUT='soon'"),
    (client_settings.COORDINATOR_CHECK_ENV, "maybe", "DELTACOORD_COORDINATOR_CHECK='maybe'"),
])
def test_a_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch, var: str, value: str, named: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(client_settings.ClientSettingError, match=re.escape(named)):
        client_settings.decision_timeout(None) if var == client_settings.TIMEOUT_ENV else client_settings.coordinator_check(None)


def test_topics_and_topic_prefix_are_one_setting() -> None:
    with pytest.raises(ValueError, match="not both"):
        client_settings.topics_of("a", Topics.with_prefix("b"))
