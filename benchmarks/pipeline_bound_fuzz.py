"""Issue 19's pipelines bound fuzzed by the thousand: `pipelines_lower_bound` (no deadline) against the
brute-force optimum of every plan on tiny random problems.

    PYTHONPATH=. .venv/bin/python benchmarks/pipeline_bound_fuzz.py --start 0 --count 5000
    PYTHONPATH=. .venv/bin/python benchmarks/pipeline_bound_fuzz.py --start 3000 --count 100 --without-free-fix
    PYTHONPATH=. .venv/bin/python benchmarks/pipeline_bound_fuzz.py --count 1000 --alone [--wrong-crossing]
    PYTHONPATH=. .venv/bin/python benchmarks/pipeline_bound_fuzz.py --count 300 --alone --cut-scale 1.1

The problems are those of tests/partitioner/pipeline_bound_fuzz.py (seeds start..start+count-1): 3-6 ops with
skips and multi-output nodes, 3-5 devices of 2-3 types on 1-3 machines, 1F1B/GPipe/inference, 1-8
microbatches. Prints every seed whose bound exceeds the optimum, then the counts: problems, problems with no
plan, violations, bounds within 2% of the optimum, the mean bound / optimum, seconds. `--without-free-fix`
puts back what `_least_infeasible` returned before the fuzz found it (the start when the LP reaches it, taken
by NOTE [memory bound parts] as a step no part reaches), to show what the fuzz catches. `--alone` checks NOTE
[pipelines bound] without NOTE [pipelines memory bound] (the larger of the two is the bound, and can hide a term);
`--wrong-crossing` uses NOTE [priced fill]'s crossing row also where it is not valid (T >= alpha), to show what
the fuzz catches; `--cut-scale 1.1` scales the alpha of NOTE [stage sum cuts]'s lines by 1.1 (invalid), likewise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "partitioner"))

from pipeline_bound_fuzz import check  # noqa: E402

from hetpart.partitioner import pipeline_memory_bound  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--without-free-fix", action="store_true")
    ap.add_argument("--alone", action="store_true", help="NOTE [pipelines bound] without the memory bound")
    ap.add_argument("--wrong-crossing", action="store_true",
                    help="NOTE [priced fill]'s crossing row also where T >= alpha (invalid): what the fuzz catches")
    ap.add_argument("--cut-scale", type=float, default=1.0,
                    help="NOTE [stage sum cuts]'s alpha times this (above 1 is invalid): what the fuzz catches")
    args = ap.parse_args()
    if args.cut_scale != 1.0:
        from hetpart.partitioner import pipeline_stage_sum
        pipeline_stage_sum.ALPHA_SCALE = args.cut_scale
    if args.wrong_crossing:
        from hetpart.partitioner import pipeline_bounds
        pipeline_bounds.CROSS_EVERYWHERE = True
    if args.without_free_fix:
        real = pipeline_memory_bound._least_infeasible

        def before(feasible, lo, deadline, hi=None):
            return (lo, True) if feasible(lo) else real(feasible, lo, deadline, hi)

        pipeline_memory_bound._least_infeasible = before
    t0 = time.perf_counter()
    cases = none = violations = close = 0
    ratios = []
    for seed in range(args.start, args.start + args.count):
        optimum, bound = check(seed, args.alone)
        cases += 1
        if optimum is None:
            none += 1
            continue
        if bound > optimum:
            violations += 1
            print(f"seed {seed}: bound {bound} > optimum {optimum}", flush=True)
        close += bound >= 0.98 * optimum
        ratios.append(bound / optimum if optimum else 1.0)
    print(f"problems {cases}, no plan {none}, bound above the optimum {violations}, within 2% {close}, "
          f"mean bound/optimum {sum(ratios) / max(1, len(ratios)):.3f}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
