"""Issue 17's fuzz, seeded and small: every solver path against a brute force (certificate_fuzz.py).
benchmarks/certificates.py runs the same problems by the thousand.

The counts are sized to the suite's time budget: 60 placement and 50 partition problems hold every
family the generators promise (asserted below), and the 50 partition problems still catch the
int32 bug (NOTE [int32 activities]): with the fix taken out, `benchmarks/certificates.py --placement 60
--partition 50 --without-int32-fix` finds 5 bounds above the optimum. The seeds past them run in the
benchmark."""

from __future__ import annotations

import math

from hetpart.partitioner import TIME_NS

from certificate_fuzz import (
    partition_optimum,
    partition_paths,
    placement_optimum,
    placement_paths,
    random_partition,
    random_placement,
    unsound,
)

PLACEMENT_PROBLEMS = 60
PARTITION_PROBLEMS = 50


def test_placement_paths_never_bound_above_the_brute_force_optimum():
    wrong, big, training, optimal = [], 0, 0, 0
    for seed in range(PLACEMENT_PROBLEMS):
        problem = random_placement(seed)
        big += max(n.cpu_latency for n in problem.nodes.values()) >= 1000
        training += any(n.backward for n in problem.nodes.values())
        optimum, slack = placement_optimum(problem)
        for path, result in placement_paths(problem).items():
            optimal += result.claims_optimal and result.value is not None
            if why := unsound(result, optimum, slack):
                wrong.append(f"seed {seed} {path}: {why}")
    assert wrong == []
    # The families the generator promises are all there, and most claims are of optimality.
    assert big >= 10 and training >= 10 and optimal >= PLACEMENT_PROBLEMS


def test_partition_paths_never_bound_above_the_brute_force_optimum():
    wrong, slow, feasible = [], 0, 0
    for seed in range(PARTITION_PROBLEMS):
        problem = random_partition(seed)
        slow += max(max(t.values()) for _, t in problem.graph.nodes(data=TIME_NS)) >= 30_000_000
        optimum = partition_optimum(problem)
        feasible += math.isfinite(optimum)
        for path, result in partition_paths(problem).items():
            if why := unsound(result, optimum, 1e-6):
                wrong.append(f"seed {seed} {path}: {why}")
    assert wrong == []
    assert slow >= 10 and feasible >= PARTITION_PROBLEMS // 2
