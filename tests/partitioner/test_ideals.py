"""NOTE [ideal DP]: the DP over the ideals of the graph is exact but for memory, and `solve` uses it."""

import pytest

from hetpart.partitioner import Device, solve, verify_plan
from hetpart.partitioner import ideals
from hetpart.partitioner.ideals import enumerate_ideals, ideal_dp, ideal_tables

from partition_cases import (
    brute_force, constrained_problem, ideal_dp_holds, make_problem, random_problem, roomy, transformer_problem,
)


@pytest.mark.parametrize(("make", "seed"), [(random_problem, s) for s in range(60)]
                         + [(constrained_problem, s) for s in range(30)])
def test_bound_and_plan_against_brute_force(make, seed):
    """Against every plan, with tight memory, pins, and (constrained_problem) groups and forbidden types."""
    p = make(seed)
    optimum = brute_force(p)
    if optimum is None:
        return
    got = ideal_dp_holds(p, optimum)
    # With the optimum as the upper bound only a memory-relaxed plan can be below it.
    assert ideal_dp(p, optimum).bound_ns == got.bound_ns


@pytest.mark.parametrize("seed", range(40))
def test_exact_when_memory_does_not_bind(seed):
    p = roomy(random_problem(seed))
    optimum = brute_force(p)
    got = ideal_dp(p, optimum + 1)
    assert got.plan is not None and got.bound_ns == got.plan.bottleneck_ns == optimum
    verify_plan(p, got.plan)


def test_ideals_of_a_diamond():
    nodes = {v: {"time": {"g": 1}} for v in "abcd"}
    nodes["b"]["time"] = {"g": 2}  # else b and c are twins (NOTE [twin branches]), and {a, c} no ideal the DP needs
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
    assert plan.stats.ideal_seconds is not None and plan.stats.cpsat_seconds is None


def _with_free_nodes(seed, fan_out=False):
    """`random_problem` with some nodes made free (no time, memory or weights): NOTE [ideal DP free
    nodes] leaves them out of the ideals. With `fan_out`, their outputs may be larger than their
    inputs' and their inputs may have other readers (what merging into the producer could not take)."""
    p = random_problem(seed)
    g = p.graph
    for i, v in enumerate(p.node_order()):
        preds = list(g.predecessors(v))
        if i % 2 and (fan_out or len(preds) == 1) and not g.nodes[v].get("pin"):
            g.nodes[v].update({"time_ns": dict.fromkeys(g.nodes[v]["time_ns"], 0), "mem_bytes": 0, "weights": ()})
            if not fan_out:
                g.nodes[v]["out_bytes"] = min(g.nodes[v]["out_bytes"], g.nodes[preds[0]]["out_bytes"])
    return p


@pytest.mark.parametrize(("seed", "fan_out"), [(s, False) for s in range(80)] + [(s, True) for s in range(60)])
def test_free_nodes_keep_a_valid_bound_and_exact_plans(seed, fan_out):
    p = _with_free_nodes(seed, fan_out)
    optimum = brute_force(p)
    if optimum is None:
        return
    ideal_dp_holds(p, optimum)
    spacious = roomy(p)
    want = brute_force(spacious)
    got = ideal_dp(spacious, want + 1)
    assert got.bound_ns <= want and (got.plan is None or got.plan.bottleneck_ns >= want)


def test_free_nodes_leave_the_ideals_and_pay_their_fewest_bytes():
    # x -> emb, read by three free slices s0..s2 (each far smaller than emb), each read by one
    # step; the steps in a chain. Every subset of the slices is in some ideal; without them, the
    # ideals are those of the chain, and a boundary pays the slices still to be read, or emb.
    nodes = {"x": {"time": {"g": 5}, "out": 8, "pin": "first"}, "emb": {"time": {"g": 10}, "out": 3000},
             "out": {"time": {"g": 5}, "out": 8, "pin": "last"}}
    edges = [("x", "emb")]
    for t in range(3):
        nodes[f"s{t}"] = {"time": {"g": 0}, "out": 100 * (t + 1)}
        nodes[f"step{t}"] = {"time": {"g": 40}, "out": 50}
        edges += [("emb", f"s{t}"), (f"s{t}", f"step{t}")] + ([(f"step{t - 1}", f"step{t}")] if t else [])
    edges.append(("step2", "out"))
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 10**6) for i in range(3)])
    tab = ideal_tables(p, relaxed=True)
    assert sorted(tab.free) == ["s0", "s1", "s2"] and tab.n + 1 == 7  # {}, x, +emb, +step0, +step1, +step2, V
    assert len(enumerate_ideals(p)) == 18
    by_nodes = {frozenset(tab.order[i] for i in range(len(tab.order)) if s >> i & 1): k
                for k, s in enumerate(tab.ideals)}
    after_emb = by_nodes[frozenset({"x", "emb"})]
    assert tab.cut_bytes[after_emb] == 100 + 200 + 300  # the three slices, not emb's 3,000
    assert tab.cut_bytes[by_nodes[frozenset({"x", "emb", "step0"})]] == 50 + 200 + 300
    got = ideal_dp(p, 10**9)
    verify_plan(p, got.plan)
    assert got.plan.bottleneck_ns == got.bound_ns == brute_force(p)


def test_too_many_stages_leave_the_graph_to_the_solver():
    p = transformer_problem(100)
    assert ideal_dp(p, 10**12) is not None
    assert ideal_dp(p, 10**12, pairs_max=10) is None
    plan = solve(p, time_limit_s=10, ideal_pairs_max=10, run_cpsat=False)  # SolveOptions passes the limit on
    assert plan.stats.ideal_seconds is not None and plan.bounds.ideal_ns == 0


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
