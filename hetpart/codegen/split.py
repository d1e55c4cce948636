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
it from a tensor it has whose traced shape carries the same symbolic size, or
from the symbols it is made of, each divided out of a dim that is an integer
times it and symbols had already: a flattened [B*L, D] tensor gives B at a
static L (16*s0), and L from B at a dynamic one (s0*s1).
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
    # weight FQN -> the earlier rank whose weights.safetensors holds its one copy (NOTE [weights stored once])
    stored_in: dict[str, int] = field(default_factory=dict)
    # weight FQN -> this TP rank's part of it: dim, chunks, rank, degree (NOTE [tensor-parallel stages])
    shards: dict[str, dict[str, int]] = field(default_factory=dict)


# NOTE [weights stored once]
# A weight that several stages read (a tied embedding and LM head: NOTE [replicated weights]
# in runtime/worker.py) has its bytes in one file of the output directory: the weights.safetensors
# of the first stage that reads it. A later stage lists it in `stored_in`; its weights.safetensors
# leaves it out, its stage.py loads it from that file (`SHARED` in codegen/source.py: only that
# tensor, through safetensors' safe_open), its stage.pt2 names that file for it (NOTE [weightless
# .pt2]), and its manifest entry lists the file, `../rank<k>/weights.safetensors`, with the same
# sha256 as rank k's entry, so `run` checks the bytes it loads (`check_rank_files`), and
# `load_manifest` refuses a reference to any other file or with another hash. In memory nothing
# changes: each rank holds its own copy and training sums their gradients, as before. A plan traced
# on meta (NOTE [weight manifests]) leaves the weight out of the later rank's weights.json and
# records the file in its `shared`; shard-weights lists that file, with the hash of what it wrote.
# Several data-parallel pipelines (issue 19) hold the same weights in different stages: their ranks,
# numbered pipeline-major, go through the same rule, so a weight's bytes are in the first rank's file
# that reads it, whichever pipeline that rank is in (`stored_in` names ranks, which are the stages'
# indices when there is one pipeline).
def store_weights_once(stages: list[StageGraph], ranks: list[int] | None = None) -> None:
    """Set each stage's `stored_in`: the weights an earlier stage reads too, and the first such stage's
    rank (`ranks[k]` of stage k in `stages`; default: its index, one pipeline)."""
    first: dict[str, int] = {}
    for k, stage in enumerate(stages):
        stage.stored_in = {fqn: first[fqn] for fqn in sorted(set(stage.weights.values())) if fqn in first}
        for fqn in stage.weights.values():
            first.setdefault(fqn, stage.index if ranks is None else ranks[k])


def shared_weights_file(stage_index: int) -> str:
    """The weights.safetensors of stage `stage_index`, relative to another rank's directory."""
    return f"../rank{stage_index}/weights.safetensors"


def stage_of_nodes(gm: fx.GraphModule, stage_of: dict[str, int], groups: dict[str, str] | None = None) -> dict[str, int]:
    """FX node name -> stage, from a plan over problem nodes (getitems follow their op); `groups`: `group_of(gm)`."""
    groups = group_of(gm) if groups is None else groups
    return {fx_name: stage_of[problem_name] for fx_name, problem_name in groups.items()}


def _attr_name(target: str) -> str:
    return "w_" + target.replace(".", "_")


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
        if node.target is not torch.ops.aten.sym_size.int or node.args[0] in self.env:
            return self.copy(node)
        val = node.meta.get("val")
        want = val.node.expr if isinstance(val, torch.SymInt) else None
        # Every symbolic dim of a tensor this stage has: (its node here, dim, traced size).
        dims = [(new, d, size.node.expr) for have, new in self.env.items() if new.op != "get_attr"
                for d, size in enumerate(getattr(have.meta.get("val"), "shape", ())) if isinstance(size, torch.SymInt)]
        found = next(((new, d) for new, d, expr in dims if expr == want), None) if want is not None else None
        if found is not None:
            out = self.graph.call_function(torch.ops.aten.sym_size.int, found)
        else:
            out = self._from_symbols(want, dims) if want is not None else None
            if out is None:
                message = (f"stage {self.index} needs the size '{node.name}' ({want}) but receives no tensor "
                           "with that dimension; this model cannot be cut here yet")
                raise _MissingSize(self.index, want, message) if want is not None else HetpartError(message)
        out.meta = dict(node.meta)
        self.env[node] = out
        return out

    def _from_symbols(self, want: sympy.Expr, dims: list[tuple[fx.Node, int, sympy.Expr]]) -> fx.Node | None:
        """`want` (`s0`, `s1 + 1`) computed from its symbols, each divided out of a dim that is an
        integer times it and symbols known already (`16*s0` gives s0, then `s0*s1` gives s1); None
        where some symbol cannot be had that way."""
        known: dict[sympy.Symbol, fx.Node] = {}
        progress = True
        while progress and not want.free_symbols <= set(known):
            progress = False
            for new, d, expr in dims:
                coeff, factors = expr.as_coeff_mul()
                unknown = [f for f in factors if f not in known]
                if not coeff.is_Integer or not all(isinstance(f, sympy.Symbol) for f in factors) or len(unknown) != 1:
                    continue
                value = self.graph.call_function(torch.ops.aten.sym_size.int, (new, d))
                for divisor in [int(coeff)] * (int(coeff) > 1) + [known[f] for f in factors if f in known]:
                    value = self.graph.call_function(operator.floordiv, (value, divisor))
                known[unknown[0]] = value
                progress = True
        if not want.free_symbols <= set(known):
            return None

        def emit(expr: sympy.Expr) -> fx.Node | int:
            if expr in known:
                return known[expr]
            if expr.is_Integer:
                return int(expr)
            if isinstance(expr, (sympy.Add, sympy.Mul)):
                parts = [emit(a) for a in expr.args]
                fn = operator.add if isinstance(expr, sympy.Add) else operator.mul
                value = parts[0]
                for part in parts[1:]:
                    value = self.graph.call_function(fn, (value, part))
                return value
            raise HetpartError(f"stage {self.index}: cannot compute the size {want} from its symbols")

        out = emit(want)
        return out if isinstance(out, fx.Node) else None

    def copy(self, node: fx.Node) -> fx.Node:
        new = self.graph.node_copy(node, self.value)
        self.env[node] = new
        return new


def split_stages(gm: fx.GraphModule, stage_of: dict[str, int], num_stages: int,
                 groups: dict[str, str] | None = None) -> list[StageGraph]:
    """One GraphModule per stage; see NOTE [pass-through of skip values]. `groups`: `group_of(gm)`, if known."""
    where = stage_of_nodes(gm, stage_of, groups)
    recomputed = recomputed_nodes(gm)
    nodes = list(gm.graph.nodes)
    output = next(n for n in nodes if n.op == "output")
    last = num_stages - 1
    where[output.name] = last

    placeholders = [n for n in nodes if n.op == "placeholder"]
    carried: dict[fx.Node, int] = {}  # model inputs sent on for their sizes: NOTE [size carriers]
    while True:
        try:
            return _build_stages(gm, where, recomputed, num_stages, carried)
        except _MissingSize as missing:
            carrier = next((p for p in placeholders if missing.want.free_symbols <= _bare_symbols(p)), None)
            if carrier is None or carried.get(carrier, -1) >= missing.stage:
                raise HetpartError(str(missing)) from None
            carried[carrier] = missing.stage


# NOTE [size carriers]: a stage that receives only flattened values ([B*L, D], HF OPT's MLP at a
# dynamic length: `s0*s1`) cannot recompute B or L from them (NOTE [recomputed scalars]). Then
# the model input that has both as plain dims (the token ids, [B, L]) is passed through every
# stage up to that one, like a skip value, so it can read them: B*L integers per microbatch
# besides activations of B*L*D values, which the plan's transfer times do not count.
class _MissingSize(HetpartError):
    def __init__(self, stage: int, want: sympy.Expr, message: str) -> None:
        super().__init__(message)
        self.stage, self.want = stage, want


def _bare_symbols(node: fx.Node) -> set[sympy.Symbol]:
    shape = getattr(node.meta.get("val"), "shape", ())
    return {d.node.expr for d in shape if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol)}


def _build_stages(gm: fx.GraphModule, where: dict[str, int], recomputed: set[fx.Node], num_stages: int,
                  carried: dict[fx.Node, int]) -> list[StageGraph]:
    nodes = list(gm.graph.nodes)
    output = next(n for n in nodes if n.op == "output")
    last = num_stages - 1

    def last_use(node: fx.Node) -> int:
        return max([where.get(u.name, -1) for u in node.users] + [carried.get(node, -1)])

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


__all__ = ["StageGraph", "run_stages", "shared_weights_file", "split_stages", "stage_of_nodes", "store_weights_once"]
