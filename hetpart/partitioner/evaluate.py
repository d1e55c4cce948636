"""What a plan costs, recomputed from scratch in plain Python (no solver).

The solver, the DP and the verifier all agree with this module: it is the cost
model's one definition.
See NOTE [stage time] below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetpart.partitioner.problem import MEM_BYTES, OUT_BYTES, TIME_NS, WEIGHTS, Problem, StageCost

# NOTE [stage time]
# A plan is a chain of stages 0..S-1, stage k on device `device_of_stage[k]`.
# A stage's time is its compute time plus the transfer time of the boundaries
# on BOTH of its sides (boundary k-1|k and boundary k|k+1): transfers are not
# overlapped with compute, and a boundary occupies both stages it joins.
# A value produced by node u in stage s and last consumed in stage t > s is
# sent from stage to stage: it crosses every boundary s|s+1, ..., t-1|t and
# pays its `out_bytes` on each (it passes through the stages in between).
# A boundary costs `link.transfer_ns(bytes)` over the link between its two
# devices: latency plus bytes / bandwidth, and nothing at all when no byte crosses.
# A stage's memory is the `mem_bytes` of its nodes plus every weight its nodes
# read, each weight counted once per stage (a weight read in two stages is
# held by both); in training, see NOTE [training memory].

# NOTE [training memory]
# In inference a stage holds its weights and the activations of one
# microbatch. In training (`Problem.training`) it also holds, per weight, its
# gradient and the optimizer's state (`Training.state_bytes`: Adam in fp32 is
# 4 + 8 bytes per 4-byte parameter), and the activations of every microbatch
# it has run forward but not yet backward -- the stash:
#   GPipe: all M microbatches run forward before the first backward, so M;
#   1F1B: stage k of S runs S-1-k warm-up forwards, then one forward before
#     each backward, so it keeps min(S-k, M) (stage 0 keeps the most).
# The stash depends on S, the number of stages used: CP-SAT enforces it under
# a literal per possible S (cpsat.py), the DP and the bounds use the largest.
# `stage_memory_bytes` is the one formula; evaluate, the verifier and the
# CP-SAT constraint all call it.


def stash_microbatches(problem: Problem, stage: int, num_stages: int) -> int:
    """Microbatches of activations stage `stage` of `num_stages` holds at its peak (NOTE [training memory]).

        >>> from hetpart.partitioner.problem import Training
        >>> p = Problem(graph=None, weights={}, devices=[], intra_node_links={}, network=None,
        ...             training=Training("1f1b", microbatches=8))
        >>> [stash_microbatches(p, k, 4) for k in range(4)]
        [4, 3, 2, 1]
    """
    t = problem.training
    if t is None:
        return 1
    if t.schedule == "gpipe":
        return t.microbatches
    return max(1, min(num_stages - stage, t.microbatches))


def held_weight_bytes(problem: Problem, weight: str) -> int:
    """Bytes a stage holding `weight` needs for it: the weight, plus gradient and optimizer state in training."""
    extra = problem.training.state_bytes.get(weight, 0) if problem.training is not None else 0
    return problem.weights[weight] + extra


def stage_memory_bytes(problem: Problem, activation_bytes: Any, held: Mapping[str, Any], stage: int,
                       num_stages: int) -> Any:
    """Memory of stage `stage` of `num_stages` (NOTE [training memory]).

    `activation_bytes` is the sum of the stage's nodes' `mem_bytes` for one microbatch;
    `held` maps each weight to 1 when the stage holds it (0 or absent otherwise).
    Both may be CP-SAT linear expressions: the result is then one too.

        >>> from hetpart.partitioner.problem import Training
        >>> p = Problem(graph=None, weights={"w": 100}, devices=[], intra_node_links={}, network=None)
        >>> stage_memory_bytes(p, 10, {"w": 1}, 0, 2)
        110
        >>> p.training = Training("gpipe", microbatches=4, state_bytes={"w": 300})
        >>> stage_memory_bytes(p, 10, {"w": 1}, 0, 2)
        440
    """
    weights = sum(held_weight_bytes(problem, w) * on for w, on in sorted(held.items()))
    return stash_microbatches(problem, stage, num_stages) * activation_bytes + weights


def max_stage_memory_bytes(problem: Problem) -> tuple[int, dict[str, int]]:
    """(activation multiplier, bytes per held weight) that bound every stage's memory from above.

    For solvers that do not know a stage's index and the plan's stage count when
    they check memory (the DP): `mult * mem_bytes + sum(bytes[w])` is at least
    `stage_memory_bytes` of any stage in any plan.
    """
    t = problem.training
    mult = 1 if t is None else t.microbatches if t.schedule == "gpipe" else min(
        t.microbatches, problem.max_stages or len(problem.devices))
    return max(1, mult), {w: held_weight_bytes(problem, w) for w in problem.weights}


def boundary_bytes(problem: Problem, stage_of: dict[str, int], num_stages: int) -> list[int]:
    """Bytes crossing each boundary k (between stage k and k+1), k = 0..num_stages-2.

    See NOTE [stage time]: node u's output crosses boundary k when
    stage(u) <= k < max(stage of u's successors).
    """
    g = problem.graph
    crossing = [0] * max(0, num_stages - 1)
    for u in g.nodes:
        nbytes = g.nodes[u].get(OUT_BYTES, 0)
        succs = list(g.successors(u))
        if nbytes <= 0 or not succs:
            continue
        for k in range(stage_of[u], max(stage_of[v] for v in succs)):
            crossing[k] += nbytes
    return crossing


def evaluate(problem: Problem, stage_of: dict[str, int], device_of_stage: list[str]) -> list[StageCost]:
    """The cost of every stage of a plan; see NOTE [stage time].

    `stage_of` must give every node a stage in 0..len(device_of_stage)-1 and
    name devices of the problem (`verify_plan` checks this first).

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
    num_stages = len(device_of_stage)
    devices = [problem.device(name) for name in device_of_stage]
    nodes_of: list[list[str]] = [[] for _ in range(num_stages)]
    for v in g.nodes:
        nodes_of[stage_of[v]].append(v)

    crossing = boundary_bytes(problem, stage_of, num_stages)
    boundary_ns = [
        problem.link(device_of_stage[k], device_of_stage[k + 1]).transfer_ns(crossing[k])
        for k in range(num_stages - 1)
    ]

    stages = []
    for k, (dev, nodes) in enumerate(zip(devices, nodes_of)):
        weights = {w for v in nodes for w in g.nodes[v].get(WEIGHTS, ())}
        stages.append(
            StageCost(
                index=k,
                device=dev.name,
                device_type=dev.type,
                nodes=nodes,
                compute_ns=sum(g.nodes[v][TIME_NS][dev.type] for v in nodes),
                comm_in_ns=boundary_ns[k - 1] if k > 0 else 0,
                comm_out_ns=boundary_ns[k] if k < num_stages - 1 else 0,
                memory_bytes=stage_memory_bytes(problem, sum(g.nodes[v].get(MEM_BYTES, 0) for v in nodes),
                                                dict.fromkeys(weights, 1), k, num_stages),
                capacity_bytes=dev.capacity_bytes,
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
