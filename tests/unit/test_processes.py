"""The local servers' process supervisor: a recorded pid is ours only while it names our home, and a stop
always ends the process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from deltacoord.tooling import processes


def _child(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args])


def test_a_pid_counts_as_ours_only_while_its_command_line_names_the_marker(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)",
                             str(tmp_path / "home-a")], stdout=subprocess.PIPE)
    try:
        # Until the child runs its own program, /proc shows the parent's command line (between fork and exec).
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        assert processes.runs_with(proc.pid, tmp_path / "home-a")
        assert not processes.runs_with(proc.pid, tmp_path / "home-b")
    finally:
        processes.terminate(proc.pid, 5.0)
    assert not processes.pid_alive(proc.pid)
    assert not processes.runs_with(proc.pid, tmp_path / "home-a")


def test_an_exited_child_not_yet_reaped_counts_as_dead() -> None:
    proc = _child("pass")
    deadline = time.monotonic() + 30
    while processes.pid_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes.pid_alive(proc.pid)  # a zombie until waited for
    proc.wait()


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on
    processes.terminate(proc.pid, 0.5)
    assert not processes.pid_alive(proc.pid)  # it ignored SIGTERM: only the SIGKILL after the timeout ends it


def test_the_file_lock_keeps_a_second_holder_out_until_the_first_leaves(tmp_path: Path) -> None:
    order: list[str] = []
    lock = tmp_path / "sub" / ".lock"
    with processes.file_lock(lock):
        t = threading.Thread(target=lambda: _take(lock, order))
        t.start()
        time.sleep(0.3)
        order.append("first leaves")
    t.join(10)
    assert order == ["first leaves", "second in"]


def _take(lock: Path, order: list[str]) -> None:
    with processes.file_lock(lock):
        order.append("second in")


@dataclass(frozen=True)
class _Info:
    pid: int
    port: int


def test_a_recorded_state_counts_while_its_server_runs(tmp_path: Path) -> None:
    state = tmp_path / "server.json"
    assert processes.recorded(state, _Info) is None, "nothing recorded"
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)",
                             str(tmp_path / "home-a")], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        processes.record(state, _Info(proc.pid, 9092))
        assert processes.recorded(state, _Info) == _Info(proc.pid, 9092)
        assert processes.running(state, _Info, tmp_path / "home-a") == _Info(proc.pid, 9092)
        assert processes.running(state, _Info, tmp_path / "home-b") is None, "the pid is another home's server"
    finally:
        processes.terminate(proc.pid, 5.0)
    assert processes.running(state, _Info, tmp_path / "home-a") is None, "stopped"
    assert processes.recorded(state, _Info) == _Info(proc.pid, 9092), "the record outlives the server"
    state.write_text("{not json")
    assert processes.recorded(state, _Info) is None
    state.write_text('{"pid": 1}')
    assert processes.recorded(state, _Info) is None, "a record missing a field is none"
