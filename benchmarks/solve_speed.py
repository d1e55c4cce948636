"""Speed limits of the DP and of `solve`'s time shares: a table of seconds against each limit.

    .venv/bin/python benchmarks/solve_speed.py [--repeats 3]

The wall-clock checks that were asserts in tests/partitioner/test_cpsat.py (a loaded
machine made them flaky): the DP on 500 nodes, on 300 nodes of 8 distinct device classes,
past its deadline; `solve` of a 2,000-node transformer (coarsened) at an 8 s limit, once in
tests/partitioner/test_coarsen.py; and `solve` with a DP slowed to run out its share (NOTE [DP deadline] in
dp.py), which must keep its time limit and give the DP dp_share of it. Each row prints the
worst of `--repeats` runs and whether it is within its limit; the load average comes first,
since a loaded 2-core machine is slower.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "partitioner"))

from hetpart.partitioner import SolveOptions, dp, dp_hint, solve, verify_plan  # noqa: E402

from partition_cases import random_large, transformer_problem  # noqa: E402


def _dp_500() -> float:
    p = random_large(0, 500, num_devices=4)
    t0 = time.perf_counter()
    plan = dp_hint(p)
    seconds = time.perf_counter() - t0
    verify_plan(p, plan)
    return seconds


def _dp_many_classes() -> float:
    p = random_large(2, 300, num_devices=8)  # 8 distinct (type, machine) classes: the DP merges them
    t0 = time.perf_counter()
    plan = dp_hint(p)
    seconds = time.perf_counter() - t0
    assert plan.stats["dp_exact"] == 0.0
    return seconds


def _dp_past_deadline() -> float:
    p = random_large(3, 200, num_devices=4)
    t0 = time.perf_counter()
    plan = dp_hint(p, time_limit_s=1e-9)  # past the deadline before the first state
    seconds = time.perf_counter() - t0
    assert plan.stats["dp_timed_out"] == 1.0
    return seconds


def _slow_dp_solve(limit_s: float) -> tuple[float, float]:
    """(solve's seconds, the DP's) with a DP that would take far longer than the limit."""
    real = dp._dp_over

    def slow(*args, deadline=None, **kwargs):
        while deadline is not None and time.perf_counter() <= deadline:
            time.sleep(0.01)
        return real(*args, deadline=deadline, **kwargs)

    dp._dp_over = slow  # a stand-in for a slow DP: this script's process only
    try:
        p = random_large(3, 60, num_devices=4)
        t0 = time.perf_counter()
        plan = solve(p, time_limit_s=limit_s)
        seconds = time.perf_counter() - t0
    finally:
        dp._dp_over = real
    verify_plan(p, plan)
    return seconds, plan.stats.dp_seconds


def _coarsened_2000() -> float:
    """`solve` of a 2,000-node transformer at an 8 s limit: the DP, coarsening and bounds end near it."""
    p = transformer_problem(2000)
    t0 = time.perf_counter()
    plan = solve(p, time_limit_s=8, seed=1)
    seconds = time.perf_counter() - t0
    verify_plan(p, plan)
    assert plan.stats.coarsened
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    share = SolveOptions().dp_share
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores, "
          f"worst of {args.repeats}\n")
    print("| check | seconds | limit | within |\n|---|---|---|---|")

    def row(name: str, seconds: float, limit: float, at_least: bool = False) -> None:
        ok = seconds >= limit if at_least else seconds < limit
        print(f"| {name} | {seconds:.2f} | {'>=' if at_least else '<'} {limit:g} | {'yes' if ok else 'NO'} |",
              flush=True)

    row("dp_hint, 500 nodes, 4 devices", max(_dp_500() for _ in range(args.repeats)), 3.0)
    row("dp_hint, 300 nodes, 8 device classes", max(_dp_many_classes() for _ in range(args.repeats)), 3.0)
    row("dp_hint past its deadline, 200 nodes", max(_dp_past_deadline() for _ in range(args.repeats)), 3.0)
    runs = [_slow_dp_solve(2.0) for _ in range(args.repeats)]
    row("solve, time limit 2 s, slow DP", max(s for s, _ in runs), 2.0 + 3.0)
    row(f"  its DP's seconds (dp_share {share:g} of 2 s, 10% slack)", min(d for _, d in runs), share * 2 * 0.9,
        at_least=True)
    row("solve, 2,000-node transformer, time limit 8 s (coarsened)", max(_coarsened_2000() for _ in range(args.repeats)),
        20.0)


if __name__ == "__main__":
    main()
