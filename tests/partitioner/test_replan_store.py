"""`hetpart replan`'s device sets and stored analysis (NOTE [re-plan from the stored analysis]), without a trace."""

from __future__ import annotations

import pytest

from partition_cases import random_problem
from hetpart.codegen.analysis import cluster_from_json, cluster_to_json
from hetpart.devices import load_cluster
from hetpart.errors import HetpartError
from hetpart.partitioner.problem_json import problem_from_json, problem_to_json
from hetpart.replan import new_cluster, retarget


@pytest.mark.parametrize("preset", ["mixed-4", "spot-16", "cpu-4"])
def test_a_cluster_round_trips_through_analysis_json(preset):
    cluster = load_cluster(f"preset:{preset}")
    assert cluster_from_json(cluster_to_json(cluster)) == cluster


@pytest.mark.parametrize("seed", range(5))
def test_a_problem_round_trips_through_json(seed):
    p = random_problem(seed)
    q = problem_from_json(problem_to_json(p))
    assert dict(q.graph.nodes(data=True)) == dict(p.graph.nodes(data=True))
    assert set(q.graph.edges) == set(p.graph.edges)
    assert (q.weights, q.devices, q.intra_node_links, q.network, q.max_stages) == \
        (p.weights, p.devices, p.intra_node_links, p.network, p.max_stages)


def test_lose_and_add_keep_every_other_devices_name():
    old = load_cluster("preset:mixed-4")  # a/0 a/1 (a100-80g), b/0 b/1 (t4-16g)
    got = new_cluster(old, None, ("a/1",), ("t4-16g@b", "a100-80g@a"))
    assert [d.name for d in got.devices] == ["a/0", "a/2", "b/0", "b/1", "b/2"]
    assert [d.type.name for d in got.devices] == ["a100-80g", "a100-80g", "t4-16g", "t4-16g", "t4-16g"]
    with pytest.raises(HetpartError, match="no such device"):
        new_cluster(old, None, ("c/0",), ())
    with pytest.raises(HetpartError, match="TYPE@MACHINE with a machine of the old cluster"):
        new_cluster(old, None, (), ("t4-16g@z",))
    with pytest.raises(HetpartError, match="say what changed"):
        new_cluster(old, None, (), ())
    with pytest.raises(HetpartError, match="removes every device"):
        new_cluster(old, None, ("a/0", "a/1", "b/0", "b/1"), ())


def test_a_device_type_the_old_plan_did_not_cost_is_refused():
    p = random_problem(0)  # types "a" and "b"
    with pytest.raises(HetpartError, match=r"device type\(s\) a100-80g, t4-16g of the new cluster were not costed"):
        retarget(p, load_cluster("preset:mixed-4"))


def test_tp_groups_keep_what_survives_and_survivors_their_index():
    # NOTE [re-plan of tensor-parallel plans]: one machine of 8 devices in TP-2 groups (0,1) (2,3) (4,5) (6,7).
    from hetpart.devices.cluster import Cluster, Machine
    from hetpart.passes.tp_lower import tp_groups
    from hetpart.replan_tp import hostable_degrees, keep_groups

    base = load_cluster("preset:cpu-4")
    m = base.machines[0]
    cpu = m.devices[0]
    eight = Cluster("cpu-8", (Machine("local", tuple(type(cpu)(f"local/{i}", cpu.type, "local", cpu.mem_bytes)
                                                      for i in range(8)), m.link),), base.network)
    old = [(f"local/{i}", f"local/{i + 1}") for i in range(0, 8, 2)]
    # Lose 1 and 2: (4,5) and (6,7) stay whole; 0 (index 0) and 3 (index 1) make a group in their old places.
    got = keep_groups(new_cluster(eight, None, ("local/1", "local/2"), ()), old, 2)
    assert [g.devices for g in tp_groups(got, 2)] == [("local/4", "local/5"), ("local/6", "local/7"),
                                                      ("local/0", "local/3")]
    # Lose 0 and 3: 2 held index 0, 1 index 1: the new group is (2, 1), not cluster order's (1, 2).
    got = keep_groups(new_cluster(eight, None, ("local/0", "local/3"), ()), old, 2)
    assert [g.devices for g in tp_groups(got, 2)][-1] == ("local/2", "local/1")
    assert hostable_degrees(eight) == [1, 2, 4, 8] and hostable_degrees(new_cluster(
        eight, None, tuple(f"local/{i}" for i in range(5)), ())) == [1, 2]
