from collections import Counter

import numpy as np
import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import Device, Link, dp_hint, solve, verify_plan

from partition_cases import brute_force, chain, make_problem, random_large, random_problem

CHEAP = Link(100_000, 0)  # 100 bytes in 1 ns


def _sizes(plan):
    return sorted(Counter(plan.stage_of.values()).values())


def test_chain_of_four_on_two_identical_devices_splits_two_and_two():
    nodes, edges = chain(4, {"g": 10}, out=100)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 1000), Device("g1", "g", "m0", 1000)], intra=CHEAP)
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    assert plan.stage_of == {"op0": 0, "op1": 0, "op2": 1, "op3": 1}
    assert plan.device_of_stage == ["g0", "g1"]  # interchangeable devices in list order
    assert plan.bottleneck_ns == 21 and plan.lower_bound_ns == 21 and plan.solver_status == "OPTIMAL"
    assert plan.gap == 0.0


def test_three_times_faster_device_gets_three_times_the_work():
    nodes, edges = chain(8, {"fast": 10, "slow": 30})
    p = make_problem(nodes, edges, [Device("s", "slow", "m0", 1000), Device("f", "fast", "m0", 1000)], intra=CHEAP)
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    work = {s.device: len(s.nodes) for s in plan.stages}
    assert work == {"f": 6, "s": 2} and plan.bottleneck_ns == 60


def test_expensive_comm_keeps_one_stage():
    nodes, edges = chain(3, {"g": 10}, out=1_000_000)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 1000), Device("g1", "g", "m1", 1000)],
                     network=Link(1000, 50_000))
    plan = solve(p, time_limit_s=10)
    assert len(plan.device_of_stage) == 1 and plan.bottleneck_ns == 30 and plan.solver_status == "OPTIMAL"


def test_skip_value_pays_twice_in_the_solution():
    # Memory allows one of a, b, c per device, so the plan is {a} {b} {c, d} and a's
    # output crosses both boundaries on its way to d.
    nodes = {v: {"time": {"g": 10}, "out": out, "mem": mem}
             for v, out, mem in [("a", 1000, 10), ("b", 100, 10), ("c", 100, 10), ("d", 0, 0)]}
    p = make_problem(nodes, [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")],
                     [Device(f"g{i}", "g", "m0", 10) for i in range(3)])
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    assert plan.stage_of == {"a": 0, "b": 1, "c": 2, "d": 2}
    assert plan.stages[2].comm_in_ns == 1100  # a (1000 bytes) and b (100 bytes) cross boundary 1
    assert plan.bottleneck_ns == 10 + 1000 + 1100 == brute_force(p)


def test_memory_forces_a_split_despite_comm():
    nodes, edges = chain(2, {"g": 10}, out=1000, mem=60)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 100), Device("g1", "g", "m1", 100)],
                     network=Link(1, 1_000_000))
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    assert len(plan.device_of_stage) == 2 and plan.bottleneck_ns == 10 + 1_000_000 + 1_000_000


def test_weight_shared_by_two_nodes_fits_once():
    nodes = {v: {"time": {"g": 5}, "mem": 2, "weights": ["w"]} for v in "ab"}
    p = make_problem(nodes, [("a", "b")], [Device("g0", "g", "m0", 60)], weights={"w": 50})
    plan = solve(p, time_limit_s=10)
    assert plan.stages[0].memory_bytes == 54 and plan.bottleneck_ns == 10


def test_pins_first_and_last():
    nodes, edges = chain(4, {"g": 10})
    nodes["op0"]["pin"] = "first"
    nodes["op3"]["pin"] = "last"
    nodes["x"] = {"time": {"g": 25}, "pin": "last"}  # an output with no inputs: still in the last stage
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 1000) for i in range(3)], intra=CHEAP)
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    last = len(plan.device_of_stage) - 1
    assert plan.stage_of["op0"] == 0 and plan.stage_of["op3"] == last == plan.stage_of["x"]
    assert plan.bottleneck_ns == brute_force(p)


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force_on_random_small_dags(seed):
    p = random_problem(seed)
    want = brute_force(p)
    if want is None:
        with pytest.raises(HetpartError, match="no plan fits in memory"):
            solve(p, time_limit_s=10)
        return
    plan = solve(p, time_limit_s=10)
    verify_plan(p, plan)
    assert plan.solver_status == "OPTIMAL"
    assert plan.bottleneck_ns == want == plan.lower_bound_ns
    dp = dp_hint(p)
    assert dp is None or dp.bottleneck_ns >= want


def test_brute_force_cases_cover_infeasible_and_pins():
    kinds = Counter()
    for seed in range(20):
        p = random_problem(seed)
        kinds["infeasible"] += brute_force(p) is None
        kinds["pinned"] += any(a.get("pin") for _, a in p.graph.nodes(data=True))
        kinds["multi-stage"] += (p.max_stages or 3) > 1
    assert kinds["infeasible"] > 0 and kinds["pinned"] > 0 and kinds["multi-stage"] > 0


def test_deterministic():
    p = random_large(7, 40)
    a = solve(p, time_limit_s=5, seed=3)
    b = solve(p, time_limit_s=5, seed=3)
    assert a.stage_of == b.stage_of and a.device_of_stage == b.device_of_stage
    verify_plan(p, a)


def test_user_hint_with_swapped_interchangeable_devices():
    nodes, edges = chain(4, {"g": 10}, out=100)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 1000), Device("g1", "g", "m0", 1000)], intra=CHEAP)
    hint = solve(p, time_limit_s=5)
    hint.slot_of_stage = ["g1", "g0"]
    plan = solve(p, time_limit_s=5, hint=hint)
    assert plan.bottleneck_ns == 21 and plan.solver_status == "OPTIMAL"


def test_log_callback_sees_solutions():
    seen = []
    p = random_large(3, 30)
    plan = solve(p, time_limit_s=5, log_callback=lambda obj, bound: seen.append((obj, bound)), run_ideal_dp=False)
    assert seen and all(bound <= obj for obj, bound in seen)
    assert seen[-1][0] >= plan.bottleneck_ns


def test_infeasible_memory_explains_with_numbers():
    nodes, edges = chain(3, {"g": 10}, mem=40)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 50), Device("g1", "g", "m0", 50)])
    with pytest.raises(HetpartError) as err:
        solve(p, time_limit_s=5)
    msg = str(err.value)
    assert "no plan fits in memory" in msg and "120 bytes" in msg and "total device memory: 100 bytes" in msg


def test_node_larger_than_every_device():
    nodes, edges = chain(2, {"g": 10}, mem=10)
    nodes["op1"]["weights"] = ["big"]
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 50)], weights={"big": 100})
    with pytest.raises(HetpartError, match="largest single node: 'op1' needs 110 bytes"):
        solve(p)


def test_time_limit_zero_raises():
    nodes, edges = chain(2, {"g": 10})
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 50)])
    with pytest.raises(HetpartError, match="time limit"):
        solve(p, time_limit_s=0)


def test_invalid_problem_raises_listing_what_is_wrong():
    nodes, edges = chain(2, {"g": 10})
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 50), Device("g1", "h", "m0", 50)])
    with pytest.raises(HetpartError, match=r"node 'op0' has no time_ns for device type\(s\) \['h'\]"):
        solve(p)


def test_dp_hint_on_500_nodes():
    # Its time: benchmarks/solve_speed.py.
    p = random_large(0, 500, num_devices=4)
    plan = dp_hint(p)
    verify_plan(p, plan)
    assert len(plan.device_of_stage) >= 2


def test_no_search_falls_back_to_dp_plan():
    p = random_large(5, 30)
    plan = solve(p, time_limit_s=1, run_cpsat=False, run_ideal_dp=False)
    verify_plan(p, plan)
    assert plan.stats.cpsat_seconds is None and plan.stats.plan_from == "dp"
    # The solver proved nothing; the search-free bounds (bounds.py) still hold.
    assert plan.solver_status == "FEASIBLE" and plan.bounds.solver_ns == 0
    assert 0 < plan.lower_bound_ns == plan.bounds.lower_bound_ns < plan.bottleneck_ns
    assert plan.bottleneck_ns == dp_hint(p).bottleneck_ns


def test_no_search_and_no_dp_plan_says_a_longer_limit_does_not_help():
    # Nothing searched: a longer limit changes nothing (it said "raise --time-limit").
    with pytest.raises(HetpartError, match="switched off .* so is the DP .* does not change that"):
        solve(random_large(5, 30), time_limit_s=1, run_dp=False, run_cpsat=False)


def test_dp_coarsens_many_distinct_devices_and_stays_valid():
    p = random_large(2, 300, num_devices=8)  # 8 distinct (type, machine) classes; its time: benchmarks/solve_speed.py
    plan = dp_hint(p)
    assert plan.stats["dp_exact"] == 0.0
    verify_plan(p, plan)


def test_dp_stops_at_its_deadline_with_the_list_order_plan():
    from hetpart.partitioner.dp import list_order_segments, order_tables

    p = random_large(3, 200, num_devices=4)
    full = dp_hint(p)
    assert full.stats["dp_timed_out"] == 0.0 and full.stats["dp_exact"] == 1.0
    cut = dp_hint(p, time_limit_s=1e-9)  # past the deadline before the first state
    verify_plan(p, cut)
    assert cut.stats["dp_timed_out"] == 1.0 and cut.stats["dp_exact"] == 0.0
    tab = order_tables(p)
    listed = list_order_segments(p, tab, np.arange(tab.n + 1), refine=False)
    # Past its deadline the list order tries no longer prefix once one fits (here the first device).
    assert cut.device_of_stage == listed.devices[:len(cut.device_of_stage)] == [p.devices[0].name]
    assert full.bottleneck_ns <= listed.dp_ns <= cut.bottleneck_ns


def test_dp_plan_within_the_gap_skips_cpsat():
    p = random_large(5, 30)
    dp_only = solve(p, time_limit_s=1, run_cpsat=False, run_ideal_dp=False)  # the DP's plan, search-free bounds
    assert dp_only.gap > 0.0
    # Its re-proof would run CP-SAT: check_certificate off.
    plan = solve(p, time_limit_s=10, gap=dp_only.gap * 1.001 + 1e-9, check_certificate=False, run_ideal_dp=False)
    verify_plan(p, plan)
    assert plan.stats.cpsat_seconds is None and plan.stats.plan_from == "dp"  # CP-SAT did not run
    assert plan.solver_status == "WITHIN_GAP" and plan.bottleneck_ns == dp_only.bottleneck_ns
    assert plan.lower_bound_ns == dp_only.lower_bound_ns == plan.bounds.lower_bound_ns
    assert plan.gap <= dp_only.gap * 1.001 + 1e-9
    # Just below the DP's gap, CP-SAT runs (and here proves optimality).
    plan = solve(p, time_limit_s=10, gap=dp_only.gap * 0.999, run_ideal_dp=False)
    assert plan.stats.cpsat_seconds is not None
    assert plan.solver_status in ("OPTIMAL", "WITHIN_GAP") and plan.gap <= dp_only.gap * 0.999


def test_gap_plans_are_certified_and_bounds_valid():
    statuses = Counter()
    for seed in range(20):
        p = random_problem(seed)
        want = brute_force(p)
        if want is None:
            continue  # no plan fits: test_matches_brute_force_on_random_small_dags checks the error
        exact = solve(p, time_limit_s=10)
        assert exact.solver_status == "OPTIMAL" and exact.bottleneck_ns == want  # gap 0: as before
        assert solve(p, time_limit_s=10, gap=0.0).stage_of == exact.stage_of
        for gap in (0.05, 0.3):
            plan = solve(p, time_limit_s=10, gap=gap)
            verify_plan(p, plan)
            assert plan.lower_bound_ns <= want <= plan.bottleneck_ns
            assert plan.solver_status in ("OPTIMAL", "WITHIN_GAP")
            assert plan.bottleneck_ns - plan.lower_bound_ns <= gap * plan.bottleneck_ns
            assert (plan.solver_status == "OPTIMAL") == (plan.lower_bound_ns == plan.bottleneck_ns)
            statuses[plan.solver_status] += 1
    assert statuses["OPTIMAL"] > 0 and statuses["WITHIN_GAP"] > 0, statuses


def test_gap_stop_in_cpsat_is_deterministic():
    p = random_large(3, 60)
    a, b = (solve(p, time_limit_s=20, gap=0.02) for _ in range(2))
    assert a.solver_status in ("OPTIMAL", "WITHIN_GAP") and a.gap <= 0.02
    assert (a.stage_of, a.device_of_stage, a.lower_bound_ns, a.solver_status) == \
        (b.stage_of, b.device_of_stage, b.lower_bound_ns, b.solver_status)


@pytest.mark.parametrize("gap", [-0.1, 1.0, float("nan")])
def test_bad_gap_says_what_to_pass(gap):
    with pytest.raises(HetpartError, match="--gap"):
        solve(random_large(5, 30), gap=gap)
