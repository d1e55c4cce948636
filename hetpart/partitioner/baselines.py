"""What today's tools would plan, costed in hetpart's model (NOTE [stage time] in costs.py).

Every baseline cuts `Problem.node_order()` into contiguous runs and puts run k on
the k-th device of the cluster list (the tools below take devices in rank order):

- `equal-layers`: what torch.distributed.pipelining / torchtitan users write, the
  same number of top-level blocks per stage (NOTE [equal blocks]), on the devices
  in cluster order; `equal-layers-best-order` is the same split on the device
  order with the least bottleneck. Without repeated blocks, the same number of
  layers (LAYER, set by `passes/lower.py` from `nn_module_stack`) or of nodes.
- `parameters`: DeepSpeed's `partition_method="parameters"`, contiguous layers
  (or nodes) with balanced weight bytes, each weight counted at its first reader.
- `dp-topo-order`: PipeDream style, the exact DP over contiguous segments of the
  order on the devices in list order (hetpart's own DP also chooses the device order).

A baseline that breaks memory is reported with `feasible=False`, not hidden.
Ratios against the plan compare simulated steps (`simulated_step_ns`, the
plan's schedule played by simulate.py), with the bottleneck ratio beside them.
Nothing here imports torch; the torch.fx `accelerator_partitioner` baselines
live in `hetpart/baselines/fx_partitioner.py`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetpart.errors import HetpartError
from hetpart.partitioner.coarsen import cut_candidates
from hetpart.partitioner.costs import (
    boundary_bytes, machine_link, slot_capacity_bytes, stage_compute_ns, stage_time_ns, transfer_ns,
)
from hetpart.partitioner.dp import COARSE_CUTS, EXACT_CUTS, list_order_segments, order_tables
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import (
    FORWARD_NS, LAYER, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, WEIGHTS, Plan, Problem,
)
from hetpart.partitioner.simulate import Timeline, simulate
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
        # Nodes; pinned ones join the first (PIN_FIRST) or the last (PIN_LAST) unit. `node_order` puts them as
        # early or as late as the edges allow, which is not at the ends when a pinned node has ancestors
        # (descendants) that are not (NOTE [pins]): there a pinned node joins the unit of the node before it,
        # and the nodes after a PIN_LAST node the last unit, so that units never decrease along the order.
        pins = [g.nodes[v].get(PIN) for v in order]
        free = sum(p is None for p in pins)
        rank, unit = 0, []
        for p in pins:
            unit.append(0 if p == PIN_FIRST else free - 1 if p == PIN_LAST else rank)
            rank += p is None
        unit = list(itertools.accumulate((min(max(u, 0), max(free - 1, 0)) for u in unit), max))
        dense = {u: i for i, u in enumerate(sorted(set(unit)))}  # (a PIN_LAST node may skip units)
        return [dense[u] for u in unit], "nodes"
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


# NOTE [equal blocks]
# torchtitan's pipeline split, and what a torch.distributed.pipelining user writes by
# hand, gives each stage the same number of the model's repeated blocks (a transformer's
# `layers.i`, a ResNet's `layer2.1`: the layers whose path has a list index), the
# embedding with the first stage and the head with the last. So: a layer before the
# first block joins block 0, a layer after the last block joins the last block, and a
# layer between blocks (T5's encoder norm) joins the block before it; B blocks over S
# stages give stage k the blocks [k*B//S, (k+1)*B//S). A model without repeated blocks
# (an MLP) gets the same number of layers, or nodes, per stage.

def _equal_blocks(problem: Problem) -> tuple[dict[str, int], int, str]:
    """stage_of of NOTE [equal blocks], the number of stages, and a note."""
    g = problem.graph
    order = problem.node_order()
    unit, kind = _units(problem, order)
    count = unit[-1] + 1
    names: list[str | None] = [None] * count
    for v, u in zip(order, unit):
        names[u] = names[u] or g.nodes[v].get(LAYER)
    is_block = [bool(n) and any(part.isdigit() for part in n.split(".")) for n in names]
    if kind == "layers" and any(is_block):
        block, current = [], -1
        for u in range(count):
            current += is_block[u]
            block.append(max(current, 0))
        blocks = current + 1
    else:
        block, blocks = list(range(count)), count
    stages = min(len(problem.devices), problem.max_stages or len(problem.devices), blocks)
    stage_of = {v: block[u] * stages // blocks for v, u in zip(order, unit)}
    what = "blocks" if blocks != count else kind
    return stage_of, stages, f"{blocks} {what} over {stages} stages"


def equal_layers(problem: Problem) -> Baseline:
    """NOTE [equal blocks] on the first devices in cluster order."""
    stage_of, stages, note = _equal_blocks(problem)
    return baseline_of(problem, "equal-layers", stage_of, [d.name for d in problem.devices[:stages]], note=note)


BRUTE_FORCE_ORDERS = 720  # up to 6 stages every device order is tried; above, pairwise swaps


def best_order(problem: Problem, name: str, stage_of: dict[str, int], stages: int, note: str) -> Baseline:
    """The split `stage_of` on the device order with the least bottleneck (feasible orders first).

    Devices are all of the cluster's (a split of S stages may use any S of them). Every order is
    tried while there are at most BRUTE_FORCE_ORDERS; above, swaps of two positions (one in use)
    are taken while one lowers the bottleneck, from the cluster order. Ties keep the earlier order.
    """
    names = [d.name for d in problem.devices]
    cost = _OrderCost(problem, stage_of, stages)  # over memory last; the verifier runs once, at the end
    if math.perm(len(names), stages) <= BRUTE_FORCE_ORDERS:
        best = min((list(p) for p in itertools.permutations(names, stages)), key=cost)
    else:
        best = names[:]
        times, over = cost.stages(best)
        improved = True
        while improved:
            improved = False
            for i in range(stages):
                for j in range(i + 1, len(names)):
                    if cost.swapped(best, times, over, i, j) < (int(any(over)), times[0][1]):
                        best[i], best[j] = best[j], best[i]
                        times, over = cost.stages(best)
                        improved = True
    how = "every device order" if math.perm(len(names), stages) <= BRUTE_FORCE_ORDERS else "swaps of two devices"
    return baseline_of(problem, name, stage_of, best[:stages], note=f"{note}, best of {how}")


class _OrderCost:
    """(over memory, bottleneck) of the split `stage_of` on a device order, as `evaluate` costs it.

    The split fixes each stage's nodes, memory and boundary bytes; from order to order only the
    devices' types, capacities and links change, so those are all a trial recomputes (`evaluate`
    walks the whole graph: 2,000 swaps of llama-70b's split on 64 devices took 285 s), and a swap
    of two positions only the stages beside them (`swapped`).
    """

    def __init__(self, problem: Problem, stage_of: dict[str, int], stages: int) -> None:
        first = evaluate(problem, stage_of, [d.name for d in problem.devices[:stages]])
        self.problem, self.count = problem, stages
        self.crossing = boundary_bytes(problem, stage_of, stages)
        self.tensors = boundary_bytes(problem, stage_of, stages, weight=OUT_TENSORS)
        self.compute = [{t: stage_compute_ns(problem, s.nodes, t) for t in problem.device_types} for s in first]
        self.memory = [s.memory_bytes for s in first]
        self.slots = {d.name: problem.slot(d.name) for d in problem.devices}
        self.capacity = {name: slot_capacity_bytes(problem, s) for name, s in self.slots.items()}

    def _comm(self, devices: list[str], k: int) -> int:
        """Boundary k's time (between stages k and k + 1) on `devices`."""
        a, b = self.slots[devices[k]], self.slots[devices[k + 1]]
        return transfer_ns(machine_link(self.problem, a.node, b.node), self.crossing[k], self.tensors[k])

    def _stage(self, devices: list[str], k: int) -> tuple[int, bool]:
        """Stage k's time on `devices`, and whether it is over its device's memory."""
        comm_in = self._comm(devices, k - 1) if k else 0
        comm_out = self._comm(devices, k) if k < self.count - 1 else 0
        slot = self.slots[devices[k]]
        return (stage_time_ns(self.compute[k][slot.type], comm_in, comm_out),
                self.memory[k] > self.capacity[slot.name])

    def stages(self, devices: list[str]) -> tuple[list[tuple[int, int]], list[bool]]:
        """The 7 slowest stages on `devices` as (index, time), slowest first (a swap changes at most
        6 stages, so one of these is not among them), and every stage's over-memory flag."""
        got = [self._stage(devices, k) for k in range(self.count)]
        return sorted(((k, t) for k, (t, _) in enumerate(got)), key=lambda kt: -kt[1])[:7], [o for _, o in got]

    def __call__(self, devices: list[str]) -> tuple[int, int]:
        slowest, over = self.stages(devices)
        return int(any(over)), slowest[0][1]

    def swapped(self, devices: list[str], slowest: list[tuple[int, int]], over: list[bool], i: int,
                j: int) -> tuple[int, int]:
        """The cost of `devices` with positions i and j swapped, from its `stages`: only the stages
        beside i and j change."""
        near = {k for p in (i, j) for k in (p - 1, p, p + 1) if 0 <= k < self.count}
        devices[i], devices[j] = devices[j], devices[i]
        try:
            new = [self._stage(devices, k) for k in near]
        finally:
            devices[i], devices[j] = devices[j], devices[i]
        rest = next((t for k, t in slowest if k not in near), 0)
        overs = sum(over) - sum(over[k] for k in near) + sum(o for _, o in new)
        return int(overs > 0), max(rest, max(t for t, _ in new))


def equal_layers_best_order(problem: Problem) -> Baseline:
    """NOTE [equal blocks] on the device order with the least bottleneck."""
    stage_of, stages, note = _equal_blocks(problem)
    return best_order(problem, "equal-layers-best-order", stage_of, stages, note)


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
                        violations=["no contiguous split of the order" + ("" if exact else f" at {len(P)} candidate "
                                    "positions") + " fits the devices' memory in list order"])
    stage_of = {}
    for k in range(len(best.devices)):
        for v in tab.order[best.cuts[k]:best.cuts[k + 1]]:
            stage_of[v] = k
    return baseline_of(problem, "dp-topo-order", stage_of, best.devices,
                       note="" if exact else f"cuts at {len(P)} candidate positions, refined op by op")


BASELINES = {"equal-layers": equal_layers, "equal-layers-best-order": equal_layers_best_order,
             "parameters": parameter_balanced, "dp-topo-order": dp_topo_order}


def compute_baselines(problem: Problem) -> list[Baseline]:
    """The torch-free baselines, in BASELINES' order."""
    problem.validate()
    return [f(problem) for f in BASELINES.values()]


# NOTE [simulated ratios]
# A plan's speed is its step, not its bottleneck: a split with one slow stage and idle
# others can lose less per step than the bottleneck ratio says (fill and drain take
# every stage's time), and a plan balanced to the edge gains less. So the ratio printed
# beside each baseline is the ratio of simulated steps: the plan's schedule for its
# microbatches played by simulate.py (NOTE [schedule simulation]) over the stages' costs,
# forward and backward apart in training (FORWARD_NS), and transfers half each way as
# the report plays them. The bottleneck ratio stays beside it.

def simulated_step_ns(problem: Problem, plan: Plan, microbatches: int, schedule: str = "gpipe") -> int:
    """The step of `plan` for `microbatches` microbatches (NOTE [simulated ratios])."""
    return simulated_timeline(problem, plan, microbatches, schedule).step_ns


def simulated_timeline(problem: Problem, plan: Plan, microbatches: int, schedule: str = "gpipe",
                       ranks: int | None = None) -> Timeline:
    """`simulated_step_ns`'s whole timeline; a virtual-stage plan's stages run on `ranks` ranks."""
    stages = plan.stages
    if problem.training is None:
        return simulate([s.compute_ns for s in stages], [s.comm_out_ns for s in stages[:-1]], microbatches,
                        schedule, ranks=ranks)
    g = problem.graph
    forward = [sum(g.nodes[v].get(FORWARD_NS, {}).get(s.device_type, 0) for v in s.nodes) for s in stages]
    forward = [min(f, s.compute_ns) for f, s in zip(forward, stages)]
    return simulate(forward, [s.comm_out_ns // 2 for s in stages[:-1]], microbatches, schedule,
                    backward_ns=[s.compute_ns - f for f, s in zip(forward, stages)], ranks=ranks)


def baselines_json(problem: Problem, plan: Plan, baselines: list[Baseline], microbatches: int,
                   schedule: str = "gpipe") -> list[dict]:
    """plan.json's `baselines`: each one's bottleneck and simulated step, and both as ratios to the plan's."""
    plan_step = simulated_step_ns(problem, plan, microbatches, schedule)
    out = []
    for b in baselines:
        entry = b.to_json()
        if b.plan is not None:
            step = simulated_step_ns(problem, b.plan, microbatches, schedule)
            entry["step_us"] = round(step / 1000, 3)
            entry["step_ratio"] = round(step / plan_step, 4) if plan_step else None
            entry["bottleneck_ratio"] = round(b.bottleneck_ns / plan.bottleneck_ns, 4) if plan.bottleneck_ns else None
        out.append(entry)
    return out


# NOTE [--strategy]: `hetpart partition --strategy NAME` writes a baseline's plan instead of
# the optimised one, through the same codegen, so any split runs, verifies and is measured
# the same way (`hetpart run --measure`, benchmarks/measured_speedup.py). A baseline that has
# no plan, or whose plan breaks a device's memory, is refused (exit 2): its artifacts could not
# run where the plan says, and the error says by how much each stage is over. With `--parallel
# data` the strategies are the data-parallel baselines of NOTE [pipeline baselines] (megatron,
# metis, one-pipeline: `strategy_pipelines` in pipeline_baselines.py), written as the search's
# pipelines are; their status is BASELINE with no bound (a one-pipeline solve's own bound covers
# one pipeline on every device, not the data-parallel plans the problem allows).
FX_STRATEGIES = ("fx-size-based",)  # torch.fx's, computed by the caller (baselines/fx_partitioner.py)
STRATEGIES = ("optimal", *BASELINES, *FX_STRATEGIES)
DATA_PARALLEL_STRATEGIES = ("optimal", "megatron", "metis", "one-pipeline")  # NOTE [pipeline baselines]


def check_strategy(name: str, data_parallel: bool = False) -> None:
    """`--strategy NAME` for one pipeline, or with `data_parallel` for `--parallel data` (NOTE [--strategy])."""
    known, other = ((DATA_PARALLEL_STRATEGIES, STRATEGIES) if data_parallel else (STRATEGIES, DATA_PARALLEL_STRATEGIES))
    if name in known:
        return
    if name in other:
        raise HetpartError(f"--strategy {name} is a baseline of " + (
            "one pipeline: leave out --parallel data with it" if data_parallel else
            "data-parallel pipelines: pass --parallel data with it") + f" (with{'' if data_parallel else 'out'} "
            f"--parallel data: {', '.join(known)})")
    raise HetpartError(f"--strategy {name}: unknown strategy (known: {', '.join(known)}"
                       + ("" if data_parallel else f"; with --parallel data: {', '.join(DATA_PARALLEL_STRATEGIES[1:])}")
                       + ")")


def strategy_plan(problem: Problem, name: str, fx: Callable[[], list[Baseline]]) -> Plan:
    """The plan of baseline `name` (NOTE [--strategy]); `fx()` gives torch.fx's baselines."""
    check_strategy(name)
    if name in BASELINES:
        problem.validate()
        b = BASELINES[name](problem)
    else:
        b = next(x for x in fx() if x.name == name)
    if b.plan is None:
        why = "; ".join(b.violations) or b.note or "the method found none"
        raise HetpartError(f"--strategy {name}: no plan for this model and cluster ({why}); pick another --strategy")
    if not b.feasible:
        over = [f"stage {s.index} on {s.device} needs {s.memory_bytes:,} bytes, "
                f"{s.memory_bytes - s.capacity_bytes:,} over its capacity of {s.capacity_bytes:,}"
                for s in b.plan.stages if s.memory_bytes > s.capacity_bytes]
        why = "; ".join(over) or "; ".join(b.violations)
        raise HetpartError(f"--strategy {name}: its plan does not fit the cluster ({why}); the artifacts would not "
                           "run there: pick another --strategy, or a cluster with more memory")
    return b.plan
