"""Issue 17's fuzz: tiny random placement and partition problems, every solver path against a
brute force (used by test_certificate_fuzz.py, seeded and small, and benchmarks/certificates.py).

A path's result is a `PathResult`; `unsound` names what it got wrong: a lower bound above the
brute-force optimum, a claimed optimum above it, or a plan below it (an invalid one).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from ortools.sat.python import cp_model

from hetpart.errors import HetpartError
from hetpart.partitioner import OUT_TENSORS, TIME_NS, Problem, cpsat, dp_hint, solve
from hetpart.partitioner.bounds import compute_bounds
from hetpart.partitioner.ideals import ideal_dp
from hetpart.placement import PlacementNode, PlacementProblem, placement_loads, placement_violations, solve_placement
from hetpart.placement.cpsat import placement_model, solve_placement_cpsat
from hetpart.placement.ideals import placement_ideal_dp
from hetpart.placement.read import validate
from hetpart.placement.units import time_scale
from tests.placement.placement_cases import brute_force_placement

from partition_cases import brute_force, random_problem

SLOW_OPS = 30_000_000  # x the ns of random_problem: ops of 0.03-1.2 s, stage sums past 2**31 ns
BIG_LATENCY = 1_000.0  # x the placement latencies: CPU sums past 2,147.5 (2**31 units at 1e6 per unit)


@dataclass
class PathResult:
    value: float | None  # the plan's value (None: no plan, e.g. proven infeasible)
    bound: float  # its proven lower bound
    claims_optimal: bool


def random_placement(seed: int) -> PlacementProblem:
    """3-7 nodes, 1-3 devices (at most one CPU), colour classes, memory limits, sometimes a
    training graph (node i and its backward n-1-i share a class) and latencies of thousands."""
    rng = random.Random(seed)
    while True:
        n = rng.randint(3, 7)
        cpus = rng.choice([0, 1, 1])
        fpgas = rng.randint(1 - cpus, 3 - cpus)
        training = rng.random() < 0.4
        unit = BIG_LATENCY if rng.random() < 0.3 else 1.0
        forward = (n + 1) // 2 if training else n
        edges = {(u, v) for v in range(1, forward) for u in rng.sample(range(v), rng.randint(1, min(2, v)))}
        if training:
            edges |= {(n - 1 - v, n - 1 - u) for u, v in edges if n - 1 - v >= forward}
            edges |= {(forward - 1, forward)} if forward < n else set()
        nodes = {}
        for i in range(n):
            color = min(i, n - 1 - i) if training else rng.choice([i, i, i, max(0, i - 1)])
            nodes[i] = PlacementNode(i, rng.choice([1.0, 3.0, 6.0, 9.0]) * unit, rng.choice([0.0, 1.0, 2.0, 4.0]) * unit,
                                     float(rng.randint(0, 3)), cpus == 0 or rng.random() > 0.15,
                                     training and i >= forward, color)
        problem = PlacementProblem(nodes=nodes, edges=sorted(edges),
                                   cost={i: rng.choice([0.0, 0.5, 1.5, 3.0]) * unit for i in range(n)},
                                   max_fpgas=fpgas, max_cpus=cpus, max_size_bytes=float(rng.choice([3, 5, 100])),
                                   name=f"fuzz{seed}")
        try:
            validate(problem, problem.name)
        except HetpartError:
            continue
        return problem


def random_partition(seed: int) -> Problem:
    """random_problem(seed) on 1-3 of its devices, ops of nanoseconds or (a third) of seconds, in half of
    them nodes of 1-4 output tensors (each paying a latency per boundary, NOTE [stage time])."""
    rng = random.Random(seed)
    p = random_problem(seed)
    p = dataclasses.replace(p, devices=p.devices[:rng.randint(1, 3)])
    tensors = random.Random(30_000 + seed)  # (its own stream: the draws above and below stay the earlier ones)
    if tensors.random() < 0.5:
        for v in p.graph.nodes:
            p.graph.nodes[v][OUT_TENSORS] = tensors.choice([1, 2, 4])
    if rng.random() < 1 / 3:
        g = p.graph.copy()
        for v in g.nodes:
            g.nodes[v][TIME_NS] = {t: ns * SLOW_OPS for t, ns in g.nodes[v][TIME_NS].items()}
        p = dataclasses.replace(p, graph=g)
    return p


def placement_paths(problem: PlacementProblem) -> dict[str, PathResult]:
    """Each placement path: CP-SAT with presolve on and off (one model build), checked (ideal DP,
    CP-SAT, re-proof), the DP hint and the ideal DP alone."""
    out = {}
    mdl = placement_model(problem)
    for name, run in (
        ("cpsat presolve on", lambda: solve_placement_cpsat(problem, time_limit_s=10, workers=1, seed=0,
                                                                params=None, mdl=mdl)),
        ("cpsat presolve off", lambda: solve_placement_cpsat(problem, time_limit_s=10, workers=1, seed=0,
                                                                 params={"cp_model_presolve": False}, mdl=mdl)),
        ("checked", lambda: solve_placement(problem, time_limit_s=10, check_certificate=True)),
    ):
        try:
            got = run()
        except HetpartError:
            out[name] = PathResult(None, float("inf"), True)  # "no placement exists"
            continue
        assert placement_violations(problem, got.devices) == [], name
        out[name] = PathResult(got.max_load, got.lower_bound, got.status == "OPTIMAL")
    out["dp hint"] = PathResult(max(placement_loads(problem, mdl.hint)) if mdl.hint else None, 0.0, False)

    ideal = placement_ideal_dp(problem)  # NOTE [placement ideal DP]: exact when it ran over every placement
    out["ideal dp"] = PathResult(max(placement_loads(problem, ideal.devices)) if ideal.devices else None,
                                 ideal.bound_units / time_scale(problem), ideal.exact)
    return out


def partition_paths(problem: Problem, **solve_options) -> dict[str, PathResult]:
    """Each partition path: `solve` (DP, ideal DP, CP-SAT; with `solve_options`, e.g. forced coarsening),
    `solve` without the ideal DP, the CP-SAT model itself with presolve on and off (one build), the DP,
    the ideal DP, bounds.py."""
    out = {}
    for name, ideal in (("solve", True), ("solve without ideal dp", False)):
        try:
            got = solve(problem, time_limit_s=10, check_certificate=False, run_ideal_dp=ideal, **solve_options)
        except HetpartError:
            out[name] = PathResult(None, float("inf"), True)
            continue
        out[name] = PathResult(got.value_ns, got.lower_bound_ns, got.solver_status == "OPTIMAL")
    try:
        problem.validate()
        mdl = cpsat._build(problem)
    except HetpartError:
        return out
    for name, presolve in (("cpsat model presolve on", True), ("cpsat model presolve off", False)):
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_time_in_seconds = 10
        solver.parameters.cp_model_presolve = presolve
        if mdl.time_ub_ns > cpsat.INT32_SAFE_NS:
            solver.parameters.presolve_inclusion_work_limit = 0  # as `solve` does (NOTE [int32 activities])
        status = solver.solve(mdl.model)
        if status == cp_model.INFEASIBLE:
            out[name] = PathResult(None, float("inf"), True)
        elif status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            out[name] = PathResult(None, solver.best_objective_bound, False)  # the model's value is not a plan's
    dp = dp_hint(problem)
    out["dp"] = PathResult(dp.value_ns if dp else None, 0.0, False)
    if dp is not None:
        got = ideal_dp(problem, dp.bottleneck_ns + 1)
        if got is not None:
            out["ideal dp"] = PathResult(got.plan.bottleneck_ns if got.plan else None, got.bound_ns, False)
    out["bounds.py"] = PathResult(None, compute_bounds(problem).search_free_ns, False)
    return out


def unsound(result: PathResult, optimum: float, slack: float = 0.0) -> str:
    """What `result` gets wrong against the brute-force `optimum` (inf: no plan exists); "" if nothing.
    A path that says no plan exists has the bound inf."""
    if result.bound > optimum + slack:
        return f"bound {result.bound} above the optimum {optimum}"
    if result.value is not None and result.value < optimum - slack:
        return f"a plan of {result.value} below the optimum {optimum}: the brute force or the checker is wrong"
    if result.claims_optimal and result.value is not None and result.value > optimum + slack:
        return f"claims optimal at {result.value}, the optimum is {optimum}"
    return ""


def placement_optimum(problem: PlacementProblem) -> tuple[float, float]:
    """(brute-force optimum, the rounding slack a claim may have: one integer unit per node and sender)."""
    return brute_force_placement(problem), 2 * len(problem.nodes) / time_scale(problem) + 1e-9


def partition_optimum(problem: Problem) -> float:
    best = brute_force(problem)
    return float("inf") if best is None else float(best)
