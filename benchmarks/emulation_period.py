"""The same emulated plans at several CPU-quota periods and kernel bandwidth slices, interleaved (issue 22).

    .venv/bin/python benchmarks/emulation_period.py CASE_DIR 10000:5000,10000:1000,4000:1000 3 optimal,fx-size-based

CASE_DIR holds one artifacts directory per strategy (`benchmarks/measured_speedup.py --keep DIR` writes them,
DIR/<model>-<speeds>/<strategy>); each configuration is PERIOD_US:SLICE_US, the emulation's period
(`hetpart.runtime.emulate.PERIOD_US`) and the kernel's `/proc/sys/kernel/sched_cfs_bandwidth_slice_us`
(root; set before each run and put back to 5000, the kernel's default, at the end). Prints each strategy's
median step per configuration, its ratio to the first strategy, and per stage the median forward / CPU ms.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schedules import run_fresh  # noqa: E402

SLICE = Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")


def main() -> int:
    case, configs, rounds, names = Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4].split(",")
    res: dict[tuple[str, str], list] = {(n, c): [] for n in names for c in configs}
    try:
        for r in range(rounds):
            for config in configs:
                period, slice_us = config.split(":")
                for n in names:
                    SLICE.write_text(slice_us)
                    load = os.getloadavg()[0]
                    run_fresh(case / n, int(period), mode="inference", steps=4, measure=True, emulate=True)
                    m = json.loads((case / n / "measured.json").read_text())
                    res[(n, config)].append((m["step_us"]["median"], load, [(s["forward_us"]["median"],
                                                                             s["forward_cpu_us"]["median"])
                                                                            for s in m["stages"]]))
            print(f"round {r + 1} done, load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        SLICE.write_text("5000")
    for config in configs:
        base = statistics.median(x[0] for x in res[(names[0], config)])
        for n in names:
            xs = res[(n, config)]
            step = statistics.median(x[0] for x in xs)
            stages = " ".join(f"{statistics.median(x[2][k][0] for x in xs) / 1e3:.1f}/"
                              f"{statistics.median(x[2][k][1] for x in xs) / 1e3:.1f}" for k in range(len(xs[0][2])))
            print(f"period {config} us  {n:26s} step {step / 1e3:7.1f} ms  / {names[0]} {step / base:.2f}x  loads "
                  f"{min(x[1] for x in xs):.1f}-{max(x[1] for x in xs):.1f}  stages {stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
