"""The bench's CPU accounting: a process tree's CPU seconds, and the local process behind a bootstrap address."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from deltacoord.tooling.cpu_usage import ServiceCpu, broker_pid, listener_pid, process_tree_cpu_s

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_process_tree_counts_its_live_children_and_the_ones_it_reaped() -> None:
    # A parent that idles while one child burns 0.4 s and has ended, and another burns 0.4 s and lives on.
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.4)!r}])\n"
        f"p = subprocess.Popen([sys.executable, '-c', {BURN.format(s=0.4)!r} + 'time.sleep(30)'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        used = process_tree_cpu_s(parent.pid)
        while used is not None and used < 0.8 and time.monotonic() < deadline:  # the live child may still burn
            time.sleep(0.1)
            used = process_tree_cpu_s(parent.pid)
        assert used is not None and used >= 0.8, used
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
    assert process_tree_cpu_s(parent.pid) is None, "a process that is gone has no figure"


def test_service_cpu_is_what_a_process_spent_between_start_and_stop() -> None:
    # The child burns 0.3 s of CPU between two lines, and says when it is done: a loaded machine only stretches it.
    child = subprocess.Popen([sys.executable, "-c", "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n" + BURN.format(s=0.3)
                              + "print('done', flush=True)\nsys.stdin.readline()\n"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None
        services = ServiceCpu({"busy": child.pid, "elsewhere": None})
        assert child.stdout.readline().strip() == "ready"  # its start-up (the interpreter's imports) is not counted
        services.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        services.stop()
        child.stdin.write("exit\n")
        child.stdin.flush()
    finally:
        child.wait(30)
    busy = services.used["busy"]
    assert busy is not None and 0.25 <= busy < 1.0, busy
    assert services.used["elsewhere"] is None


def test_the_process_listening_on_a_bootstrap_port_is_found_and_a_remote_one_is_not() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listener_pid(port) == os.getpid()
        assert broker_pid(f"localhost:{port}") == os.getpid()
        assert broker_pid(f"broker.example.com:{port}") is None
    assert listener_pid(port) is None, "no one listens there any more"
