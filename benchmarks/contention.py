"""One plan's ranks measured alone and beside a process that computes in cache or streams memory (issue 22).

    .venv/bin/python benchmarks/contention.py DIR [--core 1] [--rounds 2]

DIR is an artifacts directory (`hetpart partition ... --profile` for the emulated types, as
benchmarks/measured_speedup.py writes them); each round runs `hetpart run DIR --emulate --measure
--steps 5` three times: alone, beside a matmul loop whose operands fit the L3, and beside a loop copying
256 MB (DRAM streaming), each contender pinned to --core with one thread. Prints each rank's median
forward CPU time and wall time and the step: whether a profile taken alone predicts ranks that share the
machine's memory system with other busy ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schedules import run_fresh  # noqa: E402

CONTENDERS = {
    "nothing": None,
    "matmul in cache": "a = torch.randn(768, 3072); b = torch.randn(3072, 768)\nwhile True: (a @ b).relu_()",
    "256 MB copy": "a = torch.randn(64 << 20); b = torch.empty_like(a)\nwhile True: b.copy_(a)",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--core", type=int, default=1, help="the core the contender runs on")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for _ in range(args.rounds):
        for name, loop in CONTENDERS.items():
            proc = None
            if loop is not None:
                code = f"import os, torch\nos.sched_setaffinity(0, {{{args.core}}}); torch.set_num_threads(1)\n{loop}\n"
                proc = subprocess.Popen([sys.executable, "-c", code])
            try:
                run_fresh(args.out, mode="inference", steps=5, measure=True, emulate=True)
            finally:
                if proc is not None:
                    proc.kill()
                    proc.wait()
            rows[name].append(json.loads((args.out / "measured.json").read_text()))
    print(f"\n{args.out}, {args.rounds} round(s); load average at the end: {os.getloadavg()}\n")
    print("| beside it | rank | forward CPU ms | forward wall ms | predicted compute ms | step ms |")
    print("|---|---|---|---|---|---|")
    for name, ms in rows.items():
        for k in range(len(ms[0]["stages"])):
            cpu = ", ".join(f"{m['stages'][k]['forward_cpu_us']['median'] / 1e3:.2f}" for m in ms)
            wall = ", ".join(f"{m['stages'][k]['forward_us']['median'] / 1e3:.2f}" for m in ms)
            pred = ms[0]["stages"][k]["predicted_compute_us"] / 1e3
            step = statistics.median(m["step_us"]["median"] for m in ms) / 1e3
            print(f"| {name} | {k} | {cpu} | {wall} | {pred:.2f} | {step:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
