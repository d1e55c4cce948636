"""Why a device of a data-parallel pipelines plan runs no stage (NOTE [idle reasons]). Nothing here imports torch."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from hetpart.partitioner.infeasible import node_need
from hetpart.partitioner.pipeline_bounds import need_bytes, sync_floor_ns
from hetpart.partitioner.pipeline_device_join import DeviceTry
from hetpart.partitioner.pipeline_join import JoinResult, JoinTry
from hetpart.partitioner.pipeline_outer import Candidate, kinds_of
from hetpart.partitioner.pipelines import PipelinesPlan, _devices_of, left_out_reasons
from hetpart.partitioner.problem import Problem
from hetpart.units import format_bytes

# NOTE [idle reasons]
# Each idle device gets the first reason that holds, in this order:
# - memory: it cannot hold even one op with its weights (and one microbatch of activations), so no
#   stage can run on it; or no pipeline shape containing a machine of its kind holds the model
#   (NOTE [pipeline shapes]); or every shape with it that was solved has no plan fitting per stage
#   (the 1F1B stash: stage k of S keeps S - k microbatches);
# - not planned: shapes with it exist but none was solved within the time limit;
# - in a pipeline whose plan leaves it out (`pipelines.left_out_reason`): "stage limit" where the plan
#   runs as many stages as it may (1F1B: as many as its microbatches; --max-stages), "too slow to
#   help" where that plan is OPTIMAL (a stage on it would not make the pipeline faster), else "left
#   out" with the plan's status (not proven);
# - not shown to help: every plan of a solved shape with it leaves it out. Those shapes add whole
#   machines, and a planner that leaves 8 devices out may still run a stage on one: llama-70b on
#   hetero-64 read "too slow to help: every plan of a pipeline shape with a l4-24g machine leaves its
#   devices out (a stage on one would make that pipeline slower)", and its 48-GPU pipeline planned
#   again with one L4 added takes 6,307 ms, 0.9% under the plan's 6,366 (docs/benchmarks.md, "idle19").
#   Where the plan itself runs stages on devices of the kind (NOTE [device join] took them), the reason
#   says so instead of "a stage on fewer of its devices was not tried", which the join's try made false;
# - too slow to help: every solved shape whose plan runs a stage on it takes longer for its fewest
#   microbatches (1F1B: as many as its stages) than the plan's whole step, and NOTE [device join]
#   gave devices of its kind to the plan's slowest pipelines without lowering the step (else "not
#   shown to help": the test problem of NOTE [join probe] has a plan 20% faster with one slow device
#   in each pipeline, which no solved shape showed). The words say "the search solved": a claim
#   about the shapes it solved, never about every pipeline (llama-70b on hetero-1024 read "every
#   pipeline with a a100-80g machine takes at least 9,156 ms for its fewest microbatches" from 3
#   solved shapes, while the plan's own pipeline 0 with a last stage on an A100-80G takes less:
#   docs/benchmarks.md, "idle19");
# - microbatches: a pipeline with it needs more microbatches than the batch has left once every
#   pipeline of the plan runs its fewest (1 each; under 1F1B as many as its stages): a larger batch
#   would use it;
# - link: in training, one more pipeline with it takes at most its share of the batch off the
#   pipelines' time (T x r / (R + r) at rates of one microbatch per bottleneck: r its best shape's,
#   R the plan's), and the least gradient sync of one more pipeline (NOTE [pipelines bound]'s
#   floor; over the network when no used device shares the idle one's machine, since then every
#   ring from it crosses machines) adds more than that;
# - not shown to help: none of the above holds. A pipeline with it runs its fewest microbatches
#   within the plan's step, there are microbatches for it and the sync floor does not forbid it, and
#   yet no plan the search found with it has a lower step: that is the search's reach (the time
#   limit, the shapes it solved), not a property of the device, so the reason does not say "too slow
#   to help" (it did; on llama-70b over hetero-256 under load the search kept 2 pipelines of 32 H100s
#   at 8,302 ms and called its 128 idle A100s "too slow to help", while 4 pipelines of 2 H100 and 2
#   A100-80G machines take 7,161 ms in the same cost model: docs/benchmarks.md, "idle19").
# Each reason carries its numbers, all from plans costed by the one cost model (`evaluate` for a
# pipeline's stages, `cost_pipelines` for a step): a memory reason the model's state
# (`need_bytes`: weights, training state, one microbatch of activations) against the device's
# capacity and how many such devices would hold it alone; a speed reason the fastest solved
# pipeline with the kind at its fewest microbatches and the fastest of that kind's machines only,
# against the plan's step; and, for a device in no pipeline, what NOTE [join probe] found when it
# gave one machine of its kind to the plan's pipelines ("adding one l4-24g machine to pipeline 0 gives
# 9,628 ms (+54.1%)"), or that the joined plan leaves it out, or why that join has no plan, or that
# the time limit came first; and what NOTE [device join] found giving a few devices of its kind to
# the plan's slowest pipelines.
# These are explanations in the cost model's terms, not proofs about every plan; `plan_pipelines`
# picks the plan, and the bound says how far from the best any plan could be.


@dataclass
class ShapeFacts:
    """What the search knows about the shapes of each machine kind (NOTE [idle reasons])."""

    kind_of_machine: dict[str, int]  # machine -> its kind's index
    in_shape: set[int] = field(default_factory=set)  # kinds in some shape that holds the model
    tried: set[int] = field(default_factory=set)  # kinds in some shape the search solved (plan or not)
    solved: set[int] = field(default_factory=set)  # kinds in some shape with a plan
    # kind -> (lo, bottleneck ns, devices, fewest ns) of its best-rate shape whose plan runs a stage on it: its
    # fewest microbatches, its bottleneck, its devices, and the least time of any such shape for its fewest
    best: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    runs_count: dict[int, int] = field(default_factory=dict)  # kind -> solved shapes whose plan runs a stage on it
    planned_count: dict[int, int] = field(default_factory=dict)  # kind -> solved shapes with it that have a plan
    kind_names: list[str] = field(default_factory=list)  # kind -> its device types ("l4-24g")
    tried_count: dict[int, int] = field(default_factory=dict)  # kind -> shapes with it the search solved
    # kind -> (fewest ns, lo, devices) of the fastest pipeline of its machines only, at its fewest microbatches
    pure: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    joins: dict[int, JoinTry] = field(default_factory=dict)  # kind -> NOTE [join probe]'s best try of it
    join_untried: set[int] = field(default_factory=set)  # kinds the probe's last round left untried (time)
    join_plan: tuple[tuple[str, ...], ...] = ()  # the pipelines (devices) the tries were made against
    device_tries: dict[tuple[str, int], DeviceTry] = field(default_factory=dict)  # NOTE [device join], per kind


def kind_names(kinds: list) -> list[str]:
    """Machine kinds (pipeline_search.MachineKind) as the reasons name them: their device types ("l4-24g"), and
    where two kinds share them (other capacities, counts or links), the first machine of each too ("l4-24g
    (kind of m1)"): each reason's numbers are its own kind's, so two kinds must not read as one."""
    base = ["+".join(dict.fromkeys(t for t, _ in k.classes)) for k in kinds]
    return [b if base.count(b) == 1 else f"{b} (kind of {k.machines[0]})" for b, k in zip(base, kinds)]


def learn(facts: ShapeFacts, problem: Problem, cands: list[Candidate], probe: JoinResult) -> None:
    """What the search's candidates (NOTE [join probe]'s among them) and the probe's last tries tell about each
    machine kind; the tries are against `probe.plan`."""
    for shape in probe.solved:
        for j in kinds_of(shape):
            facts.tried.add(j)
            facts.tried_count[j] = facts.tried_count.get(j, 0) + 1
    facts.joins = {}
    for t in probe.tries:  # the best try per kind
        old = facts.joins.get(t.kind)
        if old is None or (t.step_ns is not None and (old.step_ns is None or t.step_ns < old.step_ns)):
            facts.joins[t.kind] = t
    facts.join_untried = set(probe.untried)
    facts.join_plan = tuple(p.devices for p in probe.plan.pipelines)
    fewest = lambda c: c.sum_ns + (c.lo - 1) * c.bottleneck_ns  # noqa: E731 (its time at its fewest microbatches)
    # Per kind, the shapes whose plans run a stage on it (a plan may leave machines out).
    runs = [{facts.kind_of_machine[problem.device(d).node] for st in c.plan.stages for d in _devices_of(st)}
            for c in cands]
    facts.runs_count, facts.planned_count = {}, {}
    for c in cands:
        for j in kinds_of(c.shape):
            facts.planned_count[j] = facts.planned_count.get(j, 0) + 1
    for r in runs:
        for j in r:
            facts.runs_count[j] = facts.runs_count.get(j, 0) + 1
    for i in sorted(range(len(cands)), key=lambda i: cands[i].bottleneck_ns * len(cands[i].devices)):
        c = cands[i]
        for j in runs[i]:
            least = min(fewest(o) for o, r in zip(cands, runs) if j in r)
            facts.best.setdefault(j, (c.lo, c.bottleneck_ns, len(c.devices), least))
        if len(kinds_of(c.shape)) == 1 and c.piece_kind < 0 and runs[i]:  # whole machines of one kind
            j = next(iter(kinds_of(c.shape)))
            if j not in facts.pure or fewest(c) < facts.pure[j][0]:
                facts.pure[j] = (fewest(c), c.lo, len(c.devices))
    facts.solved = {j for c in cands for j in kinds_of(c.shape)}


def format_ns(ns: float) -> str:
    """A time as the reasons print it: "747.5 ms", "1,324 ms", "10,390 ms", "370 ns"."""
    for unit, scale in (("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:,.0f} {unit}" if ns >= 1000 * scale else f"{ns / scale:.4g} {unit}"
    return f"{ns:,.0f} ns"


def plan_only_reasons(problem: Problem, plan: PipelinesPlan) -> dict[str, str]:
    """NOTE [idle reasons]'s reasons that need nothing but `plan`, for the idle devices they hold for: memory (it
    holds no op) and left out of its pipeline's plan."""
    used = plan.used_devices
    smallest_op = min((node_need(problem, v) for v in problem.graph.nodes), default=0)
    out = left_out_reasons(problem, plan.pipelines, used)
    for dev in problem.devices:
        if dev.name not in used and dev.capacity_bytes < smallest_op:
            out[dev.name] = (f"memory: {format_bytes(dev.capacity_bytes)} holds no op with its weights "
                             f"(the smallest needs {format_bytes(smallest_op)})")
    return out


def idle_reasons(problem: Problem, plan: PipelinesPlan, microbatches: int, facts: ShapeFacts | None) -> dict[str, str]:
    """NOTE [idle reasons] for every device no stage of `plan` runs on; `facts` None (no search): the reasons
    that need no shapes (memory per op, left out of its pipeline, microbatches of one-device pipelines)."""
    used = plan.used_devices
    busy_machines = {problem.device(d).node for d in used}
    first = plan_only_reasons(problem, plan)
    need = need_bytes(problem)
    training = problem.training
    one_f1b = training is not None and training.schedule == "1f1b"
    taken = sum(len(p.plan.stages) if one_f1b else 1 for p in plan.pipelines)
    pipes = max(1, max(p.time_ns for p in plan.pipelines))
    rate = sum(1 / max(1, p.plan.bottleneck_ns) for p in plan.pipelines)
    step = format_ns(plan.iteration_ns)
    # the used devices of each machine kind, once (not per idle device: 300 of them on hetero-1024's rows)
    used_of_kind = Counter(facts.kind_of_machine[problem.device(u).node] for u in used) if facts is not None else {}
    out: dict[str, str] = {}
    for dev in problem.devices:
        d = dev.name
        if d in used:
            continue
        j = facts.kind_of_machine[dev.node] if facts is not None else -1
        name = facts.kind_names[j] if facts is not None and j < len(facts.kind_names) else dev.type
        holds = (f"the model's {format_bytes(need)} of weights, training state and one microbatch of activations "
                 f"need at least {math.ceil(need / max(1, dev.capacity_bytes))} devices of its "
                 f"{format_bytes(dev.capacity_bytes)}")
        if d in first:  # memory per op, or left out of its pipeline
            out[d] = first[d]
        elif facts is None:  # only a baseline's plan taken where the search found none (plan_with_baselines)
            out[d] = ("in no pipeline of the baseline's layout taken as the plan: the search found no plan of its own, "
                      "so no shape it solved says why (NOTE [baselines as candidates])")
        elif j not in facts.in_shape:
            out[d] = f"memory: no pipeline containing it can hold the model ({holds})"
        elif j not in facts.tried:
            out[d] = "not planned: no pipeline shape with it was solved within the time limit"
        elif j not in facts.solved:
            out[d] = (f"memory: every pipeline with it that was tried ({facts.tried_count.get(j, 0)} shape(s)) has a "
                      "stage that does not fit (weights, training state and the stash of its microbatches); "
                      f"{holds}")
        elif j not in facts.best:
            shapes = facts.planned_count.get(j, 0)
            kin = used_of_kind.get(j, 0)
            out[d] = (f"not shown to help: every plan of the {shapes} pipeline shape(s) with a {name} machine that the "
                      "search solved leaves its devices out, but " + (
                          f"the plan runs stages on {kin} of its kind's devices (NOTE [device join]): a plan using "
                          "more may be faster" if kin else
                          "a stage on fewer of its devices was not tried: a plan using one may be faster"))
        else:
            lo, bottleneck, devices, fewest_ns = facts.best[j]
            if fewest_ns >= plan.iteration_ns:
                shown = _device_try(facts, plan, dev) is not None  # NOTE [idle reasons]: the device join tried it
                out[d] = (f"{'too slow to help' if shown else 'not shown to help'}: every pipeline shape the search "
                          f"solved whose plan runs a stage on a "
                          f"{name} machine ({facts.runs_count.get(j, 0)} shape(s)) takes at least "
                          f"{format_ns(fewest_ns)} for its fewest microbatches"
                          + (" (1F1B: as many as its stages)" if one_f1b else "") + f", more than the plan's whole "
                          f"{step} step")
            elif microbatches - taken < lo:
                out[d] = (f"microbatches: a pipeline with it runs at least {lo}, and the batch's {microbatches} "
                          "are taken by the pipelines' fewest; a larger batch would use it")
            else:
                out[d] = _link_or_unshown(problem, plan, devices, bottleneck, pipes, rate,
                                          dev.node not in busy_machines)
                if out[d].startswith("not shown"):
                    out[d] += (f"; the best-rate pipeline with a {name} machine the search solved ({devices} devices) "
                               f"has a {format_ns(bottleneck)} bottleneck, and the fastest takes "
                               f"{format_ns(fewest_ns)} for its fewest microbatches, within the plan's {step} step: "
                               "a plan using it may be faster (a longer --time-limit may find it)")
        if facts is not None and d not in first:
            alone = sum(facts.kind_of_machine[x.node] == j for x in problem.devices)
            short = holds if alone * dev.capacity_bytes < need and holds not in out[d] else ""
            out[d] += _numbers(facts, j, name, plan, short, alone) + _device_words(facts, plan, dev)
    return out


def _device_try(facts: ShapeFacts, plan: PipelinesPlan, dev) -> DeviceTry | None:
    """NOTE [device join]'s last try of `dev`'s kind when it was made against `plan` and made the slowest pipeline no
    faster (its planner ran no stage on the devices, or the pipeline's time did not drop)."""
    t = facts.device_tries.get((dev.type, dev.capacity_bytes))
    if t is None or t.against != tuple(tuple(p.devices) for p in plan.pipelines) or not t.found:
        return None  # not found: a planner out of time shows nothing (rev26: it read "runs no stage on them")
    return t if t.pipeline_ns is None or t.pipeline_ns >= t.was_ns else None


def _device_words(facts: ShapeFacts, plan: PipelinesPlan, dev) -> str:
    """What NOTE [device join] found for `dev`'s kind against `plan`, "" when it did not try it or it helped."""
    t = _device_try(facts, plan, dev)
    if t is None:
        return ""
    given = f"{t.per} {dev.type} device(s) more in the slowest pipeline, planned again"
    if t.pipeline_ns is None:
        return f"; {given}, runs no stage on them"
    return f"; {given}, takes {format_ns(t.pipeline_ns)} against {format_ns(t.was_ns)}"


def _numbers(facts: ShapeFacts, j: int, name: str, plan: PipelinesPlan, short: str, alone: int) -> str:
    """NOTE [idle reasons]: the fastest pipeline of the kind's machines alone (or `short`: why they cannot hold
    the model, `alone` devices in all), and the join probe's best try."""
    out = ""
    if j in facts.pure:
        fewest_ns, lo, devices = facts.pure[j]
        out += (f"; the fastest pipeline of only {name} machines ({devices} devices) takes {format_ns(fewest_ns)} for "
                f"its fewest {lo} microbatch(es)")
    elif short:
        out += f"; {name} machines alone cannot hold the model: {short}, the cluster has {alone}"
    if facts.join_plan != tuple(p.devices for p in plan.pipelines):
        return out  # the probe tried its joins against another plan (a baseline's was kept)
    t = facts.joins.get(j)
    if t is None:
        return out + ("; the time limit came before the join probe tried it" if j in facts.join_untried else "")
    where = f"pipeline{'s' if t.copies > 1 else ''} {', '.join(map(str, t.pipelines))}"
    if t.step_ns is None:
        return out + f"; adding one {name} machine to {where}: {t.why}"
    more = (t.step_ns - plan.iteration_ns) / max(1, plan.iteration_ns)
    if t.left_out:  # the joined shape's plan runs nothing on it: whatever it costs is that plan's, not the machine's
        return out + (f"; adding one {name} machine to {where} adds nothing: the joined devices' plan leaves it "
                      f"out ({format_ns(t.step_ns)}, {more:+.1%})")
    return out + f"; adding one {name} machine to {where} gives {format_ns(t.step_ns)} ({more:+.1%})"


def _link_or_unshown(problem: Problem, plan: PipelinesPlan, devices: int, bottleneck: int, pipes: int,
                     rate: float, apart: bool) -> str:
    """NOTE [idle reasons]'s last two: link, or not shown to help (`apart`: no used device shares its machine)."""
    saving = pipes * (1 / max(1, bottleneck)) / (rate + 1 / max(1, bottleneck))
    more = sync_floor_ns(problem, devices, len(plan.pipelines) + 1, crosses_machines=apart) - plan.grad_sync_ns
    if problem.training is not None and more > saving:
        return (f"link: one more pipeline with it would save at most {format_ns(saving)} of the "
                f"pipelines' time, but its gradient sync adds at least {format_ns(more)}")
    return "not shown to help: no plan the search found with it has a lower step"
