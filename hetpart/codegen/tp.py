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
"lane", NOTE [the mesh] in codegen/artifacts.py). So every stage of a plan has the same
degree, and each lane's boundaries carry what one rank's would: the cost model charges each
boundary once, the lanes' transfers running side by side over the link.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from hetpart.codegen.split import StageGraph
from hetpart.passes.tensor_parallel import ShardingPlan, WeightShard

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


def shard_tensor(tensor: torch.Tensor, shard: WeightShard, rank: int, degree: int) -> torch.Tensor:
    """Rank `rank`'s part of `tensor`: each of its `shard.chunks` equal parts along `shard.dim` split in `degree`.

        >>> shard_tensor(torch.arange(12), WeightShard(0, chunks=3), 1, 2).tolist()
        [2, 3, 6, 7, 10, 11]
    """
    parts = tensor.chunk(shard.chunks, dim=shard.dim)
    return torch.cat([p.chunk(degree, dim=shard.dim)[rank] for p in parts], dim=shard.dim).contiguous()


def unshard_tensor(parts: list[torch.Tensor], shard: WeightShard) -> torch.Tensor:
    """The whole tensor from every rank's part, in rank order (the inverse of `shard_tensor`)."""
    per_rank = [p.chunk(shard.chunks, dim=shard.dim) for p in parts]
    return torch.cat([torch.cat([r[c] for r in per_rank], dim=shard.dim) for c in range(shard.chunks)],
                     dim=shard.dim)


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
    # Megatron's f on each replicated input of column linears.
    for x_name, columns in plan.copy_before.items():
        users = [nodes[c] for c in columns if c in nodes]
        if not users:
            continue
        x = nodes[x_name]
        with graph.inserting_before(users[0]):
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
    return StageGraph(stage.index, gm, list(stage.inputs), list(stage.outputs), dict(stage.weights),
                      list(stage.nodes))


def tp_stage_graphs(stages: list[StageGraph], plan: ShardingPlan) -> list[StageGraph]:
    """Every rank's stage graph, stage-major: stage k's TP rank j is rank k * degree + j."""
    return [shard_stage(s, plan, j) for s in stages for j in range(plan.degree)]


def stage_weight_shards(stage: StageGraph, plan: ShardingPlan) -> dict[str, dict]:
    """The manifest's record of a stage's split weights: FQN -> {dim, chunks}."""
    return {fqn: plan.weights[fqn].to_json() for fqn in sorted(set(stage.weights.values())) if fqn in plan.weights}


def tp_mesh(ranks: list[StageGraph], plan: ShardingPlan) -> dict:
    """The mesh of a plan whose every stage has degree `plan.degree` (NOTE [the mesh], NOTE [tensor-parallel
    stages]): one pipeline group per TP index (a lane), one TP group per stage, and the weights groups of
    each lane (a tied weight's copies on that lane's ranks: TP ranks hold the same whole gradients)."""
    t = plan.degree
    num_stages = len(ranks) // t
    stages = [[k * t + j for j in range(t)] for k in range(num_stages)]
    groups: list[dict] = [{"name": f"pipeline-tp{j}", "kind": "pipeline", "ranks": [s[j] for s in stages]}
                          for j in range(t)]
    groups += [{"name": f"tp-{k}", "kind": "tp", "ranks": s} for k, s in enumerate(stages)]
    for j in range(t):
        holders: dict[str, list[int]] = {}
        for s in stages:
            for name in sorted(set(ranks[s[j]].weights.values())):
                holders.setdefault(name, []).append(s[j])
        shared: dict[tuple[int, ...], list[str]] = {}
        for name, rs in sorted(holders.items()):
            if len(rs) > 1:
                shared.setdefault(tuple(rs), []).append(name)
        groups += [{"name": f"weights-tp{j}-{i}", "kind": "weights", "ranks": list(rs), "weights": names}
                   for i, (rs, names) in enumerate(sorted(shared.items()))]
    world = len(ranks)
    return {"stages": stages, "groups": groups,
            "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(world)],
            "tensor_parallel": [{"stage": k, "group": f"tp-{k}", "ranks": s, "degree": t,
                                 "weights": stage_weight_shards(ranks[s[0]], plan)} for k, s in enumerate(stages)]}


def tp_manifest(man: dict, ranks: list[StageGraph], plan: ShardingPlan) -> dict:
    """`man` (codegen's manifest of the rank graphs) with the TP mesh and each rank's place in its group."""
    man["mesh"] = tp_mesh(ranks, plan)
    for r, entry in enumerate(man["ranks"]):
        entry["tp"] = {"rank": r % plan.degree, "degree": plan.degree, "group": f"tp-{r // plan.degree}"}
    return man


__all__ = ["TP_FUNCTIONS", "TP_SOURCE", "shard_stage", "shard_tensor", "tp_manifest", "tp_mesh", "tp_stage_graphs",
           "unshard_tensor"]
