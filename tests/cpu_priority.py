"""Under `make test`, the test process that runs the in-process Spark session gets the CPU first.

Spark gives a Python streaming source's worker (`PythonStreamingSourceRunner`, the `deltacoord` change
feed read as a stream) a fixed 10 s to start and connect back (`PythonWorkerFactory.createSimpleWorker`;
no setting changes it). Its start costs about 0.2 s of CPU alone; with four test processes, their brokers
and the clusters and writer processes some tests start, two cores ran at a load of 15 and the same start
took 7 s, and once more than 10 s (a failed stream). So once a test process builds the shared Spark
session it says so in the run's directory, and every other test process lowers its own priority and that
of the processes it started (every thread: Linux sets niceness per thread) by `NICENESS`. They still run
(weights about 3:1, not a starvation), and no privilege is needed: only raising a priority needs one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

#: The directory shared by one `make test` run's processes (set by the controlling process).
RUN_DIR_ENV = "DELTACOORD_TEST_RUN_DIR"
#: How much lower the other test processes run: niceness 5 weighs 335 against a default thread's 1024.
NICENESS = 5
_MARK = "spark-process"
_lowered: list[bool] = []


def start_run() -> None:
    """In the controlling process, before the test processes start (they inherit the environment)."""
    if RUN_DIR_ENV not in os.environ:
        os.environ[RUN_DIR_ENV] = tempfile.mkdtemp(prefix="deltacoord-test-run-")


def end_run() -> None:
    run_dir = os.environ.pop(RUN_DIR_ENV, None)
    if run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)


def claim_spark() -> None:
    """This test process runs the shared Spark session: the others yield to it from their next test on."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir and os.environ.get("PYTEST_XDIST_WORKER"):
        (Path(run_dir) / _MARK).write_text(str(os.getpid()))


def yield_to_spark() -> None:
    """In every test process before each test: once another process runs Spark, lower this process's tree."""
    if _lowered:
        return
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    mark = Path(run_dir) / _MARK
    with contextlib.suppress(OSError, ValueError):
        if int(mark.read_text()) == os.getpid():
            _lowered.append(False)  # this is the Spark process: it keeps its priority
            return
        _lowered.append(True)
        for pid in _tree(os.getpid()):
            _lower(pid)


def _tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # The parent pid is the second field after the parenthesised command name.
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _lower(pid: int) -> None:
    """Every thread of `pid` (a process's niceness is its threads')."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                tid = int(task.name)
                now = os.getpriority(os.PRIO_PROCESS, tid)
                if now < NICENESS:
                    os.setpriority(os.PRIO_PROCESS, tid, NICENESS)
