"""Time to optimal and to 1% of `hetpart placement` on benchmark inputs, one table row each (issue 17).

    .venv/bin/python benchmarks/placement_dp.py INPUT.json... [--gap 0.01] [--time-limit 60]

Each row: the input, its nodes and k, the max load, the proven lower bound, the certified gap,
the seconds, the status, which engine found the plan and which proved the bound, and the load
average when it started. Run it with PYTHONPATH at an older checkout to time that one (before
issue 17 `solve_placement` had no `gap`: it is then passed to CP-SAT as relative_gap_limit).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from hetpart.placement import read_placement, solve_placement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", type=Path)
    ap.add_argument("--gap", type=float, default=0.0, help="stop once proven within this fraction")
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    print("| input | nodes | k | max load | lower bound | gap | seconds | status | plan / bound | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in args.inputs:
        problem = read_placement(path)
        load_avg = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            got = solve_placement(problem, time_limit_s=args.time_limit, gap=args.gap)
        except TypeError:  # before issue 17
            got = solve_placement(problem, time_limit_s=args.time_limit, params={"relative_gap_limit": args.gap})
        seconds = time.perf_counter() - t0
        engines = f"{getattr(got, 'plan_engine', 'cp-sat/hint')} / {getattr(got, 'bound_engine', 'cp-sat')}"
        print(f"| {path.parent.name}/{path.stem} | {len(problem.nodes)} | {problem.max_fpgas} | {got.max_load:.6f} "
              f"| {got.lower_bound:.6f} | {100 * got.gap:.4f}% | {seconds:.1f} | {got.status} | {engines} "
              f"| {load_avg:.1f} |", flush=True)


if __name__ == "__main__":
    main()
