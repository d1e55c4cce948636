import pytest

from hetpart.partitioner import Device, solve
from hetpart.partitioner.bounds import (
    compute_bounds,
    largest_op_bound_ns,
    lp_work_bound_ns,
    min_devices,
    model_bytes,
)

from partition_cases import FAST_LINK, brute_force, chain, make_problem, random_problem


@pytest.mark.parametrize("seed", range(60))
def test_every_bound_is_at_most_the_brute_force_optimum(seed):
    p = random_problem(seed)
    optimum = brute_force(p)
    b = compute_bounds(p)
    if optimum is None:
        return  # nothing fits: no bound to check against (memory_feasible may still say True)
    assert b.lp_work_ns <= optimum
    assert b.largest_op_ns <= optimum
    assert b.lower_bound_ns <= optimum
    assert b.min_devices is not None and b.min_devices <= len(p.devices)


def test_solve_reports_the_best_valid_bound():
    for seed in range(12):
        p = random_problem(seed)
        optimum = brute_force(p)
        if optimum is None:
            continue
        plan = solve(p, time_limit_s=5)
        assert plan.bounds is not None and plan.lower_bound_ns == min(plan.bounds.lower_bound_ns, plan.bottleneck_ns)
        assert plan.lower_bound_ns <= optimum <= plan.bottleneck_ns


def test_lp_is_valid_where_work_over_speed_is_not():
    # PARTITIONING-NOTES finding 6. Two ops; device types fast/slow with op-dependent ratios:
    # op a: 10 on x, 100 on y; op b: 100 on x, 10 on y. The optimum puts a on x and b on y: 10.
    # "Total work / sum of speeds" with speeds taken from totals (110 each) gives 110 / 2 = 55 > 10.
    nodes = {"a": {"time": {"x": 10, "y": 100}}, "b": {"time": {"x": 100, "y": 10}}}
    p = make_problem(nodes, [], [Device("dx", "x", "m0", 100), Device("dy", "y", "m0", 100)])
    assert brute_force(p) == 10
    assert lp_work_bound_ns(p) <= 10
    assert lp_work_bound_ns(p) >= 9  # and it is tight here (10, rounded down for LP tolerance)


def test_lp_bound_on_a_chain_is_work_over_devices():
    nodes, edges = chain(8, {"g": 100})
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 10**6) for i in range(4)], network=FAST_LINK)
    assert lp_work_bound_ns(p) in (199, 200)  # 800 ns of work over 4 devices
    assert largest_op_bound_ns(p) == 100


def test_memory_decides_the_fewest_devices():
    nodes, edges = chain(4, {"g": 1}, mem=30)
    caps = [50, 40, 70]
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", c) for i, c in enumerate(caps)])
    assert model_bytes(p) == 120
    assert min_devices(p) == 2  # 70 + 50
    p.max_stages = 1
    assert compute_bounds(p).memory_feasible is False
    small = make_problem(nodes, edges, [Device("g0", "g", "m0", 50)])
    assert min_devices(small) is None


def test_min_boundary_bytes_is_the_cheapest_cut_between_inputs_and_outputs():
    from hetpart.partitioner.bounds import min_boundary_bytes

    # x -> a -> b -> y, with a skip x -> b: cutting after a carries x's and a's outputs (1000 + 30),
    # after x only x's (1000), after b only b's (20).
    nodes = {"x": {"time": {"g": 1}, "out": 1000, "pin": "first"}, "a": {"time": {"g": 1}, "out": 30},
             "b": {"time": {"g": 1}, "out": 20}, "y": {"time": {"g": 1}, "pin": "last"}}
    p = make_problem(nodes, [("x", "a"), ("a", "b"), ("x", "b"), ("b", "y")], [Device("g0", "g", "m0", 100)])
    assert min_boundary_bytes(p) == 20
    p.graph.add_edge("x", "y")  # now x's output crosses every boundary: after x is the cheapest
    assert min_boundary_bytes(p) == 1000


def test_stage_sum_bound_counts_the_network_boundary():
    # Two ops of 100 ns, one device on each of two machines: splitting pays the network both ways.
    nodes = {"x": {"time": {"g": 100}, "out": 1000, "pin": "first"}, "y": {"time": {"g": 100}, "pin": "last"}}
    from hetpart.partitioner import Link

    p = make_problem(nodes, [("x", "y")], [Device("g0", "g", "m0", 100), Device("g1", "g", "m1", 100)],
                     network=Link(1000, 500))
    assert brute_force(p) == 200  # one stage: 200; two: 100 + 1500 each
    b = compute_bounds(p)
    assert b.lp_work_ns <= 100 and b.stage_sum_ns == 200 == b.lower_bound_ns
