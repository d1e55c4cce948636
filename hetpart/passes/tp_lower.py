"""Lower a problem to tensor-parallel slots: each group of t same-type devices of one machine is one slot.

NOTE [tensor-parallel costs]
A stage of degree t (NOTE [tensor-parallel stages] in codegen/tp.py) runs on a group of t devices of
one type inside one machine; the partitioner sees the group as one slot of kind "tp" whose type key
is `<type>/tp<t>` (`tp_type`), costed as follows, each term from the one formula that owns it:
- compute: an op the sharding splits (a column or row linear, or an op on a split value) runs at
  the shard's size on the roofline, `op_cost.roofline_ns(flops / t, bytes / t)` (a row linear's
  output is whole: its bytes are (bytes - out) / t + out), forward and backward; the per-op
  overhead stays whole, so a small shard gains less than t (the efficiency loss of small shards).
  On a profiled type, the measured time is scaled by the roofline's ratio shard / whole.
  Other ops run whole, replicated on every rank; so does a view of a split value, whose profiled
  time is dispatch (no kernel to shrink) that every rank pays whole.
- collectives, over the machine's link with `costs.allreduce_ns` (ring, t ranks): each row
  linear's output all-reduced forward (g); in training each column-linear input's gradient
  all-reduced backward (f), charged to its first column linear; a split model output's
  all-gather (`costs.allgather_ns`), whose whole copy also adds to memory.
- memory per rank (`costs.tp_shard_bytes`): a split weight, its gradient and optimizer state,
  and the activations of split values divided by t; everything else whole.
- boundaries: charged once per boundary over the link between the two groups' machines (each
  TP index's lane sends its own copy side by side, NOTE [tensor-parallel stages]).
- the ops of a region share a stage (COLOCATE), so no split value crosses a boundary.
Each op's terms are computed once per op (`tp_op_costs`) and summed per problem node; the partition
dump (ir/NN-partition.txt) shows them per op on the plan's slot types (`cpu/tp2=`, `bwd:cpu/tp2=`)
beside the op's one-device cost (`show_tp_costs`), so a TP stage's lines sum to its compute_us, as
any stage's lines do (review22: they showed one device's costs only).
With every slot of one degree these are exact per rank, and the engines, bounds and verifier
take them unchanged; a problem mixing degrees (`--max-tensor-parallel`) takes each slot from its
degree's problem, each type key with its degree's memory (NOTE [mixed tensor-parallel degrees] in
partitioner/tp_choice.py, NOTE [memory per slot type] in partitioner/costs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch.fx as fx

from hetpart.devices import Cluster
from hetpart.errors import HetpartError
from hetpart.ir import info
from hetpart.partitioner.costs import allgather_ns, allreduce_ns, tp_shard_bytes
from hetpart.partitioner.problem import (
    COLOCATE, FORWARD_NS, MEM_BYTES, TIME_NS, Device, Link, Problem, Training,
)
from hetpart.passes.flops import is_view
from hetpart.passes.op_cost import peak_key, roofline_ns
from hetpart.passes.tensor_parallel import ShardingPlan


@dataclass(frozen=True)
class TPGroup:
    """One tensor-parallel slot: its name in the problem, its devices, type and machine."""

    name: str  # "<first device>+<...>": the problem's device name for the group
    devices: tuple[str, ...]
    type: str  # the devices' type
    machine: str


def tp_type(device_type: str, degree: int) -> str:
    """The problem's type key of a group of `degree` devices of `device_type` (NOTE [tensor-parallel costs])."""
    return f"{device_type}/tp{degree}"


def tp_groups(cluster: Cluster, degree: int) -> list[TPGroup]:
    """Each machine's devices of one type in groups of `degree`, in cluster order (a remainder stays unused)."""
    groups = []
    for m in cluster.machines:
        by_type: dict[str, list[str]] = {}
        for d in m.devices:
            by_type.setdefault(d.type.name, []).append(d.name)
        for t, names in by_type.items():
            for i in range(0, len(names) - degree + 1, degree):
                part = tuple(names[i:i + degree])
                groups.append(TPGroup("+".join(part), part, t, m.name))
    if not groups:
        raise HetpartError(f"--tensor-parallel {degree}: cluster '{cluster.name}' has no machine with {degree} "
                           "devices of one type; pass a smaller degree or a cluster with larger machines")
    return groups


def _link(spec) -> Link:
    return Link(bandwidth_bytes_per_us=max(1, round(spec.bandwidth_bytes_per_s / 1e6)),
                latency_ns=round(spec.latency_s * 1e9))


def _shard_time_ns(node: fx.Node, degree: int, dev, whole_ns: int, flops: int, nbytes: int, out_bytes: int,
                   row: bool) -> int:
    """An op's time at the shard's size (NOTE [tensor-parallel costs]); `whole_ns` its time whole."""
    if is_view(node) or (flops == 0 and nbytes == 0):
        return whole_ns  # no kernel to shrink: a profiled view's time is dispatch, paid whole by every rank
    shard_bytes = (max(0, nbytes - out_bytes) // degree + out_bytes) if row else nbytes // degree
    key = peak_key(node, info(node).dtype)
    shard = roofline_ns(flops // degree, shard_bytes, dev, key)
    whole = roofline_ns(flops, nbytes, dev, key)
    return shard if whole_ns == whole or whole == 0 else round(whole_ns * shard / whole)


def _type_keys(cluster: Cluster, slots: list[TPGroup], degree: int) -> dict[tuple[str, str], str]:
    """(device type, machine) -> the problem's type key of its slots: one key per device type, or per (type, machine)
    where its machines' links differ."""
    links = {m.name: _link(m.link) for m in cluster.machines}
    type_keys = sorted({(s.type, s.machine) for s in slots})
    uniform = {ty: len({links[m] for t2, m in type_keys if t2 == ty}) == 1 for ty, _ in type_keys}
    return {(ty, m): tp_type(ty, degree) if uniform[ty] else f"{tp_type(ty, degree)}@{m}" for ty, m in type_keys}


def tp_op_costs(gm: fx.GraphModule, cluster: Cluster, plan: ShardingPlan, groups: dict[str, str],
                training: bool) -> dict[str, dict[str, tuple[int, int]]]:
    """FX op -> type key of each TP slot of `plan.degree` -> its (forward, backward) ns there, collectives included
    (NOTE [tensor-parallel costs]): what lowering sums per problem node, and the partition dump shows per op."""
    t = plan.degree
    links = {m.name: _link(m.link) for m in cluster.machines}
    keyed: dict[str, tuple[str, str]] = {}  # type key -> (type, a machine of it)
    for (ty, m), key in sorted(_type_keys(cluster, tp_groups(cluster, t), t).items()):
        keyed.setdefault(key, (ty, m))
    rows, columns = set(plan.reduce_after), {c for cs in plan.copy_before.values() for c in cs}
    first_column = {cs[0]: x for x, cs in plan.copy_before.items()}
    by_name = {n.name: n for n in gm.graph.nodes}
    costs: dict[str, dict[str, tuple[int, int]]] = {}
    for node in gm.graph.nodes:
        if groups.get(node.name) is None or node.op != "call_function":
            continue
        ni = info(node)
        split = node.name in plan.sharded or node.name in rows or node.name in columns
        costs[node.name] = {}
        for key, (ty, m) in keyed.items():
            dev = cluster.device_types[ty]
            fwd, bwd = ni.cost_ns.get(ty, 0), ni.bwd_cost_ns.get(ty, 0) if training else 0
            if split:
                row = node.name in rows
                fwd = _shard_time_ns(node, t, dev, fwd, ni.flops or 0, ni.bytes_moved or 0, ni.out_bytes or 0, row)
                if training:
                    bwd = _shard_time_ns(node, t, dev, bwd, ni.bwd_flops or 0, ni.bwd_bytes_moved or 0,
                                         ni.out_bytes or 0, False)
            if node.name in rows:  # g: the partial output all-reduced forward
                fwd += allreduce_ns(links[m], ni.out_bytes or 0, t)
            if node.name in plan.gather_before_output:  # a split model output made whole
                fwd += allgather_ns(links[m], ni.out_bytes or 0, t)
            if training and node.name in first_column:  # f: the input's gradient all-reduced backward
                bwd += allreduce_ns(links[m], info(by_name[first_column[node.name]]).out_bytes or 0, t)
            costs[node.name][key] = (fwd, bwd)
    return costs


def show_tp_costs(gm: fx.GraphModule, costs: dict[str, dict[str, tuple[int, int]]], keys: set[str]) -> None:
    """Each op's `costs` (`tp_op_costs`) on the slot types `keys` into its annotation, beside its one device's: the
    partition dump then shows what a TP stage's compute_us sums (NOTE [tensor-parallel costs])."""
    for node in gm.graph.nodes:
        for key, (fwd, bwd) in costs.get(node.name, {}).items():
            if key in keys:
                info(node).cost_ns[key] = fwd
                if bwd or info(node).bwd_cost_ns:  # (an inference graph's ops have no backward)
                    info(node).bwd_cost_ns[key] = bwd


def lower_tensor_parallel(problem: Problem, gm: fx.GraphModule, cluster: Cluster, plan: ShardingPlan,
                          groups: dict[str, str], training: bool) -> tuple[Problem, list[TPGroup]]:
    """`problem` with every slot a TP group of `plan.degree` (NOTE [tensor-parallel costs])."""
    t = plan.degree
    slots = tp_groups(cluster, t)
    key_of = _type_keys(cluster, slots, t)
    g = problem.graph.copy()
    for v in g.nodes:
        g.nodes[v][TIME_NS] = dict(g.nodes[v][TIME_NS]) | {key: 0 for key in key_of.values()}
        if training or FORWARD_NS in g.nodes[v]:
            g.nodes[v][FORWARD_NS] = dict(g.nodes[v].get(FORWARD_NS, {})) | (
                {key: 0 for key in key_of.values()} if training else {})
    for name, by_key in tp_op_costs(gm, cluster, plan, groups, training).items():
        v = groups[name]
        for key, (fwd, bwd) in by_key.items():
            g.nodes[v][TIME_NS][key] += fwd + bwd
            if training:
                g.nodes[v][FORWARD_NS][key] += fwd
    for node in gm.graph.nodes:
        v = groups.get(node.name)
        if v is None or node.op != "call_function":
            continue
        ni = info(node)
        if node.name in plan.sharded and node.name not in plan.gather_before_output:  # (gathered: whole, and its part)
            g.nodes[v][MEM_BYTES] -= (ni.act_bytes or 0) - tp_shard_bytes(ni.act_bytes or 0, t)
        elif node.name in plan.gather_before_output:
            g.nodes[v][MEM_BYTES] += tp_shard_bytes(ni.act_bytes or 0, t)
    _colocate_regions(g, plan, groups)
    weights = {w: tp_shard_bytes(b, t) if w in plan.weights else b for w, b in problem.weights.items()}
    train = problem.training
    if train is not None:
        train = Training(train.schedule, train.microbatches,
                         {w: tp_shard_bytes(b, t) if w in plan.weights else b for w, b in train.state_bytes.items()})
    devices = [Device(s.name, key_of[s.type, s.machine], s.machine,
                      min(problem.device(d).capacity_bytes for d in s.devices)) for s in slots]
    lowered = Problem(graph=g, weights=weights, devices=devices, intra_node_links=dict(problem.intra_node_links),
                      network=problem.network, max_stages=problem.max_stages, training=train)
    return lowered, slots


def _colocate_regions(g: nx.DiGraph, plan: ShardingPlan, groups: dict[str, str]) -> None:
    """Every region's problem nodes in one COLOCATE group, merged with the groups they are in already."""
    uf = nx.utils.UnionFind()
    for nodes in plan.regions:
        members = sorted({groups[n] for n in nodes if n in groups})
        uf.union(*members) if members else None
    by_group: dict[str, list[str]] = {}
    for v in g.nodes:
        if g.nodes[v].get(COLOCATE) is not None:
            by_group.setdefault(g.nodes[v][COLOCATE], []).append(v)
    for members in by_group.values():
        uf.union(*members)
    sets = [sorted(s) for s in uf.to_sets() if len(s) > 1]
    for i, members in enumerate(sorted(sets)):
        for v in members:
            g.nodes[v][COLOCATE] = f"tp-region-{i}"


__all__ = ["TPGroup", "lower_tensor_parallel", "show_tp_costs", "tp_groups", "tp_op_costs", "tp_type"]
