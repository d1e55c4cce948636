"""Whether a process is still there, by pid: a staging directory's `partition` (codegen/publish.py, NOTE [stale
staging directories]) and a rank's `hetpart run` (runtime/worker.py, NOTE [orphaned ranks]).
"""

from __future__ import annotations

import os
from pathlib import Path


def process_start(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), "" where /proc cannot tell
    (alive by signal 0), None where the process is gone (a zombie, not yet reaped, is gone) or `pid` names
    none (0 or less: signal 0 would probe a process group)."""
    if pid <= 0:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:  # another user's process: it exists
            pass
        return ""


def running(pid: int) -> bool:
    """Whether process `pid` is there (not a zombie); a `pid` of 0 or less is no process, and taken as running, so
    nothing is ever cleaned up for it."""
    return pid <= 0 or process_start(pid) is not None
