"""Why no plan fits, in the data's terms: the messages of `solve`'s memory errors, and the errors that say which
refusal it was (`NoPlan`, `OutOfTime`, the pipelines search's `PipelinesRefused`)."""

from __future__ import annotations

from hetpart.errors import HetpartError
from hetpart.partitioner.evaluate import stage_memory_bytes, stash_microbatches
from hetpart.partitioner.problem import FORBIDDEN_TYPES, MEM_BYTES, WEIGHTS, Problem


class NoPlan(HetpartError):
    """`solve` proved that no plan exists (memory, constraints, CP-SAT's INFEASIBLE): a longer time limit
    changes nothing. Its callers tell it apart from a search that ran out of time (NOTE [coarsened solve])."""


class OutOfTime(HetpartError):
    """`solve` found no plan, proved none impossible, and its time limit is what ran out: a longer limit may find
    one. A HetpartError that is neither this nor NoPlan is a search that ended without either (say, the DP alone
    found no contiguous plan): its message says what to do."""


class PipelinesRefused(HetpartError):
    """The pipelines search (`--parallel data`) ended without a plan. `memory_refused` counts the pipeline shapes it
    refused for memory (NOTE [shape misses]: none of a shape's plans has every stage fit; or the stash of the
    microbatches caps every solved shape's runs, so no mix runs the batch), set where the refusal is decided; 0:
    refused for another reason (time, the outer program, the options). NOTE [tensor-parallel hint] reads it, never
    the message's words."""

    def __init__(self, message: str, memory_refused: int = 0, without_1f1b: str | None = None) -> None:
        super().__init__(message)
        self.memory_refused = memory_refused
        # The message less its 1F1B advice, for a caller that gives its own (NOTE [no shape holds the stash])
        self.without_1f1b = without_1f1b


def check_holds_model(problem: Problem) -> None:
    """PipelinesRefused (none for memory's shapes: NOTE [tensor-parallel hint]) where the devices together hold less
    than one copy of the model, the least any pipeline needs (`need_bytes`, NOTE [pipelines bound] (f)): no plan of
    pipelines fits, whatever the time. The one refusal of it, before any work: the search's, and the re-plan's of
    pipelines (replan_deadline.py), which once wrote its own after the search's note had said it."""
    from hetpart.partitioner.pipeline_bounds import need_bytes
    from hetpart.units import format_bytes

    have, need = sum(d.capacity_bytes for d in problem.devices), need_bytes(problem)
    if have < need:
        raise PipelinesRefused(f"partitioner: no set of the {len(problem.devices)} devices holds the model (together "
                               f"they hold {format_bytes(have)}, less than one copy of it needs: {format_bytes(need)} "
                               "of weights, training state and one microbatch of activations): no plan fits "
                               "whatever the --time-limit; add devices with more memory")


def node_need(problem: Problem, v: str) -> int:
    """Memory `v` needs wherever it goes: in training, the least stash of any stage (GPipe: M; 1F1B: 1)."""
    attrs = problem.graph.nodes[v]
    return stage_memory_bytes(problem, attrs.get(MEM_BYTES, 0), dict.fromkeys(attrs.get(WEIGHTS, ()), 1), 0, 1)


def infeasible_message(problem: Problem) -> str:
    """Why no plan fits, in the data's terms."""
    g = problem.graph
    weights = sorted({w for v in g.nodes for w in g.nodes[v].get(WEIGHTS, ())})
    activations = sum(g.nodes[v].get(MEM_BYTES, 0) for v in g.nodes)
    need = stage_memory_bytes(problem, activations, dict.fromkeys(weights, 1), 0, 1)
    capacity = sum(d.capacity_bytes for d in problem.devices)
    biggest_dev = max(problem.devices, key=lambda d: d.capacity_bytes)
    biggest_node = max(g.nodes, key=lambda v: node_need(problem, v))
    biggest_weight = max(weights, key=lambda w: problem.weights[w], default=None)
    if node_need(problem, biggest_node) > biggest_dev.capacity_bytes:
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
        f"  largest single node: {biggest_node!r} needs {node_need(problem, biggest_node)} bytes; "
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


def constraints_note(problem: Problem) -> str:
    """A line for the infeasibility message when co-location groups or forbidden types narrowed the choice."""
    groups = problem.colocation_groups()
    forbidding = [v for v in problem.graph.nodes if problem.graph.nodes[v].get(FORBIDDEN_TYPES)]
    if not groups and not forbidding:
        return ""
    names = ", ".join(map(repr, list(groups)[:5]))
    return (f"\n  The plan must also keep {len(groups)} co-location group(s) ({names}) "
            f"in one stage each and {len(forbidding)} op(s) off the device types they forbid "
            f"(e.g. {', '.join(map(repr, forbidding[:3]))}); relax those if the memory above looks sufficient.")


# NOTE [no shape holds the stash]
# The pipelines search refuses before any solve when NOTE [pipeline shapes] enumerates no shape: the devices
# together hold one copy of the model (`check_holds_model` passed), but no set of them holds it with the
# activations its stages stash, by `stash_need_bytes`' estimate. It once said "no set of the N devices holds the
# model", next to a figure the devices did hold. Under GPipe the estimate for a pipeline of every device is a
# bound on every plan (k pipelines running M microbatches in all hold k copies of the weights and state and M
# microbatches of activations, at least one copy and M microbatches), so where the devices hold less no plan
# fits; otherwise (1F1B: stages stash (S + 1) / 2 microbatches on average) it is an estimate, and the refusal
# says it is the search's. It suggests --schedule 1f1b only where 1F1B's estimate for one pipeline of every device
# fits the devices' memory. `plan_with_baselines` follows it with the baselines' own 1F1B hint where a 1F1B plan
# was solved (`_one_f1b_hint`: a plan of N stages fits), so that message's 1F1B part is left out there
# (`without_1f1b`): the advice appeared twice (ux21), and an estimate's "does not fit either" beside a plan found.
def no_shape_refusal(problem: Problem, need: int, act: int, want: float, want_1f1b: float) -> PipelinesRefused:
    """NOTE [no shape holds the stash]: the refusal when the search has no shape to try; `need` and `act`: one
    copy's bytes and one microbatch's activations, `want` and `want_1f1b`: the stash estimate for one pipeline of
    every device under the problem's schedule and under 1F1B."""
    from hetpart.units import format_bytes

    t, n = problem.training, len(problem.devices)
    have = sum(d.capacity_bytes for d in problem.devices)
    gpipe = t is not None and t.schedule == "gpipe"
    stash = (f"with GPipe's stash of all {t.microbatches} microbatches ({format_bytes(act)} of activations each) "
             f"one pipeline of all {n} needs {format_bytes(int(want))}, and more pipelines need more: no plan fits "
             "whatever the --time-limit" if gpipe and have < want else
             f"with the microbatches its stages stash the search estimates that one pipeline of all {n} needs "
             f"{format_bytes(int(want))} (NOTE [pipeline shapes]), and tried no shape")
    fix = ("pass --schedule 1f1b (a stage stashes fewer microbatches), " if gpipe and want_1f1b <= have else
           f"1F1B's stash does not fit either (the search estimates {format_bytes(int(want_1f1b))}); " if gpipe else "")
    said = lambda fix: (  # noqa: E731
        f"partitioner: the {n} devices hold {format_bytes(have)}, more than one copy of the model needs "
        f"({format_bytes(need)} of weights, training state and one microbatch of activations), but no pipeline of "
        f"them holds it with the activations its stages stash: {stash}; {fix}pass a smaller --batch-size, or add "
        "devices with more memory")
    return PipelinesRefused(said(fix), without_1f1b=said("") if fix else None)
