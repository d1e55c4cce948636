"""What today's tools would plan, costed in hetpart's model (NOTE [stage time] in costs.py).

Every baseline cuts `Problem.node_order()` into contiguous runs and puts run k on
the k-th device of the cluster list (the tools below take devices in rank order):

- `equal-layers`: torch.distributed.pipelining / Megatron style, the same number
  of layers per stage. Layers are the node attribute LAYER (set by
  `passes/lower.py` from `nn_module_stack`); without it, the same number of nodes.
- `parameters`: DeepSpeed's `partition_method="parameters"`, contiguous layers
  (or nodes) with balanced weight bytes, each weight counted at its first reader.
- `dp-topo-order`: PipeDream style, the exact DP over contiguous segments of the
  order on the devices in list order (hetpart's own DP also chooses the device order).

A baseline that breaks memory is reported with `feasible=False`, not hidden.
Nothing here imports torch; the torch.fx `accelerator_partitioner` baselines
live in `hetpart/passes/fx_baselines.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetpart.partitioner.coarsen import cut_candidates
from hetpart.partitioner.dp import COARSE_CUTS, EXACT_CUTS, list_order_segments, order_tables
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import (
    LAYER, PIN, PIN_FIRST, PIN_LAST, WEIGHTS, Plan, Problem,
)
from hetpart.partitioner.verify import plan_violations

@dataclass
class Baseline:
    """One baseline plan, its bottleneck in our cost model, and whether it fits in memory."""

    name: str
    plan: Plan | None  # None when the method has no plan for this problem
    bottleneck_ns: int | None
    feasible: bool
    violations: list[str] = field(default_factory=list)  # why it is not feasible
    note: str = ""

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "bottleneck_us": None if self.bottleneck_ns is None else round(self.bottleneck_ns / 1000, 3),
            "feasible": self.feasible,
            **({"note": self.note} if self.note else {}),
        }


def plan_from_stages(problem: Problem, stage_of: dict[str, int], device_of_stage: list[str],
                     status: str = "BASELINE") -> Plan:
    """A Plan with costs from `evaluate` and no proven bound (0)."""
    stages = evaluate(problem, stage_of, device_of_stage)
    return Plan(stage_of=stage_of, device_of_stage=device_of_stage, stages=stages,
                bottleneck_ns=bottleneck_ns(stages), lower_bound_ns=0, solver_status=status, solve_seconds=0.0)


def baseline_of(problem: Problem, name: str, stage_of: dict[str, int], device_of_stage: list[str],
                note: str = "") -> Baseline:
    """Cost a stage assignment and check it with the independent verifier."""
    plan = plan_from_stages(problem, stage_of, device_of_stage)
    violations = plan_violations(problem, plan)
    return Baseline(name=name, plan=plan, bottleneck_ns=plan.bottleneck_ns, feasible=not violations,
                    violations=violations, note=note)


def _units(problem: Problem, order: list[str]) -> tuple[list[int], str]:
    """Each position's unit index (layers when the graph has LAYER attributes, else nodes) and the unit kind.

    A node without a layer joins the unit of the node before it (the first ones the first unit),
    so units are contiguous runs of the order and a unit index never decreases along it.
    """
    g = problem.graph
    layers = [g.nodes[v].get(LAYER) for v in order]
    if not any(layers):
        # Nodes; pinned ones join their neighbour (`node_order` puts them at the ends).
        pins = [g.nodes[v].get(PIN) for v in order]
        free = sum(p is None for p in pins)
        rank, unit = 0, []
        for p in pins:
            unit.append(0 if p == PIN_FIRST else free - 1 if p == PIN_LAST else rank)
            rank += p is None
        return [min(max(u, 0), max(free - 1, 0)) for u in unit], "nodes"
    unit, seen, current = [], set(), 0
    for name in layers:
        if name and name not in seen:
            seen.add(name)
            current = len(seen) - 1
        unit.append(current)
    return unit, "layers"


def _split_units(unit_weight: list[int], parts: int) -> list[int]:
    """Cut units into `parts` non-empty contiguous runs with the least largest weight; the start of each run.

    Binary search on the largest weight T, runs filled greedily from the left (exact for
    non-negative weights); when fewer runs than `parts` suffice, the first unsplit positions
    are cut too (that never raises the largest weight).
    """
    def greedy(limit: int) -> list[int]:
        starts, run = [0], 0
        for i, w in enumerate(unit_weight):
            if run + w > limit and i > 0:
                starts.append(i)
                run = 0
            run += w
        return starts

    lo, hi = max(unit_weight, default=0), sum(unit_weight)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(greedy(mid)) <= parts:
            hi = mid
        else:
            lo = mid + 1
    starts = set(greedy(lo))
    extra = (i for i in range(1, len(unit_weight)) if i not in starts)
    while len(starts) < parts:
        starts.add(next(extra))
    return sorted(starts)


def _contiguous(problem: Problem, order: list[str], unit: list[int], starts: list[int]) -> dict[str, int]:
    """stage_of for runs of units beginning at unit indices `starts`."""
    stage_of = {}
    for v, u in zip(order, unit):
        stage_of[v] = int(np.searchsorted(starts, u, side="right")) - 1
    return stage_of


def equal_layers(problem: Problem) -> Baseline:
    """The same number of layers (or nodes) per stage, stages on the devices in list order."""
    order = problem.node_order()
    unit, kind = _units(problem, order)
    count = unit[-1] + 1
    stages = min(len(problem.devices), problem.max_stages or len(problem.devices), count)
    stage_of = {v: u * stages // count for v, u in zip(order, unit)}
    return baseline_of(problem, "equal-layers", stage_of, [d.name for d in problem.devices[:stages]],
                       note=f"{count} {kind} over {stages} stages")


def parameter_balanced(problem: Problem) -> Baseline:
    """DeepSpeed's `parameters` method: contiguous layers with balanced weight bytes."""
    g = problem.graph
    order = problem.node_order()
    unit, kind = _units(problem, order)
    count = unit[-1] + 1
    stages = min(len(problem.devices), problem.max_stages or len(problem.devices), count)
    weight_bytes = [0] * count
    seen: set[str] = set()
    for v, u in zip(order, unit):
        for w in g.nodes[v].get(WEIGHTS, ()):
            if w not in seen:
                seen.add(w)
                weight_bytes[u] += problem.weights[w]
    starts = _split_units(weight_bytes, stages)
    return baseline_of(problem, "parameters", _contiguous(problem, order, unit, starts),
                       [d.name for d in problem.devices[:stages]], note=f"{count} {kind} over {stages} stages")


def dp_topo_order(problem: Problem) -> Baseline:
    """PipeDream style: the exact DP over contiguous segments of the order, devices in list order.

    Stage k runs on device k; the DP may use a prefix of the devices. Minimises the
    bottleneck of NOTE [stage time] under memory; infeasible when no prefix fits. Above
    `dp.EXACT_CUTS` nodes it cuts at candidate positions, then refines op by op around
    them (NOTE [candidate cuts] in dp.py, with the device order fixed).
    """
    tab = order_tables(problem)
    exact = tab.n <= EXACT_CUTS
    P = np.arange(tab.n + 1) if exact else cut_candidates(tab, COARSE_CUTS)
    best = list_order_segments(problem, tab, P, refine=not exact)
    if best is None:
        return Baseline(name="dp-topo-order", plan=None, bottleneck_ns=None, feasible=False,
                        violations=["no contiguous split of the order fits the devices' memory in list order"])
    stage_of = {}
    for k in range(len(best.devices)):
        for v in tab.order[best.cuts[k]:best.cuts[k + 1]]:
            stage_of[v] = k
    return baseline_of(problem, "dp-topo-order", stage_of, best.devices,
                       note="" if exact else f"cuts at {len(P)} candidate positions, refined op by op")


def compute_baselines(problem: Problem) -> list[Baseline]:
    """The torch-free baselines, in a fixed order: equal-layers, parameters, dp-topo-order."""
    problem.validate()
    return [equal_layers(problem), parameter_balanced(problem), dp_topo_order(problem)]
