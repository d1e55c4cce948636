"""Lower an annotated FX graph and a cluster to the partitioner's torch-free `Problem`.

NOTE [what the partitioner sees]
- Tensor-producing ops and the model inputs are problem nodes; inputs are
  pinned to the first stage, the output node to the last.
- Weights (get_attr) are not nodes: each op lists the weights it reads, and a
  stage holds each weight its ops read, once.
- Scalars (sym_size and SymInt arithmetic) are not nodes: codegen recomputes
  them in every stage that needs them from a tensor it has (see codegen).
- A multi-output op (split, ...) and the getitems that unpack it form one
  problem node named after the op, so a cut never separates a tuple from its
  parts; the tensors the getitems produce are what crosses: their bytes add up
  in OUT_BYTES and their number is OUT_TENSORS (codegen sends each as a value
  of its own, so each pays a link latency: NOTE [stage time] in costs.py).
- Ops that read no model input, only weights, constants and scalars (RoPE
  cos/sin from `arange`, T5's position bias, a transposed weight) are not
  nodes either: codegen recomputes them in every stage that reads them, and
  the partitioner counts their weights for each op that reads them. See
  NOTE [recomputed constants].
- So a stage's problem nodes (plan.json's `node_count`, the table's `nodes`)
  are its lines marked `stage=K` in the partition dump less its getitems
  (`group_of` gives each getitem its op's problem node); recomputed ops and
  scalars are marked with no stage (README, "Reading the plan table").

NOTE [recomputed constants]
Sending such a value would cost a transfer per microbatch at every cut it
crosses (T5's [1, heads, T, T] bias is larger than the activations at long
sequence lengths), and an integer one (position buckets) would reach
torch.distributed.pipelining's shape inference, which runs a stage on
uninitialized inputs. Recomputing costs each reading stage the op's time,
which is negligible for the ops models write this way (index and trigonometry
tables, views of weights) and is not charged. Random ops are never recomputed:
two stages would draw different values.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import networkx as nx
import torch
import torch.fx as fx

from hetpart.devices import Cluster
from hetpart.errors import HetpartError
from hetpart.ir import info
from hetpart.ir.info import DTYPE_NAMES
from hetpart.partitioner.problem import (
    FORWARD_NS, LAYER, MEM_BYTES, OUT_BYTES, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link, Problem,
    Training,
)
from hetpart.partitioner.costs import training_state_bytes

# NOTE [training costs]
# A training plan is costed per microbatch of forward plus backward:
# - a node's TIME_NS is its forward plus its backward (`bwd_cost_ns`, NOTE
#   [backward formulas] in flops.py);
# - a value crossing a boundary goes forward and its gradient comes back: its
#   OUT_BYTES is the activation plus, when it needs a gradient, the gradient
#   (same size), and each link carries two transfers per microbatch, so its
#   latency is paid twice (`Link(bandwidth, 2 x latency)`), per tensor
#   (OUT_TENSORS): exactly `transfer(activation) + transfer(gradient)` when
#   both cross (a tensor without a gradient, token ids, is charged both);
# - memory: each trainable weight adds its gradient and the optimizer's state
#   (`Training.state_bytes`: bytes of the weight + parameters x
#   optimizer_bytes_per_param), and the schedule decides the activation stash
#   (NOTE [training memory] in partitioner/costs.py).


@dataclass(frozen=True)
class TrainingSpec:
    """What `hetpart partition --mode training` plans for."""

    schedule: str = "gpipe"  # or "1f1b"
    microbatches: int = 4
    optimizer_bytes_per_param: int = 8  # Adam: two fp32 moments per parameter


_ITEM_BYTES = {name: torch.empty((), dtype=dtype).element_size() for dtype, name in DTYPE_NAMES.items()}


def _is_scalar(node: fx.Node) -> bool:
    return node.op == "call_function" and not info(node).is_tensor and not _is_tuple(node)


def _is_tuple(node: fx.Node) -> bool:
    return node.op == "call_function" and any(u.target is operator.getitem for u in node.users)


def _is_random(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags


def recomputed_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Tensor ops that read only weights, other such ops and scalars; see NOTE [recomputed constants]."""
    found: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or _is_scalar(node) or _is_random(node):
            continue
        if all(a.op == "get_attr" or a in found or _is_scalar(a) for a in node.all_input_nodes):
            found.add(node)
    return found


def weights_read(node: fx.Node, recomputed: set[fx.Node]) -> set[str]:
    """The weights `node` reads, directly or through recomputed ops."""
    read: set[str] = set()
    todo, seen = list(node.all_input_nodes), set()
    while todo:
        a = todo.pop()
        if a in seen:
            continue
        seen.add(a)
        if a.op == "get_attr":
            read.add(a.target)
        elif a in recomputed:
            todo.extend(a.all_input_nodes)
    return read


def group_of(gm: fx.GraphModule) -> dict[str, str]:
    """FX node name -> problem node name, for every node that is part of the problem."""
    groups: dict[str, str] = {}
    recomputed = recomputed_nodes(gm)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            groups[node.name] = node.name
        elif node.op == "call_function" and node not in recomputed:
            if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0].name in groups:
                groups[node.name] = groups[node.args[0].name]
            elif not _is_scalar(node):
                groups[node.name] = node.name
    return groups


def layer_of(node: fx.Node) -> str | None:
    """The model layer of a node, for the equal-layers baseline: its deepest module's path up to
    the first list index ("blocks.3.attn.q" -> "blocks.3", "wte" -> "wte"); None at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _ in stack.values() if path and not path.startswith("_empty_nn_module_stack")]
    if not paths:
        return None
    parts = paths[-1].split(".")
    cut = next((i for i, part in enumerate(parts) if part.isdigit()), 0)
    return ".".join(parts[: cut + 1])


def _link(spec, directions: int = 1) -> Link:
    return Link(bandwidth_bytes_per_us=max(1, round(spec.bandwidth_bytes_per_s / 1e6)),
                latency_ns=directions * round(spec.latency_s * 1e9))


def cluster_fields(cluster: Cluster, training: bool) -> dict:
    """The Problem fields a cluster gives: its devices, each machine's link and the network (a link's latency
    paid both ways in training); `lower_to_problem` and `hetpart replan`'s retargeting share them."""
    directions = 2 if training else 1
    return {"devices": [Device(d.name, d.type.name, d.machine, d.mem_bytes) for d in cluster.devices],
            "intra_node_links": {m.name: _link(m.link, directions) for m in cluster.machines},
            "network": _link(cluster.network, directions)}


def _state_bytes(gm: fx.GraphModule, spec: TrainingSpec) -> dict[str, int]:
    """Gradient + optimizer state bytes of each trainable weight (NOTE [training costs])."""
    out: dict[str, int] = {}
    for n in gm.graph.find_nodes(op="get_attr"):
        ni = info(n)
        if ni.needs_grad and ni.param_bytes:
            params = ni.param_bytes // _ITEM_BYTES.get(ni.dtype or "f32", 4)
            out[n.target] = training_state_bytes(ni.param_bytes, params, spec.optimizer_bytes_per_param)
    return out


def lower_to_problem(gm: fx.GraphModule, cluster: Cluster, training: TrainingSpec | None = None,
                     groups: dict[str, str] | None = None) -> Problem:
    """The annotated graph as a Problem over `cluster`'s devices (see NOTE above).

    `groups`: the graph's `group_of`, where the caller has it already (it is computed once per compile).

    With `training`, the graph must have been annotated in training mode
    (`PassContext(mode="training")`): NOTE [training costs].
    """
    if training is not None and not any(info(n).bwd_cost_ns for n in gm.graph.nodes):
        raise HetpartError("lowering for training needs backward costs: run the passes with mode='training'")
    groups = group_of(gm) if groups is None else groups
    recomputed = recomputed_nodes(gm)
    types = sorted(cluster.device_types)
    g = nx.DiGraph()
    tensors: dict[str, int] = {}  # problem node -> the tensors its output is (a multi-output op's parts)
    for node in gm.graph.nodes:
        name = groups.get(node.name)
        if name is None:
            continue
        ni = info(node)
        if name not in g:
            pin = PIN_FIRST if node.op == "placeholder" else PIN_LAST if node.op == "output" else None
            g.add_node(name, **{TIME_NS: {t: 0 for t in types}, MEM_BYTES: 0, OUT_BYTES: 0, WEIGHTS: (), PIN: pin})
        attrs = g.nodes[name]
        for t in types:
            attrs[TIME_NS][t] += ni.cost_ns.get(t, 0) + (ni.bwd_cost_ns.get(t, 0) if training else 0)
            if training:  # the forward part, for simulated steps (NOTE [simulated ratios] in baselines.py)
                attrs.setdefault(FORWARD_NS, {}).setdefault(t, 0)
                attrs[FORWARD_NS][t] += ni.cost_ns.get(t, 0)
        attrs[MEM_BYTES] += ni.act_bytes or 0
        if ni.is_tensor:
            attrs[OUT_BYTES] += (ni.out_bytes or 0) * (2 if training and ni.needs_grad else 1)
            if ni.out_bytes:  # each tensor is a message of its own at a boundary (NOTE [stage time] in costs.py)
                tensors[name] = tensors.get(name, 0) + 1
        attrs[WEIGHTS] = tuple(sorted(set(attrs[WEIGHTS]) | weights_read(node, recomputed)))
        if LAYER not in attrs and (layer := layer_of(node)) is not None:
            attrs[LAYER] = layer
        for a in node.all_input_nodes:
            src = groups.get(a.name)
            if src is not None and src != name:
                g.add_edge(src, name)
    for name, count in tensors.items():
        if count > 1:  # (one is the default: OUT_TENSORS is written only where it says more)
            g.nodes[name][OUT_TENSORS] = count
    weights = {n.target: info(n).param_bytes or 0 for n in gm.graph.find_nodes(op="get_attr")}
    return Problem(
        graph=g,
        weights=weights,
        **cluster_fields(cluster, training is not None),
        training=None if training is None else Training(training.schedule, training.microbatches,
                                                        _state_bytes(gm, training)),
    )
