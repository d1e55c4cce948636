"""NOTE [ideal DP]: the DP over the ideals of the graph is exact but for memory, and `solve` uses it."""

import dataclasses

import pytest

from hetpart.partitioner import Device, solve, verify_plan
from hetpart.partitioner.ideals import enumerate_ideals, ideal_dp, ideal_tables

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
    if got.plan is not None:  # it fits in memory: then it is an optimal plan
        verify_plan(p, got.plan)
        assert got.plan.bottleneck_ns == got.bound_ns == optimum
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
