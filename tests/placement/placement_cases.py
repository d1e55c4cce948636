"""Small placement problems (NOTE [placement load]) and a brute-force optimum."""

from __future__ import annotations

import itertools

from hetpart.placement import PlacementProblem, placement_loads, placement_violations


def brute_force_placement(problem: PlacementProblem) -> float:
    """Least max load over every assignment of nodes to devices that the checker accepts."""
    ids = sorted(problem.nodes)
    kinds = ["fpga"] * problem.max_fpgas + ["cpu"] * problem.max_cpus
    best = float("inf")
    for assign in itertools.product(range(len(kinds)), repeat=len(ids)):
        devices = [(kind, [i for i, d in zip(ids, assign) if d == slot]) for slot, kind in enumerate(kinds)]
        devices = [d for d in devices if d[1]]
        if not placement_violations(problem, devices):
            best = min(best, max(placement_loads(problem, devices)))
    return best
