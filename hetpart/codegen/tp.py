"""Tensor-parallel ranks of a stage: each rank's stage graph with its shards and the collectives written out.

NOTE [tensor-parallel stages]
A stage of tensor-parallel degree t runs on t ranks, one per device of its group. Each rank gets
its own stage.py and weights.safetensors: the weights the sharding (NOTE [tensor-parallel
sharding] in passes/tensor_parallel.py) splits hold only this rank's part (no rank holds a split
weight's full tensor), the others whole. Its forward is the stage's with
- each size argument the sharding divides (a head count in a view) divided by t;
- `tp_copy(x)` (Megatron's f) on each replicated input of column linears, once per input;
- each row linear's bias taken out, its output summed by `tp_all_reduce` (Megatron's g) over
  the stage's TP group, and the bias added once after it;
- a split model output (a vocab-parallel LM head) gathered whole by `tp_all_gather`.
Both are defined in stage.py itself (`TP_SOURCE`), as autograd functions over
torch.distributed.all_reduce on `TP_GROUP`, which `hetpart run` sets to the stage's gloo/nccl
group: explicit collectives in readable code rather than DTensor placements, so the all-reduces
that run are exactly the ones the cost model charges (one per row linear forward, one per
column-linear input backward: `tp_collectives`).
Stage boundaries are replicated: every TP rank of stage k receives the whole input from the
rank of the same TP index of stage k-1 and sends its whole output (equal on all TP ranks after
the reduce) to the same TP index of stage k+1, over one pipeline group per TP index (a
"lane", NOTE [the mesh] in codegen/artifacts.py), when every stage of the plan has the same
degree: each lane's boundaries carry what one rank's would, the cost model charges each
boundary once, the lanes' transfers running side by side over the link. Stages of different
degrees talk through their leaders instead (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py);
a stage of degree 1 there is one rank running the stage whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from hetpart.codegen.split import StageGraph
from hetpart.errors import HetpartError
from hetpart.passes.tensor_parallel import ShardingPlan
from hetpart.shards import shard_tensor
from hetpart.trust import MIXED_FORMAT_VERSION

aten = torch.ops.aten

# The TP block of a tensor-parallel rank's stage.py: FX names the functions `tp_copy` and
# `tp_all_reduce` (their module is "tp"), and the same source defines them here for codegen.
TP_SOURCE = '''
# Tensor parallelism (NOTE [tensor-parallel stages]): the split weights in WEIGHTS are this rank's parts
# (manifest.json's mesh.tensor_parallel says which dim); `hetpart run` sets TP_GROUP to the stage's process
# group. HETPART_TEST_BREAK_TP=copy drops f's backward all-reduce (tests only).
TP_GROUP = None


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward; backward sums the input's gradient over the TP group."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        if __import__("os").environ.get("HETPART_TEST_BREAK_TP") != "copy":
            torch.distributed.all_reduce(grad, group=TP_GROUP)
        return grad


class _AllReduceTP(torch.autograd.Function):
    """Megatron's g: forward sums the partial outputs over the TP group; backward is the identity."""

    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        torch.distributed.all_reduce(out, group=TP_GROUP)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class _AllGatherTP(torch.autograd.Function):
    """A split model output made whole: forward gathers every rank's part along `dim`; backward keeps this
    rank's part of the (equal on every rank) gradient."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size(TP_GROUP))]
        torch.distributed.all_gather(parts, x.contiguous(), group=TP_GROUP)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        size = torch.distributed.get_world_size(TP_GROUP)
        return grad.chunk(size, dim=ctx.dim)[torch.distributed.get_rank(TP_GROUP)].contiguous(), None


def tp_copy(x):
    return _CopyToTP.apply(x)


def tp_all_gather(x, dim):
    return _AllGatherTP.apply(x, dim)


def tp_all_reduce(x):
    return _AllReduceTP.apply(x)
'''

_namespace: dict = {"torch": torch}
exec(compile(TP_SOURCE, "<hetpart tensor-parallel block>", "exec"), _namespace)  # the same code as stage.py's
copy, all_reduce, all_gather = _namespace["tp_copy"], _namespace["tp_all_reduce"], _namespace["tp_all_gather"]
for _fn, _name in ((copy, "copy"), (all_reduce, "all_reduce"), (all_gather, "all_gather")):
    _fn.__module__, _fn.__name__, _fn.__qualname__ = "tp", _name, _name
TP_FUNCTIONS = {"tp_copy": copy, "tp_all_reduce": all_reduce, "tp_all_gather": all_gather}  # FX's name -> function


def shard_stage(stage: StageGraph, plan: ShardingPlan, rank: int) -> StageGraph:
    """Stage `stage` as TP rank `rank` of `plan.degree` runs it (NOTE [tensor-parallel stages])."""
    t = plan.degree
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(stage.gm.graph, env))
    nodes = {n.name: n for n in graph.nodes}
    root = torch.nn.Module()
    for attr, fqn in stage.weights.items():
        value = getattr(stage.gm, attr)
        if fqn in plan.weights:
            value = shard_tensor(value.detach(), plan.weights[fqn], rank, t)
            if isinstance(getattr(stage.gm, attr), torch.nn.Parameter):
                value = torch.nn.Parameter(value)
        if isinstance(value, torch.nn.Parameter):
            root.register_parameter(attr, value)
        else:
            root.register_buffer(attr, value)
    # Size arguments the sharding divides (a head count in a view).
    for name, edits in plan.arg_edits.items():
        if name not in nodes:
            continue
        node = nodes[name]
        args = list(node.args)
        for index, item in edits:
            if item < 0:
                args[index] = args[index] // t
            else:
                sizes = list(args[index])
                sizes[item] = sizes[item] // t
                args[index] = sizes
        node.args = tuple(args)
    # Megatron's f on each replicated input of column linears, before the first of them in the graph (the plan
    # lists them by name: linear_100 before linear_98).
    position = {n: i for i, n in enumerate(graph.nodes)}
    for x_name, columns in plan.copy_before.items():
        users = [nodes[c] for c in columns if c in nodes]
        if not users:
            continue
        x = nodes[x_name]
        with graph.inserting_before(min(users, key=position.__getitem__)):
            copied = graph.call_function(copy, (x,))
        copied.meta = dict(x.meta)
        for c in users:
            c.args = (copied, *c.args[1:])
    # Megatron's g after each row linear, then its bias, once.
    for name in plan.reduce_after:
        if name not in nodes:
            continue
        node = nodes[name]
        bias = node.args[2] if len(node.args) > 2 else None
        node.args = node.args[:2]
        with graph.inserting_after(node):
            reduced = graph.call_function(all_reduce, (node,))
        reduced.meta = dict(node.meta)
        final = reduced
        if bias is not None:
            with graph.inserting_after(reduced):
                final = graph.call_function(aten.add.Tensor, (reduced, bias))
            final.meta = dict(node.meta)
        node.replace_all_uses_with(final, delete_user_cb=lambda user: user is not reduced)
    # A split model output (a vocab-parallel LM head) gathered whole before it leaves.
    output = next(n for n in graph.nodes if n.op == "output")
    for name, split_dim in plan.gather_before_output.items():
        if name not in nodes:
            continue
        with graph.inserting_before(output):
            gathered = graph.call_function(all_gather, (nodes[name], split_dim))
        gathered.meta = dict(nodes[name].meta)
        output.replace_input_with(nodes[name], gathered)
    graph.lint()
    gm = fx.GraphModule(root, graph, class_name=f"Stage{stage.index}")
    shards = {fqn: {**shard, "rank": rank, "degree": t} for fqn, shard in stage_weight_shards(stage, plan).items()}
    return StageGraph(stage.index, gm, list(stage.inputs), list(stage.outputs), dict(stage.weights),
                      list(stage.nodes), shards=shards)


def tp_stage_graphs(stages: list[StageGraph], shardings: Sequence[ShardingPlan | None]) -> list[StageGraph]:
    """Every rank's stage graph, stage-major: stage k's TP ranks in order, each its shard of `shardings[k]` (None: a
    stage of degree 1, one rank running the stage whole; NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py)."""
    return [shard_stage(s, p, j) if p is not None else s
            for s, p in zip(stages, shardings) for j in range(p.degree if p is not None else 1)]


def stage_weight_shards(stage: StageGraph, plan: ShardingPlan | None) -> dict[str, dict]:
    """The manifest's record of a stage's split weights: FQN -> {dim, chunks} ({} at degree 1)."""
    if plan is None:
        return {}
    return {fqn: plan.weights[fqn].to_json() for fqn in sorted(set(stage.weights.values())) if fqn in plan.weights}


def _stage_ranks(shardings: Sequence[ShardingPlan | None]) -> list[list[int]]:
    """Stage k's ranks, stage-major (each stage's TP rank 0 first)."""
    out, first = [], 0
    for p in shardings:
        t = p.degree if p is not None else 1
        out.append(list(range(first, first + t)))
        first += t
    return out


def _holders(ranks: list[StageGraph], of: list[int]) -> list[tuple[list[int], list[str]]]:
    """The weights held by several of the ranks `of`, grouped by their holders: (holders, names) in sorted order."""
    holders: dict[str, list[int]] = {}
    for r in of:
        for name in sorted(set(ranks[r].weights.values())):
            holders.setdefault(name, []).append(r)
    shared: dict[tuple[int, ...], list[str]] = {}
    for name, rs in sorted(holders.items()):
        if len(rs) > 1:
            shared.setdefault(tuple(rs), []).append(name)
    return [(list(rs), names) for rs, names in sorted(shared.items())]


def tp_mesh(ranks: list[StageGraph], shardings: Sequence[ShardingPlan | None]) -> dict:
    """The mesh of a plan whose stage k runs at `shardings[k]`'s degree (NOTE [the mesh], NOTE [tensor-parallel
    stages]). Every stage of one degree t > 1: one pipeline group per TP index (a lane), one TP group per stage, and
    the weights groups of each lane (a tied weight's copies on that lane's ranks: TP ranks hold the same whole
    gradients). Degrees that differ: NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py (`_leaders_mesh`)."""
    stages = _stage_ranks(shardings)
    degrees = [len(s) for s in stages]
    if len(set(degrees)) > 1:
        return _leaders_mesh(ranks, shardings, stages)
    t = degrees[0]
    groups: list[dict] = [{"name": f"pipeline-tp{j}", "kind": "pipeline", "ranks": [s[j] for s in stages]}
                          for j in range(t)]
    groups += [{"name": f"tp-{k}", "kind": "tp", "ranks": s} for k, s in enumerate(stages)]
    for j in range(t):
        groups += [{"name": f"weights-tp{j}-{i}", "kind": "weights", "ranks": rs, "weights": names}
                   for i, (rs, names) in enumerate(_holders(ranks, [s[j] for s in stages]))]
    return {"stages": stages, "groups": groups,
            "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(len(ranks))],
            "tensor_parallel": [{"stage": k, "group": f"tp-{k}", "ranks": s, "degree": t,
                                 "weights": stage_weight_shards(ranks[s[0]], shardings[k])}
                                for k, s in enumerate(stages)]}


def _leaders_mesh(ranks: list[StageGraph], shardings: Sequence[ShardingPlan | None], stages: list[list[int]]) -> dict:
    """NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py: one pipeline group of the stages' leaders (TP rank 0),
    a TP group per stage of degree > 1, and the weights groups of NOTE [mixed-degree gradient sync] (a weight several
    stages hold: each slice summed over the ranks holding it, a replicated copy divided by its stage's degree)."""
    split = [stage_weight_shards(ranks[s[0]], p) for s, p in zip(stages, shardings)]
    groups: list[dict] = [{"name": "pipeline", "kind": "pipeline", "ranks": [s[0] for s in stages]}]
    groups += [{"name": f"tp-{k}", "kind": "tp", "ranks": s} for k, s in enumerate(stages) if len(s) > 1]
    groups += slice_weights_groups(ranks, [(s, w, f"stage {k}") for k, (s, w) in enumerate(zip(stages, split))])
    return {"stages": stages, "groups": groups, "tp_boundaries": "leaders",
            "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(len(ranks))],
            "tensor_parallel": [{"stage": k, "group": f"tp-{k}" if len(s) > 1 else None, "ranks": s,
                                 "degree": len(s), "weights": split[k]} for k, s in enumerate(stages)]}


def slice_weights_groups(ranks: list[StageGraph],
                         stages: Sequence[tuple[list[int], dict[str, dict], str]]) -> list[dict]:
    """NOTE [mixed-degree gradient sync] in partitioner/tp_sync.py: the weights groups of stages of several degrees
    (each its ranks, its split weights' {dim, chunks} and its name for errors): one per set of ranks summing the same
    slices, `slices` giving each split weight's slice (index of `of` along dim, in each of its chunks). A weight split
    along different dims, or whose chunk does not divide in `of` slices, is refused."""
    from hetpart.partitioner.tp_sync import held_by, slice_buckets, weight_slices

    held = held_by((rs, ranks[rs[0]].weights.values(), split, f"{where} (TP {len(rs)})") for rs, split, where in stages)
    size: dict[str, tuple[int, int]] = {}  # a split weight -> (a stage's degree, its shard's size along the dim)
    for rs, split, _ in stages:
        attr_of = {fqn: attr for attr, fqn in ranks[rs[0]].weights.items()}
        size |= {w: (len(rs), getattr(ranks[rs[0]].gm, attr_of[w]).shape[spec["dim"]])
                 for w, spec in split.items() if w in attr_of}
    slices = weight_slices(held)
    for x in slices:
        if x.split is not None and x.index == 0:
            t, n = size[x.weight]
            if (n * t) % (x.split[1] * x.of):
                raise HetpartError(f"{x.weight!r}: its {x.split[1]} chunk(s) of {n * t // x.split[1]} along dim "
                                   f"{x.split[0]} do not split in {x.of} equal slices, which its gradient sync "
                                   "across tensor-parallel degrees needs: give its stages one degree")
    return [{"name": f"weights-{i}", "kind": "weights", "ranks": list(rs), "weights": [x.weight for x in xs],
             "slices": {x.weight: {"index": x.index, "of": x.of, "dim": x.split[0], "chunks": x.split[1]}
                        for x in xs if x.split is not None}}
            for i, (rs, xs) in enumerate(sorted(slice_buckets(slices).items()))]


# NOTE [tensor-parallel pipelines mesh]
# Data-parallel pipelines whose every stage is a TP group of one degree t (`--pipelines` or
# `--parallel data` with `--tensor-parallel t`; NOTE [tensor-parallel pipelines] in
# partitioner/tp_pipelines.py plans them; several degrees: NOTE [mixed-degree pipelines mesh]).
# Ranks are numbered pipeline-major, stage-major inside a pipeline, TP index inside a stage. The
# mesh joins NOTE [the mesh]'s several pipelines and NOTE [tensor-parallel stages]'s lanes:
#   "pipelines": [{"index": p, "lanes": ["pipeline-p-tp0", ...], "stages": [[0, 1], [2, 3]],
#                  "microbatches": m_p, "microbatch_offset": ...}, ...]    one lane group per TP index
#   "tensor_parallel": [{"pipeline": p, "stage": k, "group": "tp-p-k", "ranks", "degree", "weights"}, ...]
#                                                                  every stage of every pipeline, in rank order
#   "groups": the lanes, the TP groups, then "weights-tp{j}-{i}": the ranks of TP index j holding weights,
#             across pipelines and within one (a tied embedding and LM head)
# and each rank its "pipeline", "microbatches", "batch_rows" and "tp" place. The gradient of a weight
# is summed per (weight, TP index): shard j of a split weight lives on the ranks of TP index j only
# (one sharding per degree, so every pipeline splits it alike), and summing it with shard i != j would
# add different parameters; a replicated weight's copies are equal across a TP group, so each lane
# sums its own. That is Megatron-LM's data-parallel group (the ranks of one TP index), one ring per
# TP index as NOTE [tensor-parallel gradient sync] costs it. `check_tp_mesh` (runtime/tp.py) checks
# the whole record, each weights group against the ranks' own weight lists and TP places.
def tp_pipelines_mesh(ranks: list[StageGraph], shardings: list[list[ShardingPlan | None]], shares: list[int]) -> dict:
    """The mesh of data-parallel pipelines whose every stage is a TP group of one degree (NOTE [tensor-parallel
    pipelines mesh]): pipeline p's stages `shardings[p]` with `shares[p]` microbatches, ranks pipeline-major; of
    stages at several degrees (None: 1), NOTE [mixed-degree pipelines mesh]."""
    if len({p.degree if p is not None else 1 for plans in shardings for p in plans}) > 1:
        return _mixed_pipelines_mesh(ranks, shardings, shares)
    t = shardings[0][0].degree
    pipelines, entries = _pipelines_stages(ranks, shardings, shares, lanes=True)
    groups: list[dict] = [{"name": name, "kind": "pipeline", "ranks": [s[j] for s in q["stages"]]}
                          for q in pipelines for j, name in enumerate(q["lanes"])]
    groups += [{"name": e["group"], "kind": "tp", "ranks": e["ranks"]} for e in entries]
    for j in range(t):  # shard j of a weight, or lane j's copy of a replicated one, across every pipeline
        groups += [{"name": f"weights-tp{j}-{i}", "kind": "weights", "ranks": rs, "weights": names}
                   for i, (rs, names) in enumerate(_holders(ranks, [e["ranks"][j] for e in entries]))]
    return {"pipelines": pipelines, "groups": groups, "tensor_parallel": entries,
            "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(len(ranks))]}


def _pipelines_stages(ranks: list[StageGraph], shardings: list[list[ShardingPlan | None]], shares: list[int], *,
                      lanes: bool) -> tuple[list[dict], list[dict]]:
    """The mesh's `pipelines` (each with its lanes, one per TP index, or with `lanes` False its one group) and
    `tensor_parallel` entries (a stage of degree 1: no TP group): ranks pipeline-major, stage-major inside a pipeline,
    TP index inside a stage (NOTE [tensor-parallel pipelines mesh], NOTE [mixed-degree pipelines mesh])."""
    pipelines: list[dict] = []
    entries: list[dict] = []
    first = offset = 0
    for p, (plans, m) in enumerate(zip(shardings, shares)):
        stages = [[first + r for r in s] for s in _stage_ranks(plans)]
        first = stages[-1][-1] + 1
        group = {"lanes": [f"pipeline-{p}-tp{j}" for j in range(len(stages[0]))]} if lanes else {
            "group": f"pipeline-{p}"}
        pipelines.append({"index": p, **group, "stages": stages, "microbatches": m, "microbatch_offset": offset})
        offset += m
        entries += [{"pipeline": p, "stage": k, "group": f"tp-{p}-{k}" if len(s) > 1 else None, "ranks": s,
                     "degree": len(s), "weights": stage_weight_shards(ranks[s[0]], plan)}
                    for k, (s, plan) in enumerate(zip(stages, plans))]
    return pipelines, entries


# NOTE [mixed-degree pipelines mesh]
# Data-parallel pipelines whose stages run at several TP degrees (`--tensor-parallel MACHINE=T,...` with
# `--pipelines` or `--parallel data`): each pipeline runs as NOTE [mixed-degree pipeline] in
# runtime/tp_pipeline.py runs one (its own pipeline group "pipeline-p" of its stages' leaders, a TP group
# "tp-p-k" per stage of degree > 1, a uniform pipeline too: one scheme per plan), and the gradients are
# summed across every pipeline by NOTE [mixed-degree gradient sync]'s slice groups. `tp_boundaries` is
# "leaders" (format version 3); each pipeline entry names its "group" as a mesh of pipelines without TP does.
def _mixed_pipelines_mesh(ranks: list[StageGraph], shardings: list[list[ShardingPlan | None]],
                          shares: list[int]) -> dict:
    """NOTE [mixed-degree pipelines mesh]: pipeline p's stages at `shardings[p]`'s degrees, ranks pipeline-major."""
    pipelines, entries = _pipelines_stages(ranks, shardings, shares, lanes=False)
    groups: list[dict] = [{"name": q["group"], "kind": "pipeline", "ranks": [s[0] for s in q["stages"]]}
                          for q in pipelines]
    groups += [{"name": e["group"], "kind": "tp", "ranks": e["ranks"]} for e in entries if e["group"] is not None]
    groups += slice_weights_groups(ranks, [(e["ranks"], e["weights"], f"pipeline {e['pipeline']} stage {e['stage']}")
                                           for e in entries])
    return {"pipelines": pipelines, "groups": groups, "tensor_parallel": entries, "tp_boundaries": "leaders",
            "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(len(ranks))]}


def tp_pipelines_manifest(man: dict, ranks: list[StageGraph], shardings: list[list[ShardingPlan | None]],
                          shares: list[int], microbatch_size: int) -> dict:
    """`man` (codegen's manifest of every pipeline's rank graphs, pipeline-major) with the mesh of
    `tp_pipelines_mesh` and each rank's pipeline, its share of the batch and its TP place."""
    from hetpart.codegen.artifacts import place_pipelines  # artifacts imports this module (stage.py's TP block)

    man["mesh"] = tp_pipelines_mesh(ranks, shardings, shares)
    place_pipelines(man, microbatch_size)
    return _place_tp(man)


def _place_tp(man: dict) -> dict:
    """Each rank's place in its stage's TP group, from the mesh's `tensor_parallel` record; a mesh of mixed degrees
    is format version 3 (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py, NOTE [mixed-degree pipelines
    mesh])."""
    for entry in man["mesh"]["tensor_parallel"]:
        for j, r in enumerate(entry["ranks"]):
            man["ranks"][r]["tp"] = {"rank": j, "degree": entry["degree"], "group": entry["group"]}
    if man["mesh"].get("tp_boundaries") == "leaders":
        man["format_version"] = MIXED_FORMAT_VERSION
    return man


def tp_manifest(man: dict, ranks: list[StageGraph], shardings: Sequence[ShardingPlan | None]) -> dict:
    """`man` (codegen's manifest of the rank graphs) with the TP mesh and each rank's place in its group
    (`_place_tp`)."""
    man["mesh"] = tp_mesh(ranks, shardings)
    return _place_tp(man)


__all__ = ["TP_FUNCTIONS", "TP_SOURCE", "shard_stage", "tp_manifest", "tp_mesh",
           "tp_pipelines_manifest", "tp_pipelines_mesh", "tp_stage_graphs"]
