"""`hetpart run`'s torchrun: torch.distributed.run itself, each rank forked from a process that imported it once.

NOTE [forked ranks]: a rank that torchrun starts as `python -m hetpart.runtime.worker` imports torch, its
pipelining (which imports torch._dynamo and DTensor) and the worker's own modules before its first step, and
every rank of every run pays that again: most of a rank's start on a CPU (the figures are in
docs/benchmarks.md, section "fork"). `hetpart run` starts torchrun as this module instead: the same torchrun
(`torch.distributed.run.main`: its flags, rendezvous, per-rank logs, failure report and exit status), given
`--start-method forkserver --run-path worker.py`. torchrun's multiprocessing forkserver is a fresh interpreter
that imports `hetpart.runtime.worker` once (`multiprocessing.set_forkserver_preload`); each rank is a fork of it
that runs worker.py as `__main__` (`runpy.run_path`, as `-m` would, its imports already loaded) with the
environment torchrun gives the rank. The server is forked from before any rank initialises a device, process
group or thread pool (importing torch starts none), which is why forkserver and not fork: the agent itself runs
the rendezvous store's threads.
A forked rank has its RANK in os.environ but not in /proc/PID/environ (a fork keeps the server's), where
`--emulate`'s mover finds its ranks (`_own_ranks` in emulate.py): emulated runs start each rank as an
interpreter of its own, as plain torchrun does, and so do the launch files `export` writes for other machines.
Its command line is the server's too: a rank names itself hetpart-rankN (`_name_process` in worker.py).
The agent reports one failure where exec'd ranks' torchrun lists each: NOTE [the cause fails first] in
worker.py keeps that one the cause.
"""

from __future__ import annotations

import contextlib
import multiprocessing

from torch.distributed import run as torchrun

WORKER = "hetpart.runtime.worker"


def main() -> None:
    multiprocessing.set_forkserver_preload([WORKER])
    try:
        torchrun.main()
    finally:
        _stop_forkserver()


def _stop_forkserver() -> None:
    """End the forkserver and reap it before torchrun exits: its ranks' CPU time then counts in torchrun's
    (and `hetpart run`'s) children, as an exec'd rank's does, and no server outlives the run."""
    from multiprocessing import forkserver

    with contextlib.suppress(AttributeError, OSError):  # `_stop`: CPython's own, since 3.4
        forkserver._forkserver._stop()


if __name__ == "__main__":
    main()
