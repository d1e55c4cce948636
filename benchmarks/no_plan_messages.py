"""How `solve` says "no plan" with coarsening forced on pinned problems, against the brute force.

    PYTHONPATH=. .venv/bin/python benchmarks/no_plan_messages.py --problems 2000

Each of partition_cases.pinned_problem's first N problems (tests/partitioner/test_pins.py) is solved with
coarsen_above=2 and coarse_nodes 2, then 3 (throughput, the ideal DP on; NOTE [coarsened solve]), and its
answer counted by what the brute force says: a plan; no plan where none exists, proven (NoPlan: the
infeasibility explanations) or with "raise --time-limit" (false: nothing would be found); no plan where one
exists (false whatever the message).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "partitioner"))

from partition_cases import brute_force, pinned_problem  # noqa: E402

from hetpart.errors import HetpartError  # noqa: E402
from hetpart.partitioner import solve  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=2000, help="pinned problems (seeds 0..N-1)")
    args = ap.parse_args()
    counts: Counter = Counter()
    wrong: list[str] = []
    t0 = time.perf_counter()
    for seed in range(args.problems):
        p = pinned_problem(seed)
        optimum = brute_force(p)
        for coarse_nodes in (2, 3):
            try:
                solve(p, time_limit_s=10, coarsen_above=2, coarse_nodes=coarse_nodes, check_certificate=False)
                counts["a plan" if optimum is not None else "a plan where none exists"] += 1
            except HetpartError as e:
                says = "says raise --time-limit" if "--time-limit" in str(e) else "proven"
                key = f"no plan, {'one exists' if optimum is not None else 'none exists'}, {says}"
                counts[key] += 1
                if optimum is not None or says != "proven":
                    wrong.append(f"seed {seed}, coarse_nodes {coarse_nodes}: {str(e).splitlines()[0][:90]}")
    for key, n in sorted(counts.items()):
        print(f"{key:<45} {n:>6}")
    for line in wrong[:8]:
        print("  " + line)
    print(f"{sum(counts.values())} solves in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
