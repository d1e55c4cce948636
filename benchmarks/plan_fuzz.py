"""planfuzz: the certificates of `--parallel data` plans fuzzed end to end against brute force, by the hundred.

    PYTHONPATH=. .venv/bin/python benchmarks/plan_fuzz.py --start 0 --count 400

The problems and checks are tests/partitioner/plan_fuzz.py's (seeds start..start+count-1; even seeds
`small_problem`, odd ones `random_pipelines_problem`): per problem the bound cut by seeded fake-clock deadlines,
`plan_with_baselines` under a time limit drawn from 0.002-1 s and a gap, one `--strategy` baseline, and a
`hetpart replan` after losing a device. Prints every false claim as it is found, then a table: per path (run,
deadline path, status, generator, schedule, limit) the runs that took it and how many of those made a false claim.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "partitioner"))

from plan_fuzz import Tally, fuzz_one  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=200)
    args = ap.parse_args()
    t0 = time.perf_counter()
    tally = Tally()
    for seed in range(args.start, args.start + args.count):
        seen = len(tally.unsound)
        fuzz_one(seed, tally)
        for line in tally.unsound[seen:]:
            print(line, flush=True)
        if (seed - args.start + 1) % 50 == 0:
            print(f"... {seed - args.start + 1} problems, {len(tally.unsound)} false claims, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(f"\nproblems {tally.problems} (no plan: {tally.no_plan}), false claims {len(tally.unsound)}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'path':<36} {'runs':>6} {'unsound':>8}")
    for path in sorted(tally.paths):
        print(f"{path:<36} {tally.paths[path]:>6} {tally.bad_paths[path]:>8}")


if __name__ == "__main__":
    main()
