"""Under `make test`, the test process that runs the in-process Spark session runs in a session of its own.

Spark gives a Python streaming source's worker (`PythonStreamingSourceRunner`, the `deltacoord` change
feed read as a stream) a fixed 10 s to start and connect back (`PythonWorkerFactory.createSimpleWorker`;
no setting changes it). Its start costs about 0.5 s of CPU. With `kernel.sched_autogroup_enabled` (the
default), Linux shares the CPU first between autogroups, one per session, and niceness counts only
inside one: brokers and storage servers run in sessions of their own, while the four test processes, the
coordinators and the writer processes their tests start, and the Spark JVM with its Python workers all
shared the run's session. With a dozen busy writer processes in it the worker's start took over 10 s (a
failed stream), and lowering the niceness of the other test processes did not help: their brokers' weight
is their autogroup's.

So the process that builds the shared session leaves the run's session (`os.setsid`): its JVM and Python
workers get an autogroup's share of their own whatever the other test processes run. Where the process
may (root, or CAP_SYS_NICE) it also weighs that autogroup three times a default one (niceness -5), so a
worker's start takes about a second on a loaded machine; elsewhere it keeps the fair share.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: The Spark process's autogroup niceness where it may raise it: -5 weighs 3121 against a default 1024.
SPARK_AUTOGROUP_NICENESS = -5


def claim_spark() -> None:
    """This test process runs the shared Spark session (under pytest-xdist only: a plain pytest keeps its
    terminal's session, and Ctrl-C)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.getsid(0) == os.getpid():
        return
    with contextlib.suppress(OSError):  # a process group leader cannot start a session: it keeps its place
        os.setsid()
    with contextlib.suppress(OSError):  # not permitted: the autogroup keeps niceness 0
        Path("/proc/self/autogroup").write_text(str(SPARK_AUTOGROUP_NICENESS))
