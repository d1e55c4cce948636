"""An independent check of a plan against its problem.

It shares no code with the solvers (`cpsat.py`, `dp.py`): only the cost model
in `evaluate.py`, recomputed from scratch. Every solver answer passes it.
"""

from __future__ import annotations

from hetpart.errors import HetpartError
from hetpart.partitioner.evaluate import OBJECTIVES, bottleneck_ns, evaluate, objective_ns, stash_microbatches
from hetpart.partitioner.problem import COLOCATE, FORBIDDEN_TYPES, PIN, PIN_FIRST, PIN_LAST, Plan, Problem


class PlanError(HetpartError):
    """A plan breaks its problem's rules; `violations` lists every broken rule."""

    def __init__(self, violations: list[str]):
        self.violations = violations
        super().__init__("partitioner: invalid plan:\n  " + "\n  ".join(violations))


def plan_violations(problem: Problem, plan: Plan) -> list[str]:
    """Every rule `plan` breaks, as sentences; empty when the plan is valid."""
    g = problem.graph
    out: list[str] = []
    num_stages = len(plan.slot_of_stage)

    # Structure: every node in exactly one existing stage.
    missing = sorted(str(v) for v in g.nodes if v not in plan.stage_of)
    extra = sorted(str(v) for v in plan.stage_of if v not in g)
    if missing:
        out.append(f"nodes without a stage: {missing}")
    if extra:
        out.append(f"stage_of names nodes not in the graph: {extra}")
    bad_range = sorted(
        str(v) for v, s in plan.stage_of.items() if v in g and not (isinstance(s, int) and 0 <= s < num_stages)
    )
    if bad_range:
        out.append(f"nodes with a stage outside 0..{num_stages - 1}: {bad_range}")
    if len(plan.stages) != num_stages:
        out.append(f"plan has {len(plan.stages)} StageCost entries but {num_stages} slots in slot_of_stage")
    structure_ok = not (missing or bad_range)

    # Slots: known, and the chosen slots' devices disjoint: each device runs one stage at most (NOTE [slots]).
    known = {s.name for s in problem.slots}
    unknown = [s for s in plan.slot_of_stage if s not in known]
    if unknown:
        out.append(f"unknown slots {unknown} (known: {sorted(known)})")
    held = [d for s in plan.slot_of_stage if s in known for d in problem.slot(s).devices]
    twice = sorted({d for d in held if held.count(d) > 1})
    if twice:
        out.append(f"devices used by more than one stage: {twice}")
    if num_stages == 0:
        out.append("plan has no stages")

    if structure_ok:
        stage = plan.stage_of
        # Edges go forward (or stay in a stage).
        for u, v in g.edges:
            if stage[u] > stage[v]:
                out.append(f"edge {u!r} -> {v!r} goes backwards: stage {stage[u]} -> stage {stage[v]}")
        # Every stage holds a node that is not pinned last (NOTE [pins] in problem.py).
        filled = {stage[v] for v in g.nodes if g.nodes[v].get(PIN) != PIN_LAST}
        empty = [k for k in range(num_stages) if k not in filled]
        if empty:
            out.append(f"stages {empty} hold no node (other than nodes pinned {PIN_LAST!r})")
        # Pins.
        for v in g.nodes:
            pin = g.nodes[v].get(PIN)
            if pin == PIN_FIRST and stage[v] != 0:
                out.append(f"node {v!r} is pinned {PIN_FIRST!r} but in stage {stage[v]}")
            if pin == PIN_LAST and stage[v] != num_stages - 1:
                out.append(f"node {v!r} is pinned {PIN_LAST!r} but in stage {stage[v]} of 0..{num_stages - 1}")
        # Co-location groups share a stage.
        groups: dict[str, list[str]] = {}
        for v in g.nodes:
            if g.nodes[v].get(COLOCATE) is not None:
                groups.setdefault(g.nodes[v][COLOCATE], []).append(v)
        for name, vs in sorted(groups.items()):
            if len({stage[v] for v in vs}) > 1:
                out.append(f"co-location group {name!r} is split over stages "
                           f"{sorted({stage[v] for v in vs})}: {sorted(map(str, vs))[:6]}")

    if structure_ok and not unknown and num_stages > 0:
        # No node runs on a device type it forbids.
        for v in g.nodes:
            slot = problem.slot(plan.slot_of_stage[plan.stage_of[v]])
            if slot.type in g.nodes[v].get(FORBIDDEN_TYPES, ()):
                out.append(f"node {v!r} runs on {slot.name!r} of type {slot.type!r}, which it forbids")
        fresh = evaluate(problem, plan.stage_of, plan.slot_of_stage)
        for s in fresh:
            if s.memory_bytes > s.capacity_bytes:
                why = "" if problem.training is None else (
                    f" (training, {problem.training.schedule}: weights with gradients and optimizer state, and "
                    f"{stash_microbatches(problem, s.index, num_stages)} microbatches of activations)")
                out.append(
                    f"stage {s.index} on {s.device!r} needs {s.memory_bytes} bytes, "
                    f"over its capacity of {s.capacity_bytes}{why}"
                )
        if len(plan.stages) == num_stages:
            for claimed, s in zip(plan.stages, fresh):
                got = (claimed.device, claimed.compute_ns, claimed.comm_in_ns, claimed.comm_out_ns,
                       claimed.memory_bytes, sorted(map(str, claimed.nodes)))
                want = (s.device, s.compute_ns, s.comm_in_ns, s.comm_out_ns, s.memory_bytes, sorted(map(str, s.nodes)))
                if got != want:
                    out.append(f"stage {s.index}: plan says {claimed}, recomputed {s}")
        fresh_bottleneck = bottleneck_ns(fresh)
        if plan.bottleneck_ns != fresh_bottleneck:
            out.append(f"plan claims bottleneck {plan.bottleneck_ns} ns, recomputed {fresh_bottleneck} ns")
        if plan.objective_ns is not None and plan.objective in OBJECTIVES:
            fresh_value = objective_ns(fresh, plan.objective, plan.microbatches)
            if plan.objective_ns != fresh_value:
                out.append(f"plan claims {plan.objective} {plan.objective_ns} ns, recomputed {fresh_value} ns")
    if plan.objective not in OBJECTIVES:
        out.append(f"unknown objective {plan.objective!r} (known: {', '.join(OBJECTIVES)})")
    if plan.lower_bound_ns > plan.value_ns:
        what = "bottleneck" if plan.objective == "throughput" else plan.objective
        out.append(f"lower bound {plan.lower_bound_ns} ns exceeds the plan's {what} {plan.value_ns} ns")
    return out


def verify_plan(problem: Problem, plan: Plan) -> None:
    """Raise PlanError listing every rule `plan` breaks; return None when it is valid."""
    violations = plan_violations(problem, plan)
    if violations:
        raise PlanError(violations)
