"""Issue 17's fuzz by the thousand: every solver path against a brute force on tiny random problems.

    PYTHONPATH=. .venv/bin/python benchmarks/certificates.py --placement 5000 --partition 5000
    PYTHONPATH=. .venv/bin/python benchmarks/certificates.py --placement 300 --partition 300 --without-int32-fix
    PYTHONPATH=. .venv/bin/python benchmarks/certificates.py --placement 0 --partition 0 --pinned 2000
    PYTHONPATH=. .venv/bin/python benchmarks/certificates.py --placement 0 --partition 0 --pinned 2000 --coarse-nodes 2

The problems are those of tests/partitioner/certificate_fuzz.py (seeds S..S+N-1, `--start S`, 0 unless given): placement with
3-7 nodes, 1-3 devices, colour classes, memory limits, training graphs, latencies of thousands;
partition with 2-6 nodes on 1-3 devices of 2 types and machines, memory, a third with ops of
seconds; `--pinned` adds partition_cases.pinned_problem's (tests/partitioner/test_pins.py): 2-6 nodes
on 2-4 devices, pinned anywhere in the order (NOTE [pins]), training and constraints on some. Per path:
problems, OPTIMAL claims, bounds above the optimum, claimed optima above it, plans below it (a checker
bug), and the mean time of all paths per problem. `--coarse-nodes K` forces coarsening on the partition
problems' `solve` paths (coarsen_above=2, coarse_nodes=K; NOTE [coarsened solve]). A path that finds no plan
where the brute force has one counts as a bound above the optimum (its bound is inf). `--without-int32-fix` takes out NOTE [int32 activities] (placement's scale cap and partition's presolve setting) to show what
the fuzz catches. Sets HETPART_CHECK_CERTIFICATE=1 unless it is set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HETPART_CHECK_CERTIFICATE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "partitioner"))

from certificate_fuzz import (  # noqa: E402
    partition_optimum,
    partition_paths,
    placement_optimum,
    placement_paths,
    random_partition,
    random_placement,
    unsound,
)
from partition_cases import pinned_problem  # noqa: E402

from hetpart.partitioner import cpsat  # noqa: E402
from hetpart.placement import units as placement_units  # noqa: E402


def run(kind: str, n: int, rows: dict, solve_options: dict, start: int = 0) -> None:
    for seed in range(start, start + n):
        if kind == "placement":
            problem = random_placement(seed)
            optimum, slack = placement_optimum(problem)
            t0 = time.perf_counter()
            results = placement_paths(problem)
        else:
            problem = random_partition(seed) if kind == "partition" else pinned_problem(seed)
            optimum, slack = partition_optimum(problem), 1e-6
            t0 = time.perf_counter()
            results = partition_paths(problem, **solve_options)
        rows[(kind, "(all paths)")]["seconds"] += time.perf_counter() - t0
        for path, result in results.items():
            row = rows[(kind, path)]
            row["problems"] += 1
            row["claims"] += result.claims_optimal and result.value is not None
            why = unsound(result, optimum, slack)
            key = ("bound_above" if why.startswith("bound") else "claim_above" if why.startswith("claims")
                   else "plan_below" if why else None)
            if key:
                row[key] += 1
                if row[key] <= 2:
                    row["examples"].append(f"seed {seed}: {why}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--placement", type=int, default=300, help="placement problems (seeds S..S+N-1)")
    ap.add_argument("--partition", type=int, default=300, help="partition problems (seeds S..S+N-1)")
    ap.add_argument("--pinned", type=int, default=0, help="pinned partition problems (seeds S..S+N-1)")
    ap.add_argument("--start", type=int, default=0, help="the first seed S (the suite fuzzes seeds below 1,000)")
    ap.add_argument("--without-int32-fix", action="store_true", help="take out NOTE [int32 activities]")
    ap.add_argument("--coarse-nodes", type=int, default=None,
                    help="force coarsening on the partition problems' solve paths: coarsen_above=2, coarse_nodes=K")
    args = ap.parse_args()
    solve_options = {} if args.coarse_nodes is None else {"coarsen_above": 2, "coarse_nodes": args.coarse_nodes}
    if args.without_int32_fix:
        placement_units.ACTIVITY_MAX = 2**62
        cpsat.INT32_SAFE_NS = 2**62
    rows: dict = defaultdict(lambda: defaultdict(int) | {"examples": []})
    t0 = time.perf_counter()
    run("placement", args.placement, rows, {}, args.start)
    run("partition", args.partition, rows, solve_options, args.start)
    run("pinned", args.pinned, rows, solve_options, args.start)
    print(f"{'kind':<10} {'path':<26} {'problems':>8} {'OPTIMAL':>8} {'bound>opt':>9} {'claim>opt':>9} "
          f"{'plan<opt':>8}")
    for (kind, path), row in rows.items():
        if path == "(all paths)":
            n = getattr(args, kind)
            print(f"{kind:<10} {path:<26} {n:>8} {1e3 * row['seconds'] / max(1, n):>8.1f} ms a problem")
            continue
        print(f"{kind:<10} {path:<26} {row['problems']:>8} {row['claims']:>8} {row['bound_above']:>9} "
              f"{row['claim_above']:>9} {row['plan_below']:>8}")
        for example in row["examples"]:
            print(f"{'':<37}{example}")
    print(f"total {time.perf_counter() - t0:.0f} s; HETPART_CHECK_CERTIFICATE={os.environ['HETPART_CHECK_CERTIFICATE']}"
          + ("; without the int32 fix" if args.without_int32_fix else "")
          + (f"; coarsening forced: coarsen_above=2, coarse_nodes={args.coarse_nodes}" if solve_options else ""))


if __name__ == "__main__":
    main()
