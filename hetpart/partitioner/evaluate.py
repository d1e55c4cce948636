"""What a plan costs, recomputed from scratch in plain Python (no solver).

The formulas are `costs.py`'s (NOTE [stage time] there); this module applies
them to one whole plan. The solver, the DP and the verifier all agree with it.
"""

from __future__ import annotations

from hetpart.partitioner.costs import (  # noqa: F401 (re-exported: callers import them from here)
    boundary_bytes,
    held_weight_bytes,
    link_between,
    max_stage_memory_bytes,
    slot_capacity_bytes,
    slot_compute_ns,
    stage_activation_bytes,
    stage_compute_ns,
    stage_memory_bytes,
    stage_time_ns,
    stash_microbatches,
    transfer_ns,
)
from hetpart.partitioner.problem import OUT_TENSORS, Problem, StageCost


def evaluate(problem: Problem, stage_of: dict[str, int], slot_of_stage: list[str]) -> list[StageCost]:
    """The cost of every stage of a plan; see NOTE [stage time].

    `stage_of` must give every node a stage in 0..len(slot_of_stage)-1 and
    `slot_of_stage` name slots of the problem (NOTE [slots]; today devices; `verify_plan`
    checks this first).

        >>> import networkx as nx
        >>> from hetpart.partitioner.problem import Device, Link
        >>> g = nx.DiGraph()
        >>> g.add_node("a", time_ns={"gpu": 50}, mem_bytes=8, out_bytes=1000)
        >>> g.add_node("b", time_ns={"gpu": 70}, mem_bytes=8, out_bytes=0)
        >>> g.add_edge("a", "b")
        >>> p = Problem(graph=g, weights={}, devices=[Device("g0", "gpu", "n0", 64), Device("g1", "gpu", "n0", 64)],
        ...             intra_node_links={"n0": Link(bandwidth_bytes_per_us=100, latency_ns=5)},
        ...             network=Link(10, 1000))
        >>> stages = evaluate(p, {"a": 0, "b": 1}, ["g0", "g1"])
        >>> [(s.compute_ns, s.comm_in_ns, s.comm_out_ns, s.time_ns) for s in stages]
        [(50, 0, 10005, 10055), (70, 10005, 0, 10075)]
    """
    g = problem.graph
    num_stages = len(slot_of_stage)
    slots = [problem.slot(name) for name in slot_of_stage]
    nodes_of: list[list[str]] = [[] for _ in range(num_stages)]
    for v in g.nodes:
        nodes_of[stage_of[v]].append(v)

    crossing = boundary_bytes(problem, stage_of, num_stages)
    tensors = boundary_bytes(problem, stage_of, num_stages, weight=OUT_TENSORS)
    boundary_ns = [
        transfer_ns(link_between(problem, slot_of_stage[k], slot_of_stage[k + 1]), crossing[k], tensors[k])
        for k in range(num_stages - 1)
    ]

    stages = []
    for k, (slot, nodes) in enumerate(zip(slots, nodes_of)):
        weights = problem.weights_read(nodes)
        stages.append(
            StageCost(
                index=k,
                device=slot.devices[0],  # NOTE [slots]: the slot's one device
                device_type=slot.type,
                nodes=nodes,
                compute_ns=slot_compute_ns(problem, nodes, slot),
                comm_in_ns=boundary_ns[k - 1] if k > 0 else 0,
                comm_out_ns=boundary_ns[k] if k < num_stages - 1 else 0,
                memory_bytes=stage_memory_bytes(problem, stage_activation_bytes(problem, nodes, slot.type),
                                                dict.fromkeys(weights, 1), k, num_stages, slot.type),
                capacity_bytes=slot_capacity_bytes(problem, slot),
                slot=slot.name,
                devices=slot.devices,
            )
        )
    return stages


def bottleneck_ns(stages: list[StageCost]) -> int:
    """The slowest stage's time: one microbatch leaves the pipeline every this many ns."""
    return max((s.time_ns for s in stages), default=0)


# NOTE [objectives]
# `throughput`: the bottleneck, max over stages of StageCost.time_ns (one microbatch
#   leaves the pipeline every bottleneck ns).
# `latency`: one sample through all stages, the sum of the stages' time_ns (a boundary
#   occupies both stages it joins, as in NOTE [stage time], so it counts on both sides).
# `iteration`: M microbatches through a GPipe-style pipeline, sum of stage times
#   + (M - 1) x bottleneck: the first microbatch fills the pipeline, the others follow
#   one bottleneck apart.
OBJECTIVES = ("throughput", "latency", "iteration")


def objective_ns(stages: list[StageCost], objective: str = "throughput", microbatches: int = 1) -> int:
    """The value of NOTE [objectives] for a plan's stages.

        >>> from hetpart.partitioner.problem import StageCost
        >>> s = [StageCost(0, "a", "t", [], 10, 0, 5, 0, 0), StageCost(1, "b", "t", [], 30, 5, 0, 0, 0)]
        >>> [objective_ns(s, o, microbatches=4) for o in OBJECTIVES]
        [35, 50, 155]
    """
    if objective == "throughput":
        return bottleneck_ns(stages)
    total = sum(s.time_ns for s in stages)
    if objective == "latency":
        return total
    if objective == "iteration":
        return total + (microbatches - 1) * bottleneck_ns(stages)
    raise ValueError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
