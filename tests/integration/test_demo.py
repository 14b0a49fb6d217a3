"""`deltacoord demo`, the README's main command: progress lines, then one JSON summary line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.kafka  # the demo starts a broker, or reuses the session's


@pytest.mark.slow
def test_demo_runs_end_to_end_and_ends_with_its_json_summary(tmp_path: Path) -> None:
    env = {**os.environ, "DELTACOORD_BROKER_HOME": str(tmp_path / "broker")}
    proc = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "demo"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert any(ln.startswith("[demo") for ln in lines[:-1]), "the demo prints progress while it works"
    # The story in order: what it shows, then its six steps; conflicts with winner and loser; the contrast with delta-rs.
    out = proc.stdout
    assert "what this shows:" in lines[0]
    steps = [out.index(f"step {n}/6:") for n in range(1, 7)]
    assert steps == sorted(steps), "the steps are told in order"
    assert out.count("    winner  ") == 2 and out.count("    loser   ") == 2
    assert out.rindex("deltacoord table history") > steps[-1], "it ends with the commands to inspect the table"
    assert "librdkafka" not in proc.stderr and "%3|" not in proc.stderr + out
    summary = json.loads(lines[-1])
    assert set(summary) == {"table", "versions", "commits", "conflicts", "verified_with", "appends"}
    ours, theirs = summary["appends"]["deltacoord"], summary["appends"]["delta_rs"]
    assert ours["commits"] == 80 and ours["failed"] == 0, "16 writers x 5 appends, none lost"
    assert theirs["commits"] + theirs["failed"] == 80 and theirs["commits_per_s"] > 0
    assert sum(1 for ln in lines if ln.startswith("  writer ")) == 16, "a line per writer"
    assert "x81 blind appends" in out, "the first append and the writers' 80 are one history line"
    assert f"  deltacoord  {ours['commits_per_s']:>10.1f}" in out and "  delta-rs  " in out
    assert summary["table"].startswith("file://")
    assert summary["versions"] == summary["commits"] >= 40
    # The UPDATE/DELETE race and the OPTIMIZE/DELETE race each produce a real conflict.
    assert summary["conflicts"].get("ConcurrentAppendException") == 1
    assert summary["conflicts"].get("ConcurrentDeleteReadException") == 1
    assert summary["verified_with"].startswith("deltalake ")
    log_dir = Path(summary["table"].removeprefix("file://")) / "_delta_log"
    assert (log_dir / f"{summary['versions'] - 1:020d}.json").exists()
    # The demo stops the broker it started.
    status = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "broker", "status"], capture_output=True,
                            text=True, env=env)
    assert status.returncode == 1


@pytest.mark.storage
@pytest.mark.slow
def test_demo_on_the_local_s3_server(tmp_path: Path, local_broker: Any) -> None:
    """`deltacoord demo --storage s3`: the same demo with the table in a bucket of the local S3 server."""
    env = {**os.environ, "DELTACOORD_S3_SERVER_HOME": str(tmp_path / "s3")}
    if local_broker is not None:
        env["DELTACOORD_BROKER_HOME"] = str(local_broker.home)  # reuse the session's broker
    proc = subprocess.run([sys.executable, "-m", "deltacoord.cli.main", "demo", "--storage", "s3"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads([ln for ln in proc.stdout.splitlines() if ln.strip()][-1])
    assert summary["storage"] == "s3" and summary["table"].startswith("s3://deltacoord-demo-")
    assert summary["versions"] == summary["commits"] >= 40
    assert summary["conflicts"].get("ConcurrentAppendException") == 1
    assert summary["conflicts"].get("ConcurrentDeleteReadException") == 1
    assert "S3 server stopped" in proc.stdout, "the demo stops the S3 server it started"
