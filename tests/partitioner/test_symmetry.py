"""NOTE [twin branches]: ordering identical parallel branches keeps an optimal plan, and the DP of ideals uses it."""

import pytest

from hetpart.partitioner import Device, solve, verify_plan
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.ideals import _without_free_nodes, enumerate_ideals, ideal_dp, ideal_tables
from hetpart.partitioner.symmetry import twin_order

from partition_cases import (
    ideal_dp_holds, make_problem, roomy, twin_problem, valid_plans,
)


def _sorted(pairs, stage_of):
    """The plan with every pair (u, w) sorted, min to u, until nothing moves (NOTE [twin branches])."""
    stage_of = dict(stage_of)
    for _ in range(100):
        moved = False
        for u, w in pairs:
            if stage_of[u] > stage_of[w]:
                stage_of[u], stage_of[w] = stage_of[w], stage_of[u]
                moved = True
        if not moved:
            return stage_of
    raise AssertionError("sorting the twins does not settle")


@pytest.mark.parametrize("seed", range(60))
def test_sorting_twins_keeps_every_plan_valid_and_no_slower(seed):
    """The lemma itself, on every plan: the sorted plan is valid, has the same memory and is no slower."""
    p = twin_problem(seed)
    pairs = twin_order(p)
    for stage_of, devices, stages in valid_plans(p):
        moved = _sorted(pairs, stage_of)
        if moved == stage_of:
            continue
        assert all(moved[u] <= moved[w] for u, w in p.graph.edges)
        after = evaluate(p, moved, devices)
        assert [s.memory_bytes for s in after] == [s.memory_bytes for s in stages]
        assert bottleneck_ns(after) <= bottleneck_ns(stages)


def _optima(p):
    """brute_force(p) and brute_force(roomy(p)) from one enumeration: the two problems differ only in
    capacity, so p's valid plans are roomy(p)'s whose stages fit p's memory. Each enumeration was half of
    this test's time; the pair agreed with `brute_force` on all 80 seeds (docs/benchmarks.md, suite3)."""
    capacity = {d.name: d.capacity_bytes for d in p.devices}
    tight = spacious = None
    for _, devices, stages in valid_plans(roomy(p)):
        value = bottleneck_ns(stages)
        spacious = value if spacious is None else min(spacious, value)
        if all(s.memory_bytes <= capacity[d] for s, d in zip(stages, devices)):
            tight = value if tight is None else min(tight, value)
    return tight, spacious


@pytest.mark.parametrize("seed", range(80))
def test_ideal_dp_with_twins_against_brute_force(seed):
    p = twin_problem(seed)
    optimum, want = _optima(p)
    if optimum is not None:
        ideal_dp_holds(p, optimum)
    spacious = roomy(p)  # memory never binds: the DP is exact, twins ordered or not
    got = ideal_dp(spacious, want + 1)
    assert got.plan is not None and got.bound_ns == got.plan.bottleneck_ns == want


def _moe(experts: int = 3):
    """x -> router -> gates; each expert silu(x W_g) * (x W_u) -> W_d, times its free slice of the
    gates; the products summed in order (zoo:moe's layer, NOTE [dense expert dispatch])."""
    t = {"g": 10}
    nodes = {"x": {"time": t, "out": 64, "pin": "first"}, "router": {"time": t, "out": 8},
             "out": {"time": t, "out": 64, "pin": "last"}}
    edges = [("x", "router")]
    weights = {}
    for e in range(experts):
        for k in ("gate", "up", "down"):
            weights[f"{k}{e}"] = 100
            nodes[f"{k}{e}"] = {"time": {"g": 30}, "out": 128 if k != "down" else 64, "weights": (f"{k}{e}",)}
        nodes[f"silu{e}"] = {"time": t, "out": 128}
        nodes[f"mul{e}"] = {"time": t, "out": 128}
        nodes[f"slice{e}"] = {"time": {"g": 0}, "out": 2}
        nodes[f"prod{e}"] = {"time": t, "out": 64}
        edges += [("x", f"gate{e}"), ("x", f"up{e}"), (f"gate{e}", f"silu{e}"), (f"silu{e}", f"mul{e}"),
                  (f"up{e}", f"mul{e}"), (f"mul{e}", f"down{e}"), ("router", f"slice{e}"),
                  (f"slice{e}", f"prod{e}"), (f"down{e}", f"prod{e}")]
    for e in range(1, experts):
        nodes[f"sum{e}"] = {"time": t, "out": 64}
        edges += [(f"sum{e - 1}" if e > 1 else "prod0", f"sum{e}"), (f"prod{e}", f"sum{e}")]
    edges.append((f"sum{experts - 1}", "out"))
    devices = [Device(f"g{i}", "g", "m0", 10**6) for i in range(4)]
    return make_problem(nodes, edges, devices, weights=weights)


def test_experts_are_ordered_by_their_sum_and_gate_before_up():
    p = _moe()
    got = set(twin_order(p))
    positions = ("gate", "up", "silu", "mul", "down", "slice", "prod")
    experts = {(f"{k}{e}", f"{k}{e + 1}") for e in range(2) for k in positions}
    assert got == experts | {(f"gate{e}", f"up{e}") for e in range(3)}
    core, _ = _without_free_nodes(p)
    before = [(u, w) for u, w in got if u in core.graph and w in core.graph]
    fewer = enumerate_ideals(core, 10**6, before=before)
    assert len(fewer) < len(enumerate_ideals(core, 10**6)) // 4
    assert ideal_tables(p, relaxed=True).n + 1 == len(fewer)  # the DP runs over these


def test_the_ideal_dp_with_twins_is_exact_on_the_experts():
    """Against CP-SAT's proven optimum over every plan (the experts' graph is too big for brute force)."""
    p = _moe()
    got = ideal_dp(p, 10**9)
    verify_plan(p, got.plan)
    cpsat = solve(p, time_limit_s=60, run_ideal_dp=False)
    assert cpsat.solver_status == "OPTIMAL"
    assert got.bound_ns == got.plan.bottleneck_ns == cpsat.bottleneck_ns


@pytest.mark.parametrize("differ", ["readers_apart", "other_input", "other_size"])
def test_no_order_where_the_branches_differ(differ):
    """x -> a -> ra -> z1 and x -> b -> rb -> z2 (z1, z2 unlike): ordered only when z2 comes after
    z1 (NOTE [twin branches]' (V) and (B)), and the branches read the same inputs and cost the same."""
    t = {"g": 10}
    nodes = {v: {"time": t, "out": 8} for v in ("x", "a", "b", "ra", "rb")}
    nodes |= {"z1": {"time": {"g": 10}, "out": 4}, "z2": {"time": {"g": 20}, "out": 4}}
    edges = [("x", "a"), ("x", "b"), ("a", "ra"), ("b", "rb"), ("ra", "z1"), ("rb", "z2")]
    devices = [Device("g0", "g", "m0", 10**6)]
    assert twin_order(make_problem(nodes, edges, devices)) == []
    edges.append(("z1", "z2"))
    assert twin_order(make_problem(nodes, edges, devices)) == [("a", "b"), ("ra", "rb")]
    if differ == "other_input":
        nodes["y"] = {"time": t, "out": 8}
        edges += [("x", "y"), ("y", "b")]
    if differ == "other_size":
        nodes["rb"] = {"time": t, "out": 16}
    want = [] if differ != "readers_apart" else [("a", "b"), ("ra", "rb")]
    assert twin_order(make_problem(nodes, edges, devices)) == want


def test_a_reader_outside_one_branch_only_keeps_the_branches_unordered():
    """(B) of NOTE [twin branches]: p0 -> q0 and p1 -> q1 are alike, but p0 is also read by e. Putting
    p0 first makes p0's value cross the boundaries up to e, so a plan with p1 first can be faster."""
    t = {"g": 10}
    nodes = {v: {"time": t, "out": 1000 if v.startswith("p") else 1} for v in ("x", "p0", "p1", "q0", "q1", "e", "z")}
    edges = [("x", "p0"), ("x", "p1"), ("p0", "q0"), ("p1", "q1"), ("p0", "e"), ("q0", "z"), ("q1", "z"), ("e", "z")]
    nodes["e"]["out"] = 2  # no twin of q0
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 10**6) for i in range(3)])
    assert twin_order(p) == []
    plan = {"x": 0, "p1": 0, "q1": 0, "p0": 1, "q0": 1, "e": 2, "z": 2}
    first = evaluate(p, plan, ["g0", "g1", "g2"])
    swapped = evaluate(p, _sorted([("p0", "p1"), ("q0", "q1")], plan), ["g0", "g1", "g2"])
    assert bottleneck_ns(swapped) > bottleneck_ns(first)


def test_the_search_stops_at_its_budget(monkeypatch):
    from hetpart.partitioner import symmetry

    assert twin_order(_moe())
    monkeypatch.setattr(symmetry, "_WORK_PER_NODE", 0)
    assert twin_order(_moe()) == []
