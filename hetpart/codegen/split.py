"""Cut the annotated graph into one GraphModule per stage.

NOTE [pass-through of skip values]
A value made in stage s and read in stage t > s+1 is passed through every stage
in between: stage k's outputs are exactly the values crossing boundary k|k+1,
and stage k+1's inputs are the same list in the same order (graph order). So
every stage talks only to its neighbours, which is what
torch.distributed.pipelining runs, and any DAG (residuals, U-Net skips) can be
pipelined.

NOTE [recomputed scalars]
Scalars (sym_size of the dynamic batch and arithmetic on it) never cross a
stage boundary: pipelining sends tensors only. A stage that needs one recomputes
it from a tensor it has whose traced shape carries the same symbolic size (or
an integer multiple of it, divided back: a flattened [B*L, D] tensor gives B).
Likewise, ops on weights and constants only (RoPE tables, position biases) are
recomputed by every stage that reads them, never sent: see NOTE [recomputed
constants] in hetpart/passes/lower.py.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.ir import info
from hetpart.passes.lower import group_of, recomputed_nodes
from hetpart.passes.memory import fetch_attr


@dataclass
class StageGraph:
    """One stage: its GraphModule, boundary values and the weights it reads."""

    index: int
    gm: fx.GraphModule
    inputs: list[str]  # value names, in order (stage 0: the model's inputs)
    outputs: list[str]  # value names, in order (last stage: the model's outputs)
    weights: dict[str, str] = field(default_factory=dict)  # attribute in the stage -> weight FQN
    nodes: list[str] = field(default_factory=list)  # original FX nodes computed here


def stage_of_nodes(gm: fx.GraphModule, stage_of: dict[str, int]) -> dict[str, int]:
    """FX node name -> stage, from a plan over problem nodes (getitems follow their op)."""
    groups = group_of(gm)
    return {fx_name: stage_of[problem_name] for fx_name, problem_name in groups.items()}


def _attr_name(target: str) -> str:
    return "w_" + target.replace(".", "_")


def _scale_of(size: object, sym: object) -> int | None:
    """k when the traced dimension `size` is k * `sym` for an integer k > 1 (`16*s0` of `s0`)."""
    if not isinstance(size, torch.SymInt) or not isinstance(sym, torch.SymInt):
        return None
    ratio = sympy.simplify(size.node.expr / sym.node.expr)
    return int(ratio) if ratio.is_Integer and int(ratio) > 1 else None


def _sym_key(value: object) -> str | None:
    return str(value.node.expr) if isinstance(value, torch.SymInt) else None


class _StageBuilder:
    def __init__(self, gm: fx.GraphModule, index: int, inputs: list[fx.Node], recomputed: set[fx.Node]):
        self.src = gm
        self.index = index
        self.recomputed = recomputed
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[fx.Node, fx.Node] = {}
        self.weights: dict[str, str] = {}
        for node in inputs:
            self.env[node] = self.graph.placeholder(node.name)
            self.env[node].meta = dict(node.meta)

    def value(self, node: fx.Node) -> fx.Node:
        if node in self.env:
            return self.env[node]
        if node.op == "get_attr":
            attr = _attr_name(node.target)
            if attr not in self.weights:
                tensor = fetch_attr(self.src, node.target)
                if isinstance(tensor, torch.nn.Parameter):
                    self.root.register_parameter(attr, tensor)
                else:
                    self.root.register_buffer(attr, tensor)
                self.weights[attr] = node.target
            new = self.graph.get_attr(attr)
            new.meta = dict(node.meta)
            self.env[node] = new
            return new
        if node.op == "call_function" and not info(node).is_tensor and info(node).dtype == "scalar":
            return self._recompute_scalar(node)
        if node in self.recomputed:
            return self.copy(node)
        raise HetpartError(
            f"internal: stage {self.index} needs '{node.name}', which is neither computed here nor received"
        )

    def _recompute_scalar(self, node: fx.Node) -> fx.Node:
        """See NOTE [recomputed scalars]."""
        if node.target is torch.ops.aten.sym_size.int and node.args[0] not in self.env:
            key = _sym_key(node.meta.get("val"))
            for have, new in self.env.items():
                shape = getattr(have.meta.get("val"), "shape", None)
                if shape is None or new.op == "get_attr":
                    continue
                for dim, size in enumerate(shape):
                    if key is not None and _sym_key(size) == key:
                        out = self.graph.call_function(torch.ops.aten.sym_size.int, (new, dim))
                        out.meta = dict(node.meta)
                        self.env[node] = out
                        return out
            # Only flattened tensors arrive (HF OPT's MLP runs on [B*L, D]): B = size(0) // L.
            for have, new in self.env.items():
                shape = getattr(have.meta.get("val"), "shape", None)
                if shape is None or new.op == "get_attr" or key is None:
                    continue
                for dim, size in enumerate(shape):
                    scale = _scale_of(size, node.meta["val"])
                    if scale is not None:
                        whole = self.graph.call_function(torch.ops.aten.sym_size.int, (new, dim))
                        whole.meta = {**node.meta, "val": size}
                        out = self.graph.call_function(operator.floordiv, (whole, scale))
                        out.meta = dict(node.meta)
                        self.env[node] = out
                        return out
            raise HetpartError(
                f"stage {self.index} needs the size '{node.name}' ({key}) but receives no tensor with that "
                "dimension; this model cannot be cut here yet"
            )
        return self.copy(node)

    def copy(self, node: fx.Node) -> fx.Node:
        new = self.graph.node_copy(node, self.value)
        self.env[node] = new
        return new


def split_stages(gm: fx.GraphModule, stage_of: dict[str, int], num_stages: int) -> list[StageGraph]:
    """One GraphModule per stage; see NOTE [pass-through of skip values]."""
    where = stage_of_nodes(gm, stage_of)
    recomputed = recomputed_nodes(gm)
    nodes = list(gm.graph.nodes)
    output = next(n for n in nodes if n.op == "output")
    last = num_stages - 1
    where[output.name] = last

    def last_use(node: fx.Node) -> int:
        return max((where.get(u.name, -1) for u in node.users), default=-1)

    crossing = [
        [n for n in nodes if n.name in where and n.op != "output" and info(n).is_tensor
         and where[n.name] <= k < last_use(n)]
        for k in range(num_stages - 1)
    ]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    stages = []
    for k in range(num_stages):
        inputs = placeholders if k == 0 else crossing[k - 1]
        b = _StageBuilder(gm, k, inputs, recomputed)
        computed = []
        for n in nodes:
            if n.op == "call_function" and where.get(n.name) == k:
                b.copy(n)
                computed.append(n.name)
        outs = list(output.args[0]) if k == last else crossing[k]
        if k < last and not outs:
            raise HetpartError(f"internal: nothing crosses from stage {k} to stage {k + 1}")
        b.graph.output(tuple(b.value(o) for o in outs))
        b.graph.eliminate_dead_code()
        stage_gm = fx.GraphModule(b.root, b.graph, class_name=f"Stage{k}")
        stages.append(StageGraph(k, stage_gm, [n.name for n in inputs], [o.name for o in outs],
                                 dict(b.weights), computed))
    return stages


def run_stages(stages: list[StageGraph], *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Run the stages back to back in this process (a reference for the pipeline)."""
    values = inputs
    for stage in stages:
        values = stage.gm(*values)
    return values


__all__ = ["StageGraph", "run_stages", "split_stages", "stage_of_nodes"]
