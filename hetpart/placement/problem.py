"""The placement problem, its answer, and its cost model (NOTE [placement load]) and checker, in floats."""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from hetpart.partitioner.problem import Certificate

# NOTE [placement load]
# (The authors' ILP `maxload`, read from msr-fiddle/dnn-partitioning, and our README.)
# An accelerator's load is the `fpgaLatency` of its nodes plus, for every node u
# with an edge u->v where exactly one of u, v is on this accelerator, u's
# transfer `cost` once: the sender pays once however many receivers, and every
# distinct receiving accelerator pays once too. A CPU's load is the `cpuLatency`
# of its nodes: data already sits in host memory, so it pays no transfer.
# Feasible: nodes with supportedOnFpga = 0 on a CPU; accelerator memory (sum of
# `size`) <= maxSizePerFPGA; at most maxFPGAs accelerators and maxCPUs CPUs;
# colour classes on one device; and the devices in an order where every edge
# into a forward node goes from an earlier device to the same or a later one
# (the authors' DP over ideals assumes this; backward nodes follow their class).
# Objective: the maximum load.


@dataclass(frozen=True)
class PlacementNode:
    id: int
    cpu_latency: float
    fpga_latency: float
    size_bytes: float
    on_fpga: bool  # supportedOnFpga
    backward: bool
    color: object  # nodes of one colour class share a device


@dataclass
class PlacementProblem:
    """One benchmark input: a DAG of profiled nodes, k accelerators, some CPUs."""

    nodes: dict[int, PlacementNode]
    edges: list[tuple[int, int]]
    cost: dict[int, float]  # node id -> time to move its output off its device
    max_fpgas: int
    max_cpus: int
    max_size_bytes: float
    name: str = ""

    def classes(self) -> dict[object, list[int]]:
        """Colour class -> its node ids (ids ascending), classes in order of their first node id."""
        out: dict[object, list[int]] = {}
        for i in sorted(self.nodes):
            out.setdefault(self.nodes[i].color, []).append(i)
        return out


@dataclass
class Placement:
    """The answer: ordered devices, each a kind ("fpga" or "cpu") and its node ids."""

    devices: list[tuple[str, list[int]]]  # in pipeline order
    loads: list[float]
    max_load: float
    lower_bound: float  # proven: no placement of this problem has a smaller max load
    status: str  # "OPTIMAL" or "FEASIBLE"
    seconds: float
    stats: dict[str, float] = field(default_factory=dict)
    certificate: Certificate | None = None  # the bound's provenance and re-proof (NOTE [checked certificates])
    plan_engine: str = "cp-sat"  # what found the placement: "ideal-dp", "order-dp" (the hint) or "cp-sat"
    bound_engine: str = "cp-sat"  # what proved lower_bound: "ideal-dp" or "cp-sat"

    @property
    def gap(self) -> float:
        if self.max_load <= 0:
            return 0.0
        return max(0.0, (self.max_load - self.lower_bound) / self.max_load)

    def to_json(self, problem: PlacementProblem) -> dict:
        """The authors' output shape, plus lowerBound, gap, status and seconds.

        `fpgas` lists maxFPGAs accelerators in pipeline order (unused ones empty),
        `cpus` lists maxCPUs CPUs; `order` gives the pipeline order of all devices.
        """
        fpgas, cpus, order = [], [], []
        for (kind, nodes), load in zip(self.devices, self.loads):
            target = fpgas if kind == "fpga" else cpus
            order.append(f"{kind}{len(target)}")
            target.append({"load": load, "nodes": sorted(nodes)})
        fpgas += [{"load": 0.0, "nodes": []} for _ in range(problem.max_fpgas - len(fpgas))]
        cpus += [{"load": 0.0, "nodes": []} for _ in range(problem.max_cpus - len(cpus))]
        return {
            "maxLoad": self.max_load,
            "fpgas": fpgas,
            "cpus": cpus,
            "order": order,
            "lowerBound": self.lower_bound,
            "gap": round(self.gap, 6),
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "planEngine": self.plan_engine,
            "boundEngine": self.bound_engine,
            "certificate": self.certificate.to_json() if self.certificate else None,
        }


def class_graph(problem: PlacementProblem) -> nx.DiGraph:
    """Colour classes, with an edge for every edge into a forward node (the order they must respect)."""
    cls = {i: n.color for i, n in problem.nodes.items()}
    g = nx.DiGraph()
    g.add_nodes_from(problem.classes())
    for u, v in problem.edges:
        if not problem.nodes[v].backward and cls[u] != cls[v]:
            g.add_edge(cls[u], cls[v])
    return g


def placement_loads(problem: PlacementProblem, devices: list[tuple[str, list[int]]]) -> list[float]:
    """Each device's load by NOTE [placement load], in floats (as the authors compute it)."""
    where = {i: d for d, (_, ids) in enumerate(devices) for i in ids}
    loads = []
    for d, (kind, ids) in enumerate(devices):
        if kind == "cpu":
            loads.append(sum(problem.nodes[i].cpu_latency for i in ids))
            continue
        senders = {u for u, v in problem.edges if (where[u] == d) != (where[v] == d)}
        loads.append(sum(problem.nodes[i].fpga_latency for i in ids) + sum(problem.cost[u] for u in senders))
    return loads


def placement_violations(problem: PlacementProblem, devices: list[tuple[str, list[int]]]) -> list[str]:
    """Every rule of NOTE [placement load] that `devices` breaks; empty when valid."""
    out = []
    where: dict[int, int] = {}
    for d, (kind, ids) in enumerate(devices):
        if kind not in ("fpga", "cpu"):
            out.append(f"device {d} has kind {kind!r}, not 'fpga' or 'cpu'")
        for i in ids:
            if i in where:
                out.append(f"node {i} is on devices {where[i]} and {d}")
            where[i] = d
    missing = sorted(set(problem.nodes) - set(where))
    if missing:
        out.append(f"nodes without a device: {missing[:10]}")
        return out
    kinds = [k for k, _ in devices]
    if kinds.count("fpga") > problem.max_fpgas:
        out.append(f"{kinds.count('fpga')} accelerators used, at most {problem.max_fpgas} allowed")
    if kinds.count("cpu") > problem.max_cpus:
        out.append(f"{kinds.count('cpu')} CPUs used, at most {problem.max_cpus} allowed")
    for d, (kind, ids) in enumerate(devices):
        if kind != "fpga":
            continue
        bad = [i for i in ids if not problem.nodes[i].on_fpga]
        if bad:
            out.append(f"accelerator {d} runs nodes {bad[:5]} that are not supported on an accelerator")
        size = sum(problem.nodes[i].size_bytes for i in ids)
        if size > problem.max_size_bytes:
            out.append(f"accelerator {d} holds {size:.0f} bytes, over maxSizePerFPGA {problem.max_size_bytes:.0f}")
    for color, ids in problem.classes().items():
        if len({where[i] for i in ids}) > 1:
            out.append(f"colour class {color!r} is split over devices {sorted({where[i] for i in ids})}")
    # The devices can be ordered: the quotient graph of edges into forward nodes is acyclic.
    q = nx.DiGraph()
    q.add_nodes_from(range(len(devices)))
    q.add_edges_from((where[u], where[v]) for u, v in problem.edges
                     if not problem.nodes[v].backward and where[u] != where[v])
    if not nx.is_directed_acyclic_graph(q):
        out.append(f"no device order respects every edge into a forward node: cycle {nx.find_cycle(q)}")
    return out
