"""Checked certificates: where a claimed lower bound comes from, and an independent re-proof of it.

`partition` (solve.solve) and `placement` (placement.solve_placement) both claim a proven lower
bound, and OPTIMAL or WITHIN_GAP from it. Issue 17 showed that a claim can be wrong when the
engine behind it is (NOTE [int32 activities] in placement/units.py), so each result carries a
`Certificate` (problem.py): the bound's source and relaxation, and, with --check-certificate
(or HETPART_CHECK_CERTIFICATE=1), the verdict of a second route.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time

from ortools.sat.python import cp_model

from hetpart.partitioner.evaluate import evaluate, objective_ns
from hetpart.partitioner.problem import PIN, PIN_FIRST, PIN_LAST, Certificate, Plan, Problem
from hetpart.partitioner.verify import plan_violations

# NOTE [checked certificates]
# A claim is the plan's (placement's) lower bound, and with it OPTIMAL or WITHIN_GAP. The
# check re-proves the bound by a route that shares no solver state with the one that found it:
# - brute force, where the plans can be listed (BRUTE_MAX of them): the exact optimum;
# - else CP-SAT again on the same model with presolve off (issue 17's bug lives in presolve),
#   started from the claimed plan, within the time limit: its proven bound, and any plan it
#   finds below the claimed bound, re-costed and re-checked by evaluate / plan_violations;
# - else (coarsened graphs) none: the verdict says so.
# Verdicts: "confirmed" (the route proves at least the claimed bound), "refuted" (it finds a
# plan below the claimed bound: the result becomes the better plan, status FEASIBLE, the
# route's proven bound, and a warning), "unconfirmed" (neither within the time limit: the claim
# stands, with a warning). Only OPTIMAL and WITHIN_GAP claims are checked; every result
# carries its provenance, checked or not.

CHECK_ENV = "HETPART_CHECK_CERTIFICATE"  # "1": re-prove every claim (tests/conftest.py and benchmarks set it)
BRUTE_MAX = 2_000  # plans (partition) or assignments (placement) the brute-force route enumerates at most
_REL_TOL = 1e-9  # placement bounds are floats: relative slack when comparing them


def check_by_default() -> bool:
    """Whether to check certificates when the caller did not say: HETPART_CHECK_CERTIFICATE."""
    return os.environ.get(CHECK_ENV, "").strip() not in ("", "0")


# Bounds field -> (source, relaxation), in the order a tie is attributed.
_SOURCES = {
    "solver_ns": ("cpsat_objective_bound", "CP-SAT's proven objective bound of the exact model (presolve on)"),
    "ideal_ns": ("ideal_dp", "DP over chains of the graph's ideals, memory relaxed (NOTE [ideal DP])"),
    "sequence_ns": ("sequence", "ops and work each stage of a device sequence can run (NOTE [sequence bound])"),
    "stage_sum_ns": ("stage_sum", "work and unavoidable transfers per device multiset (NOTE [stage-sum bound])"),
    "lp_work_ns": ("lp_work", "LP spreading work and memory over device types fractionally, order and "
                              "transfers relaxed (NOTE [LP work bound])"),
    "largest_op_ns": ("single_op", "the slowest op on its fastest allowed device type"),
}


def plan_provenance(plan: Plan) -> Certificate:
    """Which engine's bound is `plan.lower_bound_ns`, and what it relaxes."""
    b = plan.bounds
    if b is None or plan.lower_bound_ns <= 0:
        return Certificate("none", "no bound above 0 was proven")
    if plan.objective != "throughput":
        if (plan.stats.solver_bound_ns or 0) >= plan.lower_bound_ns:
            return Certificate("cpsat_objective_bound", f"CP-SAT's proven bound of the {plan.objective} objective "
                                                        "(presolve on)")
        return Certificate("work_sum", "every node on its fastest type, summed, and the bottleneck's search-free "
                                       "bounds (NOTE [objectives])")
    for name, (source, relaxation) in _SOURCES.items():
        if getattr(b, name) >= plan.lower_bound_ns:
            return Certificate(source, relaxation)
    return Certificate("none", "no bound reaches the claimed one")  # not reached: the claim is their max


def _plan_count(problem: Problem) -> int:
    n, d = problem.graph.number_of_nodes(), len(problem.devices)
    most = min(problem.max_stages or d, d)
    return sum(s**n * math.perm(d, s) for s in range(1, most + 1))


def valid_plans(problem: Problem):
    """Every valid plan that fits in memory, by enumeration: (stage_of, devices, stages)."""
    g = problem.graph
    nodes = list(g.nodes)
    pin = {v: g.nodes[v].get(PIN) for v in nodes}
    max_s = min(problem.max_stages or len(problem.devices), len(problem.devices))
    for S in range(1, max_s + 1):
        for assign in itertools.product(range(S), repeat=len(nodes)):
            stage_of = dict(zip(nodes, assign))
            if any(stage_of[u] > stage_of[v] for u, v in g.edges):
                continue
            if any(pin[v] == PIN_FIRST and stage_of[v] != 0 for v in nodes):
                continue
            if any(pin[v] == PIN_LAST and stage_of[v] != S - 1 for v in nodes):
                continue
            if {stage_of[v] for v in nodes if pin[v] != PIN_LAST} != set(range(S)):
                continue
            for devs in itertools.permutations([d.name for d in problem.devices], S):
                stages = evaluate(problem, stage_of, list(devs))
                if all(s.memory_bytes <= s.capacity_bytes for s in stages):
                    plan = Plan(stage_of=stage_of, device_of_stage=list(devs), stages=stages,
                                bottleneck_ns=max(s.time_ns for s in stages), lower_bound_ns=0,
                                solver_status="FEASIBLE", solve_seconds=0.0)
                    if not plan_violations(problem, plan):  # co-location groups, forbidden types
                        yield stage_of, list(devs), stages


def brute_force(problem: Problem, objective: str = "throughput", microbatches: int = 1) -> int | None:
    """The least value of `objective` (NOTE [objectives]) over every valid plan, or None when none fits."""
    best = _brute_plan(problem, objective, microbatches)
    return best[0] if best is not None else None


def _brute_plan(problem: Problem, objective: str, microbatches: int) -> tuple[int, dict, list] | None:
    best = None
    for stage_of, devs, stages in valid_plans(problem):
        value = objective_ns(stages, objective, microbatches)
        if best is None or value < best[0]:
            best = (value, stage_of, devs)
    return best


def _resolve_without_presolve(problem: Problem, plan: Plan, time_limit_s: float) -> tuple[int, tuple | None]:
    """CP-SAT on `solve`'s model with presolve off, from `plan`: (proven bound, (value, stage_of, devices)
    of its best plan re-costed by evaluate, or None)."""
    from hetpart.partitioner.cpsat import _add_hint, _build, _canonical, _PastDeadline

    t0 = time.perf_counter()
    try:  # no search-free cut: independent of bounds.py
        mdl = _build(problem, plan.objective, plan.microbatches, 0, deadline=t0 + time_limit_s)
    except _PastDeadline:  # too big to build in time: nothing re-proved (the claim stays unconfirmed)
        return 0, None
    _add_hint(problem, mdl, plan.stage_of, _canonical(problem, plan.device_of_stage))
    solver = cp_model.CpSolver()
    solver.parameters.cp_model_presolve = False
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (time.perf_counter() - t0))
    status = solver.solve(mdl.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0, None
    bound = max(0, math.ceil(solver.best_objective_bound - 1e-6))
    raw = {v: next(k for k in range(mdl.num_stages) if solver.boolean_value(mdl.y[v][k])) for v in mdl.order}
    renumber = {k: i for i, k in enumerate(sorted(set(raw.values())))}
    stage_of = {v: renumber[raw[v]] for v in problem.graph.nodes}
    devices = [next(d for d, lit in mdl.a[k].items() if solver.boolean_value(lit)) for k in sorted(renumber)]
    stages = evaluate(problem, stage_of, devices)
    trial = Plan(stage_of=stage_of, device_of_stage=devices, stages=stages, bottleneck_ns=max(s.time_ns for s in stages),
                 lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
    found = None if plan_violations(problem, trial) else (objective_ns(stages, plan.objective, plan.microbatches),
                                                           stage_of, devices)
    return bound, found


def check_plan(problem: Problem, plan: Plan, *, time_limit_s: float, coarsen_above: int | None) -> Plan:
    """NOTE [checked certificates] for a plan of `solve`: the plan with its certificate set,
    downgraded when the re-proof refutes it."""
    cert = plan.certificate or plan_provenance(plan)
    if plan.solver_status not in ("OPTIMAL", "WITHIN_GAP"):
        return dataclasses.replace(plan, certificate=cert)
    claimed = plan.lower_bound_ns
    if problem.graph.number_of_nodes() <= 7 and _plan_count(problem) <= BRUTE_MAX:
        route = "brute_force"
        best = _brute_plan(problem, plan.objective, plan.microbatches)
        bound, found = (best[0], best) if best is not None else (0, None)
    elif coarsen_above is None or problem.graph.number_of_nodes() <= coarsen_above:
        route = "cpsat_no_presolve"
        bound, found = _resolve_without_presolve(problem, plan, time_limit_s)
    else:
        cert = dataclasses.replace(cert, verdict="unconfirmed", warning=(
            f"the {plan.solver_status} claim rests on {cert.bound_source} alone: a coarsened graph of "
            f"{problem.graph.number_of_nodes()} nodes has no independent route"))
        return dataclasses.replace(plan, certificate=cert)
    if found is not None and found[0] < claimed:  # below the bound, so below the plan too: take it
        value, stage_of, devices = found
        stages = evaluate(problem, stage_of, devices)
        cert = dataclasses.replace(cert, checked_by=route, verdict="refuted", reproved_bound=float(bound), warning=(
            f"{route} found a plan of {value} ns below the claimed bound {claimed} ns of {cert.bound_source}: "
            f"{plan.solver_status} downgraded to FEASIBLE with the bound {min(bound, value)} ns it proves"))
        return dataclasses.replace(plan, stage_of=stage_of, device_of_stage=list(devices), stages=stages,
                                   bottleneck_ns=max(s.time_ns for s in stages), objective_ns=value,
                                   lower_bound_ns=min(bound, value), solver_status="FEASIBLE", certificate=cert)
    if bound >= claimed:
        cert = dataclasses.replace(cert, checked_by=route, verdict="confirmed", reproved_bound=float(bound))
    else:
        cert = dataclasses.replace(cert, checked_by=route, verdict="unconfirmed", reproved_bound=float(bound), warning=(
            f"{route} proved only {bound} ns of the claimed {claimed} ns within {time_limit_s:g} s"))
    return dataclasses.replace(plan, certificate=cert)


def _placement_brute_force(problem) -> tuple[float, list] | None:
    """(least max load, devices) over every assignment of colour classes to the devices, in the
    order the checker accepts (`placement_violations`), or None when none is valid."""
    from hetpart.placement.problem import placement_loads, placement_violations

    classes = list(problem.classes().values())
    kinds = ["fpga"] * problem.max_fpgas + ["cpu"] * problem.max_cpus
    best = None
    for assign in itertools.product(range(len(kinds)), repeat=len(classes)):
        devices = [(kind, sorted(i for ids, d in zip(classes, assign) if d == slot for i in ids))
                   for slot, kind in enumerate(kinds)]
        devices = [d for d in devices if d[1]]
        if placement_violations(problem, _ordered(problem, devices)):
            continue
        load = max(placement_loads(problem, devices))
        if best is None or load < best[0]:
            best = (load, _ordered(problem, devices))
    return best


def _ordered(problem, devices: list) -> list:
    """`devices` in an order where every edge into a forward node goes forward (any, when none exists)."""
    import networkx as nx

    where = {i: d for d, (_, ids) in enumerate(devices) for i in ids}
    q = nx.DiGraph()
    q.add_nodes_from(range(len(devices)))
    q.add_edges_from((where[u], where[v]) for u, v in problem.edges
                     if not problem.nodes[v].backward and where[u] != where[v])
    if not nx.is_directed_acyclic_graph(q):
        return devices
    return [devices[d] for d in nx.lexicographical_topological_sort(q)]


def check_placement(problem, result, *, time_limit_s: float):
    """NOTE [checked certificates] for a `solve_placement` result: the result with its certificate
    set, downgraded when the re-proof refutes it."""
    from hetpart.placement.cpsat import solve_placement_cpsat as _solve_placement_cpsat
    from hetpart.placement.problem import placement_loads

    cert = result.certificate or Certificate("none", "")
    if result.status != "OPTIMAL":
        return dataclasses.replace(result, certificate=cert)
    claimed = result.lower_bound
    slack = _REL_TOL * max(1.0, abs(claimed))
    if (problem.max_fpgas + problem.max_cpus) ** len(problem.classes()) <= BRUTE_MAX:
        route, best = "brute_force", _placement_brute_force(problem)
        bound = best[0] if best is not None else 0.0
    else:
        route = "cpsat_no_presolve"
        again = _solve_placement_cpsat(problem, time_limit_s=time_limit_s, workers=1, seed=0,
                                       params={"cp_model_presolve": False})
        bound, best = again.lower_bound, (again.max_load, again.devices)
    if best is not None and best[0] < claimed - slack:
        load, devices = best
        cert = dataclasses.replace(cert, checked_by=route, verdict="refuted", reproved_bound=bound, warning=(
            f"{route} found a placement of max load {load:.6f} below the claimed bound {claimed:.6f} of "
            f"{cert.bound_source}: OPTIMAL downgraded to FEASIBLE with the bound {min(bound, load):.6f} it proves"))
        return dataclasses.replace(result, devices=devices, loads=placement_loads(problem, devices), max_load=load,
                                   lower_bound=min(bound, load), status="FEASIBLE", certificate=cert)
    if bound >= claimed - slack:
        cert = dataclasses.replace(cert, checked_by=route, verdict="confirmed", reproved_bound=bound)
    else:
        cert = dataclasses.replace(cert, checked_by=route, verdict="unconfirmed", reproved_bound=bound, warning=(
            f"{route} proved only {bound:.6f} of the claimed {claimed:.6f} within {time_limit_s:g} s"))
    return dataclasses.replace(result, certificate=cert)
