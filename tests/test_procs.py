"""hetpart/procs.py: the one probe of whether a process is there."""

import os
import subprocess
import sys
import time

from hetpart.procs import process_start, running


def test_this_process_runs_and_has_a_start_time():
    assert running(os.getpid())
    assert process_start(os.getpid()) == process_start(os.getpid()) != ""  # /proc tells on Linux


def test_an_exited_child_is_gone_zombie_or_reaped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_start(child.pid) is not None and time.monotonic() < deadline:  # a zombie until waited for
        time.sleep(0.05)
    assert process_start(child.pid) is None and not running(child.pid)
    child.wait()
    assert not running(child.pid)


def test_no_pid_names_a_process_group():
    assert process_start(0) is None and process_start(-1) is None
    assert running(0) and running(-1)  # never taken as gone: nothing is cleaned up for them
