from hetpart.partitioner import Device, Link, bottleneck_ns, evaluate

from partition_cases import make_problem


def test_skip_value_pays_every_boundary_it_crosses():
    # a -> b -> c -> d and a -> d: with stages {a} {b} {c, d}, a's output crosses both boundaries.
    nodes = {v: {"time": {"g": 10}, "out": out} for v, out in [("a", 1000), ("b", 100), ("c", 100), ("d", 0)]}
    p = make_problem(nodes, [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")],
                     [Device(f"g{i}", "g", "m0", 100) for i in range(3)])
    stages = evaluate(p, {"a": 0, "b": 1, "c": 2, "d": 2}, ["g0", "g1", "g2"])
    assert [(s.comm_in_ns, s.comm_out_ns) for s in stages] == [(0, 1000), (1000, 1100), (1100, 0)]
    assert [s.compute_ns for s in stages] == [10, 10, 20]
    assert bottleneck_ns(stages) == 10 + 1000 + 1100


def test_link_latency_only_when_bytes_cross_and_network_between_machines():
    nodes = {"a": {"time": {"g": 5}, "out": 0}, "b": {"time": {"g": 5}, "out": 7}, "c": {"time": {"g": 5}}}
    p = make_problem(nodes, [("a", "b"), ("b", "c")],
                     [Device("g0", "g", "m0", 10), Device("g1", "g", "m0", 10), Device("g2", "g", "m1", 10)],
                     intra=Link(1000, 3), network=Link(10, 500))
    stages = evaluate(p, {"a": 0, "b": 1, "c": 2}, ["g0", "g1", "g2"])
    assert stages[0].comm_out_ns == 0  # nothing crosses boundary 0: no latency either
    assert stages[1].comm_out_ns == 500 + 700  # 7 bytes over 10 bytes/us = 700 ns, plus latency
    assert stages[2].device_type == "g" and stages[2].nodes == ["c"]


def test_weight_shared_by_two_nodes_counted_once_per_stage():
    nodes = {v: {"time": {"g": 1}, "mem": 3, "weights": ["w"]} for v in "ab"}
    p = make_problem(nodes, [("a", "b")], [Device("g0", "g", "m0", 100), Device("g1", "g", "m0", 100)],
                     weights={"w": 50})
    one = evaluate(p, {"a": 0, "b": 0}, ["g0"])
    assert one[0].memory_bytes == 3 + 3 + 50
    two = evaluate(p, {"a": 0, "b": 1}, ["g0", "g1"])
    assert [s.memory_bytes for s in two] == [53, 53]  # replicated in both stages


# --- Training memory (NOTE [training memory]): one formula for evaluate, verify and CP-SAT.

def _chain(n: int, capacity: int, schedule: str, microbatches: int = 4, state: int = 0):
    from hetpart.partitioner.problem import Training

    names = [f"n{i}" for i in range(n)]
    nodes = {v: {"time": {"g": 10}, "mem": 100, "out": 1} for v in names}
    if state:
        nodes["n0"]["weights"] = ["w"]
    p = make_problem(nodes, list(zip(names, names[1:])), [Device(f"g{i}", "g", "m0", capacity) for i in range(2)],
                     weights={"w": 50} if state else {})
    p.training = Training(schedule, microbatches, {"w": state} if state else {})
    return p, names


def test_stash_gpipe_keeps_all_microbatches_1f1b_keeps_s_minus_k():
    p, names = _chain(4, 10_000, "gpipe", state=150)
    stages = evaluate(p, {v: int(i >= 2) for i, v in enumerate(names)}, ["g0", "g1"])
    assert [s.memory_bytes for s in stages] == [4 * 200 + 50 + 150, 4 * 200]
    p, names = _chain(4, 10_000, "1f1b", state=150)
    stages = evaluate(p, {v: int(i >= 2) for i, v in enumerate(names)}, ["g0", "g1"])
    assert [s.memory_bytes for s in stages] == [2 * 200 + 50 + 150, 1 * 200]
    p.training = None  # inference: one microbatch, no gradient or optimizer state
    assert [s.memory_bytes for s in evaluate(p, {v: int(i >= 2) for i, v in enumerate(names)}, ["g0", "g1"])] \
        == [250, 200]


def test_1f1b_fits_where_gpipe_does_not_and_the_solver_respects_the_stash():
    import pytest

    from hetpart.errors import HetpartError
    from hetpart.partitioner import plan_violations, solve

    # Six 100-byte nodes on two 450-byte devices, M = 4. 1F1B with 2 stages: stage 0 keeps 2
    # microbatches (at most 2 nodes), stage 1 keeps 1 (at most 4 nodes): the balanced 3/3 split
    # does not fit, 2/4 does. GPipe keeps 4 everywhere: not even one node pair fits.
    p, names = _chain(6, 450, "1f1b")
    plan = solve(p, time_limit_s=10)
    assert [sum(1 for v in names if plan.stage_of[v] == k) for k in range(2)] == [2, 4]
    assert [s.memory_bytes for s in plan.stages] == [400, 400] and plan.bottleneck_ns == 40 + 1  # 4 nodes + 1 byte in
    assert plan_violations(p, plan) == []
    balanced = {v: int(i >= 3) for i, v in enumerate(names)}
    bad = type(plan)(balanced, ["g0", "g1"], evaluate(p, balanced, ["g0", "g1"]), 31, 0, "FEASIBLE", 0.0)
    assert any("over its capacity of 450 (training, 1f1b: weights with gradients and optimizer state, and 2 "
               "microbatches" in v for v in plan_violations(p, bad))
    p, _ = _chain(6, 450, "gpipe")
    with pytest.raises(HetpartError, match="GPipe stashes all M"):
        solve(p, time_limit_s=10)
