"""Deterministic text and JSON views of an annotated graph.

One line per node, MLIR/jaxpr-like, annotations aligned in a right-hand column:

    %linear : f32[s0,64,384] = aten.linear(%layer_norm, %blocks_0_attn_qkv_weight, ...)   # flops=...

No object ids, no addresses, rounded numbers, graph order: a golden file of a
dump changes only when the graph or an annotation does.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.fx as fx

from hetpart.ir.info import META_KEY, NodeInfo


def _si(value: float, unit: str = "") -> str:
    """3 significant digits with an SI suffix: 1234567 -> '1.23M'."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}{unit}"
    return f"{value:.3g}{unit}"


def format_ns(time_ns: int) -> str:
    """A duration for humans: 31200 -> '31.2us'."""
    if time_ns >= 1_000_000:
        return f"{time_ns / 1e6:.3g}ms"
    return f"{time_ns / 1e3:.3g}us"


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        name = target.name()  # "aten::linear" or "aten::add.Tensor"
        return name.replace("::", ".").removesuffix(".default")
    if callable(target):
        module = getattr(target, "__module__", "") or ""
        return f"{module.removeprefix('_')}.{getattr(target, '__name__', repr(target))}".lstrip(".")
    return str(target)


def _arg(a: Any) -> str:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k}={_arg(v)}" for k, v in sorted(a.items())) + "}"
    if isinstance(a, float):
        return f"{a:.6g}"
    if isinstance(a, torch.dtype):
        return str(a).removeprefix("torch.")
    if isinstance(a, torch.device):
        return f"device({a.type})"
    return repr(a)


def _type(ni: NodeInfo | None) -> str:
    if ni is None or ni.is_tensor is None:
        return "?"
    if not ni.is_tensor:
        return ni.dtype or "?"
    return f"{ni.dtype}[{','.join(ni.shape or ())}]"


def _annotations(ni: NodeInfo | None) -> str:
    if ni is None:
        return ""
    parts = []
    if ni.flops:
        parts.append(f"flops={_si(ni.flops)}")
    if ni.bytes_moved:
        parts.append(f"bytes={_si(ni.bytes_moved, 'B')}")
    if ni.param_bytes:
        parts.append(f"param={_si(ni.param_bytes, 'B')}")
    if ni.act_bytes:
        parts.append(f"act={_si(ni.act_bytes, 'B')}")
    if any(ni.cost_ns.values()):  # views cost nothing anywhere: say nothing
        parts.extend(f"{dev}={format_ns(t)}" for dev, t in sorted(ni.cost_ns.items()))
    if ni.bwd_flops:  # training only
        parts.append(f"bwd_flops={_si(ni.bwd_flops)}")
    if any(ni.bwd_cost_ns.values()):
        parts.extend(f"bwd:{dev}={format_ns(t)}" for dev, t in sorted(ni.bwd_cost_ns.items()))
    parts.extend(f"tp{t}={part}" for t, part in sorted(ni.tp.items()))
    if ni.stage is not None:
        parts.append(f"stage={ni.stage}")
    return " ".join(parts)


def _line(node: fx.Node) -> str:
    ni = node.meta.get(META_KEY)
    lhs = f"%{node.name} : {_type(ni)}"
    if node.op == "placeholder":
        return f"{lhs} = input()"
    if node.op == "get_attr":
        return f"{lhs} = weight({node.target})"
    if node.op == "output":
        return f"return {_arg(node.args[0])}"
    args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
    return f"{lhs} = {_target_name(node)}({', '.join(args)})"


def dump_text(gm: fx.GraphModule, title: str | None = None) -> str:
    """The graph as text, one node a line, annotations in an aligned right-hand column."""
    rows = [(_line(n), _annotations(n.meta.get(META_KEY))) for n in gm.graph.nodes]
    width = max((len(code) for code, ann in rows if ann), default=0)
    out = [f"// ===== {title} =====" if title else None]
    for code, ann in rows:
        out.append(f"{code.ljust(width)}   # {ann}" if ann else code)
    return "\n".join(line for line in out if line is not None) + "\n"


def graph_json(gm: fx.GraphModule) -> dict[str, Any]:
    """Nodes (with every annotation) and edges, for tools."""
    nodes = []
    for n in gm.graph.nodes:
        ni: NodeInfo | None = n.meta.get(META_KEY)
        entry: dict[str, Any] = {"name": n.name, "op": n.op, "target": _target_name(n)}
        if ni is not None:
            entry.update({k: v for k, v in vars(ni).items() if v is not None and v != {}})
            if ni.shape is not None:
                entry["shape"] = list(ni.shape)
        nodes.append(entry)
    edges = [{"src": a.name, "dst": n.name} for n in gm.graph.nodes for a in n.all_input_nodes]
    return {"nodes": nodes, "edges": edges}


def dump_json(gm: fx.GraphModule) -> str:
    return json.dumps(graph_json(gm), indent=1, sort_keys=True) + "\n"


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def dump_dot(gm: fx.GraphModule) -> str:
    """The graph in Graphviz DOT, one cluster per stage (`dot -Tsvg partition.dot`).

    A weight sits in the cluster of the stage that reads it; nodes without
    one stage (scalars recomputed where needed, weights read by several
    stages) sit outside the clusters. Deterministic, like `dump_text`.
    """

    def stage_of(n: fx.Node) -> int | None:
        ni = n.meta.get(META_KEY)
        if ni is not None and ni.stage is not None:
            return ni.stage
        if n.op == "get_attr":
            readers = {u.meta[META_KEY].stage for u in n.users if META_KEY in u.meta}
            return readers.pop() if len(readers) == 1 else None
        return None

    stages: dict[int | None, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        stages.setdefault(stage_of(n), []).append(n)

    def node_line(n: fx.Node) -> str:
        ni = n.meta.get(META_KEY)
        label = f"{n.name}\n{_target_name(n) if n.op == 'call_function' else n.op}\n{_type(ni)}"
        attrs = [f"label={_dot_quote(label)}"]
        if n.op in ("placeholder", "get_attr", "output"):
            attrs.append("shape=ellipse")
        return f"    {_dot_quote(n.name)} [{', '.join(attrs)}];"

    out = ["digraph partition {", '  rankdir=TB;',
           '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="monospace", fontsize=9];']
    for stage in sorted(k for k in stages if k is not None):
        out += [f"  subgraph cluster_stage_{stage} {{",
                f'    label="stage {stage}"; style=filled; colorscheme=set312; fillcolor={stage % 12 + 1};']
        out += [node_line(n) for n in stages[stage]]
        out.append("  }")
    out += [node_line(n).removeprefix("  ") for n in stages.get(None, [])]
    out += [f"  {_dot_quote(a.name)} -> {_dot_quote(n.name)};" for n in gm.graph.nodes for a in n.all_input_nodes]
    out.append("}")
    return "\n".join(out) + "\n"
