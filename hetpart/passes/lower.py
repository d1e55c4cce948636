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
  parts; the tensors the getitems produce are what crosses.
"""

from __future__ import annotations

import operator

import networkx as nx
import torch.fx as fx

from hetpart.devices import Cluster
from hetpart.ir import info
from hetpart.partitioner.problem import (
    MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link, Problem,
)


def _is_scalar(node: fx.Node) -> bool:
    return node.op == "call_function" and not info(node).is_tensor and not _is_tuple(node)


def _is_tuple(node: fx.Node) -> bool:
    return node.op == "call_function" and any(u.target is operator.getitem for u in node.users)


def group_of(gm: fx.GraphModule) -> dict[str, str]:
    """FX node name -> problem node name, for every node that is part of the problem."""
    groups: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            groups[node.name] = node.name
        elif node.op == "call_function":
            if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0].name in groups:
                groups[node.name] = groups[node.args[0].name]
            elif not _is_scalar(node):
                groups[node.name] = node.name
    return groups


def _link(spec) -> Link:
    return Link(bandwidth_bytes_per_us=max(1, round(spec.bandwidth_bytes_per_s / 1e6)),
                latency_ns=round(spec.latency_s * 1e9))


def lower_to_problem(gm: fx.GraphModule, cluster: Cluster) -> Problem:
    """The annotated graph as a Problem over `cluster`'s devices (see NOTE above)."""
    groups = group_of(gm)
    types = sorted(cluster.device_types)
    g = nx.DiGraph()
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
            attrs[TIME_NS][t] += ni.cost_ns.get(t, 0)
        attrs[MEM_BYTES] += ni.act_bytes or 0
        if ni.is_tensor:
            attrs[OUT_BYTES] += ni.out_bytes or 0
        read = [a.target for a in node.all_input_nodes if a.op == "get_attr"]
        attrs[WEIGHTS] = tuple(sorted(set(attrs[WEIGHTS]) | set(read)))
        for a in node.all_input_nodes:
            src = groups.get(a.name)
            if src is not None and src != name:
                g.add_edge(src, name)
    weights = {n.target: info(n).param_bytes or 0 for n in gm.graph.find_nodes(op="get_attr")}
    devices = [Device(d.name, d.type.name, d.machine, d.mem_bytes) for d in cluster.devices]
    return Problem(
        graph=g,
        weights=weights,
        devices=devices,
        intra_node_links={m.name: _link(m.link) for m in cluster.machines},
        network=_link(cluster.network),
    )
