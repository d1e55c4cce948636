"""Co-location groups and forbidden device types: solvers against brute force, the verifier, the errors."""

import dataclasses
import random

import networkx as nx
import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import FORBIDDEN_TYPES, Device, dp_hint, solve, verify_plan
from hetpart.partitioner.baselines import plan_from_stages
from hetpart.partitioner.constraints import closure, conflicts
from hetpart.partitioner.verify import plan_violations

from partition_cases import brute_force, chain, constrained_problem, make_problem


@pytest.mark.parametrize("seed", range(30))
def test_solve_matches_brute_force_with_groups_and_forbidden_types(seed):
    p = constrained_problem(seed)
    want = brute_force(p)
    if want is None:
        with pytest.raises(HetpartError, match="no plan"):
            solve(p, time_limit_s=10)
        return
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    assert plan.bottleneck_ns == want == plan.lower_bound_ns and plan.solver_status == "OPTIMAL"
    dp = dp_hint(p)
    if dp is not None:
        verify_plan(p, dp)
        assert dp.bottleneck_ns >= want


def test_cases_cover_groups_forbidden_and_both_outcomes():
    cases = [constrained_problem(s) for s in range(30)]
    grouped = sum(bool(p.colocation_groups()) for p in cases)
    forbidding = sum(any(a.get(FORBIDDEN_TYPES) for _, a in p.graph.nodes(data=True)) for p in cases)
    solved = sum(brute_force(p) is not None for p in cases)
    assert grouped >= 10 and forbidding >= 10 and 5 <= solved < 30


def test_group_pulls_the_nodes_between_its_members_into_its_stage():
    # a -> b -> c with a and c tied: b must share their stage, so one stage runs all three.
    nodes, edges = chain(3, {"g": 10})
    nodes["op0"]["colocate"] = nodes["op2"]["colocate"] = "tied"
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 100), Device("g1", "g", "m0", 100)])
    plan = solve(p, time_limit_s=5)
    assert len(set(plan.stage_of.values())) == 1 and plan.bottleneck_ns == 30 == brute_force(p)


def test_forbidden_type_moves_the_op_to_the_slow_device():
    nodes, edges = chain(2, {"fast": 1, "slow": 50})
    nodes["op1"]["forbidden"] = ("fast",)
    p = make_problem(nodes, edges, [Device("f", "fast", "m0", 100), Device("s", "slow", "m0", 100)])
    plan = solve(p, time_limit_s=5)
    verify_plan(p, plan)
    assert plan.device_of_stage[plan.stage_of["op1"]] == "s" and plan.bottleneck_ns == brute_force(p) == 50


def test_op_no_device_type_can_run_is_named():
    nodes, edges = chain(2, {"a": 1, "b": 1})
    nodes["op1"]["forbidden"] = ("a", "b")
    p = make_problem(nodes, edges, [Device("x", "a", "m0", 100), Device("y", "b", "m0", 100)])
    with pytest.raises(HetpartError, match=r"node 'op1' cannot run on any device type of the cluster"):
        solve(p)


def test_group_with_no_common_type_names_the_group_and_the_ops():
    nodes, edges = chain(3, {"a": 1, "b": 1})
    nodes["op0"].update(colocate="g", forbidden=("a",))
    nodes["op2"].update(colocate="g", forbidden=("b",))
    p = make_problem(nodes, edges, [Device("x", "a", "m0", 100), Device("y", "b", "m0", 100)])
    msg = "; ".join(conflicts(p))
    assert "co-location group 'g'" in msg and "'op1'" in msg and "no device type can run all of them" in msg
    assert "'op0' forbids ['a']" in msg and "'op2' forbids ['b']" in msg
    with pytest.raises(HetpartError, match="co-location group 'g'"):
        solve(p)


def test_group_too_big_for_any_device_says_how_big():
    nodes, edges = chain(2, {"g": 1}, mem=60)
    nodes["op0"]["colocate"] = nodes["op1"]["colocate"] = "g"
    p = make_problem(nodes, edges, [Device("x", "g", "m0", 100), Device("y", "g", "m0", 100)])
    with pytest.raises(HetpartError, match=r"co-location group 'g'.*needs 120 bytes in one stage.*'x'.*100 bytes"):
        solve(p)


def test_verifier_rejects_split_group_and_forbidden_type():
    nodes, edges = chain(2, {"a": 1, "b": 1})
    nodes["op0"]["colocate"] = nodes["op1"]["colocate"] = "g"
    nodes["op1"]["forbidden"] = ("b",)
    p = make_problem(nodes, edges, [Device("x", "a", "m0", 100), Device("y", "b", "m0", 100)])
    bad = plan_from_stages(p, {"op0": 0, "op1": 1}, ["x", "y"])
    got = plan_violations(p, bad)
    assert "co-location group 'g' is split over stages [0, 1]: ['op0', 'op1']" in got
    assert "node 'op1' runs on 'y' of type 'b', which it forbids" in got
    good = plan_from_stages(p, {"op0": 0, "op1": 0}, ["x"])
    assert plan_violations(p, good) == []


@pytest.mark.parametrize("seed", range(40))
def test_closure_matches_every_path_between_members(seed):
    # NOTE [co-location closure] against its definition: the members and each node on a path between two of them.
    rng = random.Random(seed)
    n = rng.randint(2, 14)
    nodes, _ = chain(n, {"g": 1})
    names = list(nodes)
    edges = [(names[i], names[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.25]
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 100)])
    members = rng.sample(names, rng.randint(1, min(4, n)))
    g = p.graph
    want = set(members) | {v for u in members for w in members if u != w
                           for v in nx.descendants(g, u) & nx.ancestors(g, w)}
    assert closure(p, members) == want


class _CountingDiGraph(nx.DiGraph):
    """A DiGraph that counts the neighbours it is asked for."""

    asked = 0

    def successors(self, n):
        type(self).asked += 1
        return super().successors(n)

    neighbors = successors

    def predecessors(self, n):
        type(self).asked += 1
        return super().predecessors(n)


def test_groups_check_walks_each_group_window_not_the_whole_graph():
    # 1,000 groups of two neighbours on a chain of 2,000 ops: each group's closure lies between its members
    # (NOTE [co-location closure]), so the check asks for a few neighbours per op, where walking each member's
    # descendants and ancestors asked for 2 million (the 405B-shaped model's 253 TP groups: 20-30 s before
    # any solver ran, whatever --time-limit said).
    nodes, edges = chain(2_000, {"g": 1})
    for i, v in enumerate(nodes):
        nodes[v]["colocate"] = f"pair{i // 2}"
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 10**6), Device("g1", "g", "m0", 10**6)])
    p = dataclasses.replace(p, graph=_CountingDiGraph(p.graph))
    _CountingDiGraph.asked = 0
    assert conflicts(p) == []
    assert _CountingDiGraph.asked <= 4 * 2_000
