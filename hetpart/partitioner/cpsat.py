"""The exact model: one CP-SAT model of the whole problem, and its solve call (`solve_model`).

DESIGN.md section 5 and PARTITIONING-NOTES finding 2: order encoding
y[v,k] = [stage(v) <= k], device literals a[k,d], costs enforced under the
literal of the stage's device type, machine or capacity. The model is built in
sections (data, variables, constraints, objective, solve); the plan built from its
answer takes its costs from `evaluate.py`, never from solver values. Which engines
run before it, and with how much time, is the strategy's (solve.py, NOTE [solve strategy]).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ortools.sat.python import cp_model

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import (
    boundary_bytes, device_classes, has_typed_memory, held_weight_bytes, links, machine_link, max_stage_memory_bytes,
    node_mem_bytes, node_out_tensors, node_time_ns, slot_capacity_bytes, stage_memory_bytes, stage_time_ns, transfer_ns,
)
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
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
)

LogCallback = Callable[[int, int], None]  # (objective_ns, bound_ns) on each improving solution
INT32_SAFE_NS = 2**31 - 1  # stage times the model may reach before presolve needs NOTE [int32 activities]


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
    time_ub_ns: int = 0  # the most a stage's time can reach in the model (NOTE [int32 activities] in placement/units.py)


class _PastDeadline(Exception):
    """`_build` passed its deadline: the model is too large to build within the time limit."""


def _build(problem: Problem, objective: str = "throughput", microbatches: int = 1,
           bottleneck_lb_ns: int = 0, deadline: float | None = None, break_symmetry: bool = True) -> _Model:
    """The CP-SAT model; raises _PastDeadline once `deadline` (a `time.perf_counter()` value) passes
    (a cluster of many machines makes machines^2 link constraints per boundary, NOTE [bounds deadline]).
    `break_symmetry=False` leaves interchangeable devices free (NOTE [lexicographic re-plan] in replan.py)."""
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
    check_clock()  # (the tables below and the variables take seconds on thousands of nodes)
    time_ns = {v: {t: node_time_ns(problem, v, t) for t in types} for v in order}
    out_bytes = {v: g.nodes[v].get(OUT_BYTES, 0) for v in order}
    mem_bytes = {v: g.nodes[v].get(MEM_BYTES, 0) for v in order}
    readers: dict[str, list[str]] = {}
    for v in order:
        for w in g.nodes[v].get(WEIGHTS, ()):
            if v not in readers.setdefault(w, []):
                readers[w].append(v)
    senders = [u for u in order if out_bytes[u] > 0 and g.out_degree(u) > 0]
    out_tensors = {u: node_out_tensors(problem, u) for u in senders}
    total_bytes = sum(out_bytes[u] for u in senders)
    comm_ub = max(transfer_ns(link, total_bytes, sum(out_tensors.values())) for link in links(problem))
    compute_ub = sum(max(time_ns[v].values()) for v in order)
    stash_max, held_bytes = max_stage_memory_bytes(problem)
    total_mem = stash_max * sum(mem_bytes.values()) + sum(held_bytes[w] for w in readers)
    typed_mem: dict[str, tuple[dict[str, int], int]] = {}  # slot type -> its node memory, its total (if typed)
    for t in types if has_typed_memory(problem) else ():
        mem_t = {v: node_mem_bytes(problem, v, t) for v in order}
        typed_mem[t] = (mem_t, stash_max * sum(mem_t.values()) + sum(held_weight_bytes(problem, w, t) for w in readers))

    check_clock()
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
        # A used stage holds at least one node not pinned last (NOTE [pins] in problem.py).
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
    for cls in device_classes(problem) if break_symmetry else []:
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
        tensors = sum(out_tensors[u] * cross[u][k] for u in senders)
        for m1 in machines:
            check_clock()
            for m2 in machines:
                if m1 == m2 and sum(s.node == m1 for s in slots) < 2:
                    continue  # two stages cannot both run on this machine's only slot
                link = machine_link(problem, m1, m2)
                # Boundary k between machines m1 and m2 takes at least a latency per tensor + bytes /
                # bandwidth when something crosses: (comm - tensors * latency) * bw >= 1000 * bytes,
                # i.e. the integer comm is >= costs.transfer_ns(link, bytes, tensors) exactly (ceil).
                bw = link.bandwidth_bytes_per_us
                m.add(bw * comm[k] - 1000 * nbytes - bw * link.latency_ns * tensors >= 0).only_enforce_if(
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
            for c in capacities if not typed_mem else ():
                if total_mem > c:
                    m.add(load <= c).only_enforce_if([has_capacity[k][c], *when])
            for t, (mem_t, total_t) in typed_mem.items():
                # ... on a slot of type t, with t's own memory (NOTE [memory per slot type] in costs.py).
                load = stage_memory_bytes(problem, sum(mem_t[v] * x(v, k) for v in order), held, k, num_stages, t)
                for c in sorted({capacity[s.name] for s in slots if s.type == t and total_t > capacity[s.name]}):
                    m.add(load <= c).only_enforce_if([is_type[k][t], has_capacity[k][c], *when])

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
        if self._gap > 0 and within_gap(objective, max(bound, self._external_lb), self._gap):
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
def within_gap(value: int, bound: int, gap: float) -> bool:
    """Whether `value` is certified within the relative `gap` of optimal by `bound` (NOTE [gap stop])."""
    return value <= 0 or value - bound <= gap * value




@dataclass
class ModelAnswer:
    """What one CP-SAT solve of `_build`'s model found: the raw plan (costs come from `evaluate`) and the bound."""

    status: str  # "OPTIMAL", "FEASIBLE", "UNKNOWN" (none found in time), "INFEASIBLE", "NOT_BUILT" (past its deadline)
    stage_of: dict[str, int] | None = None  # stages renumbered 0..S-1
    device_of_stage: list[str] | None = None
    bound_ns: int = 0  # CP-SAT's proven bound of the objective (0 when it found nothing)
    build_seconds: float = 0.0  # building the model and hinting it
    cpsat_seconds: float = 0.0
    variables: int = 0
    constraints: int = 0
    max_stages: int = 0  # K, the stages the model may use
    presolve_inclusion_off: bool = False  # NOTE [int32 activities]
    hinted: bool = False  # CP-SAT started from a complete plan (the hint, or `fallback`)


def solve_model(problem: Problem, *, objective: str, microbatches: int, bottleneck_lb_ns: int, external_lb_ns: int,
                hint: Plan | None, fallback: Plan | None, gap: float, seed: int, workers: int, t0: float,
                time_limit_s: float, log_callback: LogCallback | None = None,
                int32_safe_ns: int | None = None, floor: float = 0.25) -> ModelAnswer:
    """Build the model (with `bottleneck_lb_ns` as a cut), start it from `hint` (checked) or else
    `fallback`, and solve it for what is left of `time_limit_s` since `t0`; stops within `gap` of
    max(its bound, `external_lb_ns`), NOTE [gap stop]. `int32_safe_ns` None: INT32_SAFE_NS (read at
    the call, so benchmarks/certificates.py --without-int32-fix can raise it). The build stops at t0 + time_limit_s (NOTE [bounds
    deadline]): then status "NOT_BUILT"."""
    t_start = time.perf_counter()
    try:
        mdl = _build(problem, objective, microbatches, bottleneck_lb_ns, deadline=t0 + time_limit_s)
    except _PastDeadline:
        return ModelAnswer(status="NOT_BUILT", build_seconds=time.perf_counter() - t_start)
    if hint is not None:
        _check_hint(problem, hint, mdl.num_stages)
    start = hint if hint is not None else fallback
    if start is not None:
        _add_hint(problem, mdl, start.stage_of, _canonical(problem, start.device_of_stage))
    t_build = time.perf_counter()

    solver = cp_model.CpSolver()
    # What is left of the limit; when neither the DP nor a hint gave a plan, CP-SAT is the only
    # way to one: then a share `floor` of the limit at least (a quarter; 0 where an earlier search
    # had its turn, NOTE [coarsened solve] step 4), even if the DP and bounds overran it.
    floor_s = floor * time_limit_s if start is None else 0.0
    solver.parameters.max_time_in_seconds = max(floor_s, time_limit_s - (t_build - t0), 0.0)
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = workers
    # PARTITIONING-NOTES finding 3: presolve dominates on big models; probing is what costs.
    solver.parameters.cp_model_probing_level = 0
    inclusion_off = mdl.time_ub_ns > (INT32_SAFE_NS if int32_safe_ns is None else int32_safe_ns)
    if inclusion_off:
        # NOTE [int32 activities] (placement/units.py): OR-Tools 9.15's presolve gets `bottleneck >= sum(...)`
        # wrong once the sum can reach 2**31; its inclusion step is where ("linear + amo"), so it goes.
        # (Random 2-6 node problems with ops of 0.03-1.2 s: 33 of 146 claimed bounds above the
        # brute-force optimum with it, none of 296 without.)
        solver.parameters.presolve_inclusion_work_limit = 0
    if gap > 0:
        solver.parameters.relative_gap_limit = gap  # NOTE [gap stop]; the callback adds the external bound
    callback = _Progress(log_callback, gap, external_lb_ns) if log_callback or gap > 0 else None
    status = solver.solve(mdl.model, callback)
    t_solve = time.perf_counter()

    proto = mdl.model.proto
    answer = ModelAnswer(
        status=solver.status_name(status), build_seconds=t_build - t_start,
        cpsat_seconds=t_solve - t_build, variables=len(proto.variables), constraints=len(proto.constraints),
        max_stages=mdl.num_stages, presolve_inclusion_off=inclusion_off, hinted=start is not None,
    )
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"hetpart bug: invalid CP-SAT model: {mdl.model.validate()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return answer
    answer.bound_ns = max(0, math.ceil(solver.best_objective_bound - 1e-6))
    # Read the solution; used stages are a prefix, renumber them 0..S-1 all the same.
    raw = {v: next(k for k in range(mdl.num_stages) if solver.boolean_value(mdl.y[v][k])) for v in mdl.order}
    used = sorted(set(raw.values()))
    renumber = {k: i for i, k in enumerate(used)}
    answer.stage_of = {v: renumber[raw[v]] for v in problem.graph.nodes}
    answer.device_of_stage = [next(d for d, lit in mdl.a[k].items() if solver.boolean_value(lit)) for k in used]
    return answer
