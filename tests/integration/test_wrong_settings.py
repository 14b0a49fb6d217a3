"""The most likely first mistakes fail at once with one line that names them and how to fix them: brokers
that do not answer (seconds, not the 30 s metadata timeout and a raw librdkafka error), and a topic prefix
other than the coordinator's (naming the prefixes the cluster has), in Python and in the CLI alike."""

from __future__ import annotations

import socket
from pathlib import Path

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner

from deltacoord import ProposalNotSentError, TopicNotFoundError, UnreachableKafkaError
from deltacoord.cli.tables import register
from deltacoord.writer.table import Table
from tests.integration.coord_harness import fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli() -> click.Group:
    cli = click.Group("deltacoord")
    register(cli)
    return cli


def test_brokers_that_do_not_answer_are_named_in_one_error(tmp_path: Path) -> None:
    servers = f"127.0.0.1:{_closed_port()}"
    with Table(tmp_path / "t", servers) as t, pytest.raises(UnreachableKafkaError) as ei:
        t.create(SCHEMA)
    text = str(ei.value)
    assert text.startswith(f"cannot reach Kafka at {servers}: ") and "connection refused" in text, text
    assert "--bootstrap-servers" in text and "deltacoord broker start" in text, text
    assert not (tmp_path / "t" / "_delta_log").exists()


@pytest.mark.kafka
def test_a_topic_prefix_other_than_the_coordinators_names_the_prefixes_the_cluster_has(kafka_bootstrap: str,
                                                                                       tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    prefix = topics.proposals.removesuffix(".proposals")
    with Table(tmp_path / "t", kafka_bootstrap, topic_prefix="deltacoord-typo") as t, \
            pytest.raises(TopicNotFoundError) as ei:
        t.create(SCHEMA)
    err = ei.value
    assert isinstance(err, ProposalNotSentError)  # nothing was sent: a retry is safe
    assert err.topic == "deltacoord-typo.proposals" and prefix in err.prefixes
    assert f"topic deltacoord-typo.proposals not found on {kafka_bootstrap}; this cluster has deltacoord topics " \
           "with the prefix" in str(err) and f"'{prefix}'" in str(err) and "--topic-prefix" in str(err)

    # The CLI without --topic-prefix (the default prefix is not the coordinator's): one line, exit 1.
    res = CliRunner().invoke(_cli(), ["table", "create", str(tmp_path / "c"), "--schema", "id:long",
                                      "--bootstrap-servers", kafka_bootstrap])
    assert res.exit_code == 1, res.output
    assert "TopicNotFoundError: topic deltacoord.proposals not found" in res.output and f"'{prefix}'" in res.output
    assert "Traceback" not in res.output


def test_a_metrics_port_that_is_taken_exits_2_with_one_line() -> None:
    """A configuration error (exit 2, which systemd's RestartPreventExitStatus relies on), found before any
    Kafka work; it was a traceback and exit 1 once the coordinator had set up its clients."""
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers",
             f"127.0.0.1:{_closed_port()}", "--metrics-port", str(port), "--no-checkpoints"],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"cannot serve metrics on 0.0.0.0:{port}" in done.stderr and "--metrics-port" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
