"""The solvers' integer units: latencies, costs and sizes scaled so that no linear expression of a
CP-SAT model reaches 2**31 (NOTE [int32 activities])."""

from __future__ import annotations

import math

from hetpart.placement.problem import PlacementProblem

SCALE = 1_000_000  # integer units per unit of the input's latencies, at most (NOTE [int32 activities])
ROUND_SLACK = 1e-9  # relative tolerance when comparing float loads
ACTIVITY_MAX = 2**31 - 1  # the largest |activity| a linear constraint of the model may reach (NOTE [int32 activities])

# NOTE [int32 activities]
# OR-Tools 9.15's CP-SAT presolve proves wrong optima when a linear constraint can reach an
# activity of 2**31 or more: an enforced `max_load >= sum(w_i x_i)` whose weights sum to
# 2**31 - 1 presolves right and to 2**31 wrong, as if the sum were cut to 32 bits
# (benchmarks/ortools_presolve_int32.py: two items, only ortools; the model is valid: with
# presolve off the same proto is solved right). Bisecting debug_max_num_presolve_operations,
# the first operation that breaks it is a "linear + amo" rule (ProcessAtMostOneAndLinear); of
# the presolve parameters tried, only presolve_inclusion_work_limit=0 and
# keep_all_feasible_solutions_in_presolve avoid it (symmetry, SAT presolve, BVA, hints, one
# presolve iteration, big-linear-overlap, probing: no).
# That was issue 17's false OPTIMAL: at SCALE = 1e6 a CPU slot's expression, the sum of every
# node's cpuLatency, passes 2**31 once the CPU latencies add up to 2147.5 (1,071 nodes of a
# training graph: 79.50 "proven" where 72.86 exists). Every linear expression the model builds
# is therefore kept below ACTIVITY_MAX:
# - time: the scale is min(SCALE, ACTIVITY_MAX / U), U = the largest load any slot can
#   have (`time_scale`); latencies are still rounded down, so bounds stay valid, and a
#   coarser scale only widens the rounding (at most one unit per node and sender);
# - memory: sizes over the gcd of the (integral) sizes when that fits, an exact rewrite;
#   else rounded down to units of total / ACTIVITY_MAX and the limit too: a relaxation
#   (every placement that fits still fits), so the bound stays valid, but a solution may
#   not fit in bytes, and `solve_placement` keeps only placements `placement_violations` accepts;
# - the redundant work cut is max_load >= ceil(work / K), not K * max_load >= work.
# `partition`'s model (cpsat.py) meets the same bug once a stage's time can pass 2**31 ns
# (2.1 s); there, where that can happen, CP-SAT runs without presolve's inclusion step
# (presolve_inclusion_work_limit = 0), which random problems show is enough (cpsat.py).


def scaled_loads(problem: PlacementProblem, devices: list[tuple[str, list[int]]], fpga: dict[int, int],
                  cpu: dict[int, int], cost: dict[int, int]) -> list[int]:
    """`placement_loads` in the solver's integer units."""
    where = {i: d for d, (_, ids) in enumerate(devices) for i in ids}
    loads = []
    for d, (kind, ids) in enumerate(devices):
        if kind == "cpu":
            loads.append(sum(cpu[i] for i in ids))
            continue
        senders = {u for u, v in problem.edges if (where[u] == d) != (where[v] == d)}
        loads.append(sum(fpga[i] for i in ids) + sum(cost[u] for u in senders))
    return loads


def time_scale(problem: PlacementProblem) -> float:
    """Integer units per unit of latency: SCALE, or less where a slot's load could reach
    ACTIVITY_MAX units (NOTE [int32 activities])."""
    most = (sum(max(n.fpga_latency, n.cpu_latency) for n in problem.nodes.values())
            + sum(problem.cost.values()))  # no slot's load, accelerator or CPU, exceeds this
    # (1 - 1e-6): float rounding of each floor(x * scale) cannot carry the sum past ACTIVITY_MAX.
    return min(float(SCALE), ACTIVITY_MAX * (1 - 1e-6) / most) if most > 0 else float(SCALE)


def scaled_costs(problem: PlacementProblem) -> tuple[dict[int, int], dict[int, int], dict[int, float], dict[int, int]]:
    """Integer latencies and costs for the solver: floor(x * `time_scale`).

    Rounding down makes every integer load <= scale x the float load, so the
    solver's bound / scale is a valid bound of the float problem.
    """
    scale = time_scale(problem)
    fpga = {i: math.floor(n.fpga_latency * scale) for i, n in problem.nodes.items()}
    cpu = {i: math.floor(n.cpu_latency * scale) for i, n in problem.nodes.items()}
    size = {i: n.size_bytes for i, n in problem.nodes.items()}
    cost = {i: math.floor(c * scale) for i, c in problem.cost.items()}
    return fpga, cpu, size, cost


def memory_units(sizes: list[float], limit_bytes: float) -> tuple[list[int], int, bool]:
    """(integer sizes, integer limit, exact) for the accelerator memory constraint, their sum
    at most ACTIVITY_MAX (NOTE [int32 activities]). Exact: over the gcd of integral sizes;
    else rounded down to a coarser unit, a relaxation (exact False)."""
    if all(float(s).is_integer() for s in sizes):
        unit = math.gcd(*(int(s) for s in sizes)) or 1
        if sum(int(s) for s in sizes) // unit <= ACTIVITY_MAX:
            return [int(s) // unit for s in sizes], math.floor(limit_bytes / unit), True
    unit = max(1.0, sum(sizes) / ACTIVITY_MAX)
    return [math.floor(s / unit) for s in sizes], math.floor(limit_bytes / unit), False
