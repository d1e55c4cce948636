"""torch.fx's `accelerator_partitioner` as a baseline, costed in hetpart's model.

Runs the real `torch.fx.experimental.accelerator_partitioner.Partitioner`
(`size_based` and `kl_based` modes) on a copy of the annotated export graph,
maps its partitions to a `Plan` of the partitioner's `Problem` and evaluates
it with `hetpart.partitioner.evaluate` (see `hetpart/partitioner/baselines.py`
for the torch-free baselines).

NOTE [fx partitioner on export graphs]
- The fx partitioner sizes every node from `node.meta["tensor_meta"]`
  (`get_size_of_all_nodes`), which ShapeProp leaves unset on the SymInt nodes
  (`sym_size`) and tuple outputs of an export graph: it raises "Node sym_size_int
  has no tensor metadata" on every graph with a dynamic batch dimension. We give
  every node a 1-D uint8 `tensor_meta` of the size hetpart itself uses: a weight
  (get_attr) its `param_bytes`, a tensor its `out_bytes`, scalars and tuples 0 (the
  getitems that unpack a tuple carry its tensors). The partitioner then sees
  exactly the bytes our cost model sees.
- It places a whole model on the largest device whenever the model's bytes fit
  there (`find_single_partition`), whatever the mode: on real device memories
  both modes are "one stage on the biggest device" for every zoo model.
- `kl_based` takes one latency per node (it assumes identical devices): we give
  each op's time on the first device's type and the network's bandwidth.
- `kl_based` is skipped above KL_MAX_NODES FX nodes (it runs for minutes).
- Two partitions on one logical device, or partitions whose dependencies form a
  cycle, are not pipeline plans: such a result is reported infeasible.
"""

from __future__ import annotations

import copy

import networkx as nx
import torch
import torch.fx as fx
from torch.fx.experimental.accelerator_partitioner import Partitioner
from torch.fx.experimental.partitioner_utils import Device, NodeLatency, PartitionerConfig, PartitionMode
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from hetpart.ir import info
from hetpart.partitioner.baselines import Baseline, baseline_of
from hetpart.partitioner.problem import PIN, PIN_FIRST, PIN_LAST, TIME_NS, Problem
from hetpart.passes.lower import group_of

MODES = {"fx-size-based": PartitionMode.size_based, "fx-kl-based": PartitionMode.kl_based}
# kl_based tries every node pair across partitions and re-costs the graph for each: measured
# 0.7 s at 60 FX nodes (zoo:mlp), 72 s at 217 (zoo:gpt-small). Above this it is skipped, and says so.
KL_MAX_NODES = 120


def _bytes_of(node: fx.Node) -> int:
    ni = info(node)
    if node.op == "get_attr":
        return ni.param_bytes or 0
    return (ni.out_bytes or 0) if ni.is_tensor else 0


def _annotate_sizes(gm: fx.GraphModule) -> None:
    """Every node's `tensor_meta` as a 1-D uint8 tensor of hetpart's byte size (NOTE [fx partitioner on export graphs])."""
    for node in gm.graph.nodes:
        node.meta["tensor_meta"] = _extract_tensor_metadata(torch.empty(_bytes_of(node), dtype=torch.uint8,
                                                                         device="meta"))


def fx_partition(gm: fx.GraphModule, problem: Problem, mode: str) -> Baseline:
    """Run torch.fx's Partitioner in `mode` (a key of MODES) and cost its partitions as a pipeline plan."""
    if MODES[mode] == PartitionMode.kl_based and len(gm.graph.nodes) > KL_MAX_NODES:
        return Baseline(name=mode, plan=None, bottleneck_ns=None, feasible=False,
                        note=f"skipped: {len(gm.graph.nodes)} FX nodes > {KL_MAX_NODES} (kl_based is quadratic)")
    groups = group_of(gm)
    work = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # a graph of our own; weights shared, never written
    _annotate_sizes(work)
    devices = [Device(d.name, d.capacity_bytes, i) for i, d in enumerate(problem.devices)]
    first_type = problem.devices[0].type
    latency = {}
    for node in work.graph.nodes:
        # A problem node's time goes to the fx node named like it (the op, not its getitems).
        ns = problem.graph.nodes[node.name][TIME_NS][first_type] if groups.get(node.name) == node.name else 0
        latency[node] = NodeLatency(mem_latency_sec=0.0, computer_latency_sec=ns * 1e-9)
    config = PartitionerConfig(devices=devices, mode=MODES[mode],
                               transfer_rate_bytes_per_sec=problem.network.bandwidth_bytes_per_us * 1e6,
                               node_to_latency_mapping=latency)
    partitioner = Partitioner()
    try:
        partitioner.partition_graph(work, work, config)
    except RuntimeError as err:  # the real implementation's own refusal, e.g. not enough memory
        return Baseline(name=mode, plan=None, bottleneck_ns=None, feasible=False,
                        violations=[f"torch.fx Partitioner: {err}"], note=f"torch.fx Partitioner: {err}")

    # Map partitions to stages: problem node -> partition, partitions in dependency order.
    part_of: dict[str, int] = {}
    for pid, part in enumerate(partitioner.partitions):
        for node in part.nodes:
            name = groups.get(node.name)
            if name is not None and name in problem.graph:
                part_of.setdefault(name, pid)
    g = problem.graph
    pinned = {v for v in g.nodes if g.nodes[v].get(PIN) in (PIN_FIRST, PIN_LAST)}
    for v in problem.node_order():  # an op outside every partition goes with its first producer's
        if v not in part_of and v not in pinned:
            part_of[v] = next((part_of[u] for u in sorted(g.predecessors(v)) if u in part_of), 0)
    q = nx.DiGraph()
    q.add_nodes_from(sorted({part_of[v] for v in g.nodes if v not in pinned}))
    q.add_edges_from((part_of[u], part_of[v]) for u, v in g.edges
                     if u not in pinned and v not in pinned and part_of[u] != part_of[v])
    if not nx.is_directed_acyclic_graph(q):
        return Baseline(name=mode, plan=None, bottleneck_ns=None, feasible=False,
                        violations=["its partitions depend on each other in a cycle: not a pipeline"],
                        note=f"{len(partitioner.partitions)} partitions with cyclic dependencies")
    rank = {pid: k for k, pid in enumerate(nx.lexicographical_topological_sort(q))}
    last = len(rank) - 1
    # Inputs go to the first stage and outputs to the last, as in every hetpart plan.
    stage_of = {v: 0 if g.nodes[v].get(PIN) == PIN_FIRST else last if v in pinned else rank[part_of[v]]
                for v in g.nodes}
    by_rank = sorted(rank, key=rank.get)
    device_of_stage = [problem.devices[partitioner.partitions[pid].logical_device_ids[0]].name for pid in by_rank]
    return baseline_of(problem, mode, stage_of, device_of_stage,
                       note=f"{len(partitioner.partitions)} partition(s)")


def fx_baselines(gm: fx.GraphModule, problem: Problem) -> list[Baseline]:
    """Both torch.fx modes, in a fixed order: fx-size-based, fx-kl-based."""
    return [fx_partition(gm, problem, mode) for mode in MODES]
