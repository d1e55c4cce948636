"""What a `hetpart run` costs before and around its steps: ranks forked from torchrun's forkserver
(NOTE [forked ranks] in hetpart/runtime/agent.py) against ranks torchrun starts as interpreters of
their own (what `hetpart run` did before, and still does under --emulate).

    .venv/bin/python benchmarks/rank_start.py                     # zoo:mlp on cpu-2, gpt-small on cpu-4
    .venv/bin/python benchmarks/rank_start.py --rounds 5

For each plan (partitioned once): interleaved rounds, forked then exec'd, of `hetpart run DIR` (one
inference step) in a fresh process, each inside a cpuacct cgroup of its own (cgroup v1, root): the
CPU-s of the launcher, torchrun, its forkserver and every rank together (a forked rank is reaped by
the forkserver, which torchrun's agent does not wait for, so getrusage would miss it), and the wall.
Prints the median of each and the load average (`os.getloadavg`) at the start and end of each run.
The exec'd side is the same `hetpart run` with `_torchrun_commands(..., forked=False)`, set in the
run's own process; nothing else differs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PLANS = {
    "zoo:mlp x cpu-2": ["zoo:mlp", "--set", "hidden=256", "--set", "n_blocks=4", "--batch-size", "64",
                        "--microbatches", "2", "--cluster", "preset:cpu-2", "--no-pt2"],
    "zoo:gpt-small x cpu-4": ["zoo:gpt-small", "--cluster", "preset:cpu-4"],
}
# `hetpart run DIR` with the ranks exec'd (forked=False) or forked, in a process of its own
RUN = """import sys
from hetpart.cli import main
from hetpart.runtime import launch
forked = sys.argv[1] == "forked"
commands = launch._torchrun_commands
launch._torchrun_commands = lambda *a, **k: commands(*a, **{**k, "forked": forked})
sys.exit(main(["run", sys.argv[2]]))
"""


def _in_cgroup(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s of cmd and everything it started) in a fresh cpuacct cgroup, removed after."""
    group = CPUACCT / f"hetpart-rank-start-{os.getpid()}"
    group.mkdir()
    try:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        _, err = proc.communicate()
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
        for _ in range(100):  # the forkserver may outlive torchrun by a moment
            if not (group / "cgroup.procs").read_text().strip():
                break
            time.sleep(0.05)
        return wall, int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        group.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.access(CPUACCT, os.W_OK):
        sys.exit(f"{CPUACCT} is not writable: run as root on a cgroup v1 machine")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print("| plan | ranks | forked: wall s | exec'd: wall s | forked: CPU-s | exec'd: CPU-s | CPU-s saved a rank after the first | "
          "load (first run start -> last run end) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="rank-start-") as tmp:
        for name, spec in PLANS.items():
            out = Path(tmp) / name.replace(" ", "").replace(":", "-")
            subprocess.run([sys.executable, "-m", "hetpart", "partition", *spec, "--out", str(out)], env=env,
                           check=True, capture_output=True)
            world = json.loads((out / "manifest.json").read_text())["world_size"]
            runs: dict[str, list[tuple[float, float]]] = {"forked": [], "exec": []}
            load0 = os.getloadavg()[0]
            for _ in range(args.rounds):
                for how in runs:
                    runs[how].append(_in_cgroup([sys.executable, "-c", RUN, how, str(out)], env))
            load1 = os.getloadavg()[0]
            med = {how: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                   for how, r in runs.items()}
            # the forkserver imports once what each exec'd rank imports: every rank after the first is saved it
            saved = (med["exec"][1] - med["forked"][1]) / max(1, world - 1)
            print(f"| {name} | {world} | {med['forked'][0]:.2f} | {med['exec'][0]:.2f} | {med['forked'][1]:.2f} | "
                  f"{med['exec'][1]:.2f} | {saved:.2f} | {load0:.2f} -> {load1:.2f} |", flush=True)


if __name__ == "__main__":
    main()
