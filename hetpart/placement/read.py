"""`read_placement`: a benchmark input file -> `PlacementProblem`, trusting nothing in it."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from hetpart.errors import HetpartError
from hetpart.placement.problem import PlacementNode, PlacementProblem, class_graph
from hetpart.placement.units import SCALE

# NOTE [placement input ranges]
# `read_placement` trusts nothing in the file. JSON's NaN and Infinity (which Python's json
# accepts) are refused, and so are booleans and strings where numbers belong, negative
# latencies, costs and sizes, and numbers the solver cannot take: it counts latencies and costs
# in integer units of 1/SCALE (int64 in CP-SAT), and a slot's load sums the latencies and
# costs of every node, so that total times SCALE times the slots (the redundant cut multiplies
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
    if total * SCALE * (max_fpgas + max_cpus + 1) >= _EXACT_MAX:
        raise HetpartError(f"{path}: the latencies and costs add up to {total:g}, too large for the solver's "
                           f"integer units (1/{SCALE} of the input's); scale the input's times down "
                           "(NOTE [placement input ranges])")
    if sum(n.size_bytes for n in nodes.values()) >= _EXACT_MAX:
        raise HetpartError(f"{path}: the nodes' sizes add up to 2^53 bytes or more; scale them down")
    problem = PlacementProblem(nodes=nodes, edges=edges, cost=cost, max_fpgas=max_fpgas, max_cpus=max_cpus,
                               max_size_bytes=max_size, name=path.stem)
    validate(problem, str(path))
    return problem


def validate(problem: PlacementProblem, where: str) -> None:
    errors = []
    if problem.max_fpgas < 0 or problem.max_cpus < 0 or problem.max_fpgas + problem.max_cpus == 0:
        errors.append(f"maxFPGAs={problem.max_fpgas} and maxCPUs={problem.max_cpus}: need at least one device")
    cpu_only = [i for i, n in problem.nodes.items() if not n.on_fpga]
    if cpu_only and problem.max_cpus == 0:
        errors.append(f"nodes {cpu_only[:5]} are not supported on an accelerator but maxCPUs is 0")
    for color, ids in problem.classes().items():
        if len({problem.nodes[i].on_fpga for i in ids}) > 1 and problem.max_cpus == 0:
            errors.append(f"colour class {color!r} mixes CPU-only nodes with others and there is no CPU")
    g = class_graph(problem)
    if not nx.is_directed_acyclic_graph(g):
        errors.append(f"edges into forward nodes form a cycle between colour classes: {nx.find_cycle(g)}")
    if errors:
        raise HetpartError(f"{where}: invalid placement input:\n  " + "\n  ".join(errors))
