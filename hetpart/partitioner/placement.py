"""Device placement of the NeurIPS 2020 benchmark (Tarnawski et al.): k accelerators and CPUs.

`hetpart placement INPUT.json` reads the public benchmark's format
(`../shared/benchmarks/dnn-partitioning/README.md`), solves it with a dedicated
CP-SAT model and prints the authors' output shape plus a proven lower bound.
The cost model differs from hetpart's pipeline model (see NOTE [placement load]),
so this module has its own model, evaluator and checker; nothing here imports torch.

Data flows `read_placement` (the question) -> `placement_hint` (a DP over one
topological order) -> `solve_placement` (exact CP-SAT) -> `placement_loads`
(the cost model, in floats) -> `placement_violations` (independent check).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np
from ortools.sat.python import cp_model

from hetpart.errors import HetpartError

if TYPE_CHECKING:
    from hetpart.partitioner.placement_ideals import IdealPlacement
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

_SCALE = 1_000_000  # integer units per unit of the input's latencies, at most (NOTE [int32 activities])
_ROUND_SLACK = 1e-9  # relative tolerance when comparing float loads
_ACTIVITY_MAX = 2**31 - 1  # the largest |activity| a linear constraint of the model may reach (NOTE [int32 activities])

# NOTE [int32 activities]
# OR-Tools 9.15's CP-SAT presolve proves wrong optima when a linear constraint can reach an
# activity of 2**31 or more: an enforced `max_load >= sum(w_i x_i)` whose weights sum to
# 2**31 - 1 presolves right and to 2**31 wrong, as if the sum were cut to 32 bits
# (benchmarks/ortools_presolve_int32.py: two items, only ortools; the model is valid: with
# presolve off the same proto is solved right). Bisecting debug_max_num_presolve_operations,
# the first operation that breaks it is a "linear + amo" rule (ProcessAtMostOneAndLinear); of
# the presolve parameters tried, only presolve_inclusion_work_limit=0 and
# keep_all_feasible_solutions_in_presolve avoid it (symmetry, SAT presolve, BVA, hints, one
# presolve iteration, big-linear-overlap, probing: no).
# That was issue 17's false OPTIMAL: at _SCALE = 1e6 a CPU slot's expression, the sum of every
# node's cpuLatency, passes 2**31 once the CPU latencies add up to 2147.5 (1,071 nodes of a
# training graph: 79.50 "proven" where 72.86 exists). Every linear expression the model builds
# is therefore kept below _ACTIVITY_MAX:
# - time: the scale is min(_SCALE, _ACTIVITY_MAX / U), U = the largest load any slot can
#   have (`_time_scale`); latencies are still rounded down, so bounds stay valid, and a
#   coarser scale only widens the rounding (at most one unit per node and sender);
# - memory: sizes over the gcd of the (integral) sizes when that fits, an exact rewrite;
#   else rounded down to units of total / _ACTIVITY_MAX and the limit too: a relaxation
#   (every placement that fits still fits), so the bound stays valid, but a solution may
#   not fit in bytes, and `solve_placement` keeps only placements `placement_violations` accepts;
# - the redundant work cut is max_load >= ceil(work / K), not K * max_load >= work.
# `partition`'s model (cpsat.py) meets the same bug once a stage's time can pass 2**31 ns
# (2.1 s); there, where that can happen, CP-SAT runs without presolve's inclusion step
# (presolve_inclusion_work_limit = 0), which random problems show is enough (cpsat.py).


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


# NOTE [placement input ranges]
# `read_placement` trusts nothing in the file. JSON's NaN and Infinity (which Python's json
# accepts) are refused, and so are booleans and strings where numbers belong, negative
# latencies, costs and sizes, and numbers the solver cannot take: it counts latencies and costs
# in integer units of 1/_SCALE (int64 in CP-SAT), and a slot's load sums the latencies and
# costs of every node, so that total times _SCALE times the slots (the redundant cut multiplies
# by them) must stay below 2^53 (exact in floats too). Accelerator sizes are summed the same
# way. Slots (maxFPGAs + maxCPUs) are at most PLACEMENT_MAX_SLOTS: the model has a literal per
# colour class and slot.
PLACEMENT_MAX_SLOTS = 256
_EXACT_MAX = 2.0**53


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _count(data: dict, key: str, where: str) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0 or (
            isinstance(value, float) and not value.is_integer()) or value > PLACEMENT_MAX_SLOTS:
        raise HetpartError(f"{where}: {key!r} must be a whole number from 0 to {PLACEMENT_MAX_SLOTS}, got {value!r}")
    return int(value)


def _field(raw: dict, key: str, where: str, default: object = None) -> object:
    """raw[key], or `default` where it is missing and given; an error where it is missing."""
    if key in raw:
        return raw[key]
    if default is not None:
        return default
    raise HetpartError(f"{where}: missing field {key!r}; every node needs id, supportedOnFpga, "
                       "cpuLatency, fpgaLatency (see the benchmark README)")


def _amount(raw: dict, key: str, where: str, default: float | None = None) -> float:
    """raw[key]: a finite number >= 0 (not a bool, not a string) below 2^53."""
    value = _field(raw, key, where, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < _EXACT_MAX:
        raise HetpartError(f"{where}: {key!r} must be a finite number >= 0 and below 2^53, got {value!r}")
    return float(value)


def _flag(raw: dict, key: str, where: str, default: bool | None = None) -> bool:
    """raw[key]: 0, 1, true or false."""
    value = _field(raw, key, where, default)
    if value not in (0, 1) or not isinstance(value, (int, bool)):
        raise HetpartError(f"{where}: {key!r} must be 0 or 1, got {value!r}")
    return bool(value)


def _node_id(raw: dict, key: str, where: str) -> int:
    if key not in raw:
        raise HetpartError(f"{where}: missing field {key!r} (an integer node id)")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**63:
        raise HetpartError(f"{where}: {key!r} must be an integer node id, got {value!r}")
    return value


def read_placement(path: str | Path) -> PlacementProblem:
    """Read a benchmark input file; raise HetpartError saying what is malformed and where
    (NOTE [placement input ranges])."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HetpartError(f"{path}: no such file; pass a benchmark JSON such as "
                           "../shared/benchmarks/dnn-partitioning/LayerGraphs/bert24_training.json") from None
    except IsADirectoryError:
        raise HetpartError(f"{path} is a directory; pass one benchmark JSON file") from None
    except UnicodeDecodeError as err:
        raise HetpartError(f"{path}: not a text file ({err.reason} at byte {err.start}); pass a benchmark JSON file"
                           ) from None
    except OSError as err:
        raise HetpartError(f"{path}: cannot read it ({err.strerror}); pass a readable benchmark JSON file") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        raise HetpartError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    except RecursionError:
        raise HetpartError(f"{path}: JSON nested too deeply to read (the benchmark format nests 3 levels)"
                           ) from None
    except ValueError as err:  # NaN / Infinity, or an integer of thousands of digits
        why = "a number has thousands of digits" if "digits" in str(err) else str(err)
        raise HetpartError(f"{path}: not a valid benchmark input: {why}; numbers must be finite") from None
    if not isinstance(data, dict):
        raise HetpartError(f"{path}: expected a JSON object with maxSizePerFPGA, maxFPGAs, maxCPUs, nodes, edges")
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges"):
        if key not in data:
            raise HetpartError(f"{path}: missing top-level field {key!r}")
    for key in ("nodes", "edges"):
        if not isinstance(data[key], list) or not all(isinstance(x, dict) for x in data[key]):
            raise HetpartError(f"{path}: {key!r} must be a list of JSON objects")
    max_fpgas, max_cpus = _count(data, "maxFPGAs", str(path)), _count(data, "maxCPUs", str(path))
    if max_fpgas + max_cpus > PLACEMENT_MAX_SLOTS:
        raise HetpartError(f"{path}: maxFPGAs + maxCPUs = {max_fpgas + max_cpus}; at most {PLACEMENT_MAX_SLOTS} "
                           "devices are placed")
    max_size = _amount(data, "maxSizePerFPGA", str(path))
    if not data["nodes"]:
        raise HetpartError(f"{path}: 'nodes' is empty; a placement input needs at least one node")
    nodes: dict[int, PlacementNode] = {}
    for idx, raw in enumerate(data["nodes"]):
        where = f"{path}: nodes[{idx}]"
        nid = _node_id(raw, "id", where)
        if nid in nodes:
            raise HetpartError(f"{where}: node id {nid} appears twice; ids must be unique")
        where = f"{where} (id {nid})"
        color = raw.get("colorClass")
        if isinstance(color, (dict, list)):
            raise HetpartError(f"{where}: 'colorClass' must be a number, a string or null, got {color!r}")
        node = PlacementNode(
            id=nid,
            cpu_latency=_amount(raw, "cpuLatency", where),
            fpga_latency=_amount(raw, "fpgaLatency", where),
            size_bytes=_amount(raw, "size", where, default=0.0),
            on_fpga=_flag(raw, "supportedOnFpga", where),
            backward=_flag(raw, "isBackwardNode", where, default=False),
            color=("node", nid) if color is None else color,  # no class: a class of its own
        )
        nodes[nid] = node
    edges: list[tuple[int, int]] = []
    cost: dict[int, float] = {i: 0.0 for i in nodes}
    seen_cost: dict[int, float] = {}
    seen_edges: set[tuple[int, int]] = set()
    for idx, raw in enumerate(data["edges"]):
        where = f"{path}: edges[{idx}]"
        u, v = _node_id(raw, "sourceId", where), _node_id(raw, "destId", where)
        where = f"{where} ({u}->{v})"
        c = _amount(raw, "cost", where)
        if u not in nodes or v not in nodes:
            raise HetpartError(f"{where}: edge {u}->{v} names an unknown node id "
                               f"({u if u not in nodes else v} is not in 'nodes')")
        if u == v:
            raise HetpartError(f"{where}: edge {u}->{v} goes from a node to itself; remove it")
        if u in seen_cost and abs(seen_cost[u] - c) > 1e-6:
            raise HetpartError(f"{where}: node {u} has two different outgoing costs ({seen_cost[u]} and {c}); "
                               "a node's output costs the same on every edge")
        seen_cost[u] = c
        cost[u] = c
        if (u, v) not in seen_edges:
            seen_edges.add((u, v))
            edges.append((u, v))
    total = sum(max(n.cpu_latency, n.fpga_latency) for n in nodes.values()) + sum(cost.values())
    if total * _SCALE * (max_fpgas + max_cpus + 1) >= _EXACT_MAX:
        raise HetpartError(f"{path}: the latencies and costs add up to {total:g}, too large for the solver's "
                           f"integer units (1/{_SCALE} of the input's); scale the input's times down "
                           "(NOTE [placement input ranges])")
    if sum(n.size_bytes for n in nodes.values()) >= _EXACT_MAX:
        raise HetpartError(f"{path}: the nodes' sizes add up to 2^53 bytes or more; scale them down")
    problem = PlacementProblem(nodes=nodes, edges=edges, cost=cost, max_fpgas=max_fpgas, max_cpus=max_cpus,
                               max_size_bytes=max_size, name=path.stem)
    _validate(problem, str(path))
    return problem


def _validate(problem: PlacementProblem, where: str) -> None:
    errors = []
    if problem.max_fpgas < 0 or problem.max_cpus < 0 or problem.max_fpgas + problem.max_cpus == 0:
        errors.append(f"maxFPGAs={problem.max_fpgas} and maxCPUs={problem.max_cpus}: need at least one device")
    cpu_only = [i for i, n in problem.nodes.items() if not n.on_fpga]
    if cpu_only and problem.max_cpus == 0:
        errors.append(f"nodes {cpu_only[:5]} are not supported on an accelerator but maxCPUs is 0")
    for color, ids in problem.classes().items():
        if len({problem.nodes[i].on_fpga for i in ids}) > 1 and problem.max_cpus == 0:
            errors.append(f"colour class {color!r} mixes CPU-only nodes with others and there is no CPU")
    g = _class_graph(problem)
    if not nx.is_directed_acyclic_graph(g):
        errors.append(f"edges into forward nodes form a cycle between colour classes: {nx.find_cycle(g)}")
    if errors:
        raise HetpartError(f"{where}: invalid placement input:\n  " + "\n  ".join(errors))


def _class_graph(problem: PlacementProblem) -> nx.DiGraph:
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


# --- The hint: a DP over one topological order of the colour classes.


def placement_hint(problem: PlacementProblem) -> list[tuple[str, list[int]]] | None:
    """The best placement whose devices take contiguous runs of one topological order of the classes.

    Each run is an accelerator or (at most maxCPUs of them) a CPU. Exact for that
    class of placements, under the integer costs of `_scaled`; None when none fits.
    """
    classes = problem.classes()
    order = list(nx.lexicographical_topological_sort(_class_graph(problem), key=lambda c: min(classes[c])))
    n = len(order)
    pos_of_class = {c: p for p, c in enumerate(order)}
    pos = {i: pos_of_class[problem.nodes[i].color] for i in problem.nodes}
    fpga, cpu, size, cost = _scaled(problem)

    fp = np.zeros(n + 1, dtype=np.int64)
    cp = np.zeros(n + 1, dtype=np.int64)
    sz = np.zeros(n + 1, dtype=np.float64)
    ok_fpga = np.ones(n + 1, dtype=np.int64)  # prefix count of classes that may run on an accelerator
    for c, ids in classes.items():
        p = pos_of_class[c] + 1
        fp[p] += sum(fpga[i] for i in ids)
        cp[p] += sum(cpu[i] for i in ids)
        sz[p] += sum(size[i] for i in ids)
        ok_fpga[p] = int(all(problem.nodes[i].on_fpga for i in ids))
    ok_fpga[0] = 0
    fp, cp, sz, ok_fpga = np.cumsum(fp), np.cumsum(cp), np.cumsum(sz), np.cumsum(ok_fpga)
    starts = np.arange(n + 1)

    # comm[i, j]: transfer cost paid by an accelerator holding the classes at positions [i, j).
    # u pays when it is inside and a successor outside, or outside with a successor inside.
    comm = np.zeros((n + 1, n + 1), dtype=np.int64)
    succ: dict[int, set[int]] = {}
    for u, v in problem.edges:
        succ.setdefault(u, set()).add(pos[v])
    for u, ps in succ.items():
        if cost[u] == 0:
            continue
        p, ps_arr = pos[u], np.array(sorted(ps))
        pays = np.zeros((n + 1, n + 1), dtype=bool)
        # Inside: i <= p < j, and a successor at q < i or q >= j.
        lo, hi = ps_arr.min(), ps_arr.max()
        inside = (starts[:, None] <= p) & (starts[None, :] > p)
        pays |= inside & ((lo < starts[:, None]) | (hi >= starts[None, :]))
        # Outside (p < i or p >= j) with a successor q in [i, j): the first successor >= i is < j.
        k = np.searchsorted(ps_arr, starts)
        nxt = np.where(k < len(ps_arr), ps_arr[np.minimum(k, len(ps_arr) - 1)], n + 1)
        pays |= ~inside & (nxt[:, None] < starts[None, :])
        comm += np.where(pays, cost[u], 0)

    seg_fpga = fp[None, :] - fp[:, None] + comm
    seg_fpga_ok = ((ok_fpga[None, :] - ok_fpga[:, None]) == (starts[None, :] - starts[:, None])) & (
        sz[None, :] - sz[:, None] <= problem.max_size_bytes)
    seg_cpu = cp[None, :] - cp[:, None]
    later = starts[None, :] > starts[:, None]
    inf = np.int64(1) << np.int64(60)
    seg = {"fpga": np.where(later & seg_fpga_ok, seg_fpga, inf), "cpu": np.where(later, seg_cpu, inf)}

    # best[(a, c)][j]: least max-load of placing positions [0, j) on a accelerators and c CPUs.
    best = {(0, 0): np.where(starts == 0, 0, inf)}
    back: dict[tuple[int, int], tuple[np.ndarray, str]] = {}
    for a in range(problem.max_fpgas + 1):
        for c in range(problem.max_cpus + 1):
            if (a, c) == (0, 0):
                continue
            cands = []
            for kind, prev in (("fpga", (a - 1, c)), ("cpu", (a, c - 1))):
                if prev in best:
                    val = np.maximum(best[prev][:, None], seg[kind])
                    arg = np.argmin(val, axis=0)
                    cands.append((val[arg, starts], arg, kind))
            if not cands:
                continue
            vals = np.stack([v for v, _, _ in cands])
            which = np.argmin(vals, axis=0)
            best[(a, c)] = vals[which, starts]
            back[(a, c)] = (np.stack([arg for _, arg, _ in cands])[which, starts],
                            np.array([kind for _, _, kind in cands])[which])
    state = min(best, key=lambda s: (best[s][n], s))
    if best[state][n] >= inf:
        return None
    runs = []
    j = n
    while state != (0, 0):
        arg, kinds = back[state]
        i, kind = int(arg[j]), str(kinds[j])
        runs.append((kind, i, j))
        state = (state[0] - (kind == "fpga"), state[1] - (kind == "cpu"))
        j = i
    runs.reverse()
    return [(kind, sorted(i for cl in order[s:e] for i in classes[cl])) for kind, s, e in runs if e > s]


def _scaled_loads(problem: PlacementProblem, devices: list[tuple[str, list[int]]], fpga: dict[int, int],
                  cpu: dict[int, int], cost: dict[int, int]) -> list[int]:
    """`placement_loads` in the solver's integer units."""
    where = {i: d for d, (_, ids) in enumerate(devices) for i in ids}
    loads = []
    for d, (kind, ids) in enumerate(devices):
        if kind == "cpu":
            loads.append(sum(cpu[i] for i in ids))
            continue
        senders = {u for u, v in problem.edges if (where[u] == d) != (where[v] == d)}
        loads.append(sum(fpga[i] for i in ids) + sum(cost[u] for u in senders))
    return loads


def _time_scale(problem: PlacementProblem) -> float:
    """Integer units per unit of latency: _SCALE, or less where a slot's load could reach
    _ACTIVITY_MAX units (NOTE [int32 activities])."""
    most = (sum(max(n.fpga_latency, n.cpu_latency) for n in problem.nodes.values())
            + sum(problem.cost.values()))  # no slot's load, accelerator or CPU, exceeds this
    # (1 - 1e-6): float rounding of each floor(x * scale) cannot carry the sum past _ACTIVITY_MAX.
    return min(float(_SCALE), _ACTIVITY_MAX * (1 - 1e-6) / most) if most > 0 else float(_SCALE)


def _scaled(problem: PlacementProblem) -> tuple[dict[int, int], dict[int, int], dict[int, float], dict[int, int]]:
    """Integer latencies and costs for the solver: floor(x * `_time_scale`).

    Rounding down makes every integer load <= scale x the float load, so the
    solver's bound / scale is a valid bound of the float problem.
    """
    scale = _time_scale(problem)
    fpga = {i: math.floor(n.fpga_latency * scale) for i, n in problem.nodes.items()}
    cpu = {i: math.floor(n.cpu_latency * scale) for i, n in problem.nodes.items()}
    size = {i: n.size_bytes for i, n in problem.nodes.items()}
    cost = {i: math.floor(c * scale) for i, c in problem.cost.items()}
    return fpga, cpu, size, cost


def _memory_units(sizes: list[float], limit_bytes: float) -> tuple[list[int], int, bool]:
    """(integer sizes, integer limit, exact) for the accelerator memory constraint, their sum
    at most _ACTIVITY_MAX (NOTE [int32 activities]). Exact: over the gcd of integral sizes;
    else rounded down to a coarser unit, a relaxation (exact False)."""
    if all(float(s).is_integer() for s in sizes):
        unit = math.gcd(*(int(s) for s in sizes)) or 1
        if sum(int(s) for s in sizes) // unit <= _ACTIVITY_MAX:
            return [int(s) // unit for s in sizes], math.floor(limit_bytes / unit), True
    unit = max(1.0, sum(sizes) / _ACTIVITY_MAX)
    return [math.floor(s / unit) for s in sizes], math.floor(limit_bytes / unit), False


# --- The exact model.


def solve_placement(problem: PlacementProblem, *, time_limit_s: float = 60.0, workers: int = 1,
                    seed: int = 0, params: dict | None = None, gap: float = 0.0,
                    check_certificate: bool | None = None, ideal_dp: bool = True) -> Placement:
    """The placement with the least max load (NOTE [placement load]), or the best found in time.

    First the DP over ideals (NOTE [placement ideal DP]): when its placement is within `gap` of
    its bound, CP-SAT does not run. Otherwise CP-SAT over device slots 0..maxFPGAs+maxCPUs-1 in
    pipeline order, with the order encoding y[c][s] = [slot(class c) <= s] (the paper's
    contiguity assumption), a kind literal per slot, the better of the two DPs' placements as
    its hint and the ideal DP's bound as a cut. `check_certificate` (None:
    HETPART_CHECK_CERTIFICATE) re-proves an OPTIMAL claim by a route that uses neither,
    NOTE [checked certificates]. `ideal_dp=False` leaves the DP over ideals out (CP-SAT alone).
    """
    from hetpart.partitioner.certificate import check_by_default, check_placement
    from hetpart.partitioner.placement_ideals import IDEAL_SHARE, ideal_placement, placement_ideal_dp  # imports us

    t0 = time.perf_counter()
    if not time_limit_s > 0:
        raise HetpartError(f"placement: --time-limit must be positive, got {time_limit_s}")
    if not 0 <= gap < 1:
        raise HetpartError(f"placement: --gap must be a fraction in [0, 1), e.g. --gap 0.01 for 1% (got {gap})")
    hint = placement_hint(problem)
    ideal = placement_ideal_dp(problem, deadline=t0 + IDEAL_SHARE * time_limit_s, known=hint) if ideal_dp else None
    if ideal is not None and ideal.devices is not None and ideal.settled(gap):
        result = ideal_placement(problem, ideal, t0)
    else:
        result = _solve_placement_cpsat(problem, time_limit_s=max(0.1, time_limit_s - (time.perf_counter() - t0)),
                                        workers=workers, seed=seed, params=params, gap=gap, ideal=ideal)
        result.seconds = time.perf_counter() - t0
    if check_certificate if check_certificate is not None else check_by_default():
        t_check = time.perf_counter()
        result = check_placement(problem, result, time_limit_s=time_limit_s)
        result.stats["certificate_seconds"] = time.perf_counter() - t_check
        result.seconds += result.stats["certificate_seconds"]
    return result


@dataclass
class _PlacementModel:
    """`solve_placement`'s CP-SAT model and what reading an answer needs; solvable more than once."""

    model: cp_model.CpModel
    x: dict[object, list]  # x[c][s]: class c runs on slot s
    is_cpu: list  # is_cpu[s]: slot s is a CPU
    classes: dict[object, list[int]]
    hint: list[tuple[str, list[int]]] | None  # placement_hint's placement
    mem_exact: bool  # memory in exact units (NOTE [int32 activities]); else relaxed
    seconds: dict[str, float]  # hint_seconds, build_seconds
    hint_engine: str = "order-dp"  # which DP's placement the hint is


def _placement_model(problem: PlacementProblem, ideal: "IdealPlacement | None" = None) -> _PlacementModel:
    """The CP-SAT model of `solve_placement`, with the hint of `placement_hint` (or the ideal DP's
    placement where lower) and the ideal DP's bound as a cut."""
    t0 = time.perf_counter()
    classes = problem.classes()
    cls_of = {i: problem.nodes[i].color for i in problem.nodes}
    names = list(classes)
    fpga, cpu, size, cost = _scaled(problem)
    K = problem.max_fpgas + problem.max_cpus
    slots = range(K)
    hint = placement_hint(problem)
    hint_engine = "order-dp"
    if ideal is not None and ideal.devices is not None and (
            hint is None or ideal.load_units < max(_scaled_loads(problem, hint, fpga, cpu, cost))):
        hint, hint_engine = ideal.devices, "ideal-dp"
    t_hint = time.perf_counter()

    # --- Data per class.
    c_fpga = {c: sum(fpga[i] for i in ids) for c, ids in classes.items()}
    c_cpu = {c: sum(cpu[i] for i in ids) for c, ids in classes.items()}
    c_size = {c: sum(size[i] for i in ids) for c, ids in classes.items()}
    c_fpga_ok = {c: all(problem.nodes[i].on_fpga for i in ids) for c, ids in classes.items()}
    # Classes every node u sends to (other than its own), for the transfer costs.
    sends: dict[int, set] = {}
    for u, v in problem.edges:
        if cls_of[u] != cls_of[v] and cost[u] > 0:
            sends.setdefault(u, set()).add(cls_of[v])

    # --- Variables.
    m = cp_model.CpModel()
    y = {c: [m.new_bool_var(f"y[{c}][{s}]") for s in range(K - 1)] for c in names}
    x = {c: [m.new_bool_var(f"x[{c}][{s}]") for s in slots] for c in names}
    is_cpu = [m.new_bool_var(f"cpu[{s}]") for s in slots]
    used = [m.new_bool_var(f"used[{s}]") for s in slots]
    pay = {(u, s): m.new_bool_var(f"pay[{u}][{s}]") for u in sends for s in slots}
    ub = sum(max(c_fpga[c], c_cpu[c]) for c in names) + sum(cost.values())
    assert ub <= _ACTIVITY_MAX, "hetpart bug: NOTE [int32 activities] scale too large"
    max_load = m.new_int_var(0, ub, "max_load")

    def le(c, s):  # [slot(c) <= s] as a literal or constant
        return 1 if s >= K - 1 else y[c][s]

    # --- Constraints: slots in the order encoding.
    for c in names:
        for s in range(K - 2):
            # slot(c) <= s implies slot(c) <= s+1.
            m.add_implication(y[c][s], y[c][s + 1])
        for s in slots:
            # x[c][s] = [slot(c) <= s] - [slot(c) <= s-1]: class c runs on slot s.
            m.add(x[c][s] == le(c, s) - (le(c, s - 1) if s > 0 else 0))
    for cu, cv in _class_graph(problem).edges:
        for s in range(K - 1):
            # Every edge into a forward node goes to the same or a later slot.
            m.add_implication(y[cv][s], y[cu][s])

    # --- Constraints: slot kinds and symmetry breaking.
    # Exactly maxCPUs slots are CPUs (unused ones included), so at most maxFPGAs are accelerators.
    m.add(sum(is_cpu) == problem.max_cpus)
    for s in slots:
        # A slot is used when it runs a class.
        for c in names:
            m.add_implication(x[c][s], used[s])
        m.add_bool_or([x[c][s] for c in names]).only_enforce_if(used[s])
        for c in names:
            if not c_fpga_ok[c]:
                # Classes with a node an accelerator cannot run go to a CPU.
                m.add_implication(x[c][s], is_cpu[s])
        if s + 1 < K:
            # Used slots come first; among the unused ones, accelerators before CPUs
            # (empty slots are interchangeable).
            m.add_implication(~used[s], ~used[s + 1])
            m.add_implication(is_cpu[s], is_cpu[s + 1]).only_enforce_if(~used[s])

    # --- Constraints: memory and transfers.
    mem_units, mem_limit, mem_exact = _memory_units([c_size[c] for c in names], problem.max_size_bytes)
    for s in slots:
        if sum(c_size.values()) > problem.max_size_bytes:
            # An accelerator holds at most maxSizePerFPGA bytes (in the units of NOTE [int32 activities]).
            held = sum(u * x[c][s] for u, c in zip(mem_units, names))
            m.add(held <= mem_limit).only_enforce_if(~is_cpu[s])
        for u, targets in sends.items():
            for cv in sorted(targets, key=str):
                # u pays its cost on slot s when it is on s and a consumer is not, or the reverse.
                m.add_bool_or([~x[cls_of[u]][s], x[cv][s], pay[u, s]])
                m.add_bool_or([x[cls_of[u]][s], ~x[cv][s], pay[u, s]])

    # --- Objective: the largest load.
    for s in slots:
        # An accelerator's load: its nodes' fpgaLatency plus the transfers it pays.
        m.add(max_load >= sum(c_fpga[c] * x[c][s] for c in names)
              + sum(cost[u] * pay[u, s] for u in sends)).only_enforce_if(~is_cpu[s])
        # A CPU's load: its nodes' cpuLatency.
        m.add(max_load >= sum(c_cpu[c] * x[c][s] for c in names)).only_enforce_if(is_cpu[s])
    # Redundant cut: every class runs somewhere, at its cheaper speed, on one of K slots
    # (a constant right-hand side, not K * max_load: NOTE [int32 activities]).
    m.add(max_load >= -(-sum(min(c_fpga[c] if c_fpga_ok[c] else ub, c_cpu[c]) for c in names) // K))
    if ideal is not None and ideal.bound_units > 0:
        # The ideal DP's bound (NOTE [placement ideal DP]: no placement is below it).
        m.add(max_load >= min(ideal.bound_units, ub))
    m.minimize(max_load)

    # --- Hint: the DP's placement, in slot order.
    if hint is not None:
        slot_of = {problem.nodes[i].color: s for s, (_, ids) in enumerate(hint) for i in ids}
        kinds = [k for k, _ in hint]
        empty = K - len(hint)
        free_cpus = problem.max_cpus - kinds.count("cpu")
        kinds += ["fpga"] * (empty - free_cpus) + ["cpu"] * free_cpus
        for c in names:
            for s in range(K - 1):
                m.add_hint(y[c][s], slot_of[c] <= s)
            for s in slots:
                m.add_hint(x[c][s], slot_of[c] == s)
        for s in slots:
            m.add_hint(is_cpu[s], kinds[s] == "cpu")
            m.add_hint(used[s], s < len(hint))
        m.add_hint(max_load, max(_scaled_loads(problem, hint, fpga, cpu, cost)))
        where = {i: s for s, (_, ids) in enumerate(hint) for i in ids}
        for u, targets in sends.items():
            for s in slots:
                inside = where[u] == s
                m.add_hint(pay[u, s], any((slot_of[cv] == s) != inside for cv in targets))
    t_build = time.perf_counter()
    return _PlacementModel(model=m, x=x, is_cpu=is_cpu, classes=classes, hint=hint, mem_exact=mem_exact,
                           seconds={"hint_seconds": t_hint - t0, "build_seconds": t_build - t_hint},
                           hint_engine=hint_engine)


def _solve_placement_cpsat(problem: PlacementProblem, *, time_limit_s: float, workers: int, seed: int,
                           params: dict | None, mdl: _PlacementModel | None = None, gap: float = 0.0,
                           ideal: "IdealPlacement | None" = None) -> Placement:
    """`solve_placement`'s CP-SAT step, without the certificate check, on `mdl` (built here when
    None, with `ideal`'s hint and bound)."""
    t0 = time.perf_counter()
    if not time_limit_s > 0:
        raise HetpartError(f"placement: --time-limit must be positive, got {time_limit_s}")
    mdl = mdl or _placement_model(problem, ideal)
    m, x, is_cpu, classes, hint, mem_exact = mdl.model, mdl.x, mdl.is_cpu, mdl.classes, mdl.hint, mdl.mem_exact
    names, slots = list(classes), range(len(is_cpu))
    t_build = time.perf_counter()

    # --- Solve.
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (t_build - t0))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # PARTITIONING-NOTES finding 3: probing is most of presolve (20 s of 25 s on bert_l-12) for no gain here.
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.relative_gap_limit = gap
    for key, value in (params or {}).items():
        setattr(solver.parameters, key, value)
    status = solver.solve(m)
    t_solve = time.perf_counter()

    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if status == cp_model.INFEASIBLE or (not found and hint is None):
        raise HetpartError(
            f"placement: no feasible placement found for {problem.name or 'the input'} "
            f"({'proven infeasible' if status == cp_model.INFEASIBLE else f'within {time_limit_s:g} s'}); "
            "check maxSizePerFPGA against the node sizes, or raise --time-limit")
    candidates = []
    if found:
        devices = []
        for s in slots:
            ids = sorted(i for c in names if solver.boolean_value(x[c][s]) for i in classes[c])
            if ids:
                devices.append(("cpu" if solver.boolean_value(is_cpu[s]) else "fpga", ids))
        candidates.append(devices)
    if hint is not None:
        candidates.append(hint)
    # Only placements the checker accepts count: with memory relaxed (NOTE [int32 activities])
    # the solver's may hold too many bytes; with it exact, a broken one is a bug.
    scored = []
    for n, d in enumerate(candidates):
        violations = placement_violations(problem, d)
        if violations and (mem_exact or n == len(candidates) - 1 and hint is not None):
            raise RuntimeError("hetpart bug: the placement breaks its problem:\n  " + "\n  ".join(violations))
        if not violations:
            scored.append((max(placement_loads(problem, d)), n, d))
    if not scored:
        raise HetpartError(f"placement: no placement found for {problem.name or 'the input'} that fits in "
                           "maxSizePerFPGA bytes within the time limit; raise --time-limit")
    best_load, picked, best = min(scored)
    scale = _time_scale(problem)
    bound = max(0.0, solver.best_objective_bound / scale) if found else 0.0  # rounded down: valid
    # CP-SAT's bound is of the floored costs, so at most any placement's float load: above the
    # checked one, its model has lost a placement and proves nothing (a guard; NOTE [int32 activities]).
    unsound = bound > best_load * (1 + _ROUND_SLACK)
    if unsound:
        bound = 0.0
    ideal_bound = ideal.bound_units / scale if ideal is not None else 0.0
    bound_engine = "ideal-dp" if ideal_bound > bound else "cp-sat"
    bound = max(bound, ideal_bound)
    loads = placement_loads(problem, best)
    # The solver's optimum is the problem's when its placement is one of those kept.
    optimal = status == cp_model.OPTIMAL and gap == 0 and scored[0][1] == 0 and not unsound
    presolve = "on" if solver.parameters.cp_model_presolve else "off"
    relaxation = (f"CP-SAT's objective bound (presolve {presolve}) of the slot model: latencies and costs rounded down to "
                  f"1/{scale:.6g} units" + ("" if mem_exact else ", memory rounded down to coarser units")
                  + " (NOTE [int32 activities])")
    return Placement(
        devices=best, loads=loads, max_load=best_load, lower_bound=min(bound, best_load),
        certificate=(Certificate("ideal_dp", ideal.note) if bound_engine == "ideal-dp" else
                     Certificate("cpsat_objective_bound" if found else "none", relaxation)),
        status="OPTIMAL" if optimal else "FEASIBLE", seconds=time.perf_counter() - t0,
        stats={**mdl.seconds, "cpsat_seconds": t_solve - t_build,
               "hint_max_load": max(placement_loads(problem, hint)) if hint else math.inf,
               "classes": float(len(names)), "variables": float(len(m.proto.variables)),
               "cpsat_bound_unsound": float(unsound),
               **({"ideal_seconds": ideal.seconds, "ideals": float(ideal.ideals)} if ideal is not None else {})},
        plan_engine="cp-sat" if found and picked == 0 else mdl.hint_engine, bound_engine=bound_engine,
    )
