"""The README's "first table in five minutes", run as written: its shell block (a fresh broker on the
README's port, a coordinator in the background, create, append, history, delta-rs reading the table) and
then its Python block against the same coordinator.

Three substitutions only: the setup lines (`make venv jars`, activating `.venv`) are what this test process
already is; `/tmp/...` table paths move under the test's directory; and the broker takes a free port instead
of the README's 19092, which the suite's own brokers may hold.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deltacoord.tooling.ports import free_port

pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
SETUP_LINES = ("make venv jars", ". .venv/bin/activate")


def _blocks(kind: str) -> list[str]:
    section = REPO.joinpath("README.md").read_text().split("## Your first table in five minutes", 1)[1]
    section = section.split("\n## ", 1)[0]
    return re.findall(rf"```{kind}\n(.*?)```", section, re.DOTALL)


def test_the_five_minute_path_runs_as_written(tmp_path: Path) -> None:
    (shell,) = _blocks("bash")
    python_blocks = _blocks("python")
    assert "deltacoord broker start" in shell and "DeltaTable" in shell
    readme_port = re.search(r"127\.0\.0\.1:(\d+)", shell).group(1)  # type: ignore[union-attr]
    port = free_port()
    lines = [line for line in shell.splitlines() if not line.startswith(SETUP_LINES)]
    script = ("\n".join(lines).replace("/tmp/", f"{tmp_path}/").replace(f"127.0.0.1:{readme_port}", f"127.0.0.1:{port}")
              .replace("deltacoord broker start", f"deltacoord broker start --port {port}"))
    assert f"--port {port}" in script and f"127.0.0.1:{port}" in script
    python = python_blocks[0].replace("/tmp/", f"{tmp_path}/")
    (tmp_path / "first.py").write_text(python)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DELTACOORD_BROKER_HOME": str(tmp_path / "broker")}
    env.pop("DELTACOORD_BOOTSTRAP_SERVERS", None)
    whole = (f"set -euo pipefail\ntrap 'kill %1 2>/dev/null; wait; deltacoord broker stop >/dev/null 2>&1' EXIT\n"
             f"{script}\npython first.py\n")
    done = subprocess.run(["bash", "-c", whole], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{(tmp_path / 'coordinator.log').read_text()[-3000:]}"
    out = done.stdout.splitlines()
    history = [json.loads(line) for line in out if line.startswith("{") and '"operation"' in line]
    assert [h["operation"] for h in history if h.get("version") is not None][-2:] == ["WRITE", "CREATE TABLE"]
    text = done.stdout
    assert re.search(r"\b1\s+2024-01-01\s+10\.50\b", text), text  # delta-rs reads the shell's row
    assert re.search(r"\b2\s+2024-01-02\s+21\b", text), text  # and the Python block's update
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the trap stopped the broker"
