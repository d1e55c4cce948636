"""Why a device of a data-parallel pipelines plan runs no stage (NOTE [idle reasons]). Nothing here imports torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetpart.partitioner.infeasible import node_need
from hetpart.partitioner.pipeline_bounds import sync_floor_ns
from hetpart.partitioner.pipelines import PipelinesPlan, _devices_of
from hetpart.partitioner.problem import Problem

# NOTE [idle reasons]
# Each idle device gets the first reason that holds, in this order:
# - memory: it cannot hold even one op with its weights (and one microbatch of activations), so no
#   stage can run on it; or no pipeline shape containing a machine of its kind holds the model
#   (NOTE [pipeline shapes]); or every shape with it that was solved has no plan fitting per stage
#   (the 1F1B stash: stage k of S keeps S - k microbatches);
# - not planned: shapes with it exist but none was solved within the time limit;
# - too slow to help: it is in a pipeline whose plan leaves it out (a stage on it would make that
#   pipeline slower), or none of the above and none below holds;
# - too slow to help: every solved shape with it takes longer for its fewest microbatches (1F1B: as
#   many as its stages) than the plan's whole step;
# - microbatches: a pipeline with it needs more microbatches than the batch has left once every
#   pipeline of the plan runs its fewest (1 each; under 1F1B as many as its stages): a larger batch
#   would use it;
# - link: in training, one more pipeline with it takes at most its share of the batch off the
#   pipelines' time (T x r / (R + r) at rates of one microbatch per bottleneck: r its best shape's,
#   R the plan's), and the least gradient sync of one more pipeline (NOTE [pipelines bound]'s
#   floor; over the network when no used device shares the idle one's machine, since then every
#   ring from it crosses machines) adds more than that.
# These are explanations in the cost model's terms, not proofs about every plan; `plan_pipelines`
# picks the plan, and the bound says how far from the best any plan could be.


@dataclass
class ShapeFacts:
    """What the search knows about the shapes of each machine kind (NOTE [idle reasons])."""

    kind_of_machine: dict[str, int]  # machine -> its kind's index
    in_shape: set[int] = field(default_factory=set)  # kinds in some shape that holds the model
    tried: set[int] = field(default_factory=set)  # kinds in some shape the search solved (plan or not)
    solved: set[int] = field(default_factory=set)  # kinds in some shape with a plan
    # kind -> (lo, bottleneck ns, devices, fewest ns) of its best-rate shape with a plan: its fewest
    # microbatches, its bottleneck, its devices, and its time for its fewest microbatches
    best: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)


def idle_reasons(problem: Problem, plan: PipelinesPlan, microbatches: int, facts: ShapeFacts | None) -> dict[str, str]:
    """NOTE [idle reasons] for every device no stage of `plan` runs on; `facts` None (no search): the reasons
    that need no shapes (memory per op, left out of its pipeline, microbatches of one-device pipelines)."""
    used = {d for p in plan.pipelines for s in p.plan.stages for d in _devices_of(s)}
    busy_machines = {problem.device(d).node for d in used}
    planned = {d for p in plan.pipelines for d in p.devices}
    smallest_op = min((node_need(problem, v) for v in problem.graph.nodes), default=0)
    training = problem.training
    one_f1b = training is not None and training.schedule == "1f1b"
    taken = sum(len(p.plan.stages) if one_f1b else 1 for p in plan.pipelines)
    pipes = max(1, max(p.time_ns for p in plan.pipelines))
    rate = sum(1 / max(1, p.plan.bottleneck_ns) for p in plan.pipelines)
    out: dict[str, str] = {}
    for dev in problem.devices:
        d = dev.name
        if d in used:
            continue
        j = facts.kind_of_machine[dev.node] if facts is not None else -1
        if dev.capacity_bytes < smallest_op:
            out[d] = (f"memory: {dev.capacity_bytes / 2**30:.1f} GiB holds no op with its weights "
                      f"(the smallest needs {smallest_op / 2**30:.1f} GiB)")
        elif d in planned:
            out[d] = ("too slow to help: its pipeline's best plan leaves it out (a stage on it would not "
                      "make that pipeline faster)")
        elif facts is None:
            out[d] = "in no pipeline"
        elif j not in facts.in_shape:
            out[d] = "memory: no pipeline containing it can hold the model"
        elif j not in facts.tried:
            out[d] = "not planned: no pipeline shape with it was solved within the time limit"
        elif j not in facts.solved:
            out[d] = ("memory: every pipeline with it that was tried has a stage that does not fit (weights, "
                      "training state and the stash of its microbatches)")
        else:
            lo, bottleneck, devices, fewest_ns = facts.best[j]
            if fewest_ns >= plan.iteration_ns:
                out[d] = (f"too slow to help: a pipeline with it runs at least {lo} microbatch(es)"
                          + (" (1F1B: as many as its stages)" if one_f1b else "") + f", which take "
                          f"{fewest_ns / 1e6:.4g} ms, more than the whole step's {plan.iteration_ns / 1e6:.4g} ms")
            elif microbatches - taken < lo:
                out[d] = (f"microbatches: a pipeline with it runs at least {lo}, and the batch's {microbatches} "
                          "are taken by the pipelines' fewest; a larger batch would use it")
            else:
                out[d] = _link_or_slow(problem, plan, devices, bottleneck, pipes, rate, dev.node not in busy_machines)
    return out


def _link_or_slow(problem: Problem, plan: PipelinesPlan, devices: int, bottleneck: int, pipes: int,
                  rate: float, apart: bool) -> str:
    """NOTE [idle reasons]'s last two: link, or too slow to help (`apart`: no used device shares its machine)."""
    saving = pipes * (1 / max(1, bottleneck)) / (rate + 1 / max(1, bottleneck))
    more = sync_floor_ns(problem, devices, len(plan.pipelines) + 1, crosses_machines=apart) - plan.grad_sync_ns
    if problem.training is not None and more > saving:
        return (f"link: one more pipeline with it would save at most {saving / 1e6:.3g} ms of the "
                f"pipelines' time, but its gradient sync adds at least {more / 1e6:.3g} ms")
    return ("too slow to help: no pipeline with it lowers the step time (it would be slower than the step, or "
            "its gradient sync would cost more than it saves)")
