"""What today's tools would plan, costed in hetpart's model (NOTE [stage time] in evaluate.py).

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

from hetpart.partitioner.dp import order_cut_bytes, transfer_ns
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import (
    LAYER, MEM_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Plan, Problem,
)
from hetpart.partitioner.verify import plan_violations

_INF = np.int64(1) << np.int64(60)


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


_DP_MAX_NODES = 6_000  # the DP holds (n+1)^2 int64 matrices: 290 MB each at 6,000 nodes


def dp_topo_order(problem: Problem) -> Baseline:
    """PipeDream style: the exact DP over contiguous segments of the order, devices in list order.

    Stage k runs on device k; the DP may use a prefix of the devices. Minimises the
    bottleneck of NOTE [stage time] under memory; infeasible when no prefix fits.
    """
    g = problem.graph
    order = problem.node_order()
    n = len(order)
    if n > _DP_MAX_NODES:
        return Baseline(name="dp-topo-order", plan=None, bottleneck_ns=None, feasible=False,
                        note=f"skipped: {n} nodes > {_DP_MAX_NODES} (the DP's matrices grow as n^2)")
    devices = problem.devices[: min(len(problem.devices), problem.max_stages or len(problem.devices))]
    idx = np.arange(n + 1)

    cut_bytes = order_cut_bytes(problem, order)

    # Segment memory [i, j): mem_bytes plus each weight read in the segment, once.
    mem_prefix = np.concatenate([[0], np.cumsum([g.nodes[v].get(MEM_BYTES, 0) for v in order], dtype=np.int64)])
    readers: dict[str, list[int]] = {}
    for i, v in enumerate(order):
        for w in g.nodes[v].get(WEIGHTS, ()):
            readers.setdefault(w, []).append(i)
    wdiff = np.zeros((n + 1, n + 2), dtype=np.int64)
    for w, rs in sorted(readers.items()):
        rs_arr = np.array(sorted(set(rs)))
        k = np.searchsorted(rs_arr, idx)
        has = k < len(rs_arr)
        np.add.at(wdiff, (idx[has], rs_arr[np.minimum(k, len(rs_arr) - 1)][has] + 1), problem.weights[w])
    seg_mem = mem_prefix[None, :] - mem_prefix[:, None] + np.cumsum(wdiff, axis=1)[:, : n + 1]
    later = idx[None, :] > idx[:, None]
    # Pins: stage 0 ends after the last PIN_FIRST node; a stage other than the last ends at or
    # before the first PIN_LAST node; the last stage starts at or before its last unpinned node.
    pins = [g.nodes[v].get(PIN) for v in order]
    first_end = max((i for i, p in enumerate(pins) if p == PIN_FIRST), default=-1) + 1
    inner_end = min([i for i, p in enumerate(pins) if p == PIN_LAST] + [n])
    last_start = max(i for i, p in enumerate(pins) if p != PIN_LAST)

    def transfer(a: int, b: int) -> np.ndarray:
        return transfer_ns(problem.link(devices[a].name, devices[b].name), cut_bytes)

    # best[S][k][j]: stages 0..k cover [0, j) and stage k is followed by another one (k < S-1) or not.
    # Stage k's time needs its outgoing boundary, so the DP runs once per stage count S.
    plan_best: tuple[int, int, list[int]] | None = None
    for S in range(1, len(devices) + 1):
        G = np.where(idx == 0, 0, _INF).astype(np.int64)  # G[i]: max time of stages before cut i
        backs = []
        for k in range(S):
            comp = np.concatenate([[0], np.cumsum([g.nodes[v][TIME_NS][devices[k].type] for v in order],
                                                  dtype=np.int64)])
            tin = transfer(k - 1, k) if k > 0 else np.zeros(n + 1, dtype=np.int64)
            tout = transfer(k, k + 1) if k < S - 1 else np.zeros(n + 1, dtype=np.int64)
            cost = (comp[None, :] - comp[:, None]) + tin[:, None] + tout[None, :]
            ok = later & (seg_mem <= devices[k].capacity_bytes) & (G[:, None] < _INF)
            ok &= (idx[None, :] >= first_end) if k == 0 else True
            ok &= (idx[None, :] <= inner_end) if k < S - 1 else (idx[:, None] <= last_start)
            val = np.where(ok, np.maximum(G[:, None], cost), _INF)
            arg = np.argmin(val, axis=0)
            G = val[arg, idx]
            backs.append(arg)
        if G[n] < _INF and (plan_best is None or G[n] < plan_best[0]):
            starts, j = [], n
            for arg in reversed(backs):
                j = int(arg[j])
                starts.append(j)
            plan_best = (int(G[n]), S, list(reversed(starts)))
    if plan_best is None:
        return Baseline(name="dp-topo-order", plan=None, bottleneck_ns=None, feasible=False,
                        violations=["no contiguous split of the order fits the devices' memory in list order"])
    _, S, starts = plan_best
    stage_of = {v: int(np.searchsorted(starts, i, side="right")) - 1 for i, v in enumerate(order)}
    return baseline_of(problem, "dp-topo-order", stage_of, [d.name for d in devices[:S]])


def compute_baselines(problem: Problem) -> list[Baseline]:
    """The torch-free baselines, in a fixed order: equal-layers, parameters, dp-topo-order."""
    problem.validate()
    return [equal_layers(problem), parameter_balanced(problem), dp_topo_order(problem)]
