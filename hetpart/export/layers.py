"""A plan in whole layers: what frameworks that split a model by module can take.

torchtitan, Megatron-LM, DeepSpeed and accelerate place whole modules on pipeline
stages; hetpart's plans cut between ops. This module (torch-free: it sees the
partitioner's Problem and Plan) rounds an op-level plan to whole layers and costs
the rounding, and restricts a problem to layer-aligned cuts (`partition --align layers`).
A layer is a node's MODULE attribute: a block of the model's repeated stack or a module
beside it (`blocks.3`, `model.transformer.h.0`, `wte`, `model.lm_head`), set by
`hetpart.export.modules.annotate_modules` (NOTE [export modules]); the partitioner ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from hetpart.errors import HetpartError
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.constraints import closure
from hetpart.partitioner.problem import COLOCATE, PIN, PIN_LAST, TIME_NS, WEIGHTS, Plan, Problem

MODULE = "module"  # optional str: the node's module, as frameworks place them (NOTE [export modules])
LAYER_GROUP = "layer:"  # COLOCATE prefix of the groups `align_to_layers` makes


def layer_order(problem: Problem, order: list[str] | None = None) -> list[str]:
    """The problem's layers in the order their first node runs (`order`, default `Problem.node_order`)."""
    seen: dict[str, None] = {}
    for v in problem.node_order() if order is None else order:
        layer = problem.graph.nodes[v].get(MODULE)
        if layer is not None:
            seen.setdefault(layer, None)
    return list(seen)


def _members(problem: Problem) -> dict[str, set[str]]:
    members: dict[str, set[str]] = {}
    for v, attrs in problem.graph.nodes(data=True):
        if attrs.get(MODULE) is not None:
            members.setdefault(attrs[MODULE], set()).add(v)
    return members


def _under(weight: str, modules: set[str]) -> bool:
    """Whether `weight` (`blocks.0.attn.qkv.weight`) belongs to one of `modules` (`blocks.0`)."""
    parts = weight.split(".")
    return any(".".join(parts[:i]) in modules for i in range(1, len(parts)))


def _interleaved(problem: Problem, name: str, members: set[str], position: dict[str, int]) -> bool:
    """Whether module `name` runs at several places with other modules between (NOTE [aligned modules]);
    `position`: each node's index in a topological order, as `closure` takes it."""
    g = problem.graph
    return any(g.nodes[v].get(MODULE) not in (None, name) for v in closure(problem, sorted(members), position))


def _positions(problem: Problem) -> dict[str, int]:
    return {v: i for i, v in enumerate(problem.node_order())}


def align_to_layers(problem: Problem) -> list[str]:
    """Make every module one co-location group, so that any plan cuts only between modules; returns
    the modules left free (NOTE [aligned modules]). A problem without MODULE attributes (a model
    without submodules) is an error, since nothing could be aligned. A node already in a
    co-location group keeps it (tied weights): its module then joins that group's stage anyway.
    """
    g = problem.graph
    names = layer_order(problem)
    if not names:
        raise HetpartError("--align layers: the model has no submodules to align to (every op is at its top level); "
                           "plan with the default --align ops")
    members, position = _members(problem), _positions(problem)
    free = []
    for name in names:
        if _interleaved(problem, name, members[name], position):
            free.append(name)  # called at two places with other modules between: NOTE [aligned modules]
            continue
        for v in members[name]:
            if g.nodes[v].get(COLOCATE) is None:
                g.nodes[v][COLOCATE] = LAYER_GROUP + name
    return free


# NOTE [aligned modules]
# Nodes sharing a stage drag along every node on a path between them (NOTE [co-location closure]).
# A module called at two places with other modules in between (T5's `encoder.dropout`, after the
# embedding and after the last block) would pull all of those into one stage, so it is left free:
# its calls go where the plan puts them, and `partition` says which modules these are. Rounding
# treats such a module's calls as glue too (it is listed at the stage of its first call).


@dataclass(frozen=True)
class LayerPlan:
    """An op-level plan rounded to whole layers, and what the rounding costs (plan.json `layers`)."""

    names: list[str]  # the model's layers, in execution order
    stage_of_layer: list[int]  # index into `devices`: the rounded plan's stage of each layer
    devices: list[str]  # the device of each rounded stage (a subset of the plan's, in order)
    split_by_plan: list[str]  # layers the op-level plan cuts inside (empty: the plan is layer-aligned)
    bottleneck_us: float  # the op-level plan's
    rounded_bottleneck_us: float  # the rounded plan's, in the same cost model
    rounded_stage_us: list[float]  # each rounded stage's time
    over_memory_stages: list[int]  # rounded stages over their device's capacity
    modules_outside_layers: list[str] = field(default_factory=list)  # of weights read at the top level (in `names`)
    shared: list[str] = field(default_factory=list)  # run at several places, placed call by call (NOTE [aligned modules])

    @property
    def aligned(self) -> bool:
        return not self.split_by_plan

    def layers_of_stage(self) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in self.devices]
        for name, k in zip(self.names, self.stage_of_layer):
            out[k].append(name)
        return out

    def to_json(self) -> dict:
        return {"names": self.names, "stage_of_layer": self.stage_of_layer, "devices": self.devices,
                "aligned": self.aligned, "split_by_plan": self.split_by_plan, "bottleneck_us": self.bottleneck_us,
                "rounded_bottleneck_us": self.rounded_bottleneck_us, "rounded_stage_us": self.rounded_stage_us,
                "over_memory_stages": self.over_memory_stages, "modules_outside_layers": self.modules_outside_layers,
                "shared": self.shared}

    @classmethod
    def from_json(cls, data: dict) -> LayerPlan:
        """plan.json's `layers`; a ValueError saying what does not hold where it was edited (review22: a layer on
        stage 9 of 4 was an IndexError, DeepSpeed's `parts` came out wrong, fewer names than stages cut the map)."""
        try:
            lp = cls._from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{type(err).__name__}: {err}"[:200]) from None
        stages = len(lp.devices)
        if len(lp.stage_of_layer) != len(lp.names) or not all(isinstance(n, str) for n in lp.names + lp.devices):
            raise ValueError(f"{len(lp.names)} names and {len(lp.stage_of_layer)} stage_of_layer entries; "
                             "each layer needs its name and its stage")
        if any(not 0 <= k < stages for k in lp.stage_of_layer + lp.over_memory_stages):
            raise ValueError(f"a stage outside 0..{stages - 1}, the rounded plan's {stages} stage(s) (devices)")
        if len(lp.rounded_stage_us) != stages or set(lp.split_by_plan) - set(lp.names):
            raise ValueError(f"{len(lp.rounded_stage_us)} rounded_stage_us for {stages} stage(s), or a split_by_plan "
                             "layer that is not among names")
        return lp

    @classmethod
    def _from_json(cls, data: dict) -> LayerPlan:
        return cls(names=list(data["names"]), stage_of_layer=[int(k) for k in data["stage_of_layer"]],
                   devices=list(data["devices"]), split_by_plan=list(data["split_by_plan"]),
                   bottleneck_us=float(data["bottleneck_us"]), rounded_bottleneck_us=float(data["rounded_bottleneck_us"]),
                   rounded_stage_us=[float(t) for t in data["rounded_stage_us"]],
                   over_memory_stages=[int(k) for k in data["over_memory_stages"]],
                   modules_outside_layers=list(data.get("modules_outside_layers", [])),
                   shared=list(data.get("shared", [])))


# NOTE [rounding to layers]
# A layer goes to the stage that holds most of its compute (on that stage's device
# type; ties to the earlier stage), so the layers keep the plan's devices and roughly its
# balance, and a layer-aligned plan is reproduced exactly. Ops outside every layer (the
# inputs, top-level adds and reshapes) go as early as their inputs allow, the outputs
# to the last stage; one pass in topological order then lifts any node below one of
# its inputs (so edges never go backwards; independent branches, T5's encoder and
# decoder embedding, keep their own stages).
# Stages left without a layer are dropped (their device stays idle). The rounded plan
# is costed by `evaluate`, the cost model's one definition, so its bottleneck compares
# with the op-level plan's; the best layer-aligned plan (`partition --align layers`) is
# at most the rounded one whenever the rounded plan fits in memory.
def round_to_layers(problem: Problem, plan: Plan) -> LayerPlan | None:
    """The plan rounded to whole layers (NOTE [rounding to layers]); None without MODULE attributes."""
    g = problem.graph
    node_order = problem.node_order()
    names = layer_order(problem, node_order)
    if not names:
        return None
    types = [problem.device(d).type for d in plan.device_of_stage]
    share: dict[str, dict[int, int]] = {name: {} for name in names}
    for v, attrs in g.nodes(data=True):
        if attrs.get(MODULE) is not None:
            k = plan.stage_of[v]
            share[attrs[MODULE]][k] = share[attrs[MODULE]].get(k, 0) + attrs[TIME_NS][types[k]]
    split = [name for name in names if len(share[name]) > 1]
    members, position = (_members(problem), _positions(problem)) if split else ({}, {})
    free = {name for name in split if _interleaved(problem, name, members[name], position)}
    if len(free) == len(names):
        free = set()
    names = [name for name in names if name not in free]
    stage_of_layer: list[int] = []
    for name in names:
        by_stage = share[name]
        stage_of_layer.append(min(by_stage, key=lambda k: (-by_stage[k], k)))
    target = dict(zip(names, stage_of_layer))
    split_by_plan = [name for name in names if len(share[name]) > 1]
    last = max(stage_of_layer)
    stage_of: dict[str, int] = {}
    for v in nx.topological_sort(g):
        attrs = g.nodes[v]
        below = max((stage_of[u] for u in g.predecessors(v)), default=0)
        if attrs.get(PIN) == PIN_LAST:
            stage_of[v] = max(last, below)
        elif attrs.get(MODULE) in target:
            stage_of[v] = max(target[attrs[MODULE]], below)
        else:
            stage_of[v] = below
    used = sorted({stage_of[v] for v, a in g.nodes(data=True) if a.get(MODULE) in target})
    renumber = {k: i for i, k in enumerate(used)}
    # Placeholders of a dropped first stage move to the first kept one; nothing else can be outside `used`.
    stage_of = {v: renumber.get(k, 0 if k < used[0] else len(used) - 1) for v, k in stage_of.items()}
    devices = [plan.device_of_stage[k] for k in used]
    stages = evaluate(problem, stage_of, devices)
    # The layers again, now with the modules of weights read outside every layer (GPT's position
    # embedding, looked up at the top level): a framework must place those modules too.
    order: dict[str, int] = {}
    extra: list[str] = []
    known = set(names) | free
    for v in node_order:
        attrs = g.nodes[v]
        if attrs.get(MODULE) in target:
            order[attrs[MODULE]] = max(order.get(attrs[MODULE], 0), stage_of[v])
        elif attrs.get(MODULE) is not None:
            order.setdefault(attrs[MODULE], stage_of[v])  # a module left free: where it first runs
        for w in attrs.get(WEIGHTS, ()):
            if not _under(w, known):
                module = w.rpartition(".")[0] or w
                if module not in order:
                    order[module] = stage_of[v]
                    extra.append(module)
    return LayerPlan(
        names=list(order), stage_of_layer=list(order.values()), devices=devices,
        split_by_plan=split_by_plan, bottleneck_us=round(plan.bottleneck_ns / 1000, 3),
        rounded_bottleneck_us=round(bottleneck_ns(stages) / 1000, 3),
        rounded_stage_us=[round(s.time_ns / 1000, 3) for s in stages],
        over_memory_stages=[s.index for s in stages if s.memory_bytes > s.capacity_bytes],
        modules_outside_layers=extra, shared=sorted(free),
    )
