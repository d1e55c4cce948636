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
from hetpart.partitioner.problem import FORWARD_NS, Plan, Problem
from hetpart.partitioner.tp_choice import MixedChoice, TPSlot, choose_degree, choose_mixed
from hetpart.passes.tensor_parallel import TP_META, ShardingPlan, describe
from hetpart.passes.tp_lower import TPGroup, lower_tensor_parallel

TP_DEGREES = (1, 2, 4, 8)


def check_tp_options(degree: int, data_parallel: bool, strategy: str, max_degree: int = 1) -> None:
    """`--tensor-parallel T` and `--max-tensor-parallel N`: each one of TP_DEGREES, not both, and not with
    data-parallel pipelines or a baseline's strategy."""
    for flag, value in (("--tensor-parallel", degree), ("--max-tensor-parallel", max_degree)):
        if value not in TP_DEGREES:
            raise HetpartError(f"{flag} {value}: expected one of {', '.join(map(str, TP_DEGREES))}")
    if degree > 1 and max_degree > 1:
        raise HetpartError(f"--tensor-parallel {degree} forces the degree, --max-tensor-parallel {max_degree} lets "
                           "the solve choose it: pass one of them")
    degree = max(degree, max_degree)
    if degree > 1 and data_parallel:
        raise HetpartError(f"--tensor-parallel {degree} with --pipelines or --parallel data is not supported yet; "
                           "leave one of them out")
    if degree > 1 and strategy != "optimal":
        raise HetpartError(f"--tensor-parallel {degree} with --strategy {strategy} is not supported: the baselines "
                           "plan single-device stages; leave one of them out")


@dataclass
class TPCompile:
    """What a TP compile carries from lowering to the manifest."""

    problem: Problem  # every slot a TP group (NOTE [tensor-parallel costs] in passes/tp_lower.py)
    sharding: ShardingPlan
    groups: list[TPGroup]

    def rank_graphs(self, stages: list[StageGraph]) -> list[StageGraph]:
        """Every rank's stage graph, stage-major (NOTE [tensor-parallel stages] in codegen/tp.py)."""
        return tp_stage_graphs(stages, self.sharding)

    def with_groups(self, plan: Plan) -> tuple[Plan, list[int]]:
        """The plan with each stage's devices the group's, and each stage's forward time on its slot type."""
        of = {g.name: g for g in self.groups}
        stages = [dataclasses.replace(s, devices=of[s.device].devices) for s in plan.stages]
        g = self.problem.graph
        forward = [sum(g.nodes[v].get(FORWARD_NS, {}).get(s.device_type, 0) for v in s.nodes) for s in plan.stages]
        return dataclasses.replace(plan, stages=stages), forward

    def manifest(self, man: dict, ranks: list[StageGraph]) -> dict:
        return tp_manifest(man, ranks, self.sharding)


def tp_on_meta(degree: int) -> HetpartError:
    """The refusal of a TP plan of a model traced on meta (NOTE [weight manifests] fills whole tensors only)."""
    return HetpartError(f"a tensor-parallel plan (degree {degree}) of a model traced on meta has no weights to "
                        "split, and shard-weights does not split checkpoints yet: pass --no-meta if the model fits "
                        "this machine, or plan without TP (benchmarks/tensor_parallel.py compares the degrees "
                        "without writing artifacts)")


def tp_degrees(forced: int, max_degree: int) -> tuple[int, ...]:
    """The degrees > 1 the sharding pass analyses: the forced one, or every one up to the cap."""
    return (forced,) if forced > 1 else tuple(t for t in TP_DEGREES if 1 < t <= max_degree)


def tp_slots(problem: Problem, lowered: dict[int, "TPCompile"]) -> dict[int, list[TPSlot]]:
    """Every degree's slots (degree 1: the problem's devices), for NOTE [mixed tensor-parallel degrees]."""
    out = {1: [TPSlot(d.name, (d.name,), d.node, d.type, 1) for d in problem.devices]}
    for t, tp in lowered.items():
        out[t] = [TPSlot(g.name, g.devices, g.machine, g.type, t) for g in tp.groups]
    return out


def _us(ns: int | None) -> str:
    return "no plan fits" if ns is None else f"{ns / 1000:,.1f} us"


def mixed_summary(choice: MixedChoice) -> str:
    """What `--max-tensor-parallel` found mixing degrees per machine, in a line."""
    by_degree: dict[int, list[str]] = {}
    for place, t in sorted(choice.degree_of_place.items()):
        by_degree.setdefault(t, []).append(place.split(":")[0])
    found = [r.value_ns for r in choice.mixed if r.value_ns is not None]
    return (f"mixed per machine: relaxation bound {_us(choice.relaxed.bound_ns)}, best of {len(choice.mixed)} "
            f"assignment(s) {_us(min(found) if found else None)}"
            + (f" (TP {'; TP '.join(f'{t} on {len(ms)} machine(s)' for t, ms in sorted(by_degree.items()))})"
               if choice.is_mixed else ""))


def choose_tp(gm: fx.GraphModule, problem: Problem, cluster: Cluster, max_degree: int, groups: dict[str, str],
              training: bool, echo: Callable[[str], None],
              solve: Callable[..., Plan], per_machine: bool = False) -> tuple[TPCompile | None, Plan]:
    """NOTE [tensor-parallel degree choice], NOTE [mixed tensor-parallel degrees]: each degree up to `max_degree`
    solved, and with `per_machine` degrees mixed per machine reported; the best plan that can be written kept
    (None: TP 1)."""
    problems: dict[int, Problem] = {1: problem}
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
        lowered[t] = TPCompile(tp_problem, sharding, slots)
        problems[t] = tp_problem
    slots = tp_slots(problem, lowered)
    places = {s.place for ss in slots.values() for s in ss}
    mixed = choose_mixed(problems, slots, solve) if per_machine and len(places) > 1 and lowered else None
    choice = mixed.uniform if mixed is not None else choose_degree(problems, solve)
    if choice is None:  # only a mixed plan fits (NOTE [mixed tensor-parallel degrees]), which is not written yet
        raise HetpartError(f"no uniform tensor-parallel degree fits this cluster's memory, only plans mixing "
                           f"degrees per machine ({mixed_summary(mixed)}), which hetpart does not write yet: add "
                           "devices or memory until a uniform degree fits")
    echo("tensor parallel: " + "; ".join(f"degree {r.degree}: {_us(r.value_ns)} (bound {_us(r.bound_ns)})"
                                         for r in choice.results)
         + (f"; skipped: {', '.join(skipped)}" if skipped else "") + f"; chose degree {choice.degree}")
    if mixed is not None:
        echo(f"tensor parallel {mixed_summary(mixed)}")
    if mixed is not None and mixed.is_mixed:
        gain = 1 - mixed.plan.value_ns / choice.plan.value_ns
        echo(f"note: the plan mixing degrees is predicted {gain:.1%} faster than degree {choice.degree}'s, but "
             "hetpart does not write (or run) mixed-degree plans yet: writing degree "
             f"{choice.degree}'s (NOTE [mixed tensor-parallel degrees])")
    return lowered.get(choice.degree), choice.plan


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
    return TPCompile(lowered, sharding, slots)
