"""TensorParallelPass ("tensor-parallel"): which weights and activations a tensor-parallel stage shards.

NOTE [tensor-parallel sharding]
Decided on the FX graph's dataflow, not on module names (Megatron-LM's scheme, found as
torch.distributed.tensor.parallel's ColwiseParallel / RowwiseParallel pairs would be placed):
- a *column* linear reads a replicated activation x and a weight W [out, in] that nothing
  else reads; W (and its bias) is split on dim 0, so its output is split on its last dim.
  A fused weight whose output is then split in n equal parts on that dim (GPT's qkv) is
  split per part (`WeightShard.chunks`): rank r holds rows r of q, of k and of v.
- the split travels through the ops that keep it: pointwise ops whose other operands are
  split alike or broadcast over that dim (torch.Tag.pointwise), views and reshapes that
  keep it on one dim (the head count in their size argument is divided by t: `arg_edits`),
  transposes, slices, chunks and cats along other dims, repeat_interleave (GQA), and
  scaled_dot_product_attention of q, k, v split on the heads dim: attention by heads.
- a *row* linear reads a value split on its last (contraction) dim: its weight is split on
  dim 1 and its output is a partial sum, all-reduced over the group (Megatron's g: sum
  forward, identity backward), then its bias is added once.
- a split value that is a model output (an untied LM head: vocab-parallel) is all-gathered on its
  split dim before it leaves (`gather_before_output`; backward: each rank's part of the gradient).
- each replicated x that column linears read passes through Megatron's f (identity forward,
  all-reduce of its gradient backward), once per x: one all-reduce per attention and per MLP
  each way, as in Megatron.
A split value that reaches anything else (an op without a rule, a
sym_size of the split dim, a weight someone else reads, a size not divisible by t) makes
every column linear it came from replicated again, and the analysis reruns until no such
conflict is left: ops with no rule stay replicated. Every node of one region (the ops
between its column and row linears) must run in one stage: lowering co-locates them.
Vocab-parallel embeddings (and so a tied LM head) and MoE experts are not split yet (they stay replicated).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import ClassVar

import sympy
import torch
import torch.fx as fx

from hetpart.ir import info
from hetpart.passes.manager import PassContext, PassResult
from hetpart.shards import WeightShard

aten = torch.ops.aten
TP_META = "tensor_parallel"  # gm.meta key: {degree: ShardingPlan}

_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_SAME_SHAPE = {aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
               aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.dropout.default,
               aten.lift_fresh_copy.default}
_DIM_MAPS = {aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.flatten.using_ints}


@dataclass
class ShardingPlan:
    """What a stage of tensor-parallel degree `degree` shards (NOTE [tensor-parallel sharding])."""

    degree: int
    weights: dict[str, WeightShard] = field(default_factory=dict)  # weight FQN -> its shard
    sharded: dict[str, int] = field(default_factory=dict)  # FX node -> the split dim of its output
    arg_edits: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # node -> (arg, item) / t
    reduce_after: tuple[str, ...] = ()  # row linears: their partial output all-reduced (g)
    copy_before: dict[str, tuple[str, ...]] = field(default_factory=dict)  # replicated x -> its column linears (f)
    gather_before_output: dict[str, int] = field(default_factory=dict)  # split model output -> dim all-gathered
    regions: list[tuple[str, ...]] = field(default_factory=list)  # the FX nodes of each region, to co-locate

    def region_of(self) -> dict[str, int]:
        """FX node -> its region's index."""
        return {n: i for i, nodes in enumerate(self.regions) for n in nodes}


class _Conflict(Exception):
    def __init__(self, seeds: set[str]) -> None:
        super().__init__(sorted(seeds))
        self.seeds = seeds


def _shape(node: object) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _expr(size: object) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))


def _prod(sizes: tuple) -> sympy.Expr:
    out = sympy.Integer(1)
    for s in sizes:
        out = out * _expr(s)
    return sympy.expand(out)


def _view_dim(src: tuple, dst: tuple, d: int) -> int | None:
    """The dim of `dst` that a reshape of `src` maps `src`'s dim d onto whole, or None: the
    products of the dims before agree, and so do the products of it and the dims after."""
    before, from_here = _prod(src[:d]), _prod(src[d:])
    for e in range(len(dst)):
        if sympy.expand(_prod(dst[:e]) - before) == 0 and sympy.expand(_prod(dst[e:]) - from_here) == 0:
            return e
    return None


def _weight_param(gm: fx.GraphModule, node: object, readers: dict[str, int]) -> bool:
    """Whether `node` is a get_attr of a parameter that only one node of the graph reads."""
    if not (isinstance(node, fx.Node) and node.op == "get_attr"):
        return False
    from hetpart.passes.memory import fetch_attr

    return isinstance(fetch_attr(gm, node.target), torch.nn.Parameter) and readers.get(node.target, 0) == 1


def _readers(gm: fx.GraphModule) -> dict[str, int]:
    """Weight FQN -> how many nodes read it (a tied weight's get_attrs all count)."""
    count: dict[str, int] = {}
    for n in gm.graph.find_nodes(op="get_attr"):
        count[n.target] = count.get(n.target, 0) + len(n.users)
    return count


def _is_linear(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.linear.default


def analyse(gm: fx.GraphModule, degree: int) -> ShardingPlan:
    """The sharding of NOTE [tensor-parallel sharding] at `degree`, after removing conflicting column linears."""
    readers = _readers(gm)
    candidates = {n.name for n in gm.graph.nodes if _is_linear(n) and _weight_param(gm, n.args[1], readers)
                  and (len(n.args) < 3 or n.args[2] is None or _weight_param(gm, n.args[2], readers))}
    while True:
        try:
            return _propagate(gm, degree, candidates)
        except _Conflict as conflict:
            if not conflict.seeds & candidates:
                raise AssertionError(f"internal: a sharding conflict with no column linear {conflict.seeds}")
            candidates -= conflict.seeds


def _propagate(gm: fx.GraphModule, t: int, candidates: set[str]) -> ShardingPlan:
    """One forward sweep: split values from the column linears in `candidates`; a conflict raises."""
    plan = ShardingPlan(degree=t)
    dim: dict[fx.Node, int] = {}  # split value -> its split dim
    origin: dict[fx.Node, set[str]] = {}  # split value -> the column linears it comes from
    chunks: dict[str, int] = {}  # column linear -> its output's equal parts (fused weights)
    parent: dict[str, str] = {}  # union-find over region nodes

    def find(a: str) -> str:
        while parent.setdefault(a, a) != a:
            a = parent[a]
        return a

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    def conflict(node: fx.Node, *values: fx.Node) -> _Conflict:
        return _Conflict(set().union(*(origin[v] for v in values if v in origin)) or {node.name})

    def divisible(size: object) -> bool:
        return isinstance(size, int) and size % t == 0 and size >= t

    for node in gm.graph.nodes:
        if node.op == "output":  # a split output (a vocab-parallel LM head) is all-gathered on its split dim
            for a in node.all_input_nodes:
                if a in dim:
                    plan.gather_before_output[a.name] = dim[a]
                    union(node.name, a.name)
            continue
        if node.op != "call_function":
            continue
        ins = [a for a in node.all_input_nodes if a in dim]
        if not ins:
            if node.name in candidates and _is_linear(node):  # a column linear of a replicated input
                out = _shape(node)
                if out is None or not divisible(int(out[-1]) if not isinstance(out[-1], torch.SymInt) else None):
                    continue
                dim[node], origin[node] = len(out) - 1, {node.name}
                chunks[node.name] = 1
                parent.setdefault(node.name, node.name)
            continue
        src = set().union(*(origin[a] for a in ins))
        out_dim = _rule(node, ins, dim, t, plan, chunks, src, conflict)
        for a in ins:
            union(node.name, a.name)
        if out_dim is not None:
            dim[node], origin[node] = out_dim, src
    # Every split value is used by rules only: record the plan.
    columns = sorted(chunks)
    rows = sorted(n.name for n in gm.graph.nodes if _is_linear(n) and n.args[0] in dim)
    by_name = {n.name: n for n in gm.graph.nodes}
    for c in columns:
        n = by_name[c]
        plan.weights[n.args[1].target] = WeightShard(0, chunks[c])
        if len(n.args) > 2 and n.args[2] is not None:
            plan.weights[n.args[2].target] = WeightShard(0, chunks[c])
        plan.copy_before.setdefault(n.args[0].name, ())
        plan.copy_before[n.args[0].name] += (c,)
    for r in rows:
        plan.weights[by_name[r].args[1].target] = WeightShard(1)
    plan.reduce_after = tuple(rows)
    plan.sharded = {n.name: d for n, d in dim.items()}
    regions: dict[str, list[str]] = {}
    for n in gm.graph.nodes:
        if n.name in parent:
            regions.setdefault(find(n.name), []).append(n.name)
    plan.regions = [tuple(nodes) for nodes in regions.values()]
    return plan


def _rule(node: fx.Node, ins: list[fx.Node], dim: dict[fx.Node, int], t: int, plan: ShardingPlan,
          chunks: dict[str, int], src: set[str], conflict) -> int | None:
    """The split dim of `node`'s output, given its split inputs `ins` (None: the output is replicated, or no
    tensor); records size edits in `plan`; raises a conflict where no rule applies."""
    target, args = node.target, node.args
    first = args[0] if args else None
    out = _shape(node)
    if target is aten.sym_size.int:
        if args[1] % len(_shape(first)) == dim[first] % len(_shape(first)):
            raise conflict(node, *ins)
        return None
    if target is operator.getitem:
        return dim[first]
    if _is_linear(node):  # a row linear: the split dim is the contraction dim
        if first in dim and dim[first] == len(_shape(first)) - 1 and all(a not in dim for a in args[1:]) \
                and isinstance(args[1], fx.Node) and args[1].op == "get_attr":
            return None
        raise conflict(node, *ins)
    d = dim.get(first)
    pointwise = isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
    if d is None and not pointwise and target not in (aten.cat.default, aten.scaled_dot_product_attention.default):
        raise conflict(node, *ins)  # the rules below read the split dim of their first argument
    if target in _SAME_SHAPE:
        return d
    if pointwise:
        rank = len(out)
        aligned = {dim[a] + rank - len(_shape(a)) for a in ins}
        if len(aligned) != 1:
            raise conflict(node, *ins)
        (d_out,) = aligned
        for a in node.all_input_nodes:
            shape = _shape(a)
            if a in dim or shape is None:
                continue
            at = d_out - (rank - len(shape))
            if at >= 0 and not (isinstance(shape[at], int) and shape[at] == 1):
                raise conflict(node, *ins)  # a replicated operand with the whole split dim
        return d_out
    if target in _VIEWS:
        e = _view_dim(_shape(first), out, d)
        if e is None:
            raise conflict(node, *ins)
        size = args[1][e]
        if isinstance(size, int) and size != -1:
            if size % t:
                raise conflict(node, *ins)
            plan.arg_edits[node.name] = ((1, e),)
        elif size != -1:  # a symbolic size on the split dim: it cannot be divided here
            raise conflict(node, *ins)
        return e
    if target in _DIM_MAPS:
        e = _view_dim(_shape(first), out, d)
        if e is None:
            raise conflict(node, *ins)
        return e
    if target is aten.transpose.int:
        rank = len(out)
        a, b = args[1] % rank, args[2] % rank
        return b if d == a else a if d == b else d
    if target is aten.permute.default:
        return [p % len(out) for p in args[1]].index(d)
    if target is aten.expand.default:
        at = d + len(out) - len(_shape(first))
        size = args[1][at]
        if size != -1:
            if not isinstance(size, int) or size % t:
                raise conflict(node, *ins)
            plan.arg_edits[node.name] = ((1, at),)
        return at
    if target is aten.repeat_interleave.self_int:
        return d
    if target in (aten.slice.Tensor, aten.select.int, aten.chunk.default, aten.split.Tensor,
                  aten.split_with_sizes.default, aten.softmax.int, aten._softmax.default, aten.unbind.int):
        rank = len(_shape(first))
        along = (args[1] if len(args) > 1 else 0) if target in (aten.slice.Tensor, aten.select.int,
                                                                 aten.softmax.int, aten._softmax.default,
                                                                 aten.unbind.int) else (args[2] if len(args) > 2 else 0)
        along %= rank
        if along != d:
            return d - 1 if target in (aten.select.int, aten.unbind.int) and along < d else d
        if target in (aten.split.Tensor, aten.chunk.default, aten.split_with_sizes.default):
            return _split_on_dim(node, d, t, plan, chunks, src, conflict, ins)
        raise conflict(node, *ins)
    if target is aten.cat.default:
        tensors = args[0]
        along = (args[1] if len(args) > 1 else 0) % len(out)
        if not all(a in dim for a in tensors) or {dim[a] for a in tensors} != {dim[tensors[0]]} \
                or along == dim[tensors[0]]:
            raise conflict(node, *ins)
        return dim[tensors[0]]
    if target is aten.scaled_dot_product_attention.default:
        q, k, v = args[:3]
        mask = args[3] if len(args) > 3 else node.kwargs.get("attn_mask")
        heads = len(out) - 3
        if not all(x in dim and dim[x] == heads for x in (q, k, v)):
            raise conflict(node, *ins)
        if isinstance(mask, fx.Node) and (mask in dim or (_shape(mask) is not None and len(_shape(mask)) >= 3
                                                         and _shape(mask)[-3] != 1)):
            raise conflict(node, *ins)
        return heads
    raise conflict(node, *ins)


def _split_on_dim(node: fx.Node, d: int, t: int, plan: ShardingPlan, chunks: dict[str, int], src: set[str],
                  conflict, ins: list[fx.Node]) -> int:
    """A split of a column linear's output into equal parts along its split dim: the fused weight's parts are
    split each (`WeightShard.chunks`), and the split's size is divided by t."""
    args = node.args
    sizes = _shape(node.args[0])
    total = sizes[d]
    if len(src) != 1 or not isinstance(total, int):
        raise conflict(node, *ins)
    if node.target is aten.chunk.default:
        n = args[1]
    elif node.target is aten.split.Tensor:
        if not isinstance(args[1], int) or total % args[1]:
            raise conflict(node, *ins)
        n = total // args[1]
        plan.arg_edits[node.name] = ((1, -1),)
    else:
        if len(set(args[1])) != 1:
            raise conflict(node, *ins)
        n = len(args[1])
        plan.arg_edits[node.name] = tuple((1, i) for i in range(n))
    (column,) = src
    if total % (n * t) or chunks[column] not in (1, n):
        raise conflict(node, *ins)
    chunks[column] = n
    return d


@dataclass(frozen=True)
class TensorParallelPass:
    """NOTE [tensor-parallel sharding]: the sharding of every degree in `degrees`, as gm.meta[TP_META]."""

    name: ClassVar[str] = "tensor-parallel"
    summary: ClassVar[str] = "Megatron-style sharding of linears and attention heads, found on the dataflow"
    requires: ClassVar[tuple[str, ...]] = ("shape",)
    provides: ClassVar[tuple[str, ...]] = ("tp",)
    degrees: tuple[int, ...] = (2,)

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        gm.meta[TP_META] = {t: analyse(gm, t) for t in self.degrees if t > 1}
        for t, plan in gm.meta[TP_META].items():  # each node's part, for the IR dump (review22: it showed none)
            for n in gm.graph.nodes:
                part = node_part(plan, n)
                if part is not None:
                    info(n).tp[t] = part
        return PassResult(gm, changed=False)


def node_part(plan: ShardingPlan, node: fx.Node) -> str | None:
    """`node`'s part in a stage of `plan`'s degree, as the IR dump shows it (NodeInfo.tp); None if replicated."""
    if node.op == "get_attr" and node.target in plan.weights:
        shard = plan.weights[node.target]
        return f"shard:{shard.dim}" + (f"x{shard.chunks}" if shard.chunks > 1 else "")
    if node.name in plan.reduce_after:
        return "allreduce"  # a row linear: its partial sum all-reduced (g)
    if node.name in plan.gather_before_output:
        return f"split:{plan.gather_before_output[node.name]}+gather"
    if node.name in plan.sharded:
        return f"split:{plan.sharded[node.name]}"
    if node.name in plan.copy_before:
        return "copy"  # read by column linears: its gradient all-reduced (f)
    return None


def describe(plan: ShardingPlan) -> list[str]:
    """One line per region: its column and row linears and how many ops it splits."""
    lines = []
    column_of = {c: x for x, cs in plan.copy_before.items() for c in cs}
    for nodes in plan.regions:
        cols = [n for n in nodes if n in column_of]
        rows = [f"row {n}" for n in nodes if n in plan.reduce_after]
        rows += [f"gathered output {n}" for n in nodes if n in plan.gather_before_output]
        lines.append(f"region: column {', '.join(cols)} -> {', '.join(rows)} ({len(nodes)} ops)")
    return lines


__all__ = ["ShardingPlan", "TP_META", "TensorParallelPass", "analyse", "describe", "node_part"]
