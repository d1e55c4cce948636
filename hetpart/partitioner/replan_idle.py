"""Why a device of a re-planned set of data-parallel pipelines runs no stage (NOTE [re-plan idle reasons]).

Nothing here imports torch."""

from __future__ import annotations

from hetpart.partitioner.pipeline_idle import format_ns, plan_only_reasons
from hetpart.partitioner.pipelines import used_devices
from hetpart.partitioner.problem import Problem
from hetpart.units import format_bytes

# NOTE [re-plan idle reasons]
# A re-plan of data-parallel pipelines (NOTE [re-plan pipelines]) chooses among candidates: within the limit
# (the least iteration of any, plus --slack), the fewest bytes between machines, then within, then the least
# iteration. It once wrote "in no pipeline" for every device its choice leaves idle: a restatement, not a
# reason. Each such device now gets the first reason that holds, each computed from the candidates the choice
# compared:
# - memory, or left out of a chosen pipeline's plan: as the search says them (`plan_only_reasons`, NOTE [idle
#   reasons]);
# - bytes: a candidate within the limit runs a stage on it, and moves more bytes than the chosen plan (the
#   re-plan kept the old holdings): that candidate (of those, the first in the choice's order), its iteration
#   and bytes against the chosen one's;
# - the chosen plan is the from-scratch search's own (the same stages on the same devices): the search's
#   reason (NOTE [idle reasons]);
# - too slow to help: candidates run a stage on it, every one over the limit, or within it at no more bytes
#   than the chosen plan but a longer iteration: the fastest of them against the limit (or the chosen plan);
# - none of the candidates runs a stage on it: the from-scratch plan leaves it idle too, for the search's
#   reason (its kind first, as every reason's); without a from-scratch plan (none in time), that no re-split or
#   stripe candidate used it.
# As NOTE [idle reasons], these are the cost model's explanations of the choice among the candidates listed,
# not proofs about every plan.


def _bytes(moves) -> str:
    return f"{format_bytes(moves.between_bytes)} between machines and {format_bytes(moves.within_bytes)} within"


def replan_idle_reasons(problem: Problem, result) -> dict[str, str]:
    """NOTE [re-plan idle reasons] for every device no stage of `result.chosen` (a PipelinesReplan's) runs on."""
    chosen, scratch = result.chosen, result.scratch
    plan = chosen.plan
    used = plan.used_devices
    out = plan_only_reasons(problem, plan)
    users = [(c, used_devices(c.plan.pipelines)) for c in result.candidates if c is not chosen]
    limit = (f"the limit of {format_ns(result.limit_ns)} (the best candidate's {format_ns(result.best_ns)} plus "
             f"{result.slack:.0%} slack)")
    for dev in problem.devices:
        d = dev.name
        if d in used or d in out:
            continue
        on = [c for c, u in users if d in u]
        within = sorted((c for c in on if c.plan.iteration_ns <= result.limit_ns), key=lambda c: c.key())
        more = [c for c in within if c.key()[:2] > chosen.key()[:2]]
        if more:
            c = more[0]
            out[d] = (f"bytes: the re-plan takes the fewest bytes moved within {limit}: '{c.name}' runs a stage "
                      f"on it in {format_ns(c.plan.iteration_ns)} but moves {_bytes(c.moves)}, the chosen "
                      f"'{chosen.name}' {_bytes(chosen.moves)} (NOTE [re-plan pipelines])")
        elif scratch is not None and chosen is scratch and d in scratch.plan.devices_idle:
            out[d] = scratch.plan.devices_idle[d]
        elif on:
            c = min(on, key=lambda c: c.plan.iteration_ns)
            over = (f"over {limit}" if c.plan.iteration_ns > result.limit_ns else
                    f"no less than the chosen plan's {format_ns(plan.iteration_ns)}, and moves no fewer bytes")
            out[d] = (f"too slow to help: the fastest candidate that runs a stage on it, '{c.name}', takes "
                      f"{format_ns(c.plan.iteration_ns)}, {over}")
        elif scratch is not None and d in scratch.plan.devices_idle:
            kind, _, why = scratch.plan.devices_idle[d].partition(": ")
            out[d] = f"{kind}: the from-scratch plan leaves it idle too, as the search says: {why}"
        else:
            out[d] = ("not planned: the from-scratch search gave no plan (its note above says why), and no re-split "
                      "or stripe candidate runs a stage on it")
    return dict(sorted(out.items()))
