import pytest

from hetpart.partitioner import Device, solve
from hetpart.partitioner.bounds import (
    compute_bounds,
    largest_op_bound_ns,
    lp_work_bound_ns,
    min_devices,
    model_bytes,
    sequence_bound_ns,
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
    assert b.sequence_ns <= optimum
    assert b.lower_bound_ns <= optimum
    # A known plan's bottleneck (here the optimum itself) only narrows the bisection.
    assert compute_bounds(p, upper_ns=optimum).sequence_ns <= optimum
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


def _alike_problem(seed: int):
    """Like `random_problem`, but ops of nearly equal times (where counting ops per stage bites),
    some free ops, sometimes a forbidden type, and pins that make every boundary pay."""
    import random

    from hetpart.partitioner import Link

    rng = random.Random(seed)
    n = rng.randint(3, 6)
    names = [f"n{i}" for i in range(n)]
    base = rng.randint(5, 40)
    nodes = {}
    for v in names:
        t = 0 if rng.random() < 0.2 else base + rng.randint(0, 3)
        nodes[v] = {"time": {"a": t, "b": t + rng.choice([0, 0, 1, base])}, "out": rng.choice([0, 10, 100, 1000])}
        if rng.random() < 0.15:
            nodes[v]["forbidden"] = [rng.choice("ab")]
    nodes[names[0]]["pin"] = "first"
    nodes[names[0]].pop("forbidden", None)
    nodes[names[-1]]["pin"] = "last"
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1:] if rng.random() < 0.5]
    edges += [(names[0], names[1]), (names[-2], names[-1])]
    devices = [Device("d0", "a", "m0", 1000), Device("d1", "a", "m0", 1000), Device("d2", "b", "m1", 1000)]
    return make_problem(nodes, sorted(set(edges)), devices, intra=Link(rng.choice([100, 1000]), rng.choice([0, 5])),
                        network=Link(rng.choice([10, 100, 1000]), rng.choice([0, 20])),
                        max_stages=rng.choice([None, 2]))


@pytest.mark.parametrize("seed", range(60))
def test_sequence_bound_is_at_most_the_brute_force_optimum_on_alike_ops(seed):
    p = _alike_problem(seed)
    optimum = brute_force(p)
    if optimum is None:
        return
    b = compute_bounds(p, upper_ns=optimum)
    assert b.sequence_ns <= optimum
    assert compute_bounds(p).sequence_ns <= optimum


def test_sequence_bound_counts_ops_per_stage():
    # Five ops of 10 ns on two identical devices: the best split is 3 + 2 ops, 30 ns. The work
    # bounds say 25 (50 ns over two devices); no stage may hold 3 ops below 30 ns, and 2 + 2 < 5.
    nodes, edges = chain(5, {"g": 10})
    p = make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 10**6) for i in range(2)], network=FAST_LINK)
    assert brute_force(p) == 30
    b = compute_bounds(p)
    assert b.lp_work_ns <= 25 and b.stage_sum_ns <= 25
    assert sequence_bound_ns(p) == 30 == b.lower_bound_ns


def test_sequence_bound_pays_each_machines_own_link():
    # Pins make every boundary carry x's 1000 bytes; g0, g1 on a slow machine link (1 byte/ns),
    # h0 on a fast machine whose network link is fast too. Stage sums with the cheapest link
    # for every boundary would allow a three-way split; with each boundary on its own link,
    # the best is one fast stage and the rest.
    from hetpart.partitioner import Link

    nodes = {"x": {"time": {"g": 0}, "out": 1000, "pin": "first"}}
    nodes.update({f"op{i}": {"time": {"g": 400}} for i in range(3)})
    nodes["y"] = {"time": {"g": 0}, "pin": "last"}
    edges = [("x", "op0"), ("op0", "op1"), ("op1", "op2"), ("op2", "y"), ("x", "y")]
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 10**6), Device("g1", "g", "m0", 10**6),
                                    Device("h0", "g", "m1", 10**6)], network=Link(100_000, 0))
    p.intra_node_links["m0"] = Link(1_000, 0)
    optimum = brute_force(p)
    b = compute_bounds(p, upper_ns=optimum)
    assert b.sequence_ns <= optimum and compute_bounds(p).sequence_ns <= optimum
    assert b.sequence_ns > b.stage_sum_ns


def _mixed_speed_problem(seed: int):
    """Ops that each run well on one type only (speed ratios differ op by op), on two devices of
    type a and one of b, with cheap transfers: where pooling a type's stages (the weighted work
    checks of NOTE [sequence bound]) bites."""
    import random

    from hetpart.partitioner import Link

    rng = random.Random(seed)
    n = rng.randint(3, 6)
    names = [f"n{i}" for i in range(n)]
    nodes = {}
    for v in names:
        fast, slow = rng.randint(5, 30), rng.randint(40, 120)
        nodes[v] = {"time": {"a": fast, "b": slow} if rng.random() < 0.5 else {"a": slow, "b": fast},
                    "out": rng.choice([0, 1, 10])}
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1:] if rng.random() < 0.4]
    devices = [Device("d0", "a", "m0", 1000), Device("d1", "a", "m0", 1000), Device("d2", "b", "m1", 1000)]
    return make_problem(nodes, edges, devices, intra=Link(1000, rng.choice([0, 2])),
                        network=Link(1000, rng.choice([0, 5])))


def test_weighted_work_checks_are_valid_and_raise_the_sequence_bound():
    from hetpart.partitioner.bounds import _lp, _work_multipliers

    raised = 0
    for seed in range(40):
        p = _mixed_speed_problem(seed)
        optimum = brute_force(p)
        _, data, lam, _ = _lp(p)
        plain = sequence_bound_ns(p)
        weighted = sequence_bound_ns(p, multipliers=_work_multipliers(data, lam))
        assert plain <= weighted <= optimum, seed
        # Any nonnegative multipliers give a valid check, not just the LP's.
        for lam_a, lam_b in ((1.0, 0.0), (0.0, 1.0), (1.0, 3.0), (5.0, 1.0)):
            assert sequence_bound_ns(p, multipliers=[{"a": lam_a, "b": lam_b}]) <= optimum, (seed, lam_a, lam_b)
        assert compute_bounds(p, upper_ns=optimum).lower_bound_ns <= optimum
        raised += weighted > plain
    assert raised > 0
