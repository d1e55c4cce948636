"""`--parallel data --max-tensor-parallel N --tensor-parallel-per-machine`: degrees per machine as more candidates.

NOTE [per-machine pipelines candidates]
`choose_pipelines_tp` (compile_pipelines.py) searches each uniform degree's data-parallel pipelines
and keeps the best, degree T, in two thirds of `--time-limit`. From there, one kind of machine at a
time (its device type and count and its link: `place_kinds`; as step 4 of NOTE [mixed tensor-parallel
degrees] in partitioner/tp_choice.py), the machines of that kind go to the other end (TP 1 from T > 1,
the `--max-tensor-parallel` cap N from T = 1) and every other place keeps its degree: the assignment's
slot problem (`mixed_problem`, its gradient sync NOTE [mixed-degree gradient sync]) is searched as
`--parallel data` searches, and an assignment faster than the best so far is kept, the next kind tried
from it. The kinds share the last third of the limit, the slowest link first where they go to TP 1
(the all-reduces cost most there), the fastest first where they go to N; a kind left under `_LEAST_S`
is not tried. So a fleet of NVLink machines beside PCIe ones gets "TP T on the NVLink machines, TP 1
on the PCIe ones" as its first candidate, judged by the same cost model as the uniform degrees. The
plan kept is the fastest; its bound is the least of the uniform degrees' bound and each tried
assignment's own (each bounds every plan of its slot problem), so it covers the union of the spaces
searched, not every assignment of degrees to machines (pipelines of overlapping slots have no
relaxation here, and an assignment not tried is outside it); the bound note says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hetpart.errors import HetpartError
from hetpart.partitioner.shape_memo import ShapeMemo
from hetpart.partitioner.tp_choice import mixed_problem
from hetpart.tensor_parallel import mixed_compile, places_line, tp_slots
from hetpart.tp_machines import places
from hetpart.units import format_us

if TYPE_CHECKING:
    from hetpart.compile import CompileOptions
    from hetpart.compile_pipelines import TPPipelines
    from hetpart.devices import Cluster
    from hetpart.partitioner import Problem
    from hetpart.partitioner.pipelines import PipelinesPlan

_LEAST_S = 0.5  # an assignment left less than this of the time limit is not searched

Planner = Callable[["Problem", "CompileOptions", "ShapeMemo"], tuple["PipelinesPlan", list[dict]]]


def per_machine_pipelines(problem: Problem, cluster: Cluster, opts: CompileOptions, plan: Planner,
                          best: TPPipelines, time_limit_s: float, echo: Callable[[str], None]) -> TPPipelines:
    """NOTE [per-machine pipelines candidates]: from `best` (the uniform degrees' choice, each degree lowered;
    `problem`: the devices'), each kind of machine (`place_kinds`) at the other end in turn (TP 1 from a best
    degree T > 1, `opts.max_tensor_parallel` from T = 1), searched by `plan(problem, opts, memo)` within
    `time_limit_s`; the fastest plan kept (with its search's shape memo), its bound the least over everything
    searched."""
    degree = max(best.tp.shardings) if best.tp is not None else 1
    other = 1 if degree > 1 else opts.max_tensor_parallel
    high = max(degree, other)
    lowered = best.tp if best.tp is not None else best.lowered.get(high)
    if lowered is None:  # degree `high` was skipped (`lower_degrees` says why)
        why = next((s for s in best.skipped if s.startswith(f"{high} ")), f"{high} (not lowered)")
        echo(f"tensor parallel per machine: nothing to try: degree {why} was not lowered")
        return best
    kind_of = place_kinds(cluster)
    # TP 1 pays most where a machine's link is slowest (its all-reduces), TP N where it is fastest: tried first
    kinds = sorted(set(kind_of.values()), key=lambda k: (k[2] if other == 1 else -k[2], k))
    slots = tp_slots(problem, {high: lowered})
    current = dict.fromkeys(sorted(kind_of), degree)
    (bound, unfinished), tried = (best.plan.lower_bound_ns, best.plan.bound_unfinished), []
    deadline = time.perf_counter() + time_limit_s
    for i, kind in enumerate(kinds):
        trial = {p: other if kind_of[p] == kind else t for p, t in current.items()}
        if len(set(trial.values())) == 1:  # every place at one degree: a uniform plan, searched already
            continue
        chosen = [s for t, ss in slots.items() for s in ss if trial[s.place] == t]
        cand = mixed_compile(mixed_problem({1: problem, high: lowered.problem}, chosen), {high: lowered}, trial,
                             problem.weights)
        seconds = max(0.0, deadline - time.perf_counter()) / (len(kinds) - i)
        if seconds < _LEAST_S:  # its space is then not searched, nor in the bound
            echo(f"tensor parallel per machine: {places_line(trial)}: not tried ({seconds:.1f} s of the time limit "
                 "left for it)")
            continue
        memo = ShapeMemo("")  # this assignment's solved shapes (NOTE [shape memo])
        try:
            got, base = plan(cand.problem, dataclasses.replace(opts, time_limit_s=seconds), memo)
        except HetpartError as err:
            echo(f"tensor parallel per machine: {places_line(trial)}: no plan ({str(err).splitlines()[0]})")
            continue
        if got.lower_bound_ns < bound:  # the least bound, and the parts of it its deadline cut
            bound, unfinished = got.lower_bound_ns, got.bound_unfinished
        tried.append(places_line(trial))
        echo(f"tensor parallel per machine: {places_line(trial)}: {format_us(got.iteration_ns)} (bound "
             f"{format_us(got.lower_bound_ns)}), best so far {format_us(best.plan.iteration_ns)}")
        if got.iteration_ns < best.plan.iteration_ns:
            current = trial
            best = dataclasses.replace(best, plan=got, baselines=base, tp=cand, memo=memo)
    if not tried:
        return best
    lower_ns = min(bound, best.plan.iteration_ns)
    note = (f"the least of the uniform degrees' bound and those of the degrees per machine tried ({'; '.join(tried)}): "
            "it covers those spaces, not every assignment of degrees to machines "
            "(NOTE [per-machine pipelines candidates])")
    kept = places_line(best.tp.places) if best.tp is not None and best.tp.places else f"degree {degree} everywhere"
    echo(f"tensor parallel per machine: kept {kept}")
    return dataclasses.replace(best, plan=dataclasses.replace(
        best.plan, lower_bound_ns=lower_ns, bound_note=note, bound_unfinished=unfinished,
        solver_status="OPTIMAL" if lower_ns >= best.plan.iteration_ns else "FEASIBLE"))


def place_kinds(cluster: Cluster) -> dict[str, tuple]:
    """Each place (a machine's devices of one type, `machine:type`) -> its kind: the type, how many devices of it
    the machine has, and the machine's link (places of one kind are interchangeable)."""
    return {place: (ty, n, m.link.bandwidth_bytes_per_s, m.link.latency_s)
            for place, (m, ty, n) in places(cluster).items()}


__all__ = ["per_machine_pipelines", "place_kinds"]
