"""A Problem as JSON and back (torch-free): what `hetpart replan` re-plans from without tracing again.

    >>> import networkx as nx
    >>> from hetpart.partitioner.problem import Device, Link
    >>> g = nx.DiGraph(); g.add_node("x", time_ns={"cpu": 5}, weights=("w",)); g.add_edge("x", "y")
    >>> p = Problem(g, {"w": 8}, [Device("m/0", "cpu", "m", 64)], {"m": Link(1000, 20)}, Link(100, 50))
    >>> q = problem_from_json(problem_to_json(p))
    >>> q.graph.nodes["x"]["weights"], q.devices == p.devices, q.network
    (('w',), True, Link(bandwidth_bytes_per_us=100, latency_ns=50))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import networkx as nx

from hetpart.partitioner.problem import FORBIDDEN_TYPES, WEIGHTS, Device, Link, Problem, Training
from hetpart.partitioner.tp_sync import TPSyncLayout

_TUPLES = (WEIGHTS, FORBIDDEN_TYPES)  # node attributes that are tuples (JSON has lists)


def problem_to_json(problem: Problem) -> dict[str, Any]:
    """Every field of `problem`, the graph as networkx's node-link data (nodes in graph order)."""
    return {
        "graph": nx.node_link_data(problem.graph, edges="edges"),
        "weights": problem.weights,
        "devices": [dataclasses.asdict(d) for d in problem.devices],
        "intra_node_links": {m: dataclasses.asdict(link) for m, link in problem.intra_node_links.items()},
        "network": dataclasses.asdict(problem.network),
        "max_stages": problem.max_stages,
        "training": dataclasses.asdict(problem.training) if problem.training is not None else None,
        "held_bytes_of": problem.held_bytes_of,  # a mixed-degree problem's memory per slot type
        "tp_sync": problem.tp_sync.to_json() if problem.tp_sync is not None else None,  # and its gradient sync
    }


def problem_from_json(data: dict[str, Any]) -> Problem:
    """The Problem `problem_to_json` wrote."""
    graph = nx.node_link_graph(data["graph"], edges="edges")
    for _, attrs in graph.nodes(data=True):
        for key in _TUPLES:
            if key in attrs:
                attrs[key] = tuple(attrs[key])
    training = data["training"]
    return Problem(
        graph=graph, weights=dict(data["weights"]), devices=[Device(**d) for d in data["devices"]],
        intra_node_links={m: Link(**link) for m, link in data["intra_node_links"].items()},
        network=Link(**data["network"]), max_stages=data["max_stages"],
        training=Training(**training) if training is not None else None,
        held_bytes_of={k: dict(v) for k, v in held.items()} if (held := data.get("held_bytes_of")) else None,
        tp_sync=TPSyncLayout.from_json(sync) if (sync := data.get("tp_sync")) else None)


def costed_types(problem: Problem) -> set[str]:
    """The device types every node has a time for: the types a re-plan may use."""
    types = None
    for _, attrs in problem.graph.nodes(data=True):
        have = set(attrs.get("time_ns", {}))
        types = have if types is None else types & have
    return types or set()
