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
