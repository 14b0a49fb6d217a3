"""The Spark test process leaves the run's session, so its JVM and Python workers get an autogroup of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import cpu_priority

REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import json, os
from pathlib import Path
from tests import cpu_priority
before = os.getsid(0)
cpu_priority.claim_spark()
group = Path("/proc/self/autogroup")
print(json.dumps({"pid": os.getpid(), "sid_before": before, "sid": os.getsid(0),
                  "autogroup": group.read_text().split() if group.exists() else None}))
"""


def _claim(xdist_worker: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    if xdist_worker is not None:
        env["PYTEST_XDIST_WORKER"] = xdist_worker
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True, cwd=REPO)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _own_autogroup() -> list[str] | None:
    group = Path("/proc/self/autogroup")
    return group.read_text().split() if group.exists() else None


def test_the_spark_process_of_a_test_run_leads_a_session_and_an_autogroup_of_its_own() -> None:
    r = _claim("gw3")
    assert r["sid_before"] != r["pid"] and r["sid"] == r["pid"]
    mine = _own_autogroup()
    if mine is None:  # a kernel without autogroups: the session is all there is
        assert r["autogroup"] is None
        return
    group = r["autogroup"]
    assert isinstance(group, list) and group[0] != mine[0]
    may_raise = os.geteuid() == 0
    assert int(group[-1]) == (cpu_priority.SPARK_AUTOGROUP_NICENESS if may_raise else 0)


def test_a_plain_pytest_run_keeps_its_session() -> None:
    """Without pytest-xdist the test process is the terminal's: leaving its session would lose Ctrl-C."""
    r = _claim(None)
    assert r["sid"] == r["sid_before"] != r["pid"]
