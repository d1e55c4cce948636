"""Small hand-made and random partitioning problems, and a brute-force optimum."""

from __future__ import annotations

import itertools
import random

import networkx as nx

from hetpart.partitioner import (
    MEM_BYTES,
    OUT_BYTES,
    PIN,
    PIN_FIRST,
    PIN_LAST,
    TIME_NS,
    WEIGHTS,
    Device,
    Link,
    Problem,
    bottleneck_ns,
    evaluate,
)
from hetpart.partitioner.evaluate import objective_ns

FAST_LINK = Link(bandwidth_bytes_per_us=1_000, latency_ns=0)  # 1 byte per ns


def make_problem(
    nodes: dict[str, dict],
    edges: list[tuple[str, str]],
    devices: list[Device],
    *,
    weights: dict[str, int] | None = None,
    intra: Link = FAST_LINK,
    network: Link = FAST_LINK,
    max_stages: int | None = None,
) -> Problem:
    """`nodes` maps a name to {"time": {type: ns}, "mem": b, "out": b, "weights": (...), "pin": ...}."""
    g = nx.DiGraph()
    for name, spec in nodes.items():
        g.add_node(
            name,
            **{
                TIME_NS: spec["time"],
                MEM_BYTES: spec.get("mem", 0),
                OUT_BYTES: spec.get("out", 0),
                WEIGHTS: tuple(spec.get("weights", ())),
                PIN: spec.get("pin"),
            },
        )
    g.add_edges_from(edges)
    machines = sorted({d.node for d in devices})
    return Problem(
        graph=g,
        weights=dict(weights or {}),
        devices=devices,
        intra_node_links={m: intra for m in machines},
        network=network,
        max_stages=max_stages,
    )


def chain(n: int, time: dict[str, int], out: int = 0, mem: int = 0) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    names = [f"op{i}" for i in range(n)]
    return {v: {"time": dict(time), "out": out, "mem": mem} for v in names}, list(zip(names, names[1:]))


def brute_force(problem: Problem, objective: str = "throughput", microbatches: int = 1) -> int | None:
    """The least value of `objective` (NOTE [objectives]) over every valid plan, or None when none fits."""
    g = problem.graph
    nodes = list(g.nodes)
    pin = {v: g.nodes[v].get(PIN) for v in nodes}
    max_s = min(problem.max_stages or len(problem.devices), len(problem.devices))
    best = None
    for S in range(1, max_s + 1):
        for assign in itertools.product(range(S), repeat=len(nodes)):
            stage_of = dict(zip(nodes, assign))
            if any(stage_of[u] > stage_of[v] for u, v in g.edges):
                continue
            if any(pin[v] == PIN_FIRST and stage_of[v] != 0 for v in nodes):
                continue
            if any(pin[v] == PIN_LAST and stage_of[v] != S - 1 for v in nodes):
                continue
            if {stage_of[v] for v in nodes if pin[v] != PIN_LAST} != set(range(S)):
                continue
            for devs in itertools.permutations([d.name for d in problem.devices], S):
                stages = evaluate(problem, stage_of, list(devs))
                if any(s.memory_bytes > s.capacity_bytes for s in stages):
                    continue
                t = objective_ns(stages, objective, microbatches)
                if best is None or t < best:
                    best = t
    return best


def random_problem(seed: int) -> Problem:
    """A DAG of 2..6 nodes on 3 devices: 2 types, 2 machines, sometimes a pin or tight memory."""
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    names = [f"n{i}" for i in range(n)]
    weights = {"w0": rng.randint(1, 8), "w1": rng.randint(1, 8)}
    nodes = {}
    for i, v in enumerate(names):
        nodes[v] = {
            "time": {"a": rng.randint(1, 40), "b": rng.randint(1, 40)},
            "mem": rng.randint(0, 6),
            "out": rng.choice([0, 10, 100, 1000, 5000]),
            "weights": [w for w in sorted(weights) if rng.random() < 0.3],
        }
    if rng.random() < 0.4:
        nodes[names[0]]["pin"] = PIN_FIRST
    if rng.random() < 0.4:
        nodes[names[-1]]["pin"] = PIN_LAST
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1 :] if rng.random() < 0.4]
    cap = lambda: rng.choice([12, 20, 40, 1000])  # noqa: E731
    c0 = cap()
    devices = [
        Device("d0", "a", "m0", c0),
        Device("d1", "a", "m0", c0 if rng.random() < 0.5 else cap()),
        Device("d2", "b", "m1", cap()),
    ]
    intra = Link(rng.choice([100, 1000, 10_000]), rng.choice([0, 5, 50]))
    network = Link(rng.choice([10, 100, 1000]), rng.choice([0, 20, 200]))
    return make_problem(
        nodes, edges, devices, weights=weights, intra=intra, network=network,
        max_stages=rng.choice([None, None, 2]),
    )


def random_large(seed: int, n: int, num_devices: int = 4) -> Problem:
    """A layered random DAG of n nodes (skip edges) on a few devices, for speed and determinism."""
    rng = random.Random(seed)
    names = [f"v{i:04d}" for i in range(n)]
    nodes = {
        v: {
            "time": {"a": rng.randint(10, 100), "b": rng.randint(20, 300)},
            "mem": rng.randint(1, 100),
            "out": rng.choice([0, 1_000, 10_000]),
            "weights": [f"w{i // 5}"] if rng.random() < 0.5 else [],
        }
        for i, v in enumerate(names)
    }
    nodes[names[0]]["pin"] = PIN_FIRST
    nodes[names[-1]]["pin"] = PIN_LAST
    edges = [(names[i], names[i + 1]) for i in range(n - 1)]
    edges += [(names[i], names[min(n - 1, i + rng.randint(2, 20))]) for i in range(0, n - 2, 3)]
    weights = {f"w{i}": rng.randint(100, 1_000) for i in range(n // 5 + 1)}
    devices = [Device(f"d{i}", "a" if i % 2 == 0 else "b", f"m{i // 2}", 10**9) for i in range(num_devices)]
    return make_problem(nodes, edges, devices, weights=weights, intra=Link(10_000, 10), network=Link(1_000, 100))
