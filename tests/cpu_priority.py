"""Under `make test`, the test process that runs the in-process Spark session gets the CPU first.

Spark gives a Python streaming source's worker (`PythonStreamingSourceRunner`, the `deltacoord` change
feed read as a stream) a fixed 10 s to start and connect back (`PythonWorkerFactory.createSimpleWorker`;
no setting changes it). Its start costs about 0.5 s of CPU alone; with four test processes, their brokers
and the clusters and writer processes some tests start, two cores ran at a load of 15 and the same start
took 7 s, and sometimes more than 10 s (a failed stream). So once a test process builds the shared Spark
session it says so in the run's directory, and every other test process lowers its own priority and that
of the processes it started, and keeps doing so for the processes it starts later, by `NICENESS`. They
still run (weights about 3:1, not a starvation), and no privilege is needed: only raising a priority needs
one.

Two levels, because Linux schedules in two (with `kernel.sched_autogroup_enabled`, the default): first
between autogroups (one per session: brokers and storage servers start in sessions of their own), then
between the threads of one autogroup by their niceness. A thread's niceness weighs nothing against another
autogroup, so a process in its own session is lowered through its autogroup's niceness
(`/proc/PID/autogroup`), and every thread of a process in the test run's session through its own (the
Spark process shares that autogroup: lowering it would lower Spark too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
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
    """In every test process before each test: once another process runs Spark, lower this process's tree, and
    from then on (a thread of its own) every process it starts later."""
    if _lowered:
        return
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    mark = Path(run_dir) / _MARK
    with contextlib.suppress(OSError, ValueError):
        spark_pid = int(mark.read_text())
        if spark_pid == os.getpid():
            _lowered.append(False)  # this is the Spark process: it keeps its priority
            return
        _lowered.append(True)
        lowering = Lowering(os.getpid(), autogroup_of(spark_pid))
        lowering.scan()
        threading.Thread(target=lowering.keep_scanning, name="yield-to-spark", daemon=True).start()


#: How often a lowered test process lowers the processes it started since (a broker, a cluster, writers).
RESCAN_S = 1.0


@dataclass
class Lowering:
    """Lowers the processes under `root` once each (a process's later threads inherit its niceness), and
    the autogroups of those not in `spared_group` (the Spark process's)."""

    root: int
    spared_group: str | None
    done: set[tuple[int, str, str | None]] = field(default_factory=set)

    def scan(self) -> None:
        for pid, started in _tree(self.root):
            group = autogroup_of(pid)  # in the key: a child just forked may call setsid after a scan saw it
            if (pid, started, group) not in self.done:
                self.done.add((pid, started, group))
                _lower(pid)
                if group is not None and group != self.spared_group:
                    _lower_autogroup(pid)

    def keep_scanning(self) -> None:
        while True:
            time.sleep(RESCAN_S)
            self.scan()


def autogroup_of(pid: int) -> str | None:
    """The name of `pid`'s autogroup (`/autogroup-N`); None without autogroups."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return None


def _lower_autogroup(pid: int) -> None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        f = Path(f"/proc/{pid}/autogroup")
        if int(f.read_text().split()[-1]) < NICENESS:
            f.write_text(str(NICENESS))


def _tree(root: int) -> list[tuple[int, str]]:
    """`root` and its descendants, from /proc, each with its start time (a pid can be reused)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # The fields after the parenthesised command name: state, ppid, ..., starttime (the 20th).
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    out, todo = [], [(root, "")]
    while todo:
        pid, started = todo.pop()
        out.append((pid, started))
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
