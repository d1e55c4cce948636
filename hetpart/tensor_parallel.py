"""`--tensor-parallel T` in the pipeline (issue 20): the steps `compile_model` adds for TP stages.

Sharding on the graph (passes/tensor_parallel.py), costs of TP slots (passes/tp_lower.py), each
rank's stage graph and the mesh (codegen/tp.py); `hetpart run` creates the TP groups (runtime/tp.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch.fx as fx

from hetpart.codegen.split import StageGraph
from hetpart.codegen.tp import tp_manifest, tp_stage_graphs
from hetpart.devices import Cluster
from hetpart.errors import HetpartError
from hetpart.partitioner.costs import tp_shard_bytes
from hetpart.partitioner.problem import FORWARD_NS, Plan, Problem
from hetpart.partitioner.tp_choice import (
    MixedChoice, TPSlot, choose_degree, choose_mixed, least_bound, mixed_problem,
)
from hetpart.passes.tensor_parallel import TP_META, ShardingPlan, describe
from hetpart.partitioner.tp_sync import TPSyncLayout
from hetpart.passes.tp_lower import TPGroup, lower_tensor_parallel, show_tp_costs, tp_groups, tp_op_costs, tp_type
from hetpart.tp_machines import TP_DEGREES
from hetpart.units import format_us


def check_tp_options(degree: int, strategy: str, max_degree: int = 1, machines: tuple[tuple[str, int], ...] = (),
                     fixed_pipelines: bool = False) -> None:
    """`--tensor-parallel T` (or `KEY=T,...`: `machines`, `degree` their largest) and `--max-tensor-parallel N`:
    each one of TP_DEGREES, not both, not with a baseline's strategy, not chosen over `--pipelines`' given devices
    (`fixed_pipelines`). Data-parallel pipelines take one degree for every stage, forced or (`--parallel data`)
    chosen (NOTE [tensor-parallel pipelines]), or the degrees per machine given or tried (NOTE [mixed-degree
    gradient sync] in partitioner/tp_sync.py, NOTE [per-machine pipelines candidates]): nothing to refuse there."""
    for flag, value in (("--tensor-parallel", degree), ("--max-tensor-parallel", max_degree)):
        if value not in TP_DEGREES:
            raise HetpartError(f"{flag} {value}: expected one of {', '.join(map(str, TP_DEGREES))}")
    given = ",".join(f"{k}={t}" for k, t in machines) if machines else str(degree)
    flag = f"--tensor-parallel {given}" if degree > 1 else f"--max-tensor-parallel {max_degree}"
    if degree > 1 and max_degree > 1:
        raise HetpartError(f"--tensor-parallel {given} forces the degree, --max-tensor-parallel {max_degree} lets "
                           "the solve choose it: pass one of them")
    if max_degree > 1 and fixed_pipelines:
        raise HetpartError(f"{flag} with --pipelines is not supported: --pipelines gives the devices, so give the "
                           "degree too (--tensor-parallel T), or let --parallel data search both")
    if max(degree, max_degree) > 1 and strategy != "optimal":
        raise HetpartError(f"{flag} with --strategy {strategy} is not supported: the baselines plan single-device "
                           "stages; leave one of them out")


@dataclass
class TPCompile:
    """What a TP compile carries from lowering to the manifest: one degree per plan, or degrees mixed per machine
    (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py)."""

    problem: Problem  # its slots TP groups (NOTE [tensor-parallel costs] in passes/tp_lower.py), and devices (degree 1)
    shardings: dict[int, ShardingPlan]  # degree > 1 -> what a stage of that degree splits
    groups: list[TPGroup]  # the problem's TP slots
    places: dict[str, int] | None = None  # degrees mixed per machine: TPSlot.place -> degree (None: one degree)

    @property
    def sharding(self) -> ShardingPlan:
        """The largest degree's sharding (one degree per plan: its only one)."""
        return self.shardings[max(self.shardings)]

    def stage_shardings(self, plan: Plan) -> list[ShardingPlan | None]:
        """Each stage's sharding, by its slot's degree (None: a stage on one device)."""
        of = {g.name: g for g in self.groups}
        return [self.shardings[len(of[s.device].devices)] if s.device in of else None for s in plan.stages]

    def split_weights(self, plan: Plan) -> set[str]:
        """The weights some stage of `plan` splits (each rank holds its own part: not stored once)."""
        return {w for p in self.stage_shardings(plan) if p is not None for w in p.weights}

    def param_bytes(self, plan: Plan, stages: list[StageGraph], whole: dict[str, int]) -> list[int]:
        """Each stage's weight bytes on one of its ranks: a split weight's part at the stage's degree, as its problem
        counts it (NOTE [tensor-parallel costs]); `whole`: each weight's bytes unsplit."""
        return [sum(tp_shard_bytes(whole[w], p.degree) if p is not None and w in p.weights else whole[w]
                    for w in s.weights.values()) for s, p in zip(stages, self.stage_shardings(plan))]

    def rank_graphs(self, stages: list[StageGraph], plan: Plan) -> list[StageGraph]:
        """Every rank's stage graph, stage-major (NOTE [tensor-parallel stages] in codegen/tp.py)."""
        return tp_stage_graphs(stages, self.stage_shardings(plan))

    def with_groups(self, plan: Plan) -> tuple[Plan, list[int]]:
        """The plan with each stage's devices the group's (its one device at degree 1), and each stage's forward
        time on its slot type."""
        of = {g.name: g for g in self.groups}
        stages = [dataclasses.replace(s, devices=of[s.device].devices if s.device in of else (s.device,))
                  for s in plan.stages]
        g = self.problem.graph
        forward = [sum(g.nodes[v].get(FORWARD_NS, {}).get(s.device_type, 0) for v in s.nodes) for s in plan.stages]
        return dataclasses.replace(plan, stages=stages), forward

    def show_costs(self, gm: fx.GraphModule, cluster: Cluster, groups: dict[str, str], training: bool,
                   plans: list[Plan]) -> None:
        """Each op's cost on the TP slot types the `plans` run on, into its annotation beside its one device's, for
        the partition dump (NOTE [tensor-parallel costs]): a TP stage's lines sum to its compute_us."""
        types = {s.device_type for p in plans for s in p.stages}
        for sharding in self.shardings.values():
            show_tp_costs(gm, tp_op_costs(gm, cluster, sharding, groups, training), types)

    def analysis_record(self, whole: Problem) -> dict | None:
        """ir/analysis.json's `tensor_parallel` record of a plan of mixed degrees (None for one degree): each place's
        degree, what each degree splits, each weight's whole state that moves (`whole`: the degree-1 problem); what
        NOTE [re-plan of mixed degrees] (hetpart/replan_mixed.py) re-plans from."""
        from hetpart.partitioner.replan_holdings import state_to_move_bytes

        if self.places is None:
            return None
        return {"degree_of_place": dict(sorted(self.places.items())),
                "split": {str(t): sorted(s.weights) for t, s in sorted(self.shardings.items())},
                "state_bytes": {w: state_to_move_bytes(whole, w) for w in sorted(whole.weights)}}

    def manifest(self, man: dict, ranks: list[StageGraph], plan: Plan) -> dict:
        return tp_manifest(man, ranks, self.stage_shardings(plan))


def mixed_compile(problem: Problem, lowered: dict[int, "TPCompile"], degree_of_place: dict[str, int],
                  whole: dict[str, int]) -> TPCompile:
    """The compile of a plan whose degree is chosen per machine (`degree_of_place`: TPSlot.place -> degree; NOTE
    [mixed tensor-parallel degrees]) on `problem`, that choice's problem: the used degrees' shardings and groups,
    and the problem with what its gradient sync slices (NOTE [mixed-degree gradient sync]; `whole`: each weight's
    bytes unsplit)."""
    used = {t for t in degree_of_place.values() if t > 1}
    groups = [g for t in sorted(used) for g in lowered[t].groups if degree_of_place.get(f"{g.machine}:{g.type}") == t]
    shardings = {t: lowered[t].sharding for t in sorted(used)}
    layout = TPSyncLayout({tp_type(g.type, len(g.devices)): len(g.devices) for g in groups},
                          {t: {w: (x.dim, x.chunks) for w, x in sorted(sh.weights.items())} for t, sh in shardings.items()},
                          dict(whole))
    return TPCompile(dataclasses.replace(problem, tp_sync=layout), shardings, groups, dict(degree_of_place))


def tp_pipeline_slots(pipelines: tuple[tuple[str, ...], ...], cluster: Cluster,
                      degree: int, places: dict[str, int] | None = None) -> tuple[tuple[str, ...], ...]:
    """`--pipelines` with `--tensor-parallel T` (NOTE [tensor-parallel pipelines]): each pipeline's devices as the
    TP slots they make up (`tp_groups`: T devices of one type in one machine, in cluster order), in the order of
    their first devices; with `places` (`--tensor-parallel MACHINE=T,...`), each machine's at its degree (a device
    at degree 1: itself); a device left out of every whole slot of its pipeline is refused, before the trace."""
    if places is None:
        slots = tp_groups(cluster, degree)
    else:
        slots = [g for t in sorted(set(places.values())) for g in tp_groups(cluster, t)
                 if places.get(f"{g.machine}:{g.type}") == t]
        slots = [dataclasses.replace(g, name=g.devices[0]) if len(g.devices) == 1 else g for g in slots]
    out = []
    for p, devices in enumerate(pipelines):
        mine = sorted((g for g in slots if set(g.devices) <= set(devices)), key=lambda g: devices.index(g.devices[0]))
        left = [d for d in devices if not any(d in g.devices for g in mine)]
        if left:
            raise HetpartError(f"--pipelines: pipeline {p} has {', '.join(left)} outside any whole group of "
                               f"--tensor-parallel {degree} (the TP groups: {', '.join(g.name for g in slots[:6])}"
                               f"{', ...' if len(slots) > 6 else ''}); list each pipeline's devices group by group")
        out.append(tuple(g.name for g in mine))
    return tuple(out)


def tp_degrees(forced: int, max_degree: int, places: dict[str, int] | None = None) -> tuple[int, ...]:
    """The degrees > 1 the sharding pass analyses: those of `places` (degrees per machine), the forced one, or every
    one up to the cap."""
    if places:
        return tuple(sorted({t for t in places.values() if t > 1}))
    return (forced,) if forced > 1 else tuple(t for t in TP_DEGREES if 1 < t <= max_degree)


def tp_slots(problem: Problem, lowered: dict[int, "TPCompile"]) -> dict[int, list[TPSlot]]:
    """Every degree's slots (degree 1: the problem's devices), for NOTE [mixed tensor-parallel degrees]."""
    out = {1: [TPSlot(d.name, (d.name,), d.node, d.type, 1) for d in problem.devices]}
    for t, tp in lowered.items():
        out[t] = [TPSlot(g.name, g.devices, g.machine, g.type, t) for g in tp.groups]
    return out


def mixed_summary(choice: MixedChoice) -> str:
    """What `--max-tensor-parallel` found mixing degrees per machine, in a line."""
    by_degree: dict[int, list[str]] = {}
    for place, t in sorted(choice.degree_of_place.items()):
        by_degree.setdefault(t, []).append(place.split(":")[0])
    found = [r.value_ns for r in choice.mixed if r.value_ns is not None]
    return (f"mixed per machine: relaxation bound {format_us(choice.relaxed.bound_ns)}, best of {len(choice.mixed)} "
            f"assignment(s) {format_us(min(found) if found else None)}"
            + (f" (TP {'; TP '.join(f'{t} on {len(ms)} machine(s)' for t, ms in sorted(by_degree.items()))})"
               if choice.is_mixed else ""))


def lower_degrees(gm: fx.GraphModule, problem: Problem, cluster: Cluster, max_degree: int, groups: dict[str, str],
                  training: bool) -> tuple[dict[int, TPCompile], list[str]]:
    """Each degree up to `max_degree` lowered to its slot problem (NOTE [tensor-parallel costs]), and the degrees
    skipped, each with why (nothing to split, no machine with that many devices of one type)."""
    lowered: dict[int, TPCompile] = {}
    skipped = []
    for t in tp_degrees(1, max_degree):
        sharding = gm.meta[TP_META][t]
        try:
            if not sharding.regions:
                raise HetpartError("nothing to split")
            tp_problem, slots = lower_tensor_parallel(problem, gm, cluster, sharding, groups, training)
        except HetpartError as err:
            skipped.append(f"{t} ({str(err).split(';')[0]})")
            continue
        lowered[t] = TPCompile(tp_problem, {t: sharding}, slots)
    return lowered, skipped


def choose_tp(gm: fx.GraphModule, problem: Problem, cluster: Cluster, max_degree: int, groups: dict[str, str],
              training: bool, echo: Callable[[str], None],
              solve: Callable[..., Plan], per_machine: bool = False) -> tuple[TPCompile | None, Plan]:
    """NOTE [tensor-parallel degree choice], NOTE [mixed tensor-parallel degrees]: each degree up to `max_degree`
    solved, and with `per_machine` degrees mixed per machine too; the best plan kept (None: TP 1), a plan mixing
    degrees too (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py)."""
    lowered, skipped = lower_degrees(gm, problem, cluster, max_degree, groups, training)
    problems = {1: problem} | {t: tp.problem for t, tp in lowered.items()}
    slots = tp_slots(problem, lowered)
    places = {s.place for ss in slots.values() for s in ss}
    mixed = choose_mixed(problems, slots, solve) if per_machine and len(places) > 1 and lowered else None
    uniform = mixed.uniform if mixed is not None else choose_degree(problems, solve)
    written = mixed is not None and mixed.is_mixed  # written and run: NOTE [mixed-degree pipeline]
    if uniform is None and not written:
        raise HetpartError("no tensor-parallel degree fits this cluster's memory")
    echo("tensor parallel: " + "; ".join(f"degree {r.degree}: {format_us(r.value_ns)} (bound {format_us(r.bound_ns)})"
                                         for r in (uniform.results if uniform is not None else ()))
         + (f"; skipped: {', '.join(skipped)}" if skipped else "") + ("" if written else f"; chose degree "
                                                                         f"{uniform.degree}"))
    if mixed is not None:
        echo(f"tensor parallel {mixed_summary(mixed)}")
    if not written:  # the uniform plan; searched with the mixed plans too, its bound is the whole space's
        plan = uniform.plan if mixed is None else least_bound(uniform.plan, mixed.plan.union, f"TP {uniform.degree}")
        return lowered.get(uniform.degree), plan
    gain = (f", predicted {1 - mixed.plan.value_ns / uniform.plan.value_ns:.1%} faster than degree {uniform.degree} "
            "everywhere" if uniform is not None else " (no uniform degree fits)")
    echo(f"chose degrees per machine: {places_line(mixed.degree_of_place)}{gain}")
    return mixed_compile(mixed.problem, lowered, mixed.degree_of_place, problem.weights), mixed.plan


def places_line(degree_of_place: dict[str, int]) -> str:
    """Degrees per machine in a line: `a (cpu) TP 2, b (cpu) TP 1`."""
    return ", ".join(f"{p.split(':', 1)[0]} ({p.split(':', 1)[1]}) TP {t}" for p, t in sorted(degree_of_place.items()))


def tp_per_machine(gm: fx.GraphModule, problem: Problem, cluster: Cluster, degree_of_place: dict[str, int],
                   groups: dict[str, str], training: bool, echo: Callable[[str], None]) -> TPCompile:
    """`--tensor-parallel MACHINE=T,...` (`degree_of_place`: each machine's devices of one type -> its degree,
    hetpart/tp_machines.py): the problem over those slots only, each costed at its degree (NOTE [mixed
    tensor-parallel degrees]; two degrees at least, `tp_machines.degree_of_place` says)."""
    used = sorted({t for t in degree_of_place.values() if t > 1})
    lowered = {t: tp_lowering(gm, problem, cluster, t, groups, training, echo) for t in used}
    slots = tp_slots(problem, lowered)
    chosen = [s for t, ss in slots.items() for s in ss if degree_of_place[s.place] == t]
    echo(f"tensor parallel per machine: {places_line(degree_of_place)} ({len(chosen)} slot(s))")
    return mixed_compile(mixed_problem({1: problem} | {t: lowered[t].problem for t in used}, chosen), lowered,
                         degree_of_place, problem.weights)


def tp_lowering(gm: fx.GraphModule, problem: Problem, cluster: Cluster, degree: int, groups: dict[str, str],
                training: bool, echo: Callable[[str], None]) -> TPCompile:
    """The sharding the pass found at `degree` and the problem over TP groups; what it splits, echoed."""
    sharding = gm.meta[TP_META][degree]
    if not sharding.regions:
        raise HetpartError(f"--tensor-parallel {degree}: the sharding found no linear pair to split in this model "
                           "(NOTE [tensor-parallel sharding]); leave --tensor-parallel out")
    lowered, slots = lower_tensor_parallel(problem, gm, cluster, sharding, groups, training)
    regions = describe(sharding)
    echo(f"tensor parallel {degree}: {len(slots)} group(s) of {degree} device(s) "
         f"({', '.join(s.name for s in slots[:4])}{', ...' if len(slots) > 4 else ''}); {len(regions)} region(s) "
         f"split, {len(sharding.weights)} weight(s) sharded, the rest replicated")
    return TPCompile(lowered, {degree: sharding}, slots)
