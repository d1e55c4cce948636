"""The processes a `hetpart run` started, found the way they can be found whatever started its ranks.

A rank forked from torchrun's forkserver (NOTE [forked ranks] in hetpart/runtime/agent.py) has its
forkserver's command line, which does not name the artifacts, so a search by command line misses it;
every process `hetpart run` starts (torchrun, its forkserver, each rank, forked or not) carries the
launcher's pid in its environment as the run gave it (LAUNCHER_PID_ENV, NOTE [orphaned ranks]), and
a rank names itself (worker.RANK_NAME) before anything else.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetpart.runtime.worker import LAUNCHER_PID_ENV, RANK_NAME


def started_by(launcher_pid: int | None = None) -> list[int]:
    """Pids of the live processes (torchrun, its forkserver, the ranks) that a `hetpart run` in process
    `launcher_pid` (this process by default) started, orphans included."""
    marker = f"{LAUNCHER_PID_ENV}={launcher_pid or os.getpid()}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or a zombie
            continue
    return pids


def ranks_started_by(launcher_pid: int | None = None) -> list[int]:
    """Those of `started_by` that are ranks."""
    ranks = []
    for pid in started_by(launcher_pid):
        try:
            if (Path("/proc") / str(pid) / "comm").read_text().startswith(RANK_NAME):
                ranks.append(pid)
        except OSError:
            continue
    return ranks
