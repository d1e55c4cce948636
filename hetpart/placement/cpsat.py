"""The exact CP-SAT model of `hetpart placement`: device slots in pipeline order, the order encoding per colour class."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from hetpart.errors import HetpartError
from hetpart.partitioner.problem import Certificate
from hetpart.placement import units
from hetpart.placement.hint import placement_hint
from hetpart.placement.problem import Placement, PlacementProblem, class_graph, placement_loads, placement_violations
from hetpart.placement.units import ROUND_SLACK, memory_units, scaled_costs, scaled_loads, time_scale

if TYPE_CHECKING:
    from hetpart.placement.ideals import IdealPlacement

@dataclass
class PlacementModel:
    """`solve_placement`'s CP-SAT model and what reading an answer needs; solvable more than once."""

    model: cp_model.CpModel
    x: dict[object, list]  # x[c][s]: class c runs on slot s
    is_cpu: list  # is_cpu[s]: slot s is a CPU
    classes: dict[object, list[int]]
    hint: list[tuple[str, list[int]]] | None  # placement_hint's placement
    mem_exact: bool  # memory in exact units (NOTE [int32 activities]); else relaxed
    seconds: dict[str, float]  # hint_seconds, build_seconds
    hint_engine: str = "order-dp"  # which DP's placement the hint is


def placement_model(problem: PlacementProblem, ideal: "IdealPlacement | None" = None) -> PlacementModel:
    """The CP-SAT model of `solve_placement`, with the hint of `placement_hint` (or the ideal DP's
    placement where lower) and the ideal DP's bound as a cut."""
    t0 = time.perf_counter()
    classes = problem.classes()
    cls_of = {i: problem.nodes[i].color for i in problem.nodes}
    names = list(classes)
    fpga, cpu, size, cost = scaled_costs(problem)
    K = problem.max_fpgas + problem.max_cpus
    slots = range(K)
    hint = placement_hint(problem)
    hint_engine = "order-dp"
    if ideal is not None and ideal.devices is not None and (
            hint is None or ideal.load_units < max(scaled_loads(problem, hint, fpga, cpu, cost))):
        hint, hint_engine = ideal.devices, "ideal-dp"
    t_hint = time.perf_counter()

    # --- Data per class.
    c_fpga = {c: sum(fpga[i] for i in ids) for c, ids in classes.items()}
    c_cpu = {c: sum(cpu[i] for i in ids) for c, ids in classes.items()}
    c_size = {c: sum(size[i] for i in ids) for c, ids in classes.items()}
    c_fpga_ok = {c: all(problem.nodes[i].on_fpga for i in ids) for c, ids in classes.items()}
    # Classes every node u sends to (other than its own), for the transfer costs.
    sends: dict[int, set] = {}
    for u, v in problem.edges:
        if cls_of[u] != cls_of[v] and cost[u] > 0:
            sends.setdefault(u, set()).add(cls_of[v])

    # --- Variables.
    m = cp_model.CpModel()
    y = {c: [m.new_bool_var(f"y[{c}][{s}]") for s in range(K - 1)] for c in names}
    x = {c: [m.new_bool_var(f"x[{c}][{s}]") for s in slots] for c in names}
    is_cpu = [m.new_bool_var(f"cpu[{s}]") for s in slots]
    used = [m.new_bool_var(f"used[{s}]") for s in slots]
    pay = {(u, s): m.new_bool_var(f"pay[{u}][{s}]") for u in sends for s in slots}
    ub = sum(max(c_fpga[c], c_cpu[c]) for c in names) + sum(cost.values())
    assert ub <= units.ACTIVITY_MAX, "hetpart bug: NOTE [int32 activities] scale too large"
    max_load = m.new_int_var(0, ub, "max_load")

    def le(c, s):  # [slot(c) <= s] as a literal or constant
        return 1 if s >= K - 1 else y[c][s]

    # --- Constraints: slots in the order encoding.
    for c in names:
        for s in range(K - 2):
            # slot(c) <= s implies slot(c) <= s+1.
            m.add_implication(y[c][s], y[c][s + 1])
        for s in slots:
            # x[c][s] = [slot(c) <= s] - [slot(c) <= s-1]: class c runs on slot s.
            m.add(x[c][s] == le(c, s) - (le(c, s - 1) if s > 0 else 0))
    for cu, cv in class_graph(problem).edges:
        for s in range(K - 1):
            # Every edge into a forward node goes to the same or a later slot.
            m.add_implication(y[cv][s], y[cu][s])

    # --- Constraints: slot kinds and symmetry breaking.
    # Exactly maxCPUs slots are CPUs (unused ones included), so at most maxFPGAs are accelerators.
    m.add(sum(is_cpu) == problem.max_cpus)
    for s in slots:
        # A slot is used when it runs a class.
        for c in names:
            m.add_implication(x[c][s], used[s])
        m.add_bool_or([x[c][s] for c in names]).only_enforce_if(used[s])
        for c in names:
            if not c_fpga_ok[c]:
                # Classes with a node an accelerator cannot run go to a CPU.
                m.add_implication(x[c][s], is_cpu[s])
        if s + 1 < K:
            # Used slots come first; among the unused ones, accelerators before CPUs
            # (empty slots are interchangeable).
            m.add_implication(~used[s], ~used[s + 1])
            m.add_implication(is_cpu[s], is_cpu[s + 1]).only_enforce_if(~used[s])

    # --- Constraints: memory and transfers.
    mem_units, mem_limit, mem_exact = memory_units([c_size[c] for c in names], problem.max_size_bytes)
    for s in slots:
        if sum(c_size.values()) > problem.max_size_bytes:
            # An accelerator holds at most maxSizePerFPGA bytes (in the units of NOTE [int32 activities]).
            held = sum(u * x[c][s] for u, c in zip(mem_units, names))
            m.add(held <= mem_limit).only_enforce_if(~is_cpu[s])
        for u, targets in sends.items():
            for cv in sorted(targets, key=str):
                # u pays its cost on slot s when it is on s and a consumer is not, or the reverse.
                m.add_bool_or([~x[cls_of[u]][s], x[cv][s], pay[u, s]])
                m.add_bool_or([x[cls_of[u]][s], ~x[cv][s], pay[u, s]])

    # --- Objective: the largest load.
    for s in slots:
        # An accelerator's load: its nodes' fpgaLatency plus the transfers it pays.
        m.add(max_load >= sum(c_fpga[c] * x[c][s] for c in names)
              + sum(cost[u] * pay[u, s] for u in sends)).only_enforce_if(~is_cpu[s])
        # A CPU's load: its nodes' cpuLatency.
        m.add(max_load >= sum(c_cpu[c] * x[c][s] for c in names)).only_enforce_if(is_cpu[s])
    # Redundant cut: every class runs somewhere, at its cheaper speed, on one of K slots
    # (a constant right-hand side, not K * max_load: NOTE [int32 activities]).
    m.add(max_load >= -(-sum(min(c_fpga[c] if c_fpga_ok[c] else ub, c_cpu[c]) for c in names) // K))
    if ideal is not None and ideal.bound_units > 0:
        # The ideal DP's bound (NOTE [placement ideal DP]: no placement is below it).
        m.add(max_load >= min(ideal.bound_units, ub))
    m.minimize(max_load)

    # --- Hint: the DP's placement, in slot order.
    if hint is not None:
        slot_of = {problem.nodes[i].color: s for s, (_, ids) in enumerate(hint) for i in ids}
        kinds = [k for k, _ in hint]
        empty = K - len(hint)
        free_cpus = problem.max_cpus - kinds.count("cpu")
        kinds += ["fpga"] * (empty - free_cpus) + ["cpu"] * free_cpus
        for c in names:
            for s in range(K - 1):
                m.add_hint(y[c][s], slot_of[c] <= s)
            for s in slots:
                m.add_hint(x[c][s], slot_of[c] == s)
        for s in slots:
            m.add_hint(is_cpu[s], kinds[s] == "cpu")
            m.add_hint(used[s], s < len(hint))
        m.add_hint(max_load, max(scaled_loads(problem, hint, fpga, cpu, cost)))
        where = {i: s for s, (_, ids) in enumerate(hint) for i in ids}
        for u, targets in sends.items():
            for s in slots:
                inside = where[u] == s
                m.add_hint(pay[u, s], any((slot_of[cv] == s) != inside for cv in targets))
    t_build = time.perf_counter()
    return PlacementModel(model=m, x=x, is_cpu=is_cpu, classes=classes, hint=hint, mem_exact=mem_exact,
                           seconds={"hint_seconds": t_hint - t0, "build_seconds": t_build - t_hint},
                           hint_engine=hint_engine)


def solve_placement_cpsat(problem: PlacementProblem, *, time_limit_s: float, workers: int, seed: int,
                           params: dict | None, mdl: PlacementModel | None = None, gap: float = 0.0,
                           ideal: "IdealPlacement | None" = None) -> Placement:
    """`solve_placement`'s CP-SAT step, without the certificate check, on `mdl` (built here when
    None, with `ideal`'s hint and bound)."""
    t0 = time.perf_counter()
    if not time_limit_s > 0:
        raise HetpartError(f"placement: --time-limit must be positive, got {time_limit_s}")
    mdl = mdl or placement_model(problem, ideal)
    m, x, is_cpu, classes, hint, mem_exact = mdl.model, mdl.x, mdl.is_cpu, mdl.classes, mdl.hint, mdl.mem_exact
    names, slots = list(classes), range(len(is_cpu))
    t_build = time.perf_counter()

    # --- Solve.
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (t_build - t0))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # PARTITIONING-NOTES finding 3: probing is most of presolve (20 s of 25 s on bert_l-12) for no gain here.
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.relative_gap_limit = gap
    for key, value in (params or {}).items():
        setattr(solver.parameters, key, value)
    status = solver.solve(m)
    t_solve = time.perf_counter()

    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if status == cp_model.INFEASIBLE or (not found and hint is None):
        raise HetpartError(
            f"placement: no feasible placement found for {problem.name or 'the input'} "
            f"({'proven infeasible' if status == cp_model.INFEASIBLE else f'within {time_limit_s:g} s'}); "
            "check maxSizePerFPGA against the node sizes, or raise --time-limit")
    candidates = []
    if found:
        devices = []
        for s in slots:
            ids = sorted(i for c in names if solver.boolean_value(x[c][s]) for i in classes[c])
            if ids:
                devices.append(("cpu" if solver.boolean_value(is_cpu[s]) else "fpga", ids))
        candidates.append(devices)
    if hint is not None:
        candidates.append(hint)
    # Only placements the checker accepts count: with memory relaxed (NOTE [int32 activities])
    # the solver's may hold too many bytes; with it exact, a broken one is a bug.
    scored = []
    for n, d in enumerate(candidates):
        violations = placement_violations(problem, d)
        if violations and (mem_exact or n == len(candidates) - 1 and hint is not None):
            raise RuntimeError("hetpart bug: the placement breaks its problem:\n  " + "\n  ".join(violations))
        if not violations:
            scored.append((max(placement_loads(problem, d)), n, d))
    if not scored:
        raise HetpartError(f"placement: no placement found for {problem.name or 'the input'} that fits in "
                           "maxSizePerFPGA bytes within the time limit; raise --time-limit")
    best_load, picked, best = min(scored)
    scale = time_scale(problem)
    bound = max(0.0, solver.best_objective_bound / scale) if found else 0.0  # rounded down: valid
    # CP-SAT's bound is of the floored costs, so at most any placement's float load: above the
    # checked one, its model has lost a placement and proves nothing (a guard; NOTE [int32 activities]).
    unsound = bound > best_load * (1 + ROUND_SLACK)
    if unsound:
        bound = 0.0
    ideal_bound = ideal.bound_units / scale if ideal is not None else 0.0
    bound_engine = "ideal-dp" if ideal_bound > bound else "cp-sat"
    bound = max(bound, ideal_bound)
    loads = placement_loads(problem, best)
    # The solver's optimum is the problem's when its placement is one of those kept.
    optimal = status == cp_model.OPTIMAL and gap == 0 and scored[0][1] == 0 and not unsound
    presolve = "on" if solver.parameters.cp_model_presolve else "off"
    relaxation = (f"CP-SAT's objective bound (presolve {presolve}) of the slot model: latencies and costs rounded down to "
                  f"1/{scale:.6g} units" + ("" if mem_exact else ", memory rounded down to coarser units")
                  + " (NOTE [int32 activities])")
    return Placement(
        devices=best, loads=loads, max_load=best_load, lower_bound=min(bound, best_load),
        certificate=(Certificate("ideal_dp", ideal.note) if bound_engine == "ideal-dp" else
                     Certificate("cpsat_objective_bound" if found else "none", relaxation)),
        status="OPTIMAL" if optimal else "FEASIBLE", seconds=time.perf_counter() - t0,
        stats={**mdl.seconds, "cpsat_seconds": t_solve - t_build,
               "hint_max_load": max(placement_loads(problem, hint)) if hint else math.inf,
               "classes": float(len(names)), "variables": float(len(m.proto.variables)),
               "cpsat_bound_unsound": float(unsound),
               **({"ideal_seconds": ideal.seconds, "ideals": float(ideal.ideals)} if ideal is not None else {})},
        plan_engine="cp-sat" if found and picked == 0 else mdl.hint_engine, bound_engine=bound_engine,
    )
