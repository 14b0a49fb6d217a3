"""The test run's CPU priority helper lowers what another process started, at both levels Linux schedules."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests import cpu_priority
from tests.cpu_priority import Lowering, autogroup_of

# A parent that starts one child in a session of its own (as brokers and storage servers start) and one in
# its own session, prints their pids and waits.
_PARENT = """
import subprocess, sys, time
own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
same = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(own.pid, same.pid, flush=True)
time.sleep(60)
"""


def _kill(parent: subprocess.Popen[str], children: list[int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    parent.kill()
    parent.wait(10)


def _autogroup_nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


def test_a_scan_lowers_the_threads_of_a_tree_and_the_autogroups_apart_from_the_spared_one() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    started: list[int] = []
    try:
        assert parent.stdout is not None
        own, same = (int(x) for x in parent.stdout.readline().split())
        started.extend((own, same))
        spared = autogroup_of(os.getpid())
        spared_nice = _autogroup_nice(os.getpid()) if spared is not None else None
        Lowering(parent.pid, spared).scan()
        for pid in (parent.pid, own, same):
            assert os.getpriority(os.PRIO_PROCESS, pid) >= cpu_priority.NICENESS, pid  # never raised
        if spared is None:  # a kernel without autogroups: niceness is all there is
            assert autogroup_of(own) is None
            return
        assert autogroup_of(own) != autogroup_of(parent.pid) != spared
        assert _autogroup_nice(own) >= cpu_priority.NICENESS
        assert _autogroup_nice(parent.pid) >= cpu_priority.NICENESS
        assert _autogroup_nice(os.getpid()) == spared_nice  # the spared autogroup (the Spark process's) keeps its place
    finally:
        _kill(parent, started)


_LATER = """
import subprocess, sys, time
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_process_started_in_a_session_of_its_own_after_a_scan_is_lowered_by_the_next() -> None:
    """It inherits its parent's niceness, but its new autogroup starts at 0: the next scan lowers that too."""
    parent = subprocess.Popen([sys.executable, "-c", _LATER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        assert parent.stdin is not None and parent.stdout is not None
        lowering = Lowering(parent.pid, autogroup_of(os.getpid()))
        lowering.scan()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        child = int(parent.stdout.readline())
        started.append(child)
        assert os.getpriority(os.PRIO_PROCESS, child) >= cpu_priority.NICENESS  # inherited
        if autogroup_of(child) is not None:
            assert _autogroup_nice(child) == 0
        lowering.scan()
        if autogroup_of(child) is not None:
            assert _autogroup_nice(child) >= cpu_priority.NICENESS
        assert any(pid == child for pid, _, _ in lowering.done)
    finally:
        _kill(parent, started)
