"""The exact partitioner: one CP-SAT model of the whole problem, seeded by the DP.

DESIGN.md section 5 and PARTITIONING-NOTES finding 2: order encoding
y[v,k] = [stage(v) <= k], device literals a[k,d], costs enforced under the
literal of the stage's device type, machine or capacity. The model is built in
sections (data, variables, constraints, objective, solve); the returned plan's
costs come from `evaluate.py`, never from solver values.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from ortools.sat.python import cp_model

from hetpart.errors import HetpartError
from hetpart.partitioner.bounds import Bounds, compute_bounds, objective_bound_ns
from hetpart.partitioner.certificate import check_by_default, check_plan, plan_provenance
from hetpart.partitioner.coarsen import coarsen, cut_candidates
from hetpart.partitioner.constraints import check_constraints
from hetpart.partitioner.dp import Segments, contiguous_plan, dp_hint, order_tables, refine_cuts
from hetpart.partitioner.ideals import ideal_dp
from hetpart.partitioner.costs import (
    boundary_bytes, device_classes, links, machine_link, max_stage_memory_bytes, node_time_ns, slot_capacity_bytes,
    stage_memory_bytes, stage_time_ns, stash_microbatches, transfer_ns,
)
from hetpart.partitioner.evaluate import OBJECTIVES, bottleneck_ns, evaluate, objective_ns
from hetpart.partitioner.problem import (
    FORBIDDEN_TYPES,
    MEM_BYTES,
    OUT_BYTES,
    PIN,
    PIN_FIRST,
    PIN_LAST,
    WEIGHTS,
    Plan,
    Problem,
    StageCost,
)
from hetpart.partitioner.verify import plan_violations

LogCallback = Callable[[int, int], None]  # (objective_ns, bound_ns) on each improving solution
COARSEN_ABOVE = 1_000  # nodes; above, `solve` coarsens (NOTE [coarsened solve])
COARSE_NODES = 300  # runs of the coarse problem CP-SAT sees
DP_SHARE = 0.5  # of the time limit, the most the DP may take (NOTE [DP deadline] in dp.py)
IDEAL_SHARE = 0.8  # of the time limit, when the DP over ideals must be done (NOTE [ideal DP] in ideals.py)
INT32_SAFE_NS = 2**31 - 1  # stage times the model may reach before presolve needs NOTE [int32 activities]
BOUNDS_SHARE = 0.65  # of the time limit, when the search-free bounds must be done (NOTE [bounds deadline])


@dataclass
class _Model:
    """The CP-SAT model and its variables, indexed like the data they model."""

    model: cp_model.CpModel
    order: list[str]
    num_stages: int  # K: stages the model may use
    y: dict[str, list[cp_model.IntVar]]  # y[v][k] = [stage(v) <= k]
    used: list[cp_model.IntVar]  # stage k holds nodes
    a: list[dict[str, cp_model.IntVar]]  # a[k][slot] = stage k runs on slot (NOTE [slots])
    is_type: list[dict[str, cp_model.IntVar]]
    on_machine: list[dict[str, cp_model.IntVar]]
    has_capacity: list[dict[int, cp_model.IntVar]]
    cross: dict[str, list[cp_model.IntVar]]  # cross[u][k]: u's output crosses boundary k
    any_cross: list[cp_model.IntVar]
    comm: list[cp_model.IntVar]  # ns of boundary k
    compute: list[cp_model.IntVar]  # ns of stage k's compute
    holds: dict[str, list[cp_model.IntVar]]  # holds[w][k]: stage k holds weight w
    bottleneck: cp_model.IntVar
    stage_time: list[cp_model.IntVar]  # per stage, only for the latency and iteration objectives
    stats: dict[str, float] = field(default_factory=dict)
    time_ub_ns: int = 0  # the most a stage's time can reach in the model (NOTE [int32 activities] in placement.py)


class _PastDeadline(Exception):
    """`_build` passed its deadline: the model is too large to build within the time limit."""


def _build(problem: Problem, objective: str = "throughput", microbatches: int = 1,
           bottleneck_lb_ns: int = 0, deadline: float | None = None) -> _Model:
    """The CP-SAT model; raises _PastDeadline once `deadline` (a `time.perf_counter()` value) passes
    (a cluster of many machines makes machines^2 link constraints per boundary, NOTE [bounds deadline])."""
    g = problem.graph

    def check_clock() -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise _PastDeadline

    # --- Data (stable orders: nodes in `node_order`, devices in list order).
    order = problem.node_order()
    pin = {v: g.nodes[v].get(PIN) for v in order}
    free = [v for v in order if pin[v] != PIN_LAST]
    K = min(problem.max_stages or len(problem.devices), len(problem.devices), len(free))
    stages = range(K)
    slots = problem.slots
    capacity = {s.name: slot_capacity_bytes(problem, s) for s in slots}
    types = problem.device_types
    machines = sorted({s.node for s in slots})
    capacities = sorted(set(capacity.values()))
    time_ns = {v: {t: node_time_ns(problem, v, t) for t in types} for v in order}
    out_bytes = {v: g.nodes[v].get(OUT_BYTES, 0) for v in order}
    mem_bytes = {v: g.nodes[v].get(MEM_BYTES, 0) for v in order}
    readers: dict[str, list[str]] = {}
    for v in order:
        for w in g.nodes[v].get(WEIGHTS, ()):
            if v not in readers.setdefault(w, []):
                readers[w].append(v)
    senders = [u for u in order if out_bytes[u] > 0 and g.out_degree(u) > 0]
    total_bytes = sum(out_bytes[u] for u in senders)
    comm_ub = max(transfer_ns(link, total_bytes) for link in links(problem))
    compute_ub = sum(max(time_ns[v].values()) for v in order)
    stash_max, held_bytes = max_stage_memory_bytes(problem)
    total_mem = stash_max * sum(mem_bytes.values()) + sum(held_bytes[w] for w in readers)

    m = cp_model.CpModel()

    # --- Variables.
    y = {v: [m.new_bool_var(f"y[{v},{k}]") for k in stages] for v in order}
    for members in problem.colocation_groups().values():
        for v in members[1:]:
            # A co-location group's nodes share one stage: they share its literals.
            y[v] = y[members[0]]
    used = [m.new_bool_var(f"used[{k}]") for k in stages]
    a = []
    for k in stages:
        check_clock()
        a.append({s.name: m.new_bool_var(f"a[{k},{s.name}]") for s in slots})
    is_type = [{t: m.new_bool_var(f"type[{k},{t}]") for t in types} for k in stages]
    on_machine = [{mc: m.new_bool_var(f"machine[{k},{mc}]") for mc in machines} for k in stages]
    has_capacity = [{c: m.new_bool_var(f"capacity[{k},{c}]") for c in capacities} for k in stages]
    cross = {u: [m.new_bool_var(f"cross[{u},{k}]") for k in range(K - 1)] for u in senders}
    any_cross = [m.new_bool_var(f"any_cross[{k}]") for k in range(K - 1)]
    comm = [m.new_int_var(0, comm_ub, f"comm[{k}]") for k in range(K - 1)]
    compute = [m.new_int_var(0, compute_ub, f"compute[{k}]") for k in stages]
    holds = {w: [m.new_bool_var(f"holds[{w},{k}]") for k in stages] for w in readers}
    bottleneck = m.new_int_var(0, compute_ub + 2 * comm_ub, "bottleneck")

    def x(v: str, k: int) -> cp_model.LinearExprT:
        """[stage(v) == k] as a linear expression."""
        return y[v][k] - y[v][k - 1] if k > 0 else y[v][0]

    # --- Constraints: stages of nodes.
    for v in order:
        # Every node is in some stage: stage(v) <= K-1.
        m.add(y[v][K - 1] == 1)
        for k in range(K - 1):
            # stage(v) <= k implies stage(v) <= k+1.
            m.add_implication(y[v][k], y[v][k + 1])
    for u, v in sorted(g.edges, key=lambda e: (str(e[0]), str(e[1]))):
        for k in range(K - 1):
            # Every edge u->v keeps u in the same or an earlier stage.
            m.add_implication(y[v][k], y[u][k])
    for v in order:
        if pin[v] == PIN_FIRST:
            # A PIN_FIRST node (a model input) is in stage 0.
            m.add(y[v][0] == 1)

    # --- Constraints: which stages are used.
    # Stage 0 is used; used stages form a prefix 0..S-1.
    m.add(used[0] == 1)
    for k in range(1, K):
        m.add_implication(used[k], used[k - 1])
    for v in order:
        for k in range(1, K):
            # A node in stage >= k makes stage k used (so every node is in a used stage,
            # and an unused stage holds no node).
            m.add_implication(~y[v][k - 1], used[k])
    for k in stages:
        # A used stage holds at least one node not pinned last.
        m.add(sum(x(v, k) for v in free) >= used[k])
    for p in order:
        if pin[p] == PIN_LAST:
            for k in range(K - 1):
                # A PIN_LAST node (a model output) is in the last used stage: if it is in
                # stage <= k, stage k+1 is unused.
                m.add_implication(y[p][k], ~used[k + 1])

    # --- Constraints: slots (NOTE [slots]).
    for k in stages:
        check_clock()
        # A used stage runs on exactly one slot, an unused one on none.
        m.add(sum(a[k].values()) == used[k])
        for t in types:
            # type[k,t]: stage k runs on a slot of type t.
            m.add(is_type[k][t] == sum(a[k][s.name] for s in slots if s.type == t))
        for mc in machines:
            check_clock()
            # machine[k,mc]: stage k runs on a slot of machine mc.
            m.add(on_machine[k][mc] == sum(a[k][s.name] for s in slots if s.node == mc))
        for c in capacities:
            # capacity[k,c]: stage k runs on a slot with c bytes of memory.
            m.add(has_capacity[k][c] == sum(a[k][s.name] for s in slots if capacity[s.name] == c))
    for d in problem.devices:
        # Each device is in at most one chosen slot (so it runs at most one stage).
        m.add_at_most_one(a[k][s.name] for k in stages for s in slots if d.name in s.devices)
    for cls in device_classes(problem):
        for first, second in zip(cls.devices, cls.devices[1:]):
            for k in stages:
                # Interchangeable slots (same type, machine, capacity) are used in list
                # order: `second` runs stage k only if `first` runs an earlier stage.
                m.add(a[k][second] <= sum(a[j][first] for j in range(k)))

    for v in order:
        for t in sorted(set(g.nodes[v].get(FORBIDDEN_TYPES, ())) & set(types)):
            for k in stages:
                # A node never runs in a stage whose device type cannot run it.
                m.add(x(v, k) + is_type[k][t] <= 1)

    # --- Constraints: bytes over boundaries (see NOTE [stage time] in costs.py).
    for u in senders:
        succs = sorted(g.successors(u), key=str)
        for k in range(K - 1):
            for v in succs:
                # u's output crosses boundary k if u is in stage <= k and a consumer v is not.
                m.add_bool_or([~y[u][k], y[v][k], cross[u][k]])
            # Only a value produced at or before stage k can cross boundary k.
            m.add_implication(cross[u][k], y[u][k])
            # Something crosses boundary k if u's output does.
            m.add_implication(cross[u][k], any_cross[k])
    for k in range(K - 1):
        crossing = [cross[u][k] for u in senders]
        # Nothing crosses boundary k unless some value does (so latency is paid only then).
        if crossing:
            m.add_bool_or(crossing).only_enforce_if(any_cross[k])
        else:
            m.add(any_cross[k] == 0)
        nbytes = sum(out_bytes[u] * cross[u][k] for u in senders)
        for m1 in machines:
            check_clock()
            for m2 in machines:
                if m1 == m2 and sum(s.node == m1 for s in slots) < 2:
                    continue  # two stages cannot both run on this machine's only slot
                link = machine_link(problem, m1, m2)
                # Boundary k between machines m1 and m2 takes at least latency + bytes / bandwidth
                # when something crosses: (comm - latency) * bw >= 1000 * bytes, i.e. the
                # integer comm is >= costs.transfer_ns(link, bytes) exactly (ceil).
                bw = link.bandwidth_bytes_per_us
                m.add(bw * comm[k] - 1000 * nbytes >= bw * link.latency_ns).only_enforce_if(
                    [on_machine[k][m1], on_machine[k + 1][m2], any_cross[k]]
                )

    # --- Constraints: compute and memory per stage.
    for k in stages:
        check_clock()
        for t in types:
            # A stage on type t computes at least the sum of its nodes' times on t.
            m.add(compute[k] >= sum(time_ns[v][t] * x(v, k) for v in order)).only_enforce_if(is_type[k][t])
        for w, vs in readers.items():
            for v in vs:
                # A stage holds weight w if one of its nodes reads it.
                m.add(x(v, k) <= holds[w][k])
        activations = sum(mem_bytes[v] * x(v, k) for v in order)
        held = {w: holds[w][k] for w in readers}
        for num_stages, when in _stage_counts(problem, used, k):
            # A stage's weights (with gradients and optimizer state in training) and its activations
            # (times the microbatches its schedule stashes when the plan has `num_stages` stages) fit
            # in its slot's memory: NOTE [training memory], the formula of `evaluate`.
            load = stage_memory_bytes(problem, activations, held, k, num_stages)
            for c in capacities:
                if total_mem > c:
                    m.add(load <= c).only_enforce_if([has_capacity[k][c], *when])

    # --- Objective (NOTE [objectives] in evaluate.py): the slowest stage (compute plus the
    # boundaries on both sides), or the sum of the stages' times, or both.
    stage_time = []
    if objective != "throughput":
        stage_time = [m.new_int_var(0, compute_ub + 2 * comm_ub, f"stage_time[{k}]") for k in stages]
    for k in stages:
        comm_in = comm[k - 1] if k > 0 else 0
        comm_out = comm[k] if k < K - 1 else 0
        # The bottleneck is at least every stage's time.
        m.add(bottleneck >= stage_time_ns(compute[k], comm_in, comm_out))
        if stage_time:
            # A stage's time is its compute plus the boundaries on both of its sides.
            m.add(stage_time[k] >= stage_time_ns(compute[k], comm_in, comm_out))
    # Redundant cut: the bottleneck is at least any node's time on its fastest device type.
    m.add(bottleneck >= max(min(time_ns[v][t] for t in types) for v in order))
    # Redundant cut: the bottleneck is at least the search-free bound of bounds.py (valid for every plan).
    m.add(bottleneck >= bottleneck_lb_ns)
    if objective == "throughput":
        m.minimize(bottleneck)
    else:
        # Redundant cut: the stages together run every node, each at least at its fastest type's time.
        m.add(sum(stage_time) >= sum(min(time_ns[v][t] for t in types) for v in order))
        m.minimize(sum(stage_time) + (microbatches - 1 if objective == "iteration" else 0) * bottleneck)

    return _Model(
        model=m, order=order, num_stages=K, y=y, used=used, a=a, is_type=is_type, on_machine=on_machine,
        has_capacity=has_capacity, cross=cross, any_cross=any_cross, comm=comm, compute=compute, holds=holds,
        bottleneck=bottleneck, stage_time=stage_time, time_ub_ns=compute_ub + 2 * comm_ub,
    )


def _stage_counts(problem: Problem, used: list[cp_model.IntVar], k: int) -> list[tuple[int, list]]:
    """(S, literals that imply the plan has S stages, or at least S where the stash no longer changes)
    for stage k: the cases of NOTE [training memory] that the memory constraint needs.

    Used stages are a prefix, so S == s exactly when used[s-1] and not used[s]. Only 1F1B's stash
    depends on S, and it stops growing at S = k + M; every other case is one constraint.
    """
    K = len(used)
    t = problem.training
    if t is None or t.schedule != "1f1b":
        return [(K, [])]
    cases = []
    for s in range(k + 1, K + 1):
        if s - k >= t.microbatches or s == K:
            cases.append((s, [used[s - 1]]))  # S >= s: the stash is min(S - k, M) = that of s
            break
        cases.append((s, [used[s - 1], ~used[s]]))
    return cases


def _canonical(problem: Problem, device_of_stage: list[str]) -> list[str]:
    """The same plan (its slot of each stage) with each class of interchangeable slots used in list order."""
    out = list(device_of_stage)
    for cls in device_classes(problem):
        at = [k for k, name in enumerate(device_of_stage) if name in cls.devices]
        for k, name in zip(at, cls.devices):
            out[k] = name
    return out


def _add_hint(problem: Problem, mdl: _Model, stage_of: dict[str, int], device_of_stage: list[str]) -> None:
    """Hint every variable from one complete plan, so CP-SAT starts from a feasible solution."""
    m, K, S = mdl.model, mdl.num_stages, len(device_of_stage)
    g = problem.graph
    costs = evaluate(problem, stage_of, device_of_stage)
    crossing = boundary_bytes(problem, stage_of, S)
    hinted: set[int] = set()
    for v in mdl.order:
        if id(mdl.y[v]) in hinted:
            continue  # a co-location group's nodes share their literals: hint them once
        hinted.add(id(mdl.y[v]))
        for k in range(K):
            m.add_hint(mdl.y[v][k], stage_of[v] <= k)
    for u, lits in mdl.cross.items():
        last = max(stage_of[v] for v in g.successors(u))
        for k, lit in enumerate(lits):
            m.add_hint(lit, stage_of[u] <= k < last)
    for k in range(K):
        slot = problem.slot(device_of_stage[k]) if k < S else None
        cap = slot_capacity_bytes(problem, slot) if slot is not None else None
        m.add_hint(mdl.used[k], slot is not None)
        for name, lit in mdl.a[k].items():
            m.add_hint(lit, slot is not None and name == slot.name)
        for t, lit in mdl.is_type[k].items():
            m.add_hint(lit, slot is not None and t == slot.type)
        for mc, lit in mdl.on_machine[k].items():
            m.add_hint(lit, slot is not None and mc == slot.node)
        for c, lit in mdl.has_capacity[k].items():
            m.add_hint(lit, slot is not None and c == cap)
        m.add_hint(mdl.compute[k], costs[k].compute_ns if k < S else 0)
        for w, lits in mdl.holds.items():
            m.add_hint(lits[k], k < S and any(w in g.nodes[v].get(WEIGHTS, ()) for v in costs[k].nodes))
        if k < K - 1:
            m.add_hint(mdl.any_cross[k], k < S - 1 and crossing[k] > 0)
            m.add_hint(mdl.comm[k], costs[k].comm_out_ns if k < S else 0)
    m.add_hint(mdl.bottleneck, bottleneck_ns(costs))
    for k, var in enumerate(mdl.stage_time):
        m.add_hint(var, costs[k].time_ns if k < S else 0)


def _check_hint(problem: Problem, hint: Plan, num_stages: int) -> None:
    g = problem.graph
    S = len(hint.slot_of_stage)
    if set(hint.stage_of) != set(g.nodes) or any(not 0 <= s < S for s in hint.stage_of.values()):
        raise HetpartError(
            "partitioner: the hint plan does not match this graph (nodes or stages differ); "
            "drop the hint or recompute it for this model"
        )
    if S > num_stages or any(name not in {s.name for s in problem.slots} for name in hint.slot_of_stage):
        raise HetpartError(
            f"partitioner: the hint plan uses {S} stages on {hint.slot_of_stage}, but this "
            f"problem allows {num_stages} stages on {[s.name for s in problem.slots]}; drop the hint"
        )


class _Progress(cp_model.CpSolverSolutionCallback):
    """Reports each improving solution to `log_callback`, and stops the search once it is within
    `gap` of max(CP-SAT's bound, `external_lb`) (NOTE [gap stop])."""

    def __init__(self, log_callback: LogCallback | None, gap: float = 0.0, external_lb: int = 0):
        super().__init__()
        self._log = log_callback
        self._gap = gap
        self._external_lb = external_lb

    def on_solution_callback(self) -> None:
        objective, bound = int(round(self.objective_value)), math.ceil(self.best_objective_bound - 1e-6)
        if self._log is not None:
            self._log(objective, bound)
        if self._gap > 0 and _within_gap(objective, max(bound, self._external_lb), self._gap):
            self.stop_search()


# NOTE [gap stop]
# `solve(gap=g)` returns as soon as its plan is certified within g of optimal, i.e.
# (value - bound) / value <= g, with the bound the larger of CP-SAT's and the search-free
# ones of bounds.py (NOTE [sequence bound] above all, which the model does not see):
# - before CP-SAT: when the DP's plan is already within g of the search-free bound, CP-SAT
#   is not built at all;
# - during: CP-SAT's relative_gap_limit = g covers its own bound rising, and a solution
#   callback covers a new solution coming within g of the external bound (that bound is
#   fixed, so only new solutions can close that gap).
# CP-SAT reports OPTIMAL when its gap limit stops it; `solve` calls the plan OPTIMAL only
# when the bound reaches the value, WITHIN_GAP when it is within g (whatever stopped the
# search), FEASIBLE otherwise. g = 0 (the default) proves optimality as before.
# Deterministic as before: with one worker the callback stops at the same solution.
def _within_gap(value: int, bound: int, gap: float) -> bool:
    """Whether `value` is certified within the relative `gap` of optimal by `bound` (NOTE [gap stop])."""
    return value <= 0 or value - bound <= gap * value


def _node_need(problem: Problem, v: str) -> int:
    """Memory `v` needs wherever it goes: in training, the least stash of any stage (GPipe: M; 1F1B: 1)."""
    attrs = problem.graph.nodes[v]
    return stage_memory_bytes(problem, attrs.get(MEM_BYTES, 0), dict.fromkeys(attrs.get(WEIGHTS, ()), 1), 0, 1)


def _infeasible_message(problem: Problem) -> str:
    """Why no plan fits, in the data's terms."""
    g = problem.graph
    weights = sorted({w for v in g.nodes for w in g.nodes[v].get(WEIGHTS, ())})
    activations = sum(g.nodes[v].get(MEM_BYTES, 0) for v in g.nodes)
    need = stage_memory_bytes(problem, activations, dict.fromkeys(weights, 1), 0, 1)
    capacity = sum(d.capacity_bytes for d in problem.devices)
    biggest_dev = max(problem.devices, key=lambda d: d.capacity_bytes)
    biggest_node = max(g.nodes, key=lambda v: _node_need(problem, v))
    biggest_weight = max(weights, key=lambda w: problem.weights[w], default=None)
    if _node_need(problem, biggest_node) > biggest_dev.capacity_bytes:
        cause = f"node {biggest_node!r} alone is larger than the largest device"
    elif need > capacity:
        cause = "the model needs more than all the devices' memory together"
    else:
        cause = "the model fits in the devices' memory together but in no split of it into stages"
    lines = [
        f"partitioner: no plan fits in memory: {cause}.",
        f"  activations + weights: {need} bytes (weights counted once); total device memory: {capacity} bytes"
        f" over {len(problem.devices)} devices"
        + (f" (max_stages={problem.max_stages})" if problem.max_stages else ""),
        f"  largest single node: {biggest_node!r} needs {_node_need(problem, biggest_node)} bytes; "
        f"largest device: {biggest_dev.name!r} with {biggest_dev.capacity_bytes} bytes",
    ]
    if biggest_weight is not None:
        lines.append(f"  largest weight: {biggest_weight!r} with {problem.weights[biggest_weight]} bytes")
    t = problem.training
    if t is not None:
        state = sum(t.state_bytes.get(w, 0) for w in weights)
        lines.append(
            f"  training ({t.schedule}, {t.microbatches} microbatches): the need above counts {state} bytes of "
            f"gradients and optimizer state and the activations of {stash_microbatches(problem, 0, 1)} "
            f"microbatch(es) ({activations} bytes each); "
            + ("1F1B stage k of S stashes min(S-k, M)" if t.schedule == "1f1b" else "GPipe stashes all M; "
               "--schedule 1f1b stashes fewer")
        )
    lines.append(
        "  Add devices or larger ones, allow more stages, reduce the batch size, or note that pins "
        "(inputs first, outputs last) and weights shared across stages add memory."
    )
    return "\n".join(lines)


def solve(
    problem: Problem,
    *,
    time_limit_s: float = 30.0,
    seed: int = 0,
    workers: int = 1,
    hint: Plan | None = None,
    log_callback: LogCallback | None = None,
    objective: str = "throughput",
    microbatches: int = 1,
    coarsen_above: int | None = COARSEN_ABOVE,
    gap: float = 0.0,
    check_certificate: bool | None = None,
) -> Plan:
    """The plan with the least bottleneck (NOTE [stage time]), or the best found in `time_limit_s`.

    `objective` is one of NOTE [objectives] (evaluate.py): "throughput" (the bottleneck),
    "latency" (sum of stage times) or "iteration" (that + (microbatches - 1) x bottleneck);
    the plan's `objective_ns` and `lower_bound_ns` are in its terms.

    Starts CP-SAT from `hint`, or from `dp_hint(problem)` when no hint is given;
    returns a plan with 0..S-1 stages, costs recomputed by `evaluate`, and the
    solver's proven bound. Above `coarsen_above` nodes (None: never), NOTE [coarsened solve].
    `gap` > 0 stops as soon as the plan is certified within that relative gap of optimal
    (status "WITHIN_GAP", NOTE [gap stop]); 0 proves optimality or runs out the time limit.
    Honours co-location groups and forbidden device types (constraints.py).
    Raises HetpartError when no plan fits in memory, when the groups and forbidden
    types rule out every plan (naming which and why), or
    none was found in time.
    The plan's `certificate` names its bound's source; `check_certificate` (None: the
    HETPART_CHECK_CERTIFICATE environment variable) re-proves an OPTIMAL or WITHIN_GAP
    claim by another route, NOTE [checked certificates] in certificate.py.

        >>> import networkx as nx
        >>> from hetpart.partitioner.problem import Device, Link
        >>> g = nx.path_graph(["a", "b", "c"], create_using=nx.DiGraph)
        >>> nx.set_node_attributes(g, {"a": {"gpu": 30}, "b": {"gpu": 30}, "c": {"gpu": 60}}, "time_ns")
        >>> p = Problem(graph=g, weights={}, devices=[Device("g0", "gpu", "n0", 1), Device("g1", "gpu", "n0", 1)],
        ...             intra_node_links={"n0": Link(1000, 0)}, network=Link(1000, 0))
        >>> plan = solve(p)
        >>> plan.stage_of, plan.bottleneck_ns, plan.solver_status
        ({'a': 0, 'b': 0, 'c': 1}, 60, 'OPTIMAL')
    """
    plan = _solve_unchecked(problem, time_limit_s=time_limit_s, seed=seed, workers=workers, hint=hint,
                            log_callback=log_callback, objective=objective, microbatches=microbatches,
                            coarsen_above=coarsen_above, gap=gap)
    if check_certificate if check_certificate is not None else check_by_default():
        t_check = time.perf_counter()
        plan = check_plan(problem, plan, time_limit_s=time_limit_s, coarsen_above=coarsen_above)
        plan.stats["certificate_seconds"] = time.perf_counter() - t_check
    return plan


def _solve_unchecked(problem: Problem, *, time_limit_s: float, seed: int, workers: int, hint: Plan | None,
                     log_callback: LogCallback | None, objective: str, microbatches: int,
                     coarsen_above: int | None, gap: float) -> Plan:
    """`solve` without the certificate check."""
    t0 = time.perf_counter()
    if not time_limit_s > 0:
        raise HetpartError(
            f"partitioner: time limit must be positive, got {time_limit_s}; pass --time-limit > 0"
        )
    if workers < 1:
        raise HetpartError(f"partitioner: workers must be at least 1, got {workers}")
    if objective not in OBJECTIVES:
        raise HetpartError(f"partitioner: unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    if microbatches < 1:
        raise HetpartError(f"partitioner: microbatches must be at least 1, got {microbatches}")
    if not 0.0 <= gap < 1.0:
        raise HetpartError(
            f"partitioner: gap must be a fraction in [0, 1), got {gap}; pass e.g. --gap 0.01 for 1%"
        )
    problem.validate()
    largest = max(d.capacity_bytes for d in problem.devices)
    if any(_node_need(problem, v) > largest for v in problem.graph.nodes):
        raise HetpartError(_infeasible_message(problem))
    check_constraints(problem)
    if coarsen_above is not None and problem.graph.number_of_nodes() > coarsen_above:
        return _solve_coarsened(problem, t0, time_limit_s=time_limit_s, seed=seed, workers=workers, hint=hint,
                                log_callback=log_callback, objective=objective, microbatches=microbatches, gap=gap)

    dp_plan = dp_hint(problem, time_limit_s=DP_SHARE * time_limit_s)
    t_dp = time.perf_counter()
    bounds = compute_bounds(problem, upper_ns=dp_plan.bottleneck_ns if dp_plan is not None else None,
                            deadline=t0 + BOUNDS_SHARE * time_limit_s)
    # The model's cut leaves out NOTE [sequence bound]: fed to CP-SAT it changed its search for the
    # worse (zoo:llama training on a100-t4-8: proven optimal in 16 s without it, 15% gap after 30 s
    # with it). The plan reports it all the same (objective_bound_ns below).
    model_lb = max(bounds.lp_work_ns, bounds.largest_op_ns, bounds.stage_sum_ns)
    value = lambda st: objective_ns(st, objective, microbatches)  # noqa: E731
    search_free_lb = objective_bound_ns(problem, bounds, objective, microbatches)
    pre_stats = {"dp_seconds": t_dp - t0}
    certified = _certified_dp_plan(dp_plan, search_free_lb, gap, objective=objective, microbatches=microbatches,
                                   t0=t0, bounds=bounds, stats=pre_stats)
    if certified is not None:
        return certified
    dp_plan, bounds, certified = _ideal_pass(problem, dp_plan, bounds, t0 + IDEAL_SHARE * time_limit_s, gap=gap,
                                             objective=objective, microbatches=microbatches, t0=t0, stats=pre_stats)
    if certified is not None:
        return certified
    search_free_lb = objective_bound_ns(problem, bounds, objective, microbatches)
    try:
        mdl = _build(problem, objective, microbatches, model_lb, deadline=t0 + time_limit_s)
    except _PastDeadline:
        # No time left to search: the DP's plan with the search-free bounds (NOTE [bounds deadline]).
        if dp_plan is None:
            raise HetpartError(
                f"partitioner: no plan found within {time_limit_s:g} s ({problem.graph.number_of_nodes()} nodes, "
                f"{len(problem.devices)} devices on {len({d.node for d in problem.devices})} machines): the "
                "CP-SAT model did not finish building; raise --time-limit or plan on fewer machines") from None
        return _finished_plan(dp_plan.stage_of, dp_plan.device_of_stage, dp_plan.stages, search_free_lb, False,
                              objective=objective, microbatches=microbatches, t0=t0,
                              stats={**pre_stats, "cpsat_not_built": 1.0, "plan_from_dp": 1.0,
                                     "dp_bottleneck_ns": float(dp_plan.bottleneck_ns)}, bounds=bounds, gap=gap)
    if hint is not None:
        _check_hint(problem, hint, mdl.num_stages)
        start = (hint.stage_of, _canonical(problem, hint.device_of_stage))
    elif dp_plan is not None:
        start = (dp_plan.stage_of, _canonical(problem, dp_plan.device_of_stage))
    else:
        start = None
    if start is not None:
        _add_hint(problem, mdl, *start)
    t_build = time.perf_counter()

    solver = cp_model.CpSolver()
    # What is left of the limit; when neither the DP nor a hint gave a plan, CP-SAT is the only
    # way to one: then a quarter of the limit at least, even if the DP and bounds overran it.
    floor_s = 0.25 * time_limit_s if start is None else 0.0
    solver.parameters.max_time_in_seconds = max(floor_s, time_limit_s - (t_build - t0))
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = workers
    # PARTITIONING-NOTES finding 3: presolve dominates on big models; probing is what costs.
    solver.parameters.cp_model_probing_level = 0
    if mdl.time_ub_ns > INT32_SAFE_NS:
        # NOTE [int32 activities] (placement.py): OR-Tools 9.15's presolve gets `bottleneck >= sum(...)`
        # wrong once the sum can reach 2**31; its inclusion step is where ("linear + amo"), so it goes.
        # (Random 2-6 node problems with ops of 0.03-1.2 s: 33 of 146 claimed bounds above the
        # brute-force optimum with it, none of 296 without.)
        solver.parameters.presolve_inclusion_work_limit = 0
    if gap > 0:
        solver.parameters.relative_gap_limit = gap  # NOTE [gap stop]; the callback adds the external bound
    callback = _Progress(log_callback, gap, search_free_lb) if log_callback or gap > 0 else None
    status = solver.solve(mdl.model, callback)
    t_solve = time.perf_counter()

    proto = mdl.model.proto
    stats = {
        **pre_stats,
        "build_seconds": t_build - t_dp - pre_stats.get("ideal_seconds", 0.0),  # bounds included
        "cpsat_seconds": t_solve - t_build,
        "variables": float(len(proto.variables)),
        "constraints": float(len(proto.constraints)),
        "max_stages": float(mdl.num_stages),
        "presolve_inclusion_off": float(mdl.time_ub_ns > INT32_SAFE_NS),
    }
    if dp_plan is not None:
        stats["dp_bottleneck_ns"] = float(dp_plan.bottleneck_ns)

    if status == cp_model.INFEASIBLE:
        raise HetpartError(_infeasible_message(problem) + _constraints_note(problem))
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"hetpart bug: invalid CP-SAT model: {mdl.model.validate()}")
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    bound = max(0, math.ceil(solver.best_objective_bound - 1e-6)) if found else 0
    stats["solver_bound_ns"] = float(bound)
    if not found:
        if dp_plan is None:
            raise HetpartError(
                f"partitioner: no plan found within {time_limit_s:g} s "
                f"({len(mdl.order)} nodes, {len(problem.devices)} devices); raise --time-limit"
            )
        stage_of, device_of_stage, status_name = dp_plan.stage_of, dp_plan.device_of_stage, "FEASIBLE"
    else:
        # Read the solution; used stages are a prefix, renumber them 0..S-1 all the same.
        raw = {v: next(k for k in range(mdl.num_stages) if solver.boolean_value(mdl.y[v][k])) for v in mdl.order}
        used = sorted(set(raw.values()))
        renumber = {k: i for i, k in enumerate(used)}
        stage_of = {v: renumber[raw[v]] for v in problem.graph.nodes}
        device_of_stage = [next(d for d, lit in mdl.a[k].items() if solver.boolean_value(lit)) for k in used]
        # With a gap, CP-SAT's OPTIMAL may mean "within the gap limit": then only the bound says optimal.
        status_name = "OPTIMAL" if status == cp_model.OPTIMAL and gap == 0 else "FEASIBLE"

    stages = evaluate(problem, stage_of, device_of_stage)
    if dp_plan is not None and value(dp_plan.stages) < value(stages):
        stage_of, device_of_stage, stages = dp_plan.stage_of, dp_plan.device_of_stage, dp_plan.stages
    bounds = dataclasses.replace(bounds, solver_ns=max(0, bound) if objective == "throughput" else 0)
    proven = objective_bound_ns(problem, bounds, objective, microbatches, solver_ns=bound)
    return _finished_plan(stage_of, device_of_stage, stages, proven, status_name == "OPTIMAL",
                          objective=objective, microbatches=microbatches, t0=t0, stats=stats, bounds=bounds, gap=gap)


def _ideal_pass(problem: Problem, dp_plan: Plan | None, bounds: Bounds, deadline: float, *, gap: float,
                objective: str, microbatches: int, t0: float, stats: dict[str, float]
                ) -> tuple[Plan | None, Bounds, Plan | None]:
    """NOTE [ideal DP]: on graphs with few ideals, the optimum (memory relaxed) or a plan within
    `gap` of it, by a DP, for the throughput objective: (the better of its plan and `dp_plan`, the
    bounds with `ideal_ns`, the plan finished when it is certified within `gap`)."""
    if objective != "throughput" or dp_plan is None:
        return dp_plan, bounds, None
    t_ideal = time.perf_counter()
    got = ideal_dp(problem, dp_plan.bottleneck_ns, deadline=deadline, lower_ns=bounds.lower_bound_ns, gap=gap)
    stats["ideal_seconds"] = time.perf_counter() - t_ideal
    if got is None:
        return dp_plan, bounds, None
    bounds = dataclasses.replace(bounds, ideal_ns=got.bound_ns)
    if got.plan is not None and got.plan.bottleneck_ns < dp_plan.bottleneck_ns:
        dp_plan = dataclasses.replace(got.plan, stats={**dp_plan.stats, "from_ideal_dp": 1.0})
    certified = _certified_dp_plan(dp_plan, objective_bound_ns(problem, bounds, objective, microbatches), gap,
                                   objective=objective, microbatches=microbatches, t0=t0, bounds=bounds, stats=stats,
                                   exact_bound=True)
    return dp_plan, bounds, certified


def _certified_dp_plan(dp_plan: Plan | None, lower_bound_ns: int, gap: float, *, objective: str, microbatches: int,
                       t0: float, bounds: Bounds, stats: dict[str, float], exact_bound: bool = False) -> Plan | None:
    """The DP's plan, finished, when it is already within `gap` of `lower_bound_ns` (NOTE [gap stop]:
    the solver could only narrow the gap); else None. With `gap` 0 only when `exact_bound` (a bound
    that is the optimum where it is reached, NOTE [ideal DP]) and the bound proves the plan optimal."""
    if (gap <= 0 and not exact_bound) or dp_plan is None or not _within_gap(
            objective_ns(dp_plan.stages, objective, microbatches), lower_bound_ns, gap):
        return None
    return _finished_plan(dp_plan.stage_of, dp_plan.device_of_stage, dp_plan.stages, lower_bound_ns, False,
                          objective=objective, microbatches=microbatches, t0=t0,
                          stats={**stats, "dp_bottleneck_ns": float(dp_plan.bottleneck_ns)}, bounds=bounds, gap=gap)


def _finished_plan(stage_of: dict[str, int], device_of_stage: list[str], stages: list[StageCost], proven_ns: int,
                   solver_optimal: bool, *, objective: str, microbatches: int, t0: float, stats: dict[str, float],
                   bounds: Bounds, gap: float = 0.0) -> Plan:
    """The plan `solve` returns: its objective value, and the proven bound capped by it (OPTIMAL
    when the solver says so or the bound reaches the value; else WITHIN_GAP when `gap` > 0 and
    the bound is within it, NOTE [gap stop]; else FEASIBLE)."""
    best = objective_ns(stages, objective, microbatches)
    if solver_optimal or proven_ns >= best:
        status = "OPTIMAL"
    elif gap > 0 and _within_gap(best, proven_ns, gap):
        status = "WITHIN_GAP"
    else:
        status = "FEASIBLE"
    plan = Plan(
        stage_of=stage_of,
        device_of_stage=device_of_stage,
        stages=stages,
        bottleneck_ns=bottleneck_ns(stages),
        lower_bound_ns=min(proven_ns, best),
        solver_status=status,
        solve_seconds=time.perf_counter() - t0,
        stats=stats,
        bounds=bounds,
        objective=objective,
        objective_ns=best,
        microbatches=microbatches,
    )
    return dataclasses.replace(plan, certificate=plan_provenance(plan))


def _constraints_note(problem: Problem) -> str:
    """A line for the infeasibility message when co-location groups or forbidden types narrowed the choice."""
    groups = problem.colocation_groups()
    forbidding = [v for v in problem.graph.nodes if problem.graph.nodes[v].get(FORBIDDEN_TYPES)]
    if not groups and not forbidding:
        return ""
    names = ", ".join(map(repr, list(groups)[:5]))
    return (f"\n  The plan must also keep {len(groups)} co-location group(s) ({names}) "
            f"in one stage each and {len(forbidding)} op(s) off the device types they forbid "
            f"(e.g. {', '.join(map(repr, forbidding[:3]))}); relax those if the memory above looks sufficient.")



# NOTE [coarsened solve]
# Above COARSEN_ABOVE nodes one CP-SAT model of the whole graph stalls in presolve
# (PARTITIONING-NOTES finding 3), so `solve`:
# 1. runs the DP (dp.py, NOTE [candidate cuts]: coarse cut candidates, then op-level
#    windows around its cuts) -- the plan to beat, contiguous in the node order; and where
#    the graph without its free nodes has few ideals (hf:llama at 7B dimensions: 1,677 nodes,
#    7,115 ideals), NOTE [ideal DP], which may prove that plan optimal or beat it;
# 2. coarsens the graph into about COARSE_NODES runs of the order (coarsen.py, NOTE
#    [coarse nodes]), with the DP's cuts among the run boundaries so its plan is a
#    coarse plan, and lets CP-SAT improve that plan on the coarse problem (it may
#    place runs out of order, which the DP cannot) for the rest of the time limit;
# 3. reads the coarse answer back, recosts it exactly on the original problem, and
#    when it is contiguous in the order refines its cuts op by op (dp.refine_cuts, devices
#    fixed); then keeps the better of that and the DP's plan: never worse than the DP.
# Bounds: the coarse CP-SAT bound is a bound of the coarse problem only (fewer plans,
# transfers rounded up), NOT of the original one, so a coarsened plan reports only the
# search-free bounds of bounds.py (LP work bound, largest op, memory) and the ideal DP's,
# which hold for every plan of the original problem; its gap is honest and usually wider than a
# fine solve's. Deterministic for a given seed and worker count as long as the coarse
# CP-SAT finishes (or stops) at the same point: the DP and refinement are.


def _solve_coarsened(problem: Problem, t0: float, *, time_limit_s: float, seed: int, workers: int,
                     hint: Plan | None, log_callback: LogCallback | None, objective: str,
                     microbatches: int, gap: float = 0.0) -> Plan:
    """NOTE [coarsened solve]."""
    value = lambda st: objective_ns(st, objective, microbatches)  # noqa: E731
    dp_plan = dp_hint(problem, time_limit_s=DP_SHARE * time_limit_s)
    t_dp = time.perf_counter()
    bounds = compute_bounds(problem, 0, upper_ns=dp_plan.bottleneck_ns if dp_plan is not None else None,
                            deadline=t0 + BOUNDS_SHARE * time_limit_s)
    valid_lb = objective_bound_ns(problem, bounds, objective, microbatches)
    t_bounds = time.perf_counter()
    pre_stats = {"dp_seconds": t_dp - t0, "bounds_seconds": t_bounds - t_dp}
    certified = _certified_dp_plan(dp_plan, valid_lb, gap, objective=objective, microbatches=microbatches, t0=t0,
                                   bounds=bounds, stats={**pre_stats, "plan_from_dp": 1.0})
    if certified is not None:
        return certified
    # The graph without its free nodes may have few ideals even here (hf:llama at 7B: 7,115).
    dp_plan, bounds, certified = _ideal_pass(problem, dp_plan, bounds, t0 + IDEAL_SHARE * time_limit_s, gap=gap,
                                             objective=objective, microbatches=microbatches, t0=t0, stats=pre_stats)
    if certified is not None:
        return certified
    valid_lb = objective_bound_ns(problem, bounds, objective, microbatches)
    candidates: list[tuple[str, dict[str, int], list[str]]] = []
    if dp_plan is not None:
        source = "ideal_dp" if dp_plan.stats.get("from_ideal_dp") else "dp"
        candidates.append((source, dp_plan.stage_of, dp_plan.device_of_stage))
    if hint is not None:
        _check_hint(problem, hint, len(problem.devices))
        candidates.append(("hint", hint.stage_of, hint.device_of_stage))

    tab = order_tables(problem)
    t_eval = time.perf_counter()
    start = min(candidates, key=lambda c: value(evaluate(problem, c[1], c[2])), default=None)
    # Reading the coarse answer back costs a few recostings and checks of the whole graph: keep time for them.
    reserve_s = 8 * (time.perf_counter() - t_eval) / max(1, len(candidates))
    cuts = cut_candidates(tab, COARSE_NODES)
    if start is not None and _is_contiguous(tab.order, start[1]):
        cuts = np.union1d(cuts, [i for i in range(1, tab.n) if start[1][tab.order[i]] != start[1][tab.order[i - 1]]])
    coarse = coarsen(problem, tab, cuts)
    stats: dict[str, float] = {**pre_stats,
                               "coarse_nodes": float(coarse.problem.graph.number_of_nodes()) if coarse else 0.0}
    if dp_plan is not None:
        stats["dp_bottleneck_ns"] = float(dp_plan.bottleneck_ns)
    remaining = time_limit_s - (time.perf_counter() - t0) - reserve_s
    if coarse is not None and remaining > 0.5:
        coarse_hint = None
        if start is not None and (c_stage := coarse.coarse_stage_of(start[1])) is not None:
            st = evaluate(coarse.problem, c_stage, start[2])
            coarse_hint = Plan(stage_of=c_stage, device_of_stage=start[2], stages=st, bottleneck_ns=bottleneck_ns(st),
                               lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
        progress = (lambda obj, _bound: log_callback(obj, valid_lb)) if log_callback else None
        try:
            cplan = solve(coarse.problem, time_limit_s=remaining, seed=seed, workers=workers, hint=coarse_hint,
                          log_callback=progress, objective=objective, microbatches=microbatches, coarsen_above=None,
                          check_certificate=False)
        except HetpartError:
            cplan = None  # the runs are too coarse to fit somewhere: keep the DP's plan
        if cplan is not None:
            stats["coarse_solver_status_optimal"] = float(cplan.solver_status == "OPTIMAL")
            stats["coarse_cpsat_seconds"] = cplan.solve_seconds
            fine = coarse.fine_stage_of(cplan.stage_of)
            candidates.append(("coarse", fine, cplan.device_of_stage))
            if _is_contiguous(tab.order, fine) and objective == "throughput":
                cut_pos = [0] + [i for i in range(1, tab.n) if fine[tab.order[i]] != fine[tab.order[i - 1]]] + [tab.n]
                seg = Segments(cuts=cut_pos, devices=cplan.device_of_stage, dp_ns=0, exact=True, states=0)
                refined = refine_cuts(problem, tab, seg, radius=max(16, 2 * tab.n // max(1, len(cuts))))
                ref = contiguous_plan(problem, tab, refined.cuts, refined.devices, t0, {})
                candidates.append(("refined", ref.stage_of, ref.device_of_stage))
    if not candidates:
        if not bounds.memory_feasible:
            raise HetpartError(_infeasible_message(problem) + _constraints_note(problem))
        raise HetpartError(
            f"partitioner: no plan found within {time_limit_s:g} s ({problem.graph.number_of_nodes()} nodes, "
            f"{len(problem.devices)} devices, coarsened): no contiguous split of the node order fits, and the "
            "coarse model found none either; raise --time-limit, or add memory (the weights and activations "
            "may fit only when split across more devices than the order allows)"
        )
    # Every candidate is recosted on the original problem, and one that breaks a rule is dropped.
    scored, seen = [], set()
    for i, (source, stage_of, device_of_stage) in enumerate(candidates):
        key = (tuple(stage_of[v] for v in tab.order), tuple(device_of_stage))
        if key in seen:
            continue  # the coarse solver often hands back the DP's plan
        seen.add(key)
        st = evaluate(problem, stage_of, device_of_stage)
        trial = Plan(stage_of=stage_of, device_of_stage=list(device_of_stage), stages=st,
                     bottleneck_ns=bottleneck_ns(st), lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
        if not plan_violations(problem, trial):
            scored.append((value(st), i, (source, stage_of, device_of_stage, st)))
    if not scored:
        raise HetpartError(
            f"partitioner: no valid plan found within {time_limit_s:g} s ({problem.graph.number_of_nodes()} nodes, "
            f"{len(problem.devices)} devices, coarsened); raise --time-limit"
        )
    _, _, (source, stage_of, device_of_stage, stages) = min(scored)
    stats["coarsened"] = 1.0
    stats["plan_from_" + source] = 1.0
    return _finished_plan({v: stage_of[v] for v in problem.graph.nodes}, list(device_of_stage), stages, valid_lb,
                          False, objective=objective, microbatches=microbatches, t0=t0, stats=stats, bounds=bounds,
                          gap=gap)


def _is_contiguous(order: list[str], stage_of: dict[str, int]) -> bool:
    """Whether the stages are contiguous runs of `order` (stage numbers never decrease along it)."""
    stages = [stage_of[v] for v in order]
    return all(a <= b for a, b in zip(stages, stages[1:]))
