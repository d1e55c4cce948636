"""Sibling processes that keep this machine as busy as the other ranks of a pipeline while the profile times.

NOTE [concurrent profile]
`hetpart run` starts every rank of a node on that machine at once: preset:cpu-4
puts 4 one-thread ranks on this 2-core VM. Side by side they share the L3 cache
and memory bandwidth, and where there are more ranks than cores the kernel
switches between them mid-op, each coming back to caches the others filled: an
op costs a rank more CPU time than it costs a process alone (how much:
docs/benchmarks.md, "Measurements moved out of NOTEs"). `concurrent=N` (`hetpart profile
--concurrent N`, or `--cluster`: N = the ranks that will share the machine)
starts N-1 sibling processes before timing. Sibling k runs part k of N of the
graph (cut where the ops' times add up to equal shares, `cut`), as the other
ranks run their stages, pass after pass, untimed, on its own copy of the
weights, until the timed passes are done; the timed process runs the whole
graph, as always. A rank is not busy all the time: in a GPipe step of M
microbatches over N stages it computes M of the M + N - 1 slots and waits
for its neighbours in the others, so each sibling computes that share of the
time and sleeps in between (`sibling_duty`: 0.8 for cpu-2, 0.57 for cpu-4 at
M = 4). Busy all the time, siblings would load the machine more than the ranks
they stand for do, and the profile would over-predict the stages. The
siblings are plain subprocesses (`python -c`, the graph written as a `Replay`
with ops by name, NOTE [replay files]), started, waited for (each prints
"ready" after its first pass) and reaped by `Siblings`; one that fails stops
the profile with its error. The profile records `concurrent` and the passes
the siblings ran (`sibling_passes`).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hetpart.errors import HetpartError
from hetpart.profiler.replay import Replay


def ranks_sharing_a_machine(cluster: Any, device_type: str) -> int:
    """`hetpart profile --cluster`: the most devices of `device_type` on one machine of `cluster`, the
    ranks `hetpart run` starts side by side there (NOTE [concurrent profile]); 1 if it has none."""
    return max([sum(d.type.name == device_type for d in m.devices) for m in cluster.machines] + [1])


def sibling_duty(concurrent: int, microbatches: int) -> float:
    """The share of a pipeline step a rank computes forwards: M of the M + N - 1 slots of an N-stage
    GPipe step of M microbatches (NOTE [concurrent profile]); 1 without siblings."""
    return 1.0 if concurrent <= 1 else microbatches / (microbatches + concurrent - 1)


def sibling_main(replay_dir: str, threads: int, part: int, parts: int, duty: float = 1.0) -> None:
    """A sibling process (NOTE [concurrent profile]): replay its part of the graph until stdin closes,
    computing `duty` of the time (after a pass of t seconds it waits t * (1 - duty) / duty).

    Prints "ready" after its first pass and, when stdin closes (the profile is done, or the
    parent died), the number of passes it ran.
    """
    torch.set_num_threads(threads)
    with torch.no_grad():
        run = Replay.load(Path(replay_dir)).compile(part, parts)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    passes = 0
    with torch.no_grad():
        run()
        print("ready", flush=True)
        while not stop.is_set():
            start = time.perf_counter()
            run()
            passes += 1
            if duty < 1:
                stop.wait((time.perf_counter() - start) * (1 - duty) / duty)
    print(f"passes {passes}", flush=True)


class Siblings:
    """`count` sibling processes replaying `replay` while the profile times (NOTE [concurrent profile]).

    A context manager: entering starts them and waits until each has run one pass, leaving
    closes their stdin, waits for each to report its passes and exit, and kills one that
    does not within `stop_s`. `passes` is what they reported, all together.
    """

    def __init__(self, replay: Replay | None, count: int, threads: int, parts: int | None = None,
                 duty: float = 1.0, start_s: float = 300, stop_s: float = 30) -> None:
        self.replay, self.count, self.threads, self.duty = replay, count, threads, duty
        self.parts = count + 1 if parts is None else parts  # sibling k runs part k + 1 of them
        self.start_s, self.stop_s = start_s, stop_s
        self.procs: list[subprocess.Popen] = []
        self.passes = 0
        self._dir: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Siblings:
        if self.count == 0:
            return self
        self._dir = tempfile.TemporaryDirectory(prefix="hetpart-profile-")
        path = Path(self._dir.name)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the hetpart package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
               "OMP_NUM_THREADS": str(self.threads)}
        try:
            assert self.replay is not None
            self.replay.save(path)
            for k in range(self.count):
                code = ("from hetpart.profiler.siblings import sibling_main; "
                        f"sibling_main({str(path)!r}, {self.threads}, {(k + 1) % self.parts}, {self.parts}, "
                        f"{self.duty!r})")
                with (Path(self._dir.name) / f"sibling{k}.err").open("w") as err:
                    self.procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                                                       stdout=subprocess.PIPE, stderr=err, text=True))
            deadline = time.monotonic() + self.start_s
            for k, proc in enumerate(self.procs):
                line = ""
                while not line:
                    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                    if not ready:
                        raise HetpartError(f"--concurrent: sibling process {k + 1} did not finish a pass in "
                                           f"{self.start_s:g} s; profile with a smaller --concurrent")
                    line = proc.stdout.readline()
                    if not line:  # EOF: it died
                        raise HetpartError(f"--concurrent: sibling process {k + 1} failed (exit status "
                                           f"{proc.wait()}): {self._stderr(k)}")
                    if line.strip() != "ready":
                        line = ""
        except BaseException:
            self._reap()
            raise
        return self

    def _stderr(self, k: int) -> str:
        assert self._dir is not None
        lines = (Path(self._dir.name) / f"sibling{k}.err").read_text().strip().splitlines()
        return "\n".join(lines[-5:]) or "no output"

    def _reap(self) -> None:
        for proc in self.procs:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()
        deadline = time.monotonic() + self.stop_s
        for proc in self.procs:  # each writes a few bytes only: its stdout is read once it has exited
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out = proc.stdout.read()
            proc.stdout.close()
            self.passes += sum(int(w.split()[1]) for w in out.splitlines() if w.startswith("passes "))
        self.procs = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __exit__(self, *exc: object) -> None:
        self._reap()
