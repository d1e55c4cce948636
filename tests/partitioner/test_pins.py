"""Pins (NOTE [pins] in problem.py): what they allow, and every solver path on pinned problems against a
brute force. `pinned_problem` pins nodes anywhere (not only the graph's ends), costly nodes last too."""

from __future__ import annotations

import itertools
import math

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import PIN, PIN_FIRST, PIN_LAST, Device, Link, Plan, solve, verify_plan
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate, objective_ns
from hetpart.partitioner.infeasible import NoPlan
from hetpart.partitioner.verify import plan_violations

from certificate_fuzz import partition_paths, unsound
from partition_cases import brute_force, make_problem, pinned_problem

PINNED_PROBLEMS = 120  # partition_paths on each (about 6 s on the quiet machine)
OBJECTIVE_PROBLEMS = 80  # solve's latency and iteration objectives on each
RULE_PROBLEMS = 200  # the last-stage rule against plans that break it (those of up to 3 devices and 5 nodes)
# Forced coarsening (NOTE [coarsened solve]): windows of seeds around the five of 0..1999 where, before the
# fallback to the problem itself, `solve` said "no plan found ... raise --time-limit" while a plan exists.
COARSE_SEEDS = [*range(645, 665), *range(1600, 1615), *range(1775, 1790), *range(1915, 1960)]


def chain_problem(pin_c: bool):
    """a -> b -> c on three devices of one machine, a pinned first; c pinned last, or read by a free node
    "out" pinned last."""
    nodes = {"a": {"time": {"g": 500}, "out": 50, "pin": PIN_FIRST}, "b": {"time": {"g": 400}, "out": 50},
             "c": {"time": {"g": 500}, **({"pin": PIN_LAST} if pin_c else {"out": 8})}}
    edges = [("a", "b"), ("b", "c")]
    if not pin_c:
        nodes["out"] = {"time": {"g": 0}, "pin": PIN_LAST}
        edges.append(("c", "out"))
    devices = [Device(f"d{i}", "g", "m0", 1000) for i in range(3)]
    return make_problem(nodes, edges, devices, intra=Link(1000, 20))


def test_a_node_pinned_last_never_makes_a_stage_of_its_own():
    p = chain_problem(pin_c=True)
    apart = {"a": 0, "b": 1, "c": 2}
    stages = evaluate(p, apart, ["d0", "d1", "d2"])
    three = Plan(stage_of=apart, device_of_stage=["d0", "d1", "d2"], stages=stages,
                 bottleneck_ns=bottleneck_ns(stages), lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
    # a | b | c is faster than any valid plan, but its last stage holds only c, which is pinned last.
    assert three.bottleneck_ns == 570
    assert plan_violations(p, three) == ["stages [2] hold no node (other than nodes pinned 'last')"]
    plan = solve(p, time_limit_s=10, check_certificate=True)
    assert plan.solver_status == "OPTIMAL" and len(plan.stages) == 2
    assert plan.bottleneck_ns == plan.lower_bound_ns == brute_force(p) == 970 > three.bottleneck_ns
    # The way NOTE [pins] gives: c unpinned, a free node reading it pinned last.
    free = solve(chain_problem(pin_c=False), time_limit_s=10, check_certificate=True)
    assert free.solver_status == "OPTIMAL" and free.bottleneck_ns == 570  # (c and "out" share a stage)
    assert free.stage_of == {"a": 0, "b": 1, "c": 2, "out": 2}


def rule_breaking_optimum(p, objective: str, microbatches: int) -> int | None:
    """The brute-force optimum over the plans that keep every rule but the third of NOTE [pins] (their last
    stage may hold only nodes pinned last), or None when none fits."""
    g, nodes = p.graph, list(p.graph.nodes)
    best = None
    for S in range(1, min(p.max_stages or len(p.devices), len(p.devices)) + 1):
        allowed = f"stages [{S - 1}] hold no node (other than nodes pinned 'last')"
        for assign in itertools.product(range(S), repeat=len(nodes)):
            stage_of = dict(zip(nodes, assign))
            if any(stage_of[u] > stage_of[v] for u, v in g.edges) or set(assign) != set(range(S)):
                continue
            for devs in itertools.permutations([d.name for d in p.devices], S):
                stages = evaluate(p, stage_of, list(devs))
                plan = Plan(stage_of=stage_of, device_of_stage=list(devs), stages=stages,
                            bottleneck_ns=bottleneck_ns(stages), lower_bound_ns=0, solver_status="FEASIBLE",
                            solve_seconds=0.0)
                if set(plan_violations(p, plan)) <= {allowed}:
                    value = objective_ns(stages, objective, microbatches)
                    best = value if best is None else min(best, value)
    return best


def free_pinned_last(p):
    """`p` with every node pinned last made free, as lowering makes the FX output node (NOTE [pins])."""
    for v, attrs in p.graph.nodes(data=True):
        if attrs.get(PIN) == PIN_LAST:
            attrs.update(time_ns=dict.fromkeys(attrs["time_ns"], 0), mem_bytes=0, out_bytes=0, weights=())
    return p


def test_the_last_stage_rule_costs_nothing_when_nodes_pinned_last_are_free():
    binds, compared = 0, 0
    for seed in range(RULE_PROBLEMS):
        p = pinned_problem(seed)
        if len(p.devices) > 3 or p.graph.number_of_nodes() > 5:
            continue
        objective = ("throughput", "latency", "iteration")[seed % 3]
        # Costly nodes pinned last: the rule may forbid the best plan (the chain above)...
        relaxed, optimum = rule_breaking_optimum(p, objective, 3), brute_force(p, objective, 3)
        assert relaxed is None or optimum is None or relaxed <= optimum
        binds += relaxed is not None and (optimum is None or relaxed < optimum)
        # ...free ones never: a plan breaking it is never better than the best one keeping it.
        free = free_pinned_last(p)
        assert rule_breaking_optimum(free, objective, 3) == brute_force(free, objective, 3), seed
        compared += 1
    assert binds >= 5 and compared >= RULE_PROBLEMS // 3


def test_pinned_problems_every_path_against_the_brute_force():
    wrong, feasible, inner_first, inner_last, four, training = [], 0, 0, 0, 0, 0
    for seed in range(PINNED_PROBLEMS):
        p = pinned_problem(seed)
        g = p.graph
        inner_first += any(a.get(PIN) == PIN_FIRST and g.in_degree(v) for v, a in g.nodes(data=True))
        inner_last += any(a.get(PIN) == PIN_LAST and g.out_degree(v) for v, a in g.nodes(data=True))
        four += len(p.devices) == 4
        training += p.training is not None
        optimum = brute_force(p)
        optimum = math.inf if optimum is None else float(optimum)
        feasible += math.isfinite(optimum)
        for path, result in partition_paths(p).items():
            if why := unsound(result, optimum, 1e-6):
                wrong.append(f"seed {seed} {path}: {why}")
    assert wrong == []
    assert feasible >= PINNED_PROBLEMS * 3 // 4 and inner_first >= 20 and inner_last >= 20
    assert four >= 20 and training >= 20


def test_pinned_problems_latency_and_iteration_against_the_brute_force():
    wrong, optimal = [], 0
    for seed in range(OBJECTIVE_PROBLEMS):
        p = pinned_problem(seed)
        objective, microbatches = ("latency", 1) if seed % 2 else ("iteration", 1 + seed % 4)
        optimum = brute_force(p, objective, microbatches)
        try:
            plan = solve(p, time_limit_s=10, objective=objective, microbatches=microbatches, check_certificate=False)
        except HetpartError as e:
            if optimum is not None:
                wrong.append(f"seed {seed}: no plan ({str(e).splitlines()[0]}), the optimum is {optimum}")
            continue
        verify_plan(p, plan)
        if optimum is None or plan.value_ns < optimum or plan.lower_bound_ns > optimum:
            wrong.append(f"seed {seed}: plan {plan.value_ns}, bound {plan.lower_bound_ns}, optimum {optimum}")
        elif plan.solver_status == "OPTIMAL" and plan.value_ns > optimum:
            wrong.append(f"seed {seed}: claims optimal at {plan.value_ns}, the optimum is {optimum}")
        optimal += plan.solver_status == "OPTIMAL"
    assert wrong == []
    assert optimal >= OBJECTIVE_PROBLEMS // 2


def test_pinned_problems_with_forced_coarsening_against_the_brute_force():
    # Coarse runs of 2-3 nodes are too coarse for the only (non-contiguous) plans of some problems, or a run
    # was pinned first and last: the coarse problem having no plan proves nothing, `solve` must go on.
    wrong, fell_back, infeasible = [], 0, 0
    for seed in COARSE_SEEDS:
        p = pinned_problem(seed)
        objective, microbatches = ("throughput", 1) if seed % 3 else (("latency", 1), ("iteration", 3))[seed % 2]
        optimum = brute_force(p, objective, microbatches)
        for coarse_nodes, ideal in ((2, True), (3, False)):
            try:
                plan = solve(p, time_limit_s=10, coarsen_above=2, coarse_nodes=coarse_nodes, run_ideal_dp=ideal,
                             objective=objective, microbatches=microbatches, check_certificate=False)
            except HetpartError as e:
                # No plan: proven so (the infeasibility explanations), never "raise --time-limit".
                if optimum is not None or not isinstance(e, NoPlan) or "--time-limit" in str(e):
                    wrong.append(f"seed {seed}/{coarse_nodes}: {str(e).splitlines()[0]}, the optimum is {optimum}")
                infeasible += 1
                continue
            verify_plan(p, plan)
            fell_back += "on the problem itself" in plan.bounds.search
            if optimum is None or plan.lower_bound_ns > optimum or plan.value_ns < optimum:
                wrong.append(f"seed {seed}/{coarse_nodes}: plan {plan.value_ns}, bound {plan.lower_bound_ns}, "
                             f"optimum {optimum}")
            elif plan.solver_status == "OPTIMAL" and plan.value_ns > optimum:
                wrong.append(f"seed {seed}/{coarse_nodes}: claims optimal at {plan.value_ns}, the optimum is {optimum}")
    assert wrong == []
    assert fell_back >= 5 and infeasible >= 10


def test_no_plan_without_cpsat_says_a_longer_limit_does_not_help():
    # Seed 655: only non-contiguous plans fit, which the DP cannot find; CP-SAT finds one.
    p = pinned_problem(655)
    assert solve(p, time_limit_s=10, check_certificate=False).value_ns == brute_force(p)
    with pytest.raises(HetpartError, match="switched off") as e:
        solve(p, time_limit_s=10, run_cpsat=False, check_certificate=False)
    assert "a longer --time-limit does not change that" in str(e.value)
