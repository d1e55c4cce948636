"""Data-parallel pipelines of different shapes (issue 19): the plan, its cost, and its check.

A `PipelinesPlan` is a set of pipelines over disjoint devices. Each pipeline is an ordinary
single-pipeline `Plan` of the same problem graph, solved on the problem restricted to the
pipeline's devices (`sub_problem`), and runs an integer number of microbatches of the one
microbatch size the problem's costs are for; the pipelines' microbatches add up to the global
batch. Nothing here imports torch.

    >>> import networkx as nx
    >>> from hetpart.partitioner.problem import Device, Link
    >>> g = nx.path_graph(["a", "b"], create_using=nx.DiGraph)
    >>> nx.set_node_attributes(g, {"a": {"gpu": 30}, "b": {"gpu": 30}}, "time_ns")
    >>> nx.set_node_attributes(g, {"a": ("w",), "b": ()}, "weights")
    >>> p = Problem(graph=g, weights={"w": 1000}, devices=[Device(f"g{i}", "gpu", "n0", 10**6) for i in range(4)],
    ...             intra_node_links={"n0": Link(1000, 0)}, network=Link(100, 0))
    >>> pp = fixed_pipelines(p, [["g0", "g1"], ["g2", "g3"]], [3, 1])
    >>> [(q.microbatches, q.time_ns) for q in pp.pipelines], pp.iteration_ns
    ([(3, 120), (1, 60)], 120)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import allreduce_ns
from hetpart.partitioner.evaluate import objective_ns
from hetpart.partitioner.problem import Link, Plan, Problem, StageCost
from hetpart.partitioner.tp_sync import HeldBy, slice_buckets, slice_bytes, weight_slices
from hetpart.partitioner.verify import plan_violations

# NOTE [pipelines plan]
# A pipeline's time is the `iteration` objective of NOTE [objectives] for its microbatches m:
# the sum of its stage times + (m - 1) x its bottleneck (the first microbatch fills the
# pipeline, the others follow one bottleneck apart); its stages' costs and memory are those of
# its single-pipeline plan on `sub_problem(problem, devices, m)` (the stash depends on m).
# The step's time (`iteration_ns`) is the slowest pipeline's plus the gradient synchronisation
# (NOTE [gradient sync]), none of it overlapped: that is the number plans are compared and
# bounded by. Inference has no synchronisation; its throughput is the global batch over the
# slowest pipeline's time.

# NOTE [gradient sync]
# In training every device holding a weight all-reduces that weight's gradient with every other
# device holding it, across pipelines and within one (a tied weight read in two stages): a ring
# all-reduce (`costs.allreduce_ns`) over the slowest link the ring crosses (the network when its
# devices sit on two or more machines, else their machine's link). The weights of one device
# that share the same holders go in one bucket (one all-reduce, one latency per step); a device's
# sync time is the sum of its buckets, and the step waits for the slowest device
# (`grad_sync_ns`). `grad_sync_overlapped_ns` estimates what is left when each device starts its
# all-reduces as soon as its last backward ends: stage k of a pipeline finishes its backwards
# before the stages 0..k-1 finish theirs, which hides up to their stage times. Devices that are TP
# groups: NOTE [tensor-parallel gradient sync] (tp_pipelines.py), the network's sharing there too;
# TP groups of several degrees: NOTE [mixed-degree gradient sync] (tp_sync.py).


@dataclass
class Pipeline:
    """One pipeline: its devices, its share of the batch, and its plan on them."""

    index: int
    devices: tuple[str, ...]  # the devices it was planned on; its stages use some or all of them
    microbatches: int  # its share of the global batch, in microbatches
    plan: Plan  # a plan of `sub_problem(problem, devices, microbatches)`
    time_ns: int  # NOTE [pipelines plan]: sum of stage times + (microbatches - 1) x bottleneck


@dataclass
class PipelinesPlan:
    """Data-parallel pipelines over disjoint devices (NOTE [pipelines plan])."""

    pipelines: list[Pipeline]
    iteration_ns: int  # slowest pipeline + grad_sync_ns
    grad_sync_ns: int  # NOTE [gradient sync], not overlapped
    grad_sync_overlapped_ns: int  # what is left when each device syncs as its backwards end
    lower_bound_ns: int  # proven for every plan of the plan space `bound_note` names (0: none)
    solver_status: str  # "OPTIMAL", "WITHIN_GAP", "FEASIBLE" or "FIXED" (pipelines given by the caller)
    devices_idle: dict[str, str] = field(default_factory=dict)  # device -> why no stage runs on it
    bound_note: str = ""  # what the bound covers and which parts of it were left out (e.g. past the deadline)
    bound_unfinished: tuple[str, ...] = ()  # the bound's parts its deadline cut (PipelinesBound.unfinished)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def microbatches(self) -> int:
        return sum(p.microbatches for p in self.pipelines)

    @property
    def used_devices(self) -> set[str]:
        """The devices some stage of some pipeline runs on (a TP slot's every device)."""
        return used_devices(self.pipelines)

    @property
    def gap(self) -> float:
        """Relative distance of `iteration_ns` to the proven bound (1.0 with no bound)."""
        if self.iteration_ns <= 0:
            return 0.0
        return max(0.0, (self.iteration_ns - self.lower_bound_ns) / self.iteration_ns)


def _devices_of(stage: StageCost) -> tuple[str, ...]:
    """The devices a stage runs on: its slot's (a hand-made StageCost names only its `device`)."""
    return tuple(stage.devices) or (stage.device,)


def one_f_one_b_stage_cap(problem: Problem, schedule: str, microbatches: int) -> int | None:
    """NOTE [1F1B stages] (hetpart/compile.py): the stage cap a `schedule` pipeline of `microbatches` needs on
    `problem`'s devices -- M, for 1F1B with M below both the devices' count and the problem's own cap --
    or None when none is needed."""
    devices = len(problem.devices)
    if schedule == "1f1b" and microbatches < min(problem.max_stages or devices, devices):
        return microbatches
    return None


def sub_problem(problem: Problem, devices: Sequence[str], microbatches: int) -> Problem:
    """`problem` on `devices` only, for a pipeline of `microbatches` microbatches: the training stash
    counts them, and a 1F1B pipeline has at most that many stages (NOTE [1F1B stages] in compile.py)."""
    if microbatches < 1:
        raise HetpartError(f"partitioner: a pipeline needs at least 1 microbatch, got {microbatches}")
    keep = set(devices)
    unknown = sorted(keep - {d.name for d in problem.devices})
    if unknown:
        raise HetpartError(f"partitioner: unknown devices {unknown} in a pipeline")
    training = problem.training
    max_stages = problem.max_stages
    if training is not None:
        training = dataclasses.replace(training, microbatches=microbatches)
        if training.schedule == "1f1b":
            max_stages = min(max_stages or len(keep), microbatches)
    machines = {d.node for d in problem.devices if d.name in keep}
    return dataclasses.replace(
        problem, devices=[d for d in problem.devices if d.name in keep], training=training, max_stages=max_stages,
        intra_node_links={m: link for m, link in problem.intra_node_links.items() if m in machines})


def pipeline_time_ns(plan: Plan, microbatches: int) -> int:
    """NOTE [pipelines plan]: one pipeline's time for `microbatches` microbatches."""
    return objective_ns(plan.stages, "iteration", microbatches)


def _ring_link(problem: Problem, devices: Sequence[str]) -> Link:
    """The slowest link a ring over `devices` crosses (NOTE [gradient sync])."""
    return _ring_link_over(problem, [problem.device(d).node for d in devices])


def _ring_link_over(problem: Problem, machines: Sequence[str]) -> Link:
    """The slowest link a ring of ranks on `machines` (one entry per rank) crosses (NOTE [gradient sync])."""
    if len(set(machines)) == 1:
        return problem.intra_node_links.get(machines[0], problem.network)
    shared = [problem.intra_node_links[m] for m in set(machines)
              if m in problem.intra_node_links and machines.count(m) > 1]
    return min([problem.network, *shared], key=lambda link: (link.bandwidth_bytes_per_us, -link.latency_ns))


def weight_holders(problem: Problem, pipelines: Sequence[Pipeline]) -> dict[str, list[str]]:
    """Weight -> the devices holding it, in pipeline and stage order (each stage holds every weight its nodes read)."""
    holders: dict[str, list[str]] = {}
    for p in pipelines:
        for s in p.plan.stages:
            held = sorted(problem.weights_read(s.nodes))
            for d in _devices_of(s):
                for w in held:
                    holders.setdefault(w, []).append(d)
    return holders


def sync_buckets(problem: Problem, pipelines: Sequence[Pipeline]) -> dict[tuple[str, ...], int]:
    """NOTE [gradient sync]'s buckets: the devices holding weights (two or more) -> the bytes of the weights they
    hold together."""
    buckets: dict[tuple[str, ...], int] = {}
    for w, devs in weight_holders(problem, pipelines).items():
        if len(devs) > 1:
            key = tuple(devs)
            buckets[key] = buckets.get(key, 0) + problem.weights[w]
    return buckets


def mixed_sync_buckets(problem: Problem, pipelines: Sequence[Pipeline]) -> dict[tuple[tuple[str, int], ...], int]:
    """NOTE [mixed-degree gradient sync]'s buckets over slots of several degrees (`problem.tp_sync`): the ranks
    summing the same slices (a rank: (slot, TP index)) -> those slices' bytes."""
    layout = problem.tp_sync
    assert layout is not None
    held: dict[str, list[HeldBy]] = {}
    for p in pipelines:
        for s in p.plan.stages:
            t = layout.degree_of_type.get(problem.device(s.device).type, 1)
            split = layout.split.get(t, {})
            for w in sorted(problem.weights_read(s.nodes)):
                held.setdefault(w, []).append(HeldBy(tuple((s.device, j) for j in range(t)), split.get(w),
                                                     f"pipeline {p.index} stage {s.index} (TP {t})"))
    return {ranks: sum(slice_bytes(layout.whole_bytes.get(x.weight, problem.weights[x.weight]), x.of) for x in xs)
            for ranks, xs in slice_buckets(weight_slices(held)).items()}


def grad_sync_ns(problem: Problem, pipelines: Sequence[Pipeline]) -> tuple[int, int]:
    """(not overlapped, overlapped) gradient synchronisation of a step (NOTE [gradient sync]); (0, 0) in inference.
    Over TP slots: NOTE [tensor-parallel gradient sync] in tp_pipelines.py; over slots of several degrees
    (`problem.tp_sync`): NOTE [mixed-degree gradient sync] in tp_sync.py."""
    if problem.training is None:
        return 0, 0
    per_device: dict[str, int] = {}  # a device, or a slot whose ranks differ (its slowest rank's)
    if problem.tp_sync is not None:  # NOTE [mixed-degree gradient sync] in tp_sync.py
        per_rank: dict[tuple[str, int], int] = {}
        for ranks, nbytes in mixed_sync_buckets(problem, pipelines).items():
            t = allreduce_ns(_ring_link_over(problem, [problem.device(d).node for d, _ in ranks]), nbytes, len(ranks))
            for r in ranks:
                per_rank[r] = per_rank.get(r, 0) + t
        for (d, _), t in per_rank.items():
            per_device[d] = max(per_device.get(d, 0), t)
    else:
        for devs, nbytes in sync_buckets(problem, pipelines).items():
            t = allreduce_ns(_ring_link(problem, devs), nbytes, len(devs))
            for d in devs:
                per_device[d] = per_device.get(d, 0) + t
    hidden: dict[str, int] = {}  # device -> backward time of the stages before its own
    for p in pipelines:
        before = 0
        for s in p.plan.stages:
            for d in _devices_of(s):
                hidden[d] = before
            before += s.time_ns
    total = max(per_device.values(), default=0)
    left = max((max(0, t - hidden.get(d, 0)) for d, t in per_device.items()), default=0)
    return total, left


def used_devices(pipelines: Sequence[Pipeline]) -> set[str]:
    """The devices some stage of `pipelines` runs on (a TP slot's every device)."""
    return {d for p in pipelines for s in p.plan.stages for d in _devices_of(s)}


# NOTE [a pipeline's own bound]
# plan.json gives each pipeline of a plan of several its own bound and solver status (PipelineReport). A pipeline
# on one device (or slot) has one plan, every node on it: OPTIMAL, its bound its time. A pipeline `solve` planned
# on its own devices for its microbatches (`fixed_pipelines`, the one-pipeline baseline) keeps that solve's bound
# and status. Any other has no bound of its own (null; the search's, costed from a shape solved for other
# microbatches or on layers, NOTE [shapes on layers]; a re-plan's; a baseline's): the plan's bound (NOTE
# [pipelines bound]) covers its pipelines together. Every search pipeline read "FEASIBLE" with bound 0.0 once,
# a pipeline of one device included (ux21).
def own_bound(p: Pipeline) -> tuple[int | None, str]:
    """NOTE [a pipeline's own bound]: (its bound in ns, None where none was computed; its status)."""
    if len(p.devices) == 1:
        return p.time_ns, "OPTIMAL"
    return (p.plan.lower_bound_ns or None), p.plan.solver_status


def left_out_reason(problem: Problem, p: Pipeline) -> str:
    """Why pipeline `p`'s plan runs no stage on one of its devices, as far as it is known: the stage limit it is
    at (1F1B runs at most as many stages as microbatches; --max-stages), or its plan's optimality."""
    on = len(used_devices([p]))
    runs = f"pipeline {p.index}'s plan runs {len(p.plan.stages)} stage(s) on {on} of its {len(p.devices)} devices"
    cap = sub_problem(problem, p.devices, p.microbatches).max_stages
    if cap is not None and len(p.plan.stages) >= cap:
        one_f1b = problem.training is not None and problem.training.schedule == "1f1b"
        if one_f1b and cap == p.microbatches:
            return (f"stage limit: {runs}, as many as 1F1B runs with its {p.microbatches} microbatch(es); more "
                    "microbatches or --schedule gpipe would let it use more devices")
        return f"stage limit: {runs}, the most --max-stages allows ({cap})"
    if p.plan.solver_status == "OPTIMAL":
        return f"too slow to help: {runs}, optimal on them, so a stage on it would not make that pipeline faster"
    return (f"left out: {runs} ({p.plan.solver_status}: not proven optimal, so a plan using it may be faster; "
            "a longer --time-limit may tell)")


def left_out_reasons(problem: Problem, pipelines: Sequence[Pipeline], used: set[str]) -> dict[str, str]:
    """Each device a pipeline of `pipelines` has but runs no stage on (not in `used`) -> `left_out_reason`,
    computed once per pipeline."""
    out = {}
    for p in pipelines:
        left = [d for d in p.devices if d not in used]
        if left:
            why = left_out_reason(problem, p)
            out.update(dict.fromkeys(left, why))
    return out


def cost_pipelines(problem: Problem, pipelines: list[Pipeline], *, lower_bound_ns: int = 0, solver_status: str,
                   bound_note: str = "", stats: dict[str, float] | None = None,
                   bound_unfinished: tuple[str, ...] = ()) -> PipelinesPlan:
    """The `PipelinesPlan` of `pipelines` with its step time, sync and idle devices (NOTE [pipelines plan])."""
    sync, overlapped = grad_sync_ns(problem, pipelines)
    used = used_devices(pipelines)
    left_out = left_out_reasons(problem, pipelines, used)
    idle = {d.name: left_out.get(d.name, "in no pipeline") for d in problem.devices if d.name not in used}
    return PipelinesPlan(
        pipelines=pipelines, iteration_ns=max(p.time_ns for p in pipelines) + sync, grad_sync_ns=sync,
        grad_sync_overlapped_ns=overlapped, lower_bound_ns=lower_bound_ns, solver_status=solver_status,
        devices_idle=idle, bound_note=bound_note, stats=dict(stats or {}), bound_unfinished=bound_unfinished)


def fixed_pipelines(problem: Problem, groups: Sequence[Sequence[str]], microbatches: Sequence[int],
                    options: object | None = None, **overrides: object) -> PipelinesPlan:
    """Pipelines on the given device `groups`, fed `microbatches` each: every group solved by `solve`
    (with `options`/`overrides` as `solve` takes them) for the iteration objective of its share.
    Status "FIXED": the bound is the pipelines' own, not one over other groupings."""
    from hetpart.partitioner.solve import solve

    if len(groups) != len(microbatches) or not groups:
        raise HetpartError(f"partitioner: {len(groups)} pipeline device group(s) but {len(microbatches)} "
                           "microbatch count(s); give one count per group")
    out: list[Pipeline] = []
    for i, (devs, m) in enumerate(zip(groups, microbatches)):
        sub = sub_problem(problem, devs, m)
        plan = solve(sub, options, objective="iteration", microbatches=m, **overrides)  # type: ignore[arg-type]
        out.append(Pipeline(index=i, devices=tuple(devs), microbatches=m, plan=plan,
                            time_ns=pipeline_time_ns(plan, m)))
    bound = max(p.plan.lower_bound_ns for p in out)
    plan = cost_pipelines(problem, out, lower_bound_ns=bound, solver_status="FIXED",
                          bound_note="the slowest pipeline's own bound on these device groups and batch shares")
    grouped = {d for devs in groups for d in devs}  # a device the user's groups leave out is idle by their choice
    plan.devices_idle.update({d: "not in any group of --pipelines" for d in plan.devices_idle if d not in grouped})
    return plan


def pipelines_violations(problem: Problem, plan: PipelinesPlan, microbatches: int | None = None) -> list[str]:
    """Every rule `plan` breaks: devices shared by two pipelines, a stage off its pipeline's devices, a pipeline
    plan its sub-problem rejects, microbatches not adding up to `microbatches`, a time that is not its formula."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for p in plan.pipelines:
        for d in p.devices:
            if d in seen:
                out.append(f"device {d} is in pipelines {seen[d]} and {p.index}")
            seen[d] = p.index
        sub = sub_problem(problem, p.devices, p.microbatches)
        out += [f"pipeline {p.index}: {v}" for v in plan_violations(sub, p.plan)]
        if p.time_ns != pipeline_time_ns(p.plan, p.microbatches):
            out.append(f"pipeline {p.index}: time {p.time_ns} ns is not its plan's "
                       f"{pipeline_time_ns(p.plan, p.microbatches)} ns for {p.microbatches} microbatches")
    if microbatches is not None and plan.microbatches != microbatches:
        out.append(f"the pipelines run {plan.microbatches} microbatches, the batch has {microbatches}")
    if plan.pipelines:
        sync, _ = grad_sync_ns(problem, plan.pipelines)
        want = max(p.time_ns for p in plan.pipelines) + sync
        if plan.iteration_ns != want:
            out.append(f"iteration {plan.iteration_ns} ns is not the slowest pipeline + sync ({want} ns)")
    else:
        out.append("no pipelines")
    return out
