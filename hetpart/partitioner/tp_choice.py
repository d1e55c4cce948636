"""The tensor-parallel degree chosen by the solve: one problem per degree, the best plan, a bound over all.

NOTE [tensor-parallel degree choice]
`--max-tensor-parallel N` plans each degree t in 1, 2, 4, ... N as its own problem (degree 1: the
cluster's devices; t > 1: its TP groups, NOTE [tensor-parallel costs] in passes/tp_lower.py), each
solved with its own proven bound, and keeps the plan of least value. The space searched is the union
of the degrees' plans, so the least of the degrees' bounds bounds every plan of it: the plan's bound
is that least bound, its gap measured against it, and it is OPTIMAL only when its value reaches that
bound (tests/partitioner/test_tp_choice.py checks both against brute force on small problems).
A degree is uniform over the plan's stages: a plan with TP 8 on NVLink machines and TP 1 on PCIe
ones is not in this space yet (memory per slot would then depend on its degree, which the engines'
one `stage_memory_bytes` per node does not express); ties go to the smaller degree, so TP is chosen
only where it pays in the cost model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hetpart.errors import HetpartError
from hetpart.partitioner.problem import Plan, Problem


@dataclass(frozen=True)
class DegreeResult:
    """One degree's solve: its plan's value and proven bound (None: no plan fits)."""

    degree: int
    value_ns: int | None
    bound_ns: int | None


@dataclass(frozen=True)
class DegreeChoice:
    """The degree kept, its plan (bound and status over every degree), and each degree's result."""

    degree: int
    plan: Plan
    results: tuple[DegreeResult, ...]


def choose_degree(problems: Mapping[int, Problem], solve: Callable[[Problem], Plan | None]) -> DegreeChoice:
    """NOTE [tensor-parallel degree choice]: `solve` each degree's problem; the least plan, with the least bound."""
    plans: dict[int, Plan] = {}
    results = []
    for t in sorted(problems):
        try:
            plan = solve(problems[t])
        except HetpartError:  # nothing of this degree fits (memory, a node too large): no plan, no bound needed
            plan = None
        if plan is not None:
            plans[t] = plan
        results.append(DegreeResult(t, plan.value_ns if plan else None, plan.lower_bound_ns if plan else None))
    if not plans:
        raise HetpartError(f"no tensor-parallel degree of {', '.join(map(str, sorted(problems)))} has a plan that "
                           "fits this cluster's memory")
    degree = min(plans, key=lambda t: (plans[t].value_ns, t))
    best = plans[degree]
    # A degree without a plan has none that fits: it adds nothing to the space, and so no bound to the least.
    bound = min(plans[t].lower_bound_ns for t in plans)
    status = best.solver_status if bound >= best.lower_bound_ns else (
        "OPTIMAL" if best.value_ns <= bound else "FEASIBLE")
    return DegreeChoice(degree, dataclasses.replace(best, lower_bound_ns=bound, solver_status=status), tuple(results))


__all__ = ["DegreeChoice", "DegreeResult", "choose_degree"]
