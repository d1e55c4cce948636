"""NOTE [ideal DP]: the DP over the ideals of the graph is exact but for memory, and `solve` uses it."""

import dataclasses

import pytest

from hetpart.partitioner import Device, solve, verify_plan
from hetpart.partitioner import ideals
from hetpart.partitioner.ideals import contract_free_nodes, enumerate_ideals, ideal_dp, ideal_tables

from partition_cases import brute_force, constrained_problem, make_problem, random_problem, transformer_problem


def _roomy(p):
    """`p` with memory that never binds: the DP is then exact, not just a bound."""
    return dataclasses.replace(p, devices=[dataclasses.replace(d, capacity_bytes=10**12) for d in p.devices])


@pytest.mark.parametrize(("make", "seed"), [(random_problem, s) for s in range(60)]
                         + [(constrained_problem, s) for s in range(30)])
def test_bound_and_plan_against_brute_force(make, seed):
    """Against every plan, with tight memory, pins, and (constrained_problem) groups and forbidden types."""
    p = make(seed)
    optimum = brute_force(p)
    if optimum is None:
        return
    got = ideal_dp(p, optimum + 1)
    assert got is not None and got.bound_ns <= optimum
    if got.plan is not None:
        verify_plan(p, got.plan)
        assert got.plan.bottleneck_ns >= optimum  # optimal when it meets the bound
    # With the optimum as the upper bound only a memory-relaxed plan can be below it.
    assert ideal_dp(p, optimum).bound_ns == got.bound_ns


@pytest.mark.parametrize("seed", range(40))
def test_exact_when_memory_does_not_bind(seed):
    p = _roomy(random_problem(seed))
    optimum = brute_force(p)
    got = ideal_dp(p, optimum + 1)
    assert got.plan is not None and got.bound_ns == got.plan.bottleneck_ns == optimum
    verify_plan(p, got.plan)


def test_ideals_of_a_diamond():
    nodes = {v: {"time": {"g": 1}} for v in "abcd"}
    p = make_problem(nodes, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], [Device("g0", "g", "m0", 100)])
    order = p.node_order()
    got = {frozenset(order[i] for i in range(4) if s >> i & 1) for s in enumerate_ideals(p)}
    assert got == {frozenset(), frozenset("a"), frozenset("ab"), frozenset("ac"), frozenset("abc"), frozenset("abcd")}
    assert enumerate_ideals(p, limit=4) is None
    assert ideal_tables(p, limit=5) is None and ideal_tables(p) is not None


def test_solve_proves_optimal_without_cpsat_on_a_transformer():
    p = transformer_problem(100)
    plan = solve(p, time_limit_s=30, gap=0.0)
    verify_plan(p, plan)
    assert plan.solver_status == "OPTIMAL" and plan.bounds.ideal_ns == plan.bottleneck_ns
    assert "ideal_seconds" in plan.stats and "cpsat_seconds" not in plan.stats


def _with_free_nodes(seed):
    """`random_problem` with some nodes made free (no time, memory or weights) and their outputs
    no larger than their inputs: NOTE [ideal DP contraction] merges them."""
    p = random_problem(seed)
    g = p.graph
    for i, v in enumerate(p.node_order()):
        preds = list(g.predecessors(v))
        if i % 2 and len(preds) == 1 and not g.nodes[v].get("pin"):
            g.nodes[v].update({"time_ns": dict.fromkeys(g.nodes[v]["time_ns"], 0), "mem_bytes": 0, "weights": ()})
            g.nodes[v]["out_bytes"] = min(g.nodes[v]["out_bytes"], g.nodes[preds[0]]["out_bytes"])
    return p


@pytest.mark.parametrize("seed", range(80))
def test_contraction_keeps_a_valid_bound_and_exact_plans(seed):
    p = _with_free_nodes(seed)
    merged, into = contract_free_nodes(p)
    optimum = brute_force(p)
    if optimum is None:
        return
    got = ideal_dp(p, optimum + 1)
    assert got is not None and got.bound_ns <= optimum
    if got.plan is not None:
        verify_plan(p, got.plan)
        assert got.plan.bottleneck_ns >= optimum  # optimal when it meets the bound
    roomy = _roomy(p)
    want = brute_force(roomy)
    got = ideal_dp(roomy, want + 1)
    assert got.bound_ns <= want and (got.plan is None or got.plan.bottleneck_ns == want)


def test_contraction_merges_free_chains_into_their_producer():
    nodes = {"x": {"time": {"g": 5}, "out": 100, "pin": "first"}, "lin": {"time": {"g": 50}, "out": 400},
             "view": {"time": {"g": 0}, "out": 400}, "t": {"time": {"g": 0}, "out": 300},
             "out": {"time": {"g": 50}, "out": 10, "pin": "last"}}
    edges = [("x", "lin"), ("lin", "view"), ("view", "t"), ("t", "out")]
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 10**6) for i in range(3)])
    merged, into = contract_free_nodes(p)
    assert sorted(merged.graph.nodes) == ["lin", "out", "x"] and into["t"] == into["view"] == "lin"
    assert merged.graph.nodes["lin"]["out_bytes"] == 300 and p.graph.nodes["lin"]["out_bytes"] == 400
    got = ideal_dp(p, 10**9)
    verify_plan(p, got.plan)
    assert got.plan.bottleneck_ns == got.bound_ns == brute_force(p)


def test_deadline_proves_nothing():
    import time

    p = transformer_problem(100)
    assert ideal_dp(p, 10**12, deadline=time.perf_counter() - 1) is None


@pytest.mark.parametrize("seed", range(40))
def test_bisection_from_a_lower_bound_finds_the_same_optimum(seed):
    # NOTE [ideal DP bisection]: from any valid lower bound, the same answer.
    p = _with_free_nodes(seed)
    optimum = brute_force(p)
    if optimum is None:
        return
    once = ideal_dp(p, optimum + 1)
    for lower in (1, optimum // 2, once.bound_ns):
        got = ideal_dp(p, optimum + 1, lower_ns=lower)
        assert got.bound_ns == once.bound_ns and (got.plan is None) == (once.plan is None)


def test_a_gap_stops_the_bisection_with_a_certified_plan(monkeypatch):
    # NOTE [ideal DP bisection]: from a plan twice the optimum, 29 decisions to the optimum; 8 to 1%.
    decisions = []
    chain_below = ideals._Decider.chain_below
    monkeypatch.setattr(ideals._Decider, "chain_below", lambda *a: decisions.append(1) or chain_below(*a))
    p = transformer_problem(100)
    exact = ideal_dp(p, 10**12)
    optimum = exact.plan.bottleneck_ns
    assert exact.bound_ns == optimum
    decisions.clear()
    got = ideal_dp(p, 2 * optimum, gap=0.01)
    verify_plan(p, got.plan)
    assert got.bound_ns <= optimum <= got.plan.bottleneck_ns
    assert got.plan.bottleneck_ns - got.bound_ns <= 0.01 * got.plan.bottleneck_ns
    assert 0 < len(decisions) <= 12
